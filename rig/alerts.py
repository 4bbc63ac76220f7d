"""Threshold alerts over rig's Redis state, sent once per condition to a webhook and the log.

Three parts:

* :func:`evaluate` reads the cards, the waiting queue and recently ended jobs and returns the
  conditions that hold *now* (one :class:`Alert` each, with a stable ``key``). It only writes
  the first-seen times the "reserved but idle" condition needs (``<prefix>alerts:since``).
* :class:`AlertManager` remembers which conditions are active (``<prefix>alerts:active``, a
  hash key -> JSON) so that a condition is announced once when it starts and once ("resolved")
  when it clears, however many times the check evaluates it in between (the leading
  dispatcher's control worker checks, by its node's settings: workers.alert_check). The hash is
  claimed with HSETNX / HDEL, so two overlapping runs never both announce the same change.
* :func:`deliver` logs each alert and POSTs one Slack-compatible JSON body to a webhook;
  failures are logged, never raised.

Standard library only (the Prometheus exporter in rig.metrics reuses the helpers here).

Conditions (thresholds in :class:`AlertRules`):

``queue_length:<priority>``   more than ``max_queue`` jobs wait at that priority.
``temperature:<card>``        a card is hotter than ``max_temperature`` (C).
``failure_rate``              of the jobs that ended in the last ``failure_window`` seconds
                              (SUCCEEDED, FAILED, TIMEOUT; cancelled ones are not counted), at
                              least ``min_ended`` ended and more than ``max_failure_rate`` of them
                              FAILED or timed out.
``idle_cards``                an eligible card runs no job while a job that would fit it by
                              memory (and by its pool, if it names one) has waited longer
                              than ``idle_wait_seconds`` (since it last entered the queue:
                              rig.models.waiting_since). A card the dispatcher holds for
                              another waiting job (that job's ``held_cards``, its own record of
                              the hold) is kept idle on purpose and does not count.
``reserved_idle:<card>``      a card has memory reserved but reads 0 % utilisation, continuously
                              for longer than ``reserved_idle_seconds``.
``fragmentation``             :func:`fragmentation` is above ``max_fragmentation``: free memory
                              in blocks too small for every waiting job, where moving running
                              jobs could have made room (0 where none could: full, not
                              fragmented).
``log_space:<node>``          a node cannot write its jobs' logs (rig.logspace): it takes no
                              new jobs until it can (critical).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from rig.clock import shared_now
from rig.memory import format_memory
from rig.models import CardState, JobState, Priority, waiting_since
from rig.nodes import NodeInfo, NodeRegistry
from rig.placement import room_for_one
from rig.pools import Pools, cluster_pools

if TYPE_CHECKING:
    from rig.client import Client

__all__ = [
    "Alert",
    "AlertManager",
    "AlertRules",
    "EndedJob",
    "WaitingJob",
    "deliver",
    "evaluate",
    "fragmentation",
    "recent_ended",
    "waiting_jobs",
]

log = logging.getLogger(__name__)

#: How many waiting jobs (in run order) are read to find request sizes and waits.
PENDING_SCAN = 1000
#: Terminal states whose newest jobs count as "ended".
ENDED_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)
FAILED_STATES = (JobState.FAILED, JobState.TIMEOUT)

SEVERITY_WARNING = "warning"
SEVERITY_CRITICAL = "critical"


# -- data -------------------------------------------------------------------------------------
@dataclass
class AlertRules:
    """Alert thresholds; workers.alert_check builds them from Settings.alerts ([alerts] in the
    config) of the leading dispatcher's node."""

    max_queue: int = 50  # waiting jobs per priority
    max_temperature: int = 85  # Celsius
    failure_window: float = 15 * 60  # seconds
    min_ended: int = 5  # ended jobs in the window before the failure rate counts
    max_failure_rate: float = 0.2  # (FAILED + TIMEOUT) / (SUCCEEDED + FAILED + TIMEOUT)
    idle_wait_seconds: float = 60.0
    reserved_idle_seconds: float = 600.0
    max_fragmentation: float = 0.5
    #: Newest ended jobs read per terminal state when computing the failure rate. The state
    #: indexes are ordered by job id, not end time, so a very old job that ends now is missed
    #: if more than this many newer jobs already ended in that state.
    failure_scan: int = 1000


