"""The dispatcher's shortcuts for large clusters (issue 15) against the rules they stand for:
Capacity against place(), HoldPlanner against a plain reading of plan_hold's rule, over seeded
random clusters (full, busy, unhealthy, foreign memory, several nodes)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict

import pytest

from rig.memory import GIB
from rig.models import CardState
from rig.placement import Capacity, HoldPlanner, Release, Request, earliest_fit, place, room_for_one


def _cluster(rng: random.Random, nodes: int = 4) -> list[CardState]:
    cards = []
    for n in range(nodes):
        for i in range(8):
            usable = 80 * GIB
            jobs = rng.randint(0, 4)
            cards.append(CardState(node=f"n{n}", index=i, total=usable, usable=usable,
                                   reserved=rng.choice([0, 20, 40, 60, 72, 80]) * GIB, jobs=jobs, max_jobs=4,
                                   foreign=rng.choice([0, 0, 3]) * GIB, healthy=rng.random() > 0.1,
                                   allowed=rng.random() > 0.05))
    return cards


def _releases(rng: random.Random, cards: list[CardState], now: float) -> dict[str, list[Release]]:
    return {c.id: [Release(rng.choice([now + rng.randint(1, 600), math.inf]), rng.choice([10, 20]) * GIB)
                   for _ in range(c.jobs)] for c in cards}


def _plan_by_the_rule(cards, releases, request, now, exclude):
    """plan_hold's rule read plainly (as it was written before HoldPlanner)."""
    by_node = defaultdict(list)
    for card in cards:
        if card.eligible and card.usable >= request.nbytes and card.id not in exclude:
            when = earliest_fit(card, releases.get(card.id, ()), request, now)
            by_node[card.node].append((when, max(0, request.nbytes - card.free), card.jobs, card.index, card.id))
    best = None
    for node, options in by_node.items():
        if len(options) < request.gpus:
            continue
        chosen = sorted(options)[: request.gpus]
        key = (max(o[0] for o in chosen), sum(o[1] for o in chosen), node)
        if best is None or key < best[0]:
            best = (key, tuple(o[4] for o in chosen), key[0])
    return None if best is None else (best[1], best[2])


@pytest.mark.parametrize("seed", range(20))
def test_capacity_says_no_exactly_when_place_finds_nothing(seed):
    rng = random.Random(seed)
    cards = _cluster(rng)
    capacity = Capacity(cards)
    for gib in (1, 5, 8, 12, 20, 40, 60, 77, 80, 81):
        for gpus in (1, 2, 3, 8, 9):
            request = Request(gib * GIB, gpus)
            assert capacity.could_place(request) == (place(cards, request) is not None), (gib, gpus)


def test_room_for_one_is_the_card_rule_read_the_other_way():
    rng = random.Random(7)
    for card in _cluster(rng, nodes=8):
        room = room_for_one(card)
        for nbytes in (1, GIB, 8 * GIB, 20 * GIB, 80 * GIB):
            assert (card.refusal(nbytes) is None) == (room is not None and nbytes <= room)


@pytest.mark.parametrize("seed", range(20))
def test_hold_planner_plans_what_plan_hold_s_rule_says(seed):
    rng = random.Random(seed)
    now = 1_000_000.0
    cards = _cluster(rng)
    releases = _releases(rng, cards, now)
    planner = HoldPlanner(cards, releases, now)
    exclude: dict[str, object] = {}
    for job_id in range(1, 30):  # as a round plans: each hold excludes its cards from the next
        request = Request(rng.choice([12, 24, 40, 70]) * GIB, rng.choice([1, 1, 2, 4]))
        hold = planner.plan(request, job_id, exclude=exclude)
        expected = _plan_by_the_rule(cards, releases, request, now, exclude)
        assert (None if hold is None else (hold.cards, hold.until)) == expected
        if hold is not None:
            exclude.update(dict.fromkeys(hold.cards, hold))


