"""Why a waiting job waits: one explanation, made in one place.

:func:`explain` is the only function that words a wait. The dispatcher calls it for every job
it could not place in a round (it knows the holds of that round) and stores the sentence on the
job (``wait_reason``, stamped ``wait_reason_at``). :func:`why_waiting` is what people see
(``rig show``, its ``--json``, ``rig-submit``'s stderr line): the dispatcher's sentence while it
is current, else the same :func:`explain` over what Redis says now. "Current" means: a
dispatcher holds the leader lock (it ran within LEADER_TTL, 5 s), it wrote or confirmed the
sentence within STALE_AFTER_S, and no node changed state (up, stopped, down) since. So with no
dispatcher running at all (no control worker anywhere, e.g. after ``rig down`` of the last
node), nobody writes reasons and the live explanation still says what is true.

What a sentence says, first match wins:

1. no card registered / no node up: ``no rig node is up (node a: stopped since 12:01:05 by `rig
   down`; node b: DOWN since 11:58:40, no heartbeat); it starts when one is back (`rig up`)``;
2. the only cards big enough are on nodes that are not up: which nodes, in which state, since
   when;
3. over its user's limit (``max_jobs_per_user``, ...): that limit;
4. the card-level reason (rig.placement.explain_wait over the cards of live nodes): the memory
   needed, the largest free block *among the cards open to it* (a card held for another job is
   named as held, with its free memory and when it is expected to free, never counted as a
   free block this job could use), full job slots, unhealthy cards; or ``it fits now (node/3)``
   when it does *and still does once the jobs ahead of it are placed*. The dispatcher's cards
   already carry the jobs it placed ahead in its round; the live view (:func:`why_waiting`)
   places up to AHEAD_SIMULATED jobs ahead, in order, on a copy of the cards
   (rig.placement.place). When they take the room: ``the free memory would hold it now
   (node/3), but the 2 job(s) ahead of it take that room first``; with more ahead than that
   bound: ``..., but 80 job(s) ahead of it go first``;
   When every card that takes jobs is held for jobs ahead of it: ``every card that takes jobs
   is held for jobs ahead of it; n1/0 (10.0 GiB free) held for job 3 ...``, the cards that take
   no jobs at all (outside gpu_whitelist, unhealthy) named after, as a second fact, never as
   the cause ("no card takes jobs (not in whitelist)" was said of a job queued behind holds);
5. then: jobs ahead of it, the cards held for it (and when they are expected to have room),
   and ``no dispatcher is running`` when none is (or, from rig-submit's first look, that the
   dispatcher holding the lock did not answer: see :func:`first_look`).

A job of a pool reads only its pool's cards, and every sentence about them says so first
(``in pool 'a100': ...``, :func:`pool_words`); a user's limit (3.) concerns no card.

Times in epoch seconds; memory in bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rig.clock import shared_now
from rig.closed_cards import closed_cards_text
from rig.keys import card_id
from rig.memory import format_memory
from rig.models import CardState, Job, JobState
from rig.nodes import NodeInfo, NodeRegistry, clock
from rig.placement import CardWalk, Hold, Request, explain_wait, only_outside_whitelist, place
from rig.pools import cluster_pools
from rig.rollback import waiting_line

if TYPE_CHECKING:
    import redis

    from rig.client import Client
    from rig.keys import Keys

#: A stored reason older than this (s) is not trusted by readers; the dispatcher re-stamps an
#: unchanged reason every REFRESH_S while it keeps the job waiting.
STALE_AFTER_S = 15.0
REFRESH_S = 5.0

#: Node states whose cards take no jobs now.
NOT_UP = ("stopped", "down", "silent")

FITS_NOW = "it fits now"
NO_DISPATCHER = "no dispatcher is running (no control worker is up: `rig up` starts one)"
#: No dispatcher leads while a control worker's heartbeat is alive (it is starting, or its
#: dispatcher is stuck or stopped): NO_DISPATCHER's "no control worker is up" would be untrue
#: beside `rig status`' live control worker. {workers}: their names.
NO_LEADER = ("no dispatcher is running: control worker(s) {workers} have a heartbeat, but none has led "
             "in the last 5 s (starting, or stuck or stopped: `rig status` shows them, their logs say why)")
#: The end of a sentence for a job that is about to be placed (rig-submit says nothing then).
STARTS_NEXT_PASS = "it starts at the dispatcher's next pass"
#: The live view simulates at most this many jobs ahead (one pipelined read, then place() each).
AHEAD_SIMULATED = 64
#: rig-submit's first look waits at most this long (s) for a dispatcher that holds the lock to
#: take the submission's wake-up: it BLPOPs it at once when idle, and passes every IDLE_PASS_S
#: (1 s) when busy; the lock of a stopped one lingers up to its TTL (5 s).
ANSWER_WITHIN_S = 2.5


@dataclass(frozen=True)
class WaitFacts:
    """Everything a wait explanation depends on (a snapshot; nothing here reads Redis).

    ``cards``: the cards of the job's pool. ``nodes``: every node Redis knows (empty: nothing
    known about nodes; cards of a node not listed count as up). ``held``: card id -> the hold
    of *another* job on it this round. ``own_hold``: the cards held for this job. ``ahead``:
    jobs before it in run order. ``dispatcher``: whether a dispatcher is running."""

    request: Request
    cards: Sequence[CardState]
    nodes: Sequence[NodeInfo] = ()
    held: Mapping[str, Hold] = None  # type: ignore[assignment]
    own_hold: Hold | None = None
    ahead: int = 0
    dispatcher: bool = True
    pool: str | None = None
    strategy: str = "multi-factor"
    now: float = 0.0
    limit: str | None = None  # the user's limit it is over (rig.fairshare.over_limit), if any
    #: The job's cards once the jobs ahead are placed on them (the live view simulates it);
    #: None: ``cards`` already carry them (the dispatcher's round), or see ``ahead_unknown``.
    ahead_cards: Sequence[CardState] | None = None
    #: Jobs are ahead that were not simulated (more than AHEAD_SIMULATED): never "fits now".
    ahead_unknown: bool = False
    #: A dispatcher holds the lock but did not take a wake-up for this long (s); 0: no sign.
    silent_s: float = 0.0
    #: What is said when no ``dispatcher`` runs (:func:`no_dispatcher_words`).
    no_dispatcher: str = NO_DISPATCHER
    #: The caller knows that no card of ``cards`` could take the job now, holds aside
    #: (rig.placement.Capacity): explain then skips looking for a placement.
    fits_nowhere: bool = False
    #: rig.placement.CardWalk of ``cards`` (the dispatcher's, made once for a round's many
    #: sentences), or None: made here. Only how fast a sentence is worded, never what it says.
    walk: CardWalk | None = None
    #: NodeStates.of(``nodes``) (the dispatcher's, made once for a round's many sentences), or
    #: None: made here. Only how fast a sentence is worded, never what it says.
    node_states: NodeStates | None = None


@dataclass(frozen=True)
class NodeStates:
    """What a sentence reads of a list of nodes beside each one's words: the nodes by name, the
    names of those whose cards do not count as available (_live), and those frozen (an
    installation mismatch), in list order. O(nodes) once for a list the caller does not change,
    instead of once per body worded (hundreds a pass at 64 nodes, ~45 us each)."""

    by_name: Mapping[str, NodeInfo]
    down: frozenset[str]
    frozen: tuple[NodeInfo, ...]

    @classmethod
    def of(cls, nodes: Sequence[NodeInfo]) -> NodeStates:
        by_name = {n.name: n for n in nodes}
        return cls(by_name, frozenset(name for name, n in by_name.items() if not _live(n)),
                   tuple(n for n in nodes if n.mismatch))


def node_state_text(node: NodeInfo) -> str:
    """``node a: stopped since 12:01:05 (rig down)`` and the like, for a node that is not up."""
    if node.state == "stopped":
        how = f" ({node.stopped_why})" if node.stopped_why else " by `rig down`"
        return f"node {node.name}: stopped since {clock(node.stopped_at or node.since)}{how}"
    if node.state == "down":
        return f"node {node.name}: DOWN since {clock(node.down_since or node.since)}, no heartbeat"
    if node.writes_refused:
        return f"node {node.name}: {node.writes_refused}"
    if node.state == "silent":
        presumed = ", presumed down" if node.presumed_down else ""
        return (f"node {node.name}: silent since {clock(node.last_seen or node.since)}{presumed} "
                f"(no heartbeat; {node.silent_note})")
    return f"node {node.name}: {node.describe}"


def explain(facts: WaitFacts) -> str:
    """The one sentence that says why ``facts.request`` is not running. See the module doc."""
    body, counts_ahead = explain_body(facts)
    return body + explain_tail(facts, counts_ahead)


def pool_words(pool: str | None) -> str:
    """``in pool 'a100': `` before a sentence about the cards of a job's pool ("" without a
    pool): the one way a wait, or a job that can never run, says whose cards it read."""
    return f"in pool {pool!r}: " if pool else ""


def explain_body(facts: WaitFacts) -> tuple[str, bool]:
    """explain's sentence without its tail (explain_tail: the jobs ahead, its own hold, the
    dispatcher's state), and whether the tail is to count the jobs ahead (False: the body names
    them). The body reads neither ``ahead`` (unless ``ahead_unknown`` or ``ahead_cards``) nor
    ``own_hold``: the dispatcher words it once for every job alike (rig.waiting.body_key).

    A job of a pool reads only that pool's cards: every sentence about cards then begins with
    :func:`pool_words` (``in pool 'a100': ...``), so "no card takes jobs" or "largest free
    block" is never read as the whole cluster's. A user's limit concerns no card: said as is."""
    body, counts_ahead = _card_body(facts)
    if facts.pool and not facts.limit:
        body = pool_words(facts.pool) + body
    return body, counts_ahead


