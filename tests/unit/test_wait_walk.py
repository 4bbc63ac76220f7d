"""Wait sentences worded through a CardWalk (rig.placement: the cards sorted once for a
round's many sentences, each over the cards less its held ones) against the plain walks they
replace (explain_wait and explain_body as they were written before CardWalk, copied below), over
seeded random clusters: whitelists, unhealthy, damaged and gone cards, job caps, held cards with
known and unknown ends, nodes not up, multi-card requests, jobs that fit now."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Sequence

import pytest

from rig.card_index import RoomIndex
from rig.closed_cards import closed_cards_text
from rig.keys import card_id
from rig.memory import GIB, format_memory
from rig.models import CardState
from rig.nodes import NodeInfo
from rig.placement import (
    STRATEGIES,
    Capacity,
    CardWalk,
    Hold,
    Request,
    explain_wait,
    only_outside_whitelist,
    place,
)
from rig.waiting import (
    FITS_NOW,
    STARTS_NEXT_PASS,
    NodeStates,
    WaitFacts,
    _big_enough,
    _cards,
    _expected,
    _live,
    explain_body,
    node_state_text,
)
from tests.unit.test_card_index import _card


def _explain_wait_plainly(cards: Sequence[CardState], request: Request) -> str:
    """A person-readable reason why ``request`` cannot be placed now (assumes it can't)."""
    # One walk over the cards (a pass words this for hundreds of jobs): which take jobs
    # (CardState.eligible: allowed and healthy), their free bytes (a property) worked out once
    # each, and which are closed (allowed but unhealthy).
    eligible: list[CardState] = []
    ranks: list[tuple[int, int]] = []
    closed: list[CardState] = []
    for c in cards:
        if c.allowed:
            if c.healthy:
                eligible.append(c)
                ranks.append((c.free, -c.index))
            else:
                closed.append(c)
    need = f"needs {format_memory(request.nbytes)}"
    need += " on 1 card" if request.gpus == 1 else f" on each of {request.gpus} cards of one node"
    if not eligible:
        # Name the cause (a node that cannot write logs, a stopped node, a hot card), never
        # only "no healthy card" (rig.closed_cards words it, grouped per node).
        why = closed_cards_text(closed or [c for c in cards if not c.eligible], node_cards=cards)
        return f"{need}; no card takes jobs now ({why})" if why else f"{need}; no card is registered"
    largest = eligible[ranks.index(max(ranks))]  # the first of the largest, as max(key=) picks
    parts = [need, f"largest free block {format_memory(largest.free)} ({largest.id})"]
    roomy = [c for c, (free, _) in zip(eligible, ranks, strict=True) if free >= request.nbytes]
    if roomy and all(c.jobs >= c.max_jobs for c in roomy):
        parts.append(f"cards with that much free already run their maximum of {roomy[0].max_jobs} jobs")
    elif request.gpus > 1 and roomy:
        per_node: dict[str, int] = defaultdict(int)
        for c in roomy:
            if c.jobs < c.max_jobs:
                per_node[c.node] += 1
        best = max(per_node.values(), default=0)
        parts.append(f"only {best} such card(s) free on one node")
    if closed:
        parts.append(closed_cards_text(closed, node_cards=cards))
    return "; ".join(parts)


def _body_plainly(facts: WaitFacts) -> tuple[str, bool]:
    """explain's sentence without its tail (explain_tail: the jobs ahead, its own hold, the
    dispatcher's state), and whether the tail is to count the jobs ahead (False: the body names
    them). The body reads neither ``ahead`` (unless ``ahead_unknown`` or ``ahead_cards``) nor
    ``own_hold``: the dispatcher words it once for every job alike (rig.waiting.body_key)."""
    body, counts_ahead = _card_body_plainly(facts)
    return (f"in pool {facts.pool!r}: {body}" if facts.pool and not facts.limit else body), counts_ahead


def _card_body_plainly(facts: WaitFacts) -> tuple[str, bool]:
    req = facts.request
    nodes = {n.name: n for n in facts.nodes}
    held = facts.held or {}

    down = {name for name, n in nodes.items() if not _live(n)}  # a card of a node not listed counts as up

    def is_live(card: CardState) -> bool:
        return card.node not in down

    live = [c for c in facts.cards if c.node not in down] if down else list(facts.cards)
    not_up = sorted({c.node for c in facts.cards if c.node in down}) if down else []
    if facts.limit:
        return f"{facts.limit}; waits for one of them to end", True

    frozen = [n for n in facts.nodes if n.mismatch]
    if frozen and not live:
        # Its cards are not in this Redis: the node joined another installation (rig.installation).
        return (f"no node takes jobs here: {frozen[0].name} is frozen ({frozen[0].mismatch})"
                + (f" and {len(frozen) - 1} more node(s) too" if len(frozen) > 1 else "")), True
    if not facts.cards:
        if facts.pool:
            return "no card is registered", True
        down = [node_state_text(n) for n in facts.nodes if not _live(n)]
        return ("no cards are registered: no rig node is up"
                + (f" ({'; '.join(down)})" if down else "") + "; it starts when one is (`rig up`)"), True
    if not live:
        listed = "; ".join(node_state_text(nodes[n]) for n in not_up)
        which = "no node is up" if facts.pool else "no rig node is up"
        return f"{which} ({listed}); it starts when one is back (`rig up` there)", True
    if down and not _big_enough(live, req) and _big_enough(facts.cards, req):  # (no node down: live is all)
        wanted = sorted({c.node for c in facts.cards if not is_live(c) and c.allowed and c.usable >= req.nbytes})
        listed = "; ".join(node_state_text(nodes[n]) for n in wanted)
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; only cards of nodes that are not up "
                f"could take it ({listed}); it waits until one is back"), True

    outside = only_outside_whitelist(live, req)
    if outside:
        shown = ", ".join(c.id for c in outside[:6]) + (" …" if len(outside) > 6 else "")
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; only cards outside gpu_whitelist "
                f"could take it: {shown}; it waits until gpu_whitelist names them"), True

    open_cards = [c for c in live if c.id not in held] if held else live
    fitting = None if facts.fits_nowhere else place(open_cards, req, facts.strategy)
    if fitting is not None and facts.ahead and (facts.ahead_unknown or facts.ahead_cards is not None):
        # Free now, but jobs ahead go first: it fits now only if it still does after them.
        later = None if facts.ahead_unknown else place(
            [c for c in facts.ahead_cards if is_live(c) and c.id not in held], req, facts.strategy)
        if later is None:
            where = ", ".join(card_id(fitting.node, i) for i in fitting.cards)
            first = "go first" if facts.ahead_unknown else "take that room first"
            return (f"the free memory would hold it now ({where}), but the {facts.ahead} job(s) ahead "
                    f"of it {first}"), False
        fitting = later
    if fitting is not None:
        where = ", ".join(card_id(fitting.node, i) for i in fitting.cards)
        then = f"; {STARTS_NEXT_PASS}" if facts.dispatcher and not facts.silent_s else ""
        return f"{FITS_NOW} ({where}){then}", True
    any_eligible = any(c.eligible for c in live)
    if open_cards and not any_eligible:
        # Say why no card takes it, naming each node and card (a node that is stopped or down
        # reads as such, even where its record still says it is up).
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; no card takes jobs now "
                f"({closed_cards_text(open_cards)}); it starts when one does"), True
    all_held = not any(c.eligible for c in open_cards)
    aside = ""
    if all_held:
        every = "every card that takes jobs" if open_cards else "every card"
        text = f"needs {format_memory(req.nbytes)} on {_cards(req)}; {every} is held for jobs ahead of it"
        if open_cards:
            aside = f"; the other cards take no jobs ({closed_cards_text(open_cards, node_cards=live)})"
    else:
        text = _explain_wait_plainly(open_cards, req)
    live_by_id = {c.id: c for c in live} if held else {}
    roomy_held = [(cid, h) for cid, h in sorted(held.items())
                  if (card := live_by_id.get(cid)) is not None and card.eligible
                  and (all_held or card.free >= req.nbytes)]
    if roomy_held:
        parts = []
        for cid, hold in roomy_held:
            card = live_by_id[cid]
            parts.append(f"{cid} ({format_memory(card.free)} free) held for job {hold.job_id}"
                         + _expected(hold.until, facts.now))
        text += "; " + ", ".join(parts)
    text += aside
    if not_up:
        text += "; not up: " + ", ".join(node_state_text(nodes[n]) for n in not_up)
    return text, True