@dataclass
class Alert:
    """One condition. ``key`` is stable per condition and subject (e.g. ``temperature:n1/0``);
    ``message`` is one line a person reads; ``status`` is "firing" or "resolved"."""

    key: str
    severity: str
    message: str
    status: str = "firing"


@dataclass
class WaitingJob:
    id: int
    priority: Priority
    gpu_memory: int  # bytes per card
    gpus: int
    created_at: float
    pool: str | None = None  # only the cards of this pool may take it (rig.pools)
    #: When it last entered the queue (epoch s; rig.models.waiting_since): what "waited" counts from.
    since: float = 0.0
    #: The cards the dispatcher holds for it (card ids; its record's ``held_cards``: those held
    #: as of the dispatcher's last round that read it, emptied when the hold lapses; ``held_at``
    #: set): no other job is started there, so they are not idle by chance.
    held_cards: tuple[str, ...] = ()


@dataclass
class EndedJob:
    id: int
    state: JobState
    failure: str | None
    created_at: float | None
    started_at: float | None
    ended_at: float | None


# -- shared readers (also used by rig.metrics) -----------------------------------------------
def waiting_jobs(client: Client, limit: int = PENDING_SCAN) -> list[WaitingJob]:
    """The first ``limit`` waiting jobs in run order, reading only the fields needed."""
    ids = client.store.pending_head(limit)
    if not ids:
        return []
    pipe = client.r.pipeline(transaction=False)
    for jid in ids:
        pipe.hmget(client.keys.job(jid), "priority", "gpu_memory", "gpus", "created_at", "pool",
                   "queued_at", "held_at", "held_cards")
    out = []
    for jid, (prio, mem, gpus, created, pool, queued, held_at, held) in zip(ids, pipe.execute(), strict=True):
        if mem is None:
            continue  # the record vanished under us
        created_at = float(created) if created else 0.0
        out.append(WaitingJob(
            id=jid, priority=Priority(_s(prio)) if prio else Priority.MEDIUM,
            gpu_memory=int(float(mem)), gpus=int(gpus or 1),
            created_at=created_at, pool=_s(pool) if pool else None,
            since=waiting_since(created_at, _f(queued)),
            held_cards=tuple(_s(held).split(",")) if held and _f(held_at) else (),
        ))
    return out


def recent_ended(client: Client, limit: int,
                 states: tuple[JobState, ...] = ENDED_STATES) -> list[EndedJob]:
    """The newest ``limit`` jobs (by id) in ``states``, newest first.

    State indexes are scored by job id, so "newest" means most recently *submitted* among the
    jobs that have ended; for a queue that runs roughly in order this is the last ``limit``
    ended jobs.
    """
    if limit <= 0:
        return []
    pipe = client.r.pipeline(transaction=False)
    for state in states:
        pipe.zrevrange(client.keys.state_index(state.value), 0, limit - 1)
    tagged = [(int(jid), state) for state, ids in zip(states, pipe.execute(), strict=True)
              for jid in ids]
    tagged.sort(key=lambda item: item[0], reverse=True)
    tagged = tagged[:limit]
    if not tagged:
        return []
    pipe = client.r.pipeline(transaction=False)
    for jid, _ in tagged:
        pipe.hmget(client.keys.job(jid), "failure", "created_at", "started_at", "ended_at")
    out = []
    for (jid, state), (failure, created, started, ended) in zip(tagged, pipe.execute(), strict=True):
        out.append(EndedJob(id=jid, state=state, failure=_s(failure) if failure else None,
                            created_at=_f(created), started_at=_f(started), ended_at=_f(ended)))
    return out


def open_free(card: CardState) -> int:
    """Bytes of ``card`` a new job could be given now: 0 on a card that takes no job, one at its
    job cap (``max_task_per_gpu``) included, whatever memory it has left (placement.room_for_one,
    from CardState.refusal, the one rule)."""
    return room_for_one(card) or 0