def _card_body(facts: WaitFacts) -> tuple[str, bool]:
    """explain_body less the pool's words (see there)."""
    req = facts.request
    states = facts.node_states if facts.node_states is not None else NodeStates.of(facts.nodes)
    nodes = states.by_name
    held = facts.held or {}

    down = states.down  # a card of a node not listed counts as up

    def is_live(card: CardState) -> bool:
        return card.node not in down

    live = [c for c in facts.cards if c.node not in down] if down else list(facts.cards)
    not_up = sorted({c.node for c in facts.cards if c.node in down}) if down else []
    if facts.limit:
        return f"{facts.limit}; waits for one of them to end", True

    frozen = states.frozen
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
        which = "no node is up" if facts.pool else "no rig node is up"  # in its pool: others may be
        return f"{which} ({listed}); it starts when one is back (`rig up` there)", True
    if down and not _big_enough(live, req) and _big_enough(facts.cards, req):  # (no node down: live is all)
        wanted = sorted({c.node for c in facts.cards if not is_live(c) and c.allowed and c.usable >= req.nbytes})
        listed = "; ".join(node_state_text(nodes[n]) for n in wanted)
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; only cards of nodes that are not up "
                f"could take it ({listed}); it waits until one is back"), True

    # What follows reads the live cards less the held ones ("open"), through a walk of the live
    # cards made once (CardWalk): O(held cards met + cards with the memory asked for) a sentence.
    walk = facts.walk if facts.walk is not None and not down else CardWalk(live)
    outside = only_outside_whitelist(live, req, all_allowed=walk.all_allowed)
    if outside:
        shown = ", ".join(c.id for c in outside[:6]) + (" …" if len(outside) > 6 else "")
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; only cards outside gpu_whitelist "
                f"could take it: {shown}; it waits until gpu_whitelist names them"), True

    def opened() -> list[CardState]:
        return [c for c in live if c.id not in held] if held else live

    fitting = None
    if not facts.fits_nowhere:
        fitting = place([c for c in walk.fitting(req) if c.id not in held] if held else walk.fitting(req), req,
                        facts.strategy)
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
    roomy = walk.by_free[:walk.roomy(req.nbytes)] if held else []  # the held ones of these are named
    aside = ""
    if walk.largest(held) is None:  # no open card takes jobs
        open_cards = opened()
        if not walk.by_free and open_cards:
            # Say why no card takes it, naming each node and card (a node that is stopped or down
            # reads as such, even where its record still says it is up).
            return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; no card takes jobs now "
                    f"({closed_cards_text(open_cards)}); it starts when one does"), True
        # Every card that takes jobs is held for jobs ahead of it: that is why it waits, and
        # each is named (roomy or not); cards that take no jobs at all (outside gpu_whitelist,
        # unhealthy) are a second fact, never the cause (a tester read "no card takes jobs
        # (not in whitelist)" for a job queued behind holds on every whitelisted card).
        every = "every card that takes jobs" if open_cards else "every card"
        text = f"needs {format_memory(req.nbytes)} on {_cards(req)}; {every} is held for jobs ahead of it"
        roomy = walk.by_free
        if open_cards:
            aside = f"; the other cards take no jobs ({closed_cards_text(open_cards, node_cards=live)})"
    else:
        # explain_wait reads the open cards as a list only to name closed ones per node
        closed_open = any(c.id not in held for c in walk.closed)
        text = explain_wait(opened() if closed_open else live, req, walk=walk, held=held)
    # The held cards that take jobs and have the memory asked for (every one, when all the cards
    # that take jobs are held), by id
    roomy_held = sorted(((c.id, c) for c in roomy if c.id in held), key=lambda pair: pair[0])
    if roomy_held:
        parts = []
        for cid, card in roomy_held:
            hold = held[cid]
            parts.append(f"{cid} ({format_memory(card.free)} free) held for job {hold.job_id}"
                         + _expected(hold.until, facts.now))
        text += "; " + ", ".join(parts)
    text += aside
    if not_up:
        text += "; not up: " + ", ".join(node_state_text(nodes[n]) for n in not_up)
    return text, True