@pytest.mark.parametrize("seed", range(20))
def test_hold_planner_follows_cards_held_by_other_plans_and_a_new_exclude(seed):
    """The held cards grow by holds other views' planners made (a round's views share them), and
    a caller may pass another container: the plans are still plan_hold's rule's."""
    rng = random.Random(seed)
    now = 1_000_000.0
    cards = _cluster(rng)
    releases = _releases(rng, cards, now)
    planner = HoldPlanner(cards, releases, now)
    exclude: dict[str, object] = {}
    for job_id in range(1, 40):
        if rng.random() < 0.3:  # held meanwhile by another planner's plan
            exclude.update(dict.fromkeys(rng.sample([c.id for c in cards], rng.choice([1, 2])), None))
        given = exclude if rng.random() < 0.8 else (frozenset(exclude) if rng.random() < 0.5 else dict(exclude))
        request = Request(rng.choice([12, 24, 40, 70]) * GIB, rng.choice([1, 1, 2, 4]))
        hold = planner.plan(request, job_id, exclude=given)
        expected = _plan_by_the_rule(cards, releases, request, now, exclude)
        assert (None if hold is None else (hold.cards, hold.until)) == expected, job_id
        if hold is not None and given is exclude:
            exclude.update(dict.fromkeys(hold.cards, hold))


@pytest.mark.parametrize("seed", range(25))
def test_a_planner_carried_through_starts_plans_what_plan_hold_s_rule_says(seed):
    """HoldPlanner.after, as the dispatcher's views carry a planner from start to start: the
    changed cards' releases added after the start (as the dispatcher adds them), some sizes asked
    for only after a few starts: every plan is plan_hold's rule's over the cards as they are."""
    rng = random.Random(seed)
    now = 1_000_000.0
    cards = _cluster(rng)
    releases = _releases(rng, cards, now)
    planner = HoldPlanner(cards, releases, now)
    exclude: dict[str, object] = {}
    for job_id in range(1, 40):
        for _ in range(rng.choice([0, 1, 1, 2])):  # starts (each a new view and planner)
            request = Request(rng.choice([4, 12, 24]) * GIB, rng.choice([1, 1, 2]))
            spot = place(cards, request)
            if spot is None:
                continue
            chosen = {f"{spot.node}/{i}" for i in spot.cards}
            changed = [dataclasses.replace(c, reserved=c.reserved + request.nbytes, jobs=c.jobs + 1)
                       for c in cards if c.id in chosen]
            by_id = {c.id: c for c in changed}
            cards = [by_id.get(c.id, c) for c in cards]
            planner = planner.after(cards, changed)
            for cid in chosen:
                releases.setdefault(cid, []).append(Release(rng.choice([now + rng.randint(1, 900), math.inf]),
                                                            request.nbytes))
        request = Request(rng.choice([12, 24, 40, 70]) * GIB, rng.choice([1, 1, 2, 4]))
        hold = planner.plan(request, job_id, exclude=exclude)
        expected = _plan_by_the_rule(cards, releases, request, now, exclude)
        assert (None if hold is None else (hold.cards, hold.until)) == expected, job_id
        if hold is not None and rng.random() < 0.5:
            exclude.update(dict.fromkeys(hold.cards, hold))


def _earliest_fit_plainly(card, releases, request, now):
    """earliest_fit's rule read plainly (as it was written before release_steps)."""
    free, jobs = card.free, card.jobs
    if free >= request.nbytes and jobs < card.max_jobs:
        return now
    for release in sorted(releases, key=lambda r: r.at):
        if release.at == math.inf:
            break
        free, jobs = free + release.nbytes, jobs - 1
        if free >= request.nbytes and jobs < card.max_jobs:
            return max(now, release.at)
    return math.inf