def fragmentation(cards: list[CardState], waiting: list[WaitingJob],
                  holdings: Mapping[str, Mapping[int, int]], pools: Pools) -> float:
    """Share (0..1) of the free memory new jobs could be given (:func:`open_free`: not on a card
    at its job cap) that sits on cards whose free block is smaller than the smallest waiting
    job's per-card request, when repacking could have made room for that request: memory lost
    to how the jobs are spread, not to how many there are.

    0 when nothing waits or nothing is free, and when no repacking could make room for the
    smallest request (:func:`repacking_makes_room`: a card that has, or could be given by moving
    running single-card jobs onto other cards, a free block of that size): then the cards are
    full for it, not fragmented (a busy server with a queue read "fragmentation 100%: 98.0 GiB
    of 98.0 GiB ... (70.0 GiB)" with the free memory in 6-36 GiB pieces beside jobs of 40 GiB
    and more, none of which could move to make a 70 GiB block). The room must be on a card the
    request may use: one of its pool's (``pools``, the cluster's, rig.pools), as a job of pool
    p0 never starts on p1's cards however they are repacked. ``holdings``: card id -> (job id
    -> bytes reserved there), rig.ledger.Ledger.holdings_of."""
    if not waiting:
        return 0.0
    smallest = min(job.gpu_memory for job in waiting)
    free = [open_free(card) for card in cards]
    total = sum(free)
    asking = {job.pool for job in waiting if job.gpu_memory == smallest}
    usable = [c for c in cards if any(pools.contains(pool, c.node, c.index) for pool in asking)]
    if total <= 0 or not repacking_makes_room(cards, holdings, smallest, usable):
        return 0.0
    return sum(block for block in free if block < smallest) / total


def repacking_makes_room(cards: list[CardState], holdings: Mapping[str, Mapping[int, int]],
                         nbytes: int, usable: list[CardState] | None = None) -> bool:
    """Could some card of ``usable`` (default: any of ``cards``) take a job of ``nbytes`` (per
    card) now, or once running single-card jobs on it moved to other cards that would take them
    (CardState.refusal, the one rule, for both the moves and the request)? A first try, not an
    optimal packing: it moves the card's smallest jobs first, each to the other card with the
    least room that takes it, so it may miss a cleverer repacking but never claims one that
    cannot be done. A job on several cards is not moved (its cards go together)."""
    usable = cards if usable is None else usable
    if any(card.refusal(nbytes) is None for card in usable):
        return True
    spread: dict[int, int] = {}
    for held in holdings.values():
        for job in held:
            spread[job] = spread.get(job, 0) + 1
    # Only a card that takes a job now can take a moved one (a card at its cap, closed or
    # unhealthy cannot): the others are never looked at as takers (512 full cards: 0.19 s -> ms).
    takes = {c.id: c for c in cards if c.refusal(0) is None}
    room = sum(open_free(c) for c in takes.values())
    # The two largest rooms of the takers: the largest another card offers, in O(1) per card.
    top = sorted(((open_free(c), c.id) for c in takes.values()), reverse=True)[:2]
    for card in usable:
        if replace(card, reserved=0, jobs=0).refusal(nbytes) is not None:
            continue  # even emptied it could not take the request (too small, closed, unhealthy)
        if room - open_free(card) < nbytes - (card.usable - card.reserved - card.foreign):
            continue  # the other cards have less room in all than it would have to give away
        movable = [(size, job) for job, size in holdings.get(card.id, {}).items() if spread.get(job, 1) == 1]
        if replace(card, reserved=card.reserved - sum(size for size, _ in movable),
                   jobs=card.jobs - len(movable)).refusal(nbytes) is not None:
            continue  # even rid of every job that could move, it could not take the request
        # The largest job another card takes (room_for_one: exactly the sizes refusal allows).
        # Rooms only shrink as jobs move in and jobs are tried smallest first, so once one is
        # larger than it none after it moves: 512 cards whose 20 GiB jobs fit no other card's
        # 16 GiB tried every card for every job (0.48 s a check), now stop at the first.
        largest = next((free for free, at in top if at != card.id), 0)
        others: dict[str, CardState] | None = None
        moved, count = 0, 0
        for size, _job in sorted(movable):
            if size > largest:
                break
            if others is None:
                others = {i: c for i, c in takes.items() if i != card.id}
            takers = [c for c in others.values() if c.refusal(size) is None]
            if not takers:
                continue
            taker = min(takers, key=lambda c: (room_for_one(c) or 0, c.id))
            others[taker.id] = replace(taker, reserved=taker.reserved + size, jobs=taker.jobs + 1)
            if open_free(taker) == largest:
                largest = max(open_free(c) for c in others.values())
            moved, count = moved + size, count + 1
            if replace(card, reserved=card.reserved - moved, jobs=card.jobs - count).refusal(nbytes) is None:
                return True
    return False