#: CardState fields explain() never reads (a card's live readings): a change in them alone
#: leaves every sentence as it was. ``temperature`` only orders the cards a job that fits now
#: would take (multi-factor), so a sentence for a job that fits nowhere does not read it either.
_READINGS = frozenset({"updated_at", "used", "utilization"})
_CARD_FIELDS = tuple(f.name for f in dataclasses.fields(CardState) if f.name not in _READINGS)
_CARD_FIELDS_NO_TEMPERATURE = tuple(f for f in _CARD_FIELDS if f != "temperature")


def cards_token(cards: Sequence[CardState], *, fits_nowhere: bool = False) -> tuple:
    """What explain() reads of ``cards``, as a hashable value (O(cards)): equal tokens, equal
    sentences. ``fits_nowhere``: for jobs that no card could take now (rig.placement.Capacity),
    whose sentence does not depend on the cards' temperatures."""
    return tuple(card_token(c, fits_nowhere=fits_nowhere) for c in cards)


def card_token(card: CardState, *, fits_nowhere: bool = False) -> tuple:
    """One card's part of cards_token (a caller that changed a few cards replaces their parts)."""
    names = _CARD_FIELDS_NO_TEMPERATURE if fits_nowhere else _CARD_FIELDS
    return tuple(tuple(v) if isinstance(v := getattr(card, n), list) else v for n in names)


