"""What forgetting a node does to the jobs that wait (``rig forget-node``).

Forgetting a node removes its cards. A waiting job whose pool then has no card that could ever
hold it can never run: it is FAILED at once, with the failure class ``unschedulable`` and a
reason naming the forgotten node (never left for the dispatcher to fail with a vague one).
Other waiting jobs of its cards' pools keep waiting for the other nodes.

A node merely *stopped* (``rig down``: it comes back and adopts its running jobs) is not gone:
forgetting it is refused unless ``--force``, with what it would do (:func:`plan` and
:meth:`ForgetPlan.refusal`). A node declared DOWN, or silent, is forgotten as asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rig.failures import FailureClass
from rig.ledger import Ledger
from rig.models import CardState, JobState
from rig.nodes import NodeInfo, clock
from rig.placement import Request, never_fits
from rig.pools import Pools
from rig.waiting import pool_words


@dataclass
class ForgetPlan:
    """Waiting jobs the forgetting of ``node`` concerns."""

    node: str
    fail: dict[int, str] = field(default_factory=dict)  # job id -> why it could never run after
    wait: list[int] = field(default_factory=list)  # jobs that could use its cards, served elsewhere too

    def refusal(self, info: NodeInfo) -> str:
        """The one line refusing to forget a node that was only stopped."""
        when = f" at {clock(info.stopped_at)}" if info.stopped_at else ""
        ids = " ".join(map(str, sorted(self.fail)))
        effects = [f"FAIL waiting job(s) {ids} (failure class {FailureClass.UNSCHEDULABLE.value}: no other node "
                   "could ever run them)" if self.fail else "fail no job"]
        if self.wait:
            effects.append(f"leave job(s) {' '.join(map(str, self.wait))} waiting for the other nodes")
        return (f"node {self.node} was stopped on purpose (`rig down`{when}), not gone: it comes back with "
                f"`rig up --node {self.node}`; forgetting it now would {' and '.join(effects)}; nothing was changed. "
                f"To forget it anyway: `rig forget-node {self.node} --force`")


def plan(ledger: Ledger, pools: Pools, node: str) -> ForgetPlan:
    """Which waiting jobs forgetting ``node`` would fail, and which would wait on (read only).
    Only jobs that could use the node's cards count."""
    cards = ledger.cards()
    rest = [c for c in cards if c.node != node]
    found = ForgetPlan(node)
    store = ledger.store
    for job in store.get_many(store.ids_in_state(JobState.PENDING)):
        if job.pool is not None and job.pool not in pools.members:
            continue  # the dispatcher fails it for that, node or not
        request = Request(job.gpu_memory, job.gpus)
        now = _in_pool(cards, pools, job.pool)
        if not any(c.node == node for c in now) or never_fits(now, request):
            continue  # it never could use this node's cards
        why_not = unrunnable(rest, pools, job.pool, request)
        if why_not:
            found.fail[job.id] = why_not
        else:
            found.wait.append(job.id)
    return found


def unrunnable(cards: list[CardState], pools: Pools, pool: str | None, request: Request) -> str | None:
    """Why a job of ``pool`` could never run on ``cards`` (the cluster's cards), or None. As the
    dispatcher judges it: with no card registered at all, every job waits for a ``rig up``."""
    if not cards:
        return None
    mine = _in_pool(cards, pools, pool)
    if not mine:
        return f"no card is left in pool {pool!r}"
    why_not = never_fits(mine, request)
    return pool_words(pool) + why_not if why_not else None


def _in_pool(cards: list[CardState], pools: Pools, pool: str | None) -> list[CardState]:
    return [c for c in cards if pools.contains(pool, c.node, c.index)]


def fail_unrunnable(ledger: Ledger, pools: Pools, node: str, who: str, jobs: list[int]) -> dict[int, str]:
    """After ``node`` was forgotten: FAIL each of ``jobs`` (the plan's) still waiting that no card
    left could ever hold, with failure class ``unschedulable`` and a reason naming the node.
    Returns id -> reason of those failed (a job that left PENDING meanwhile is left alone)."""
    failed: dict[int, str] = {}
    cards = ledger.cards()
    for job in ledger.store.get_many(jobs):
        if job.state is not JobState.PENDING:
            continue
        why_not = unrunnable(cards, pools, job.pool, Request(job.gpu_memory, job.gpus))
        if not why_not:
            continue
        reason = f"unschedulable: node {node} was forgotten by {who}; {why_not}"
        code, _ = ledger.transition(job.id, JobState.FAILED, error_queue=True, expect=JobState.PENDING,
                                    fields={"reason": reason, "failure": FailureClass.UNSCHEDULABLE.value})
        if code == 1:
            failed[job.id] = reason
    return failed