# -- evaluation --------------------------------------------------------------------------------
def since_key(client: Client) -> str:
    return client.keys.alerts_since


def active_key(client: Client) -> str:
    return client.keys.alerts_active


def evaluate(client: Client, rules: AlertRules | None = None,
             now: float | None = None) -> list[Alert]:
    """Every condition that holds now. Reads Redis; writes only the first-seen times of the
    "reserved but idle" condition (so its duration survives between runs)."""
    rules = rules or AlertRules()
    now = shared_now(client.r) if now is None else now
    cards = client.ledger.cards()
    counts = client.store.pending_counts()
    waiting = waiting_jobs(client)
    alerts: list[Alert] = []
    nodes, problems = node_problems(client)
    # A stopped or down node reads its cards no more: their last temperature and utilisation are
    # not "now" (a card of a node stopped with its jobs running on "has read 0% utilisation for
    # 10 min" when nothing read it). Its own state is said where nodes are (rig status).
    unread = _unread_nodes(nodes)
    read = [card for card in cards if card.node not in unread]

    for prio in Priority:
        n = counts.get(prio, 0)
        if n > rules.max_queue:
            alerts.append(Alert(
                f"queue_length:{prio.value}", SEVERITY_WARNING,
                f"{n} {prio.value}-priority jobs are waiting (limit {rules.max_queue})"))

    for card in read:
        if card.temperature is not None and card.temperature > rules.max_temperature:
            alerts.append(Alert(
                f"temperature:{card.id}", SEVERITY_CRITICAL,
                f"card {card.id} ({card.model}) is at {card.temperature} C "
                f"(limit {rules.max_temperature} C)"))

    alerts.extend(problems)

    alerts.extend(_log_space(cards))
    alerts.extend(_failure_rate(client, rules, now))
    pools = cluster_pools(nodes).pools
    alerts.extend(_idle_cards(read, waiting, rules, now, pools))  # a stopped node's take none
    alerts.extend(_reserved_idle(client, read, rules, now))

    frag = fragmentation(cards, waiting, client.ledger.holdings_of(cards), pools)
    if frag > rules.max_fragmentation:
        smallest = min(job.gpu_memory for job in waiting)
        free = sum(open_free(c) for c in cards)
        alerts.append(Alert(
            "fragmentation", SEVERITY_WARNING,
            f"fragmentation {frag:.0%}: {format_memory(free * frag)} of "
            f"{format_memory(free)} free memory sits in blocks smaller than the smallest "
            f"waiting request ({format_memory(smallest)}; limit {rules.max_fragmentation:.0%})"))
    return alerts


#: The conditions of a node rig alerts on (key ``<kind>:<node>``); rig_node_problem{node,
#: problem} carries the same, from :func:`node_problems` (one rule for both).
NODE_PROBLEMS = ("redis_auth", "installation", "unrecorded_jobs", "clock_skew")


def _unread_nodes(nodes: list[NodeInfo]) -> dict[str, str]:
    """The nodes nobody reads the cards of (name -> state): stopped, down, silent too long."""
    return {n.name: "down" if n.presumed_down else n.state for n in nodes
            if n.state in ("stopped", "down") or n.presumed_down}