def nodes_token(nodes: Sequence[NodeInfo]) -> tuple:
    """What explain() reads of ``nodes`` (whether each is up, how one that is not is worded,
    an installation mismatch), as a hashable value: not the heartbeats' times of nodes that are up."""
    return tuple((n.name, _live(n), n.mismatch, None if _live(n) else node_state_text(n)) for n in nodes)


def held_token(held: Mapping[str, Hold], now: float) -> tuple:
    """What explain() reads of WaitFacts.held: each card, the job it is held for and how that
    hold's expected end is worded at ``now`` (held_part of each card, by card id)."""
    return tuple(held_part(cid, h, now) for cid, h in sorted(held.items()))


def held_part(cid: str, hold: Hold, now: float) -> tuple:
    """One held card's part of a held token. The set of the parts of a held mapping stands for
    it as well (each part names its card)."""
    return (cid, hold.job_id, _expected(hold.until, now))


def body_key(facts: WaitFacts, cards: Hashable, nodes: Hashable, held: Hashable | None = None) -> tuple | None:
    """A key for ``explain_body(facts)``: facts with equal keys get the same body, so a caller
    that explains the same waits pass after pass (the dispatcher) words each body once per
    change, and once for all jobs alike (the tail, explain_tail, is O(1) per job). ``cards`` and
    ``nodes`` stand for facts.cards and facts.nodes (cards_token, nodes_token, or a version the
    caller changes with them), ``held`` for facts.held (held_token; worked out here when not
    given). None: facts whose body reads the jobs ahead (the live view's simulation); explain
    those each time."""
    if facts.ahead_cards is not None or facts.ahead_unknown:
        return None
    held = held_token(facts.held or {}, facts.now) if held is None else held
    return (cards, nodes, facts.request, facts.pool, facts.strategy, facts.dispatcher, facts.limit, held,
            facts.silent_s, facts.fits_nowhere)