def _cluster(rng: random.Random) -> list[CardState]:
    cards = [_card(rng, f"n{n}", i) for n in range(rng.randint(1, 5)) for i in range(rng.choice([1, 2, 4, 8]))]
    if rng.random() < 0.3:  # a node whose cards all share one closing reason
        cards = [dataclasses.replace(c, healthy=False, health_reason="temperature 95 C") if c.node == "n0" else c
                 for c in cards]
    return sorted(cards, key=lambda c: (c.node, c.index))


def _held(rng: random.Random, cards: list[CardState]) -> dict[str, Hold]:
    held = {}
    for card in rng.sample(cards, rng.randint(0, len(cards))):
        held[card.id] = Hold(rng.randint(1, 50), (card.id,), rng.randint(1, 40) * GIB,
                             rng.choice([math.inf, 1_900_000_600.0]))
    return held


@pytest.mark.parametrize("seed", range(60))
def test_explain_wait_over_a_walk_less_held_cards_says_what_the_plain_walk_says(seed):
    rng = random.Random(seed)
    cards = _cluster(rng)
    walk = CardWalk(cards, index=RoomIndex(cards) if rng.random() < 0.5 else None)
    for _ in range(20):
        held = _held(rng, cards)
        open_cards = [c for c in cards if c.id not in held]
        request = Request(rng.choice([1, 8, 12, 20, 30, 48, 80, 81]) * GIB, rng.choice([1, 2, 3]))
        if not open_cards:
            continue
        assert explain_wait(open_cards, request, walk=walk, held=held) == _explain_wait_plainly(open_cards, request)
        assert explain_wait(open_cards, request) == _explain_wait_plainly(open_cards, request)