def node_problems(client: Client) -> tuple[list[NodeInfo], list[Alert]]:
    """Every node, and an alert for each problem of one: its new logins refused (redis_auth),
    another installation's Redis (installation), jobs it ran that Redis lost (unrecorded_jobs),
    a clock off Redis' (clock_skew, only while it is up)."""
    from rig.authwatch import annotate as annotate_auth  # why a silent node is silent

    nodes = NodeRegistry(client.r, client.keys).read()
    annotate_auth(client.r, nodes, max(60.0, 2 * client.settings.health.timeout))
    alerts: list[Alert] = []
    for node in nodes:
        if node.auth_refused:
            alerts.append(Alert(f"redis_auth:{node.name}", SEVERITY_CRITICAL, node.auth_refused))
        if node.mismatch:
            alerts.append(Alert(f"installation:{node.name}", SEVERITY_CRITICAL, node.mismatch))
        if node.unrecorded:
            alerts.append(Alert(f"unrecorded_jobs:{node.name}", SEVERITY_CRITICAL, node.unrecorded))
        if node.clock_skew and node.alive:  # a stopped node's last measure is no news
            alerts.append(Alert(f"clock_skew:{node.name}", SEVERITY_WARNING, f"node {node.name}: {node.clock_skew}"))
    return nodes, alerts


def _log_space(cards: list[CardState]) -> list[Alert]:
    """One critical alert per node whose cards are out because it cannot write logs."""
    from rig.logspace import is_log_space_reason

    out: dict[str, Alert] = {}
    for card in cards:
        if not card.healthy and is_log_space_reason(card.health_reason) and card.node not in out:
            out[card.node] = Alert(f"log_space:{card.node}", SEVERITY_CRITICAL,
                                   f"node {card.node} takes no new jobs: {card.health_reason}")
    return list(out.values())


def _failure_counts(client: Client, rules: AlertRules, now: float) -> tuple[int, int]:
    """(FAILED + TIMEOUT, SUCCEEDED + FAILED + TIMEOUT) among the jobs ended in the window."""
    states = (JobState.SUCCEEDED, *FAILED_STATES)
    start = now - rules.failure_window
    ended = [j for j in recent_ended(client, rules.failure_scan, states)
             if j.ended_at is not None and start <= j.ended_at <= now]
    return sum(1 for j in ended if j.state in FAILED_STATES), len(ended)


def _failure_rate(client: Client, rules: AlertRules, now: float) -> list[Alert]:
    failed, n_ended = _failure_counts(client, rules, now)
    if n_ended < max(1, rules.min_ended):
        return []
    rate = failed / n_ended
    if rate <= rules.max_failure_rate:
        return []
    return [Alert(
        "failure_rate", SEVERITY_WARNING,
        f"{rate:.0%} of jobs failed or timed out in the last {_minutes(rules.failure_window)} "
        f"({failed} of {n_ended} ended; limit {rules.max_failure_rate:.0%})")]


def resolved_line(client: Client, rules: AlertRules, key: str, now: float) -> str | None:
    """What a resolved condition reads *now* (the firing message's value is stale by then),
    or None for a condition without a single figure to read again."""
    kind, _, subject = key.partition(":")
    if kind == "queue_length":
        n = client.store.pending_counts().get(Priority(subject), 0)
        return f"{n} {subject}-priority jobs are waiting now (limit {rules.max_queue})"
    if kind in ("temperature", "reserved_idle"):
        card = next((c for c in client.ledger.cards() if c.id == subject), None)
        if card is None:
            return f"card {subject} is gone"
        state = _unread_nodes(NodeRegistry(client.r, client.keys).read()).get(card.node)
        if state is not None:  # its last reading is no value "now"
            return f"node {card.node} is {state}: nothing reads card {subject} now"
        if kind == "temperature":
            if card.temperature is None:
                return f"card {subject} has no temperature reading now"
            return f"card {subject} is at {card.temperature} C now (limit {rules.max_temperature} C)"
        util = "no" if card.utilization is None else f"{card.utilization}%"
        return (f"card {subject} has {format_memory(card.reserved)} reserved and reads {util} "
                f"utilisation now")
    if kind == "failure_rate":
        failed, n_ended = _failure_counts(client, rules, now)
        rate = failed / n_ended if n_ended else 0.0
        return (f"{rate:.0%} of jobs failed or timed out in the last {_minutes(rules.failure_window)} "
                f"({failed} of {n_ended} ended; limit {rules.max_failure_rate:.0%}, counted from "
                f"{max(1, rules.min_ended)} ended)")
    if kind == "fragmentation":
        cards = client.ledger.cards()
        pools = cluster_pools(NodeRegistry(client.r, client.keys).read()).pools
        frag = fragmentation(cards, waiting_jobs(client), client.ledger.holdings_of(cards), pools)
        return f"fragmentation {frag:.0%} now (limit {rules.max_fragmentation:.0%})"
    if kind == "log_space":
        return f"node {subject} can write job logs again"
    if kind == "idle_cards":
        return (f"no idle card (but those held for a waiting job) while a job that fits it has waited over "
                f"{_minutes(rules.idle_wait_seconds)}")
    return None