def _live(node: NodeInfo | None) -> bool:
    """Do this node's cards count as available? Yes when it is up, and when nothing is known
    about it (no record, or one that never heartbeated: cards registered without ``rig up``,
    as in tests), since then nothing says it is not. An up node with no live worker runs
    nothing: no place a job fits now (NodeInfo.no_worker)."""
    if node is None or (node.state not in NOT_UP and not node.no_worker):
        return True
    return node.state == "silent" and not (node.started_at or node.last_seen)


def explain_tail(facts: WaitFacts, counts_ahead: bool = True) -> str:
    """The end of explain's sentence: the jobs ahead (when ``counts_ahead``), the job's own
    hold and when it is expected to free, whether a dispatcher runs. O(1)."""
    out = ""
    if facts.ahead and counts_ahead:
        out += f"; {facts.ahead} job(s) ahead of it"
    if facts.own_hold is not None:
        out += f"; {', '.join(facts.own_hold.cards)} held for it" + _expected(facts.own_hold.until, facts.now)
    if not facts.dispatcher:
        out += f"; {facts.no_dispatcher}"
    elif facts.silent_s:
        out += (f"; the dispatcher holding the lock did not answer within {facts.silent_s:.1f} s "
                "(stopped or stuck: `rig status` shows the control workers)")
    return out


def _expected(until: float, now: float) -> str:
    """When held cards are expected to have room, as an absolute time (the minute, in the
    server's zone, with its date): a sentence stored at one pass stays true as the clock moves
    (a relative "in ~5 min" was false a minute later), and the dispatcher need not word it again
    while the expected time does not move (workers.dispatcher's repeated passes). ``now`` is not
    read: kept so that every caller words it the same way."""
    del now
    return "" if until == math.inf else f" (expected free ~{expected_clock(until)})"


def nearest_minute(at: float) -> float:
    """``at`` (epoch s) rounded to the nearest whole minute (half a minute rounds up): the one
    rule every "~14:20" of rig words a time by, so that the clock time and the "in ~N min" beside
    it agree (12:30:58 reads ~12:31, not 12:30; the "~" says it is approximate)."""
    return math.floor(at / 60 + 0.5) * 60.0


def expected_clock(at: float) -> str:
    """``Dec 01 14:20 UTC``: an expected time (epoch s) to the nearest minute (:func:`nearest_minute`),
    in the server's zone. Never relative to now, so the same time always reads the same: remembered
    per time and zone (the dispatcher words the same hundreds of shadow times round after round;
    localtime and strftime were ~5 % of a round after the starts at 512 cards)."""
    return _clock_text(nearest_minute(at), time.tzname)


@functools.lru_cache(maxsize=4096)
def _clock_text(at: float, zone: tuple[str, str]) -> str:
    """expected_clock's text of ``at`` (``zone``: time.tzname, so a changed zone words anew)."""
    del zone
    return time.strftime("%b %d %H:%M %Z", time.localtime(at))


def roughly(seconds: float) -> str:
    """A wait as a person says it, coarse enough that the reason does not change every pass."""
    if seconds < 10:
        return "in a few seconds"
    if seconds < 90:
        return f"in ~{round(seconds / 10) * 10:.0f} s"
    if seconds < 90 * 60:
        return f"in ~{round(seconds / 60):.0f} min"
    return f"in ~{seconds / 3600:.1f} h"


def _cards(req: Request) -> str:
    return "1 card" if req.gpus == 1 else f"each of {req.gpus} cards of one node"


def _big_enough(cards: Iterable[CardState], req: Request) -> bool:
    """Could some node of ``cards`` ever hold the job (enough allowed cards with the usable
    memory), whatever is on them now?"""
    per_node: dict[str, int] = {}
    for c in cards:
        if c.allowed and c.usable >= req.nbytes:
            per_node[c.node] = per_node.get(c.node, 0) + 1
    return any(n >= req.gpus for n in per_node.values())


def latest_node_change(nodes: Iterable[NodeInfo]) -> float:
    """When any node last changed state (registered, stopped, found silent, declared down)."""
    times = [t for n in nodes for t in (n.started_at, n.stopped_at, n.down_since, n.missing_since) if t]
    return max(times, default=0.0)