@pytest.mark.parametrize("seed", range(60))
def test_explain_body_through_a_walk_says_what_the_plain_body_says(seed):
    rng = random.Random(seed)
    cards = _cluster(rng)
    nodes = sorted({c.node for c in cards})
    infos: list[NodeInfo] = []
    if rng.random() < 0.3:
        frozen = rng.choice([0.0, 0.25, 1.0])  # share of nodes joined to another installation
        infos = [NodeInfo(name=n, alive=True, state=rng.choice(["up", "up", "stopped", "down", "silent"]),
                          since=1_899_999_000.0, started_at=rng.choice([1_899_998_000.0, None]),
                          workers=rng.choice([0, 4, 4]),
                          mismatch="it joined another installation" if rng.random() < frozen else None)
                 for n in nodes]
    walk = CardWalk(cards, index=RoomIndex(cards))
    capacity = Capacity(cards)
    for _ in range(20):
        request = Request(rng.choice([1, 8, 12, 20, 30, 48, 80, 81]) * GIB, rng.choice([1, 1, 2, 3]))
        facts = WaitFacts(request=request, cards=cards, nodes=infos, held=_held(rng, cards),
                          strategy=rng.choice(STRATEGIES), now=1_900_000_000.0, pool=rng.choice([None, "p"]),
                          fits_nowhere=not capacity.could_place(request) if rng.random() < 0.7 else False,
                          dispatcher=rng.random() < 0.9)
        plain = _body_plainly(facts)
        assert explain_body(dataclasses.replace(facts, walk=walk)) == plain
        assert explain_body(facts) == plain
        # the nodes' states made once for the round (the dispatcher's), not per body
        assert explain_body(dataclasses.replace(facts, walk=walk, node_states=NodeStates.of(infos))) == plain