def _idle_cards(cards: list[CardState], waiting: list[WaitingJob], rules: AlertRules,
                now: float, pools: Pools) -> list[Alert]:
    """The first waiting job (in run order) that has waited too long (since it last entered the
    queue) while idle cards it may use (its pool's, when it names one: the cluster's pools,
    rig.pools) would take it. A card the dispatcher holds for another waiting job is not idle
    by chance: the dispatcher keeps it for that job (its ``held_cards``), so it is left out."""
    idle = [c for c in cards if c.jobs == 0 and open_free(c) > 0]
    if not idle:
        return []
    held_for: dict[str, set[int]] = {}  # card id -> the waiting jobs it is held for
    for holder in waiting:
        for card_id in holder.held_cards:
            held_for.setdefault(card_id, set()).add(holder.id)
    for job in waiting:
        waited = now - job.since
        if waited <= rules.idle_wait_seconds:
            continue
        fitting = [c for c in idle if open_free(c) >= job.gpu_memory and pools.contains(job.pool, c.node, c.index)
                   and held_for.get(c.id, set()) <= {job.id}]
        by_node: dict[str, list[CardState]] = {}
        for card in fitting:
            by_node.setdefault(card.node, []).append(card)
        usable = [group for group in by_node.values() if len(group) >= job.gpus]
        if not usable:
            continue
        names = ", ".join(c.id for group in usable for c in group)
        return [Alert(
            "idle_cards", SEVERITY_WARNING,
            f"idle card(s) {names} while job {job.id} ({job.priority.value}, "
            f"{format_memory(job.gpu_memory)} x {job.gpus}) has waited {_minutes(waited)} "
            f"and would fit (limit {_minutes(rules.idle_wait_seconds)})")]
    return []


def _reserved_idle(client: Client, cards: list[CardState], rules: AlertRules,
                   now: float) -> list[Alert]:
    key = since_key(client)
    seen = {_s(k): float(v) for k, v in client.r.hgetall(key).items()}
    current: set[str] = set()
    alerts = []
    for card in cards:
        if not (card.reserved > 0 and card.utilization == 0):
            continue
        field = f"reserved_idle:{card.id}"
        current.add(field)
        if field not in seen:
            client.r.hsetnx(key, field, now)
            raw = client.r.hget(key, field)
            seen[field] = float(raw) if raw is not None else now
        idle_for = now - seen[field]
        if idle_for > rules.reserved_idle_seconds:
            alerts.append(Alert(
                field, SEVERITY_WARNING,
                f"card {card.id} has {format_memory(card.reserved)} reserved for {card.jobs} "
                f"job(s) but has read 0% utilisation for {_minutes(idle_for)} "
                f"(limit {_minutes(rules.reserved_idle_seconds)})"))
    stale = [f for f in seen if f.startswith("reserved_idle:") and f not in current]
    if stale:
        client.r.hdel(key, *stale)
    return alerts