def why_waiting(client: Client, job: Job, *, now: float | None = None, silent_s: float = 0.0,
                nodes: Sequence[NodeInfo] | None = None, cards: Sequence[CardState] | None = None) -> str | None:
    """What a person is told about a PENDING job (None for any other state): the dispatcher's
    stored sentence while it is current (see the module doc), else :func:`explain` over the
    cards, nodes and queue as Redis has them now (no holds: only a running dispatcher makes
    them), with the jobs ahead of it placed first on a copy of the cards. ``silent_s``: the
    dispatcher holding the lock did not take a wake-up for that long (:func:`first_look`).
    ``nodes``, ``cards``: read by the caller for many jobs at once (:func:`waiting_words`)."""
    if job.state is not JobState.PENDING:
        return None
    now = shared_now(client.r) if now is None else now
    r, keys = client.r, client.keys
    nodes = NodeRegistry(r, keys).read() if nodes is None else nodes
    pipe = r.pipeline(transaction=False)
    pipe.exists(keys.sched_leader)
    pipe.hget(keys.job(job.id), "wait_reason_at")
    pipe.zrank(keys.pending, str(job.id))
    leader, stamp, rank = pipe.execute()
    if not silent_s and _current(job, leader, stamp, now, latest_node_change(nodes)):
        return job.wait_reason
    pools = cluster_pools(nodes).pools  # the nodes' pools, not this client's config (rig.pools)
    every = client.ledger.cards() if cards is None else cards
    ahead = int(rank or 0)
    after: list[CardState] | None = None
    if 0 < ahead <= AHEAD_SIMULATED:
        live = {n.name: n for n in nodes}
        after = _place_ahead([c for c in every if _live(live.get(c.node))],
                             client.store.get_many(r.zrange(keys.pending, 0, ahead - 1)),
                             pools, client.settings.scheduler_type)
        after = [c for c in after if pools.contains(job.pool, c.node, c.index)]
    cards = [c for c in every if pools.contains(job.pool, c.node, c.index)]
    # After a Redis restart the dispatcher places nothing until Redis was checked (rig.rollback):
    # "fits now" alone would be untrue meanwhile.
    held_back = waiting_line(r, keys, client.settings.archive_interval)
    return explain(WaitFacts(
        request=Request(job.gpu_memory, job.gpus), cards=cards, nodes=nodes, held={},
        ahead=ahead, dispatcher=bool(leader) and held_back is None, pool=job.pool,
        strategy=client.settings.scheduler_type, now=now, ahead_cards=after,
        ahead_unknown=ahead > AHEAD_SIMULATED, silent_s=silent_s if leader else 0.0,
        no_dispatcher=held_back or (NO_DISPATCHER if leader else no_dispatcher_words(r, keys))))


def no_dispatcher_words(r: redis.Redis, keys: Keys) -> str:
    """Why no dispatcher leads, as far as Redis tells: NO_LEADER naming the control workers
    whose heartbeat is alive, else NO_DISPATCHER (none is up). One read of the workers' set
    and one MGET; said only when no dispatcher leads."""
    names = sorted(r.smembers(keys.workers))
    beats = r.mget([keys.worker(n) for n in names]) if names else []
    alive = []
    for name, beat in zip(names, beats, strict=True):
        try:
            role = json.loads(beat).get("role") if beat else None
        except (ValueError, AttributeError):
            role = None
        if role == "control":
            alive.append(name)
    return NO_LEADER.format(workers=", ".join(alive)) if alive else NO_DISPATCHER


def _current(job: Job, leader: object, stamp: object, now: float, node_change: float) -> bool:
    """Whether ``job``'s stored sentence (stamped ``stamp``, its ``wait_reason_at``) is current:
    a dispatcher leads, wrote or confirmed it within STALE_AFTER_S, and no node changed state
    since (see the module doc)."""
    try:
        stamped = float(stamp) if stamp else 0.0
    except (TypeError, ValueError):
        stamped = 0.0
    return bool(leader and job.wait_reason and now - stamped <= STALE_AFTER_S and stamped >= node_change)


def queued_words(ahead: int) -> str:
    """A waiting job's reason when the leading dispatcher has stored none (it words only the
    queue heads it reads each pass): its place in the queue, counted as :func:`why_waiting`
    counts it (Client.jobs_ahead), so never a reason that could be false."""
    return f"queued: {ahead} job(s) ahead of it" if ahead else "queued: first in line"


