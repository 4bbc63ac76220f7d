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
   when it does;
5. then: jobs ahead of it, the cards held for it (and when they are expected to have room),
   and ``no dispatcher is running`` when none is.

Times in epoch seconds; memory in bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rig.keys import card_id
from rig.memory import format_memory
from rig.models import CardState, Job, JobState
from rig.nodes import NodeInfo, NodeRegistry, clock
from rig.placement import Hold, Request, explain_wait, place

if TYPE_CHECKING:
    from rig.client import Client

#: A stored reason older than this (s) is not trusted by readers; the dispatcher re-stamps an
#: unchanged reason every REFRESH_S while it keeps the job waiting.
STALE_AFTER_S = 15.0
REFRESH_S = 5.0

#: Node states whose cards take no jobs now.
NOT_UP = ("stopped", "down", "silent")

FITS_NOW = "it fits now"
NO_DISPATCHER = "no dispatcher is running (no control worker is up: `rig up` starts one)"


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


def node_state_text(node: NodeInfo) -> str:
    """``node a: stopped since 12:01:05 (rig down)`` and the like, for a node that is not up."""
    if node.state == "stopped":
        return f"node {node.name}: stopped since {clock(node.stopped_at or node.since)} by `rig down`"
    if node.state == "down":
        return f"node {node.name}: DOWN since {clock(node.down_since or node.since)}, no heartbeat"
    if node.state == "silent":
        return (f"node {node.name}: silent since {clock(node.last_seen or node.since)} "
                "(no heartbeat; not yet declared down)")
    return f"node {node.name}: {node.describe}"


def explain(facts: WaitFacts) -> str:
    """The one sentence that says why ``facts.request`` is not running. See the module doc."""
    req = facts.request
    nodes = {n.name: n for n in facts.nodes}
    held = facts.held or {}
    in_pool = f" of pool {facts.pool}" if facts.pool else ""

    def is_live(card: CardState) -> bool:
        return _live(nodes.get(card.node))

    live = [c for c in facts.cards if is_live(c)]
    not_up = sorted({n for c in facts.cards if not is_live(c) for n in [c.node]})
    tail = _tail(facts)
    if facts.limit:
        return f"{facts.limit}; waits for one of them to end{tail}"

    if not facts.cards:
        if facts.pool:
            return f"no card{in_pool} is registered{tail}"
        down = [node_state_text(n) for n in facts.nodes if not _live(n)]
        return ("no cards are registered: no rig node is up"
                + (f" ({'; '.join(down)})" if down else "") + "; it starts when one is (`rig up`)" + tail)
    if not live:
        listed = "; ".join(node_state_text(nodes[n]) for n in not_up)
        return f"no rig node{in_pool} is up ({listed}); it starts when one is back (`rig up` there){tail}"
    if not _big_enough(live, req) and _big_enough(facts.cards, req):
        wanted = sorted({c.node for c in facts.cards if not is_live(c) and c.allowed and c.usable >= req.nbytes})
        listed = "; ".join(node_state_text(nodes[n]) for n in wanted)
        return (f"needs {format_memory(req.nbytes)} on {_cards(req)}; only cards of nodes that are not up "
                f"could take it ({listed}); it waits until one is back{tail}")

    open_cards = [c for c in live if c.id not in held]
    fitting = place(open_cards, req, facts.strategy)
    if fitting is not None:
        where = ", ".join(card_id(fitting.node, i) for i in fitting.cards)
        then = "; it starts at the dispatcher's next pass" if facts.dispatcher else ""
        return f"{FITS_NOW} ({where}){then}{tail}"
    text = explain_wait(open_cards, req) if open_cards else (
        f"needs {format_memory(req.nbytes)} on {_cards(req)}; every card is held for jobs ahead of it")
    roomy_held = [(cid, h) for cid, h in sorted(held.items())
                  if (card := _by_id(live, cid)) is not None and card.eligible and card.free >= req.nbytes]
    if roomy_held:
        parts = []
        for cid, hold in roomy_held:
            card = _by_id(live, cid)
            parts.append(f"{cid} ({format_memory(card.free)} free) held for job {hold.job_id}"
                         + _expected(hold.until, facts.now))
        text += "; " + ", ".join(parts)
    if not_up:
        text += "; not up: " + ", ".join(node_state_text(nodes[n]) for n in not_up)
    return text + tail


def _live(node: NodeInfo | None) -> bool:
    """Do this node's cards count as available? Yes when it is up, and when nothing is known
    about it (no record, or one that never heartbeated: cards registered without ``rig up``,
    as in tests), since then nothing says it is not."""
    if node is None or node.state not in NOT_UP:
        return True
    return node.state == "silent" and not (node.started_at or node.last_seen)


def _tail(facts: WaitFacts) -> str:
    out = ""
    if facts.ahead:
        out += f"; {facts.ahead} job(s) ahead of it"
    if facts.own_hold is not None:
        out += f"; {', '.join(facts.own_hold.cards)} held for it" + _expected(facts.own_hold.until, facts.now)
    if not facts.dispatcher:
        out += f"; {NO_DISPATCHER}"
    return out


def _expected(until: float, now: float) -> str:
    return "" if until == math.inf else f" (expected free {roughly(until - now)})"


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


def _by_id(cards: Iterable[CardState], cid: str) -> CardState | None:
    return next((c for c in cards if c.id == cid), None)


def latest_node_change(nodes: Iterable[NodeInfo]) -> float:
    """When any node last changed state (registered, stopped, found silent, declared down)."""
    times = [t for n in nodes for t in (n.started_at, n.stopped_at, n.down_since, n.missing_since) if t]
    return max(times, default=0.0)


def why_waiting(client: Client, job: Job, *, now: float | None = None) -> str | None:
    """What a person is told about a PENDING job (None for any other state): the dispatcher's
    stored sentence while it is current (see the module doc), else :func:`explain` over the
    cards, nodes and queue as Redis has them now (no holds: only a running dispatcher makes
    them)."""
    if job.state is not JobState.PENDING:
        return None
    now = time.time() if now is None else now
    r, keys = client.r, client.keys
    nodes = NodeRegistry(r, keys).read()
    pipe = r.pipeline(transaction=False)
    pipe.exists(keys.sched_leader)
    pipe.hget(keys.job(job.id), "wait_reason_at")
    pipe.zrank(keys.pending, str(job.id))
    leader, stamp, rank = pipe.execute()
    try:
        stamped = float(stamp) if stamp else 0.0
    except ValueError:
        stamped = 0.0
    if (leader and job.wait_reason and now - stamped <= STALE_AFTER_S
            and stamped >= latest_node_change(nodes)):
        return job.wait_reason
    pools = client.settings.pool_map
    cards = [c for c in client.ledger.cards() if pools.contains(job.pool, c.node, c.index)]
    return explain(WaitFacts(
        request=Request(job.gpu_memory, job.gpus), cards=cards, nodes=nodes, held={},
        ahead=int(rank or 0), dispatcher=bool(leader), pool=job.pool,
        strategy=client.settings.scheduler_type, now=now))