# -- once-per-condition state ------------------------------------------------------------------
class AlertManager:
    """Turns each evaluation into announcements: a condition fires once when it starts and
    sends one "resolved" when it clears. State lives in ``<prefix>alerts:active``.

    workers.alert_check calls :meth:`run` every ``alert_interval`` s while its dispatcher leads::

        AlertManager(client, AlertRules(), webhook_url=url, logger=log).run()
    """

    def __init__(self, client: Client, rules: AlertRules | None = None, *,
                 webhook_url: str | None = None, logger: logging.Logger | None = None,
                 timeout: float = 5.0) -> None:
        self.client = client
        self.rules = rules or AlertRules()
        self.webhook_url = webhook_url
        self.logger = logger or log
        self.timeout = timeout

    @property
    def key(self) -> str:
        return active_key(self.client)

    def active(self) -> dict[str, Alert]:
        """The conditions announced and not yet resolved."""
        out = {}
        for k, raw in self.client.r.hgetall(self.key).items():
            data = json.loads(raw)
            out[_s(k)] = Alert(_s(k), data.get("severity", SEVERITY_WARNING),
                               data.get("message", ""))
        return out

    def update(self, alerts: list[Alert], now: float | None = None) -> list[Alert]:
        """Record this evaluation; return what to announce: new firing alerts, then one
        "resolved" alert for each active condition absent from ``alerts``."""
        now = shared_now(self.client.r) if now is None else now
        r = self.client.r
        current = {a.key: a for a in alerts}
        out: list[Alert] = []
        for alert in current.values():
            record = json.dumps({"severity": alert.severity, "message": alert.message,
                                 "since": now})
            if r.hsetnx(self.key, alert.key, record):
                out.append(alert)
        for k, raw in r.hgetall(self.key).items():
            name = _s(k)
            if name in current:
                continue
            if r.hdel(self.key, name):  # only one overlapping run wins the resolution
                data = json.loads(raw)
                out.append(Alert(name, data.get("severity", SEVERITY_WARNING),
                                 self._resolved_message(name, data, now), status="resolved"))
        return out

    def _resolved_message(self, name: str, data: dict, now: float) -> str:
        """The value the condition reads now, not the firing one (which no longer holds)."""
        try:
            line = resolved_line(self.client, self.rules, name, now)
        except Exception as exc:  # noqa: BLE001 - a resolution is announced even so
            self.logger.warning("rig alerts: cannot read %s again: %s", name, exc)
            line = None
        fired = data.get("message", name)
        return f"resolved: {line} (fired: {fired})" if line else f"resolved, no longer holds (fired: {fired})"

    def run(self, now: float | None = None) -> list[Alert]:
        """Evaluate, update the state and deliver the changes; returns what was announced."""
        now = shared_now(self.client.r) if now is None else now
        changes = self.update(evaluate(self.client, self.rules, now), now)
        deliver(changes, self.webhook_url, self.logger, timeout=self.timeout)
        return changes


# -- delivery ------------------------------------------------------------------------------------
def deliver(alerts: list[Alert], webhook_url: str | None, logger: logging.Logger | None = None,
            *, timeout: float = 5.0) -> bool:
    """Log each alert and POST them as one JSON body ``{"text": ..., "alerts": [...]}`` (Slack's
    incoming webhooks read ``text``). Returns True when there was nothing to post or the POST
    succeeded; a failed POST is logged, never raised."""
    logger = logger or log
    if not alerts:
        return True
    for alert in alerts:
        if alert.status == "resolved":
            logger.info("rig alert resolved [%s]: %s", alert.key, alert.message)
        elif alert.severity == SEVERITY_CRITICAL:
            logger.error("rig alert [%s]: %s", alert.key, alert.message)
        else:
            logger.warning("rig alert [%s]: %s", alert.key, alert.message)
    if not webhook_url:
        return True
    lines = [f"rig {a.status.upper()} ({a.severity}): {a.message}" for a in alerts]
    body = json.dumps({"text": "\n".join(lines), "alerts": [asdict(a) for a in alerts]})
    request = urllib.request.Request(
        webhook_url, data=body.encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            response.read()
        return True
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.warning("rig alerts: could not post %d alert(s) to the webhook: %s",
                       len(alerts), exc)
        return False


# -- helpers ------------------------------------------------------------------------------------
def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _f(value: Any) -> float | None:
    return float(value) if value not in (None, "", b"") else None


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{math.floor(seconds / 60)} min"