def waiting_words(client: Client, jobs: Iterable[Job]) -> dict[int, str]:
    """What `rig jobs` and `rig top` say of each PENDING job of ``jobs`` (job id -> sentence):
    the dispatcher's stored sentence while it is current (:func:`why_waiting`'s rule), its place
    in the queue (:func:`queued_words`) when the leading dispatcher has not worded it yet, else
    :func:`why_waiting`'s live sentence. So a sentence no dispatcher keeps true any more (after
    `rig down`: "vm/2 held for it (expected free ~...)", a hold nobody keeps) is never shown.
    One round trip for the stamps and places; a live sentence only for a job whose stored one
    is not current."""
    pending = [j for j in jobs if j.state is JobState.PENDING]
    if not pending:
        return {}
    r, keys = client.r, client.keys
    now = shared_now(r)
    nodes = NodeRegistry(r, keys).read()
    node_change = latest_node_change(nodes)
    pipe = r.pipeline(transaction=False)
    pipe.exists(keys.sched_leader)
    for job in pending:
        pipe.hget(keys.job(job.id), "wait_reason_at")
        pipe.zrank(keys.pending, str(job.id))
    leader, *read = pipe.execute()
    words: dict[int, str] = {}
    cards: list[CardState] | None = None  # read once, for the first live sentence
    for job, stamp, rank in zip(pending, read[::2], read[1::2], strict=True):
        if _current(job, leader, stamp, now, node_change):
            words[job.id] = job.wait_reason  # type: ignore[assignment]
        elif leader and not job.wait_reason and rank is not None:
            words[job.id] = queued_words(int(rank))
        else:
            cards = client.ledger.cards() if cards is None else cards
            said = why_waiting(client, job, now=now, nodes=nodes, cards=cards)
            if said is not None:
                words[job.id] = said
    return words


def _place_ahead(cards: Sequence[CardState], ahead: Sequence[Job], pools, strategy: str) -> list[CardState]:  # noqa: ANN001
    """``cards`` (copies) as they would be once each job of ``ahead`` that fits, in order, is
    placed on the cards of its pool (its memory reserved and a job slot taken on each)."""
    state = {c.id: c for c in cards}
    for other in ahead:
        if other.state is not JobState.PENDING or other.gpu_memory <= 0:
            continue
        mine = [c for c in state.values() if pools.contains(other.pool, c.node, c.index)]
        spot = place(mine, Request(other.gpu_memory, other.gpus), strategy)
        if spot is None:
            continue  # it waits too, taking nothing now
        for index in spot.cards:
            card = state[card_id(spot.node, index)]
            state[card.id] = dataclasses.replace(card, reserved=card.reserved + other.gpu_memory,
                                                 jobs=card.jobs + 1)
    return list(state.values())


def first_look(client: Client, job_id: int, *, within: float = ANSWER_WITHIN_S) -> str | None:
    """What rig-submit says of the job it just queued: :func:`why_waiting` once the dispatcher
    had its chance (None: placed, or no longer waiting).

    Why it waits for that: the lock of a dispatcher that just stopped lingers up to its TTL, so
    right after ``rig down`` the lock alone says "a dispatcher runs" and the job "starts at the
    next pass", which never comes (seen: no line at all for the first jobs submitted within a
    second of a stop). The submission pushed the dispatcher's wake-up; a dispatcher that is
    alive takes it at once (idle) or within a pass. So: until the job is placed, the lock is
    gone, or the wake-up was taken, whichever comes first, re-reading every 50 ms for at most
    ``within`` seconds; a wake-up still untaken then means the lock's holder is not answering.
    No wait at all when no dispatcher holds the lock."""
    r, keys = client.r, client.keys
    start = time.monotonic()
    while True:
        job = client.get(job_id)
        if job.state is not JobState.PENDING:
            return None
        pipe = r.pipeline(transaction=False)
        pipe.exists(keys.sched_leader)
        pipe.exists(keys.sched_wake)
        leader, wake = pipe.execute()
        waited = time.monotonic() - start
        if not leader or not wake:
            return why_waiting(client, job)
        if waited >= within:
            return why_waiting(client, job, silent_s=waited)
        time.sleep(0.05)


def worth_saying(why: str | None) -> bool:
    """Does rig-submit print this wait? Yes, unless the job is about to be placed."""
    return bool(why) and STARTS_NEXT_PASS not in why