@pytest.mark.parametrize("seed", range(10))
def test_release_steps_answer_every_size_as_earliest_fit_s_rule(seed):
    """HoldPlanner reads one card's release steps for every request size: each answer is the
    plain rule's (ties in time kept in the releases' order; releases in the past; unknown ends)."""
    from rig.placement import fit_time, release_steps

    rng = random.Random(seed)
    now = 1_000_000.0
    for card in _cluster(rng, nodes=6):
        releases = [Release(rng.choice([now - 5, now + rng.choice([10, 10, 300]), math.inf]),
                            rng.choice([4, 10, 20]) * GIB) for _ in range(rng.randint(0, 5))]
        steps = release_steps(card, releases)
        for gib in (1, 4, 8, 12, 20, 30, 40, 60, 80, 81):
            request = Request(gib * GIB)
            assert fit_time(card, steps, request.nbytes, now) == _earliest_fit_plainly(card, releases, request, now)
            assert earliest_fit(card, releases, request, now) == _earliest_fit_plainly(card, releases, request, now)


@pytest.mark.parametrize("seed", range(30))
def test_planners_sharing_a_memo_across_rounds_plan_what_plan_hold_s_rule_says(seed):
    """HoldPlanner's ``memo``, as the dispatcher shares it between a round's first planners:
    between rounds some cards change (a start, an end, a card back as it was before a round's
    start: an end of what it started), some releases lists are new lists of equal values, others
    change, and ``now`` sometimes moves; within a round jobs start (planners carried with after,
    releases appended after the start) and some sizes are first asked after starts. Every plan
    is plan_hold's rule's over the cards and releases as they are, and some nodes' options were
    taken from the memo (else the comparison proved nothing)."""
    rng = random.Random(seed)
    now = 1_000_000.0
    cards = _cluster(rng)
    releases = _releases(rng, cards, now)
    memo: dict = {}
    taken = 0
    for _round in range(12):
        planner = first = HoldPlanner(cards, releases, now, memo=memo)
        before = {nbytes: {node: kept[2] for node, kept in nodes.items()} for nbytes, nodes in memo.items()}
        exclude: dict[str, object] = {}
        started_from, releases_from = list(cards), {cid: list(found) for cid, found in releases.items()}
        for job_id in range(1, 12):
            if rng.random() < 0.4:  # a start: a new planner after it, its releases added after it
                request = Request(rng.choice([4, 12, 24]) * GIB, rng.choice([1, 1, 2]))
                spot = place(cards, request)
                if spot is not None:
                    chosen = {f"{spot.node}/{i}" for i in spot.cards}
                    changed = [dataclasses.replace(c, reserved=c.reserved + request.nbytes, jobs=c.jobs + 1)
                               for c in cards if c.id in chosen]
                    by_id = {c.id: c for c in changed}
                    cards = [by_id.get(c.id, c) for c in cards]
                    planner = planner.after(cards, changed)
                    for cid in chosen:
                        releases.setdefault(cid, []).append(
                            Release(rng.choice([now + rng.randint(1, 900), math.inf]), request.nbytes))
            request = Request(rng.choice([12, 24, 40, 70]) * GIB, rng.choice([1, 1, 2, 4]))
            hold = planner.plan(request, job_id, exclude=exclude)
            expected = _plan_by_the_rule(cards, releases, request, now, exclude)
            assert (None if hold is None else (hold.cards, hold.until)) == expected, (_round, job_id)
            if hold is not None and rng.random() < 0.5:
                exclude.update(dict.fromkeys(hold.cards, hold))
        taken += sum(1 for nbytes, nodes in first._by_node.items() for node, options in nodes.items()
                     if before.get(nbytes, {}).get(node) is options)
        # Between rounds: the next round reads the cards and releases again (new lists).
        releases = {cid: list(found) for cid, found in releases.items()}
        for position, card in enumerate(cards):
            drawn = rng.random()
            if drawn < 0.05:  # back as before this round's starts (what it started ended)
                cards[position] = started_from[position]
                releases[card.id] = list(releases_from.get(card.id, ()))
            elif drawn < 0.1 and card.jobs:  # a job on it ended
                cards[position] = dataclasses.replace(card, jobs=card.jobs - 1)
                releases[card.id] = releases.get(card.id, [])[1:]
            elif drawn < 0.15:  # the same job, its expected end worked out again
                releases[card.id] = [r._replace(at=r.at + 60) for r in releases.get(card.id, ())]
        if rng.random() < 0.25:
            now += rng.choice([0.5, 30.0])
    assert taken, "no node's options came from the memo: the comparison proved nothing"
