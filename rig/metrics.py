"""A Prometheus exporter for rig: every figure is read from Redis when Prometheus scrapes.

    registry = make_registry(client)   # served at GET /metrics by rig.web.server

Every node's endpoint reads the same Redis, so any two scrapes agree. Names follow Prometheus'
rules (``promtool check metrics`` is clean; a test runs it): base units (seconds, bytes, ratios
0-1), ``_total`` for counters. Prefix ``rig_``.

Counters (kept in Redis, ``<prefix>metrics:counters``, incremented in the same transaction or
Lua script that records the event; they only grow, so ``rate()`` works. A Redis that loses its
data starts them again from 0, which Prometheus reads as a counter reset):

``rig_jobs_submitted_total``                 jobs submitted (rig.store)
``rig_jobs_started_total``                   attempts started (claim.lua: ASSIGNED -> RUNNING)
``rig_jobs_requeued_total``                  live jobs put back in the queue (a retry, a start
                                             that did not happen)
``rig_jobs_ended_total{state,failure}``      jobs that reached SUCCEEDED, FAILED, TIMEOUT or
                                             CANCELLED; ``failure`` is the class for FAILED and
                                             TIMEOUT ("unknown" when none was recorded), "none"
                                             for the others
``rig_job_start_wait_seconds``               histogram (``_bucket{le}``, ``_sum``, ``_count``) of
                                             submission to *first* start, fed by claim.lua as
                                             each job starts (``<prefix>metrics:start-wait``)

Gauges:

``rig_redis_up``                             1 if rig's Redis answered a PING within about a
                                             second (rig.redis_up), else 0 and nothing else is
                                             read: a scrape answers within ~1 s in an outage
``rig_redis_replicas``                       replicas connected to rig's Redis master (INFO
                                             replication); under Sentinel 0 means no replica
                                             confirms writes and a fail-over has none to promote
``rig_scrape_success``                       1 if Redis could be read for this scrape, else 0
``rig_jobs{state}``                          jobs per state in Redis (the state indexes; finished jobs
                                             leave for the archive, rig.archiving: count ends with
                                             rig_jobs_ended_total)
``rig_jobs_by_priority{state,priority}``     live jobs only: PENDING, ASSIGNED, RUNNING
``rig_waiting_jobs{priority}``               the pending queue per priority
``rig_oldest_wait_seconds{priority}``        the longest wait of a waiting job, since it last entered the queue
                                            (rig.models.waiting_since; 0 when none waits)
``rig_user_running_jobs{user}``              RUNNING jobs per user
``rig_user_reserved_bytes{user}``            card memory held by the user's ASSIGNED and RUNNING
                                             jobs (declaration x cards)
``rig_user_waiting_jobs{user}``              waiting jobs per user
``rig_card_{total,usable,reserved,used,free,foreign}_bytes{node,card,model}``
``rig_card_utilization_ratio`` (0-1), ``rig_card_temperature_celsius``  (absent without a reading)
``rig_card_healthy``, ``rig_card_jobs``, ``rig_card_max_jobs``
``rig_node_logs_writable{node}``             0 while the node cannot write job logs
``rig_workers_alive{role}``                  workers whose heartbeat has not expired
``rig_error_queue_length``                   jobs waiting for a person in ``rig errors``
``rig_recent_failures{failure}``             FAILED / TIMEOUT jobs by failure class among the
                                             last 500 ended jobs (newest by job id; class
                                             "unknown" when none was recorded)
``rig_fragmentation_ratio``                  share of the free memory new jobs could be given (not
                                             on a card at its job cap) that sits on cards with
                                             less free than the smallest waiting
                                             job's per-card request (0 when nothing waits, or
                                             when no repacking of the running jobs could make
                                             room for that request: full, not fragmented;
                                             rig.alerts.fragmentation)
``rig_dispatch_latency_seconds{q}``          p50 and p95 of ``started_at - created_at`` over the
                                             last 200 jobs that started (a window, read at each
                                             scrape: for a graph over time use the histogram)
``rig_dispatch_latency_samples``             how many jobs those quantiles cover
``rig_redis_refuses_writes{reason}``         1 for the reason Redis refuses rig's writes now
``rig_node_problem{node,problem}``           1 while a node has a problem rig alerts on
                                             (redis_auth, installation, unrecorded_jobs,
                                             clock_skew: rig.alerts.node_problems), else 0

Renamed for Prometheus' rules: ``rig_card_utilization_percent`` (0-100) is now
``rig_card_utilization_ratio`` (0-1); ``rig_job_start_wait_seconds`` was rebuilt from the last
200 started jobs at each scrape (its count could fall) and is now a cumulative histogram.

Cost per scrape: a handful of pipelined reads plus at most ~1,000 small HMGETs for the waiting
queue and ~2,000 for the recent-job windows.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from rig.alerts import (
    NODE_PROBLEMS,
    PENDING_SCAN,
    fragmentation,
    node_problems,
    recent_ended,
    waiting_jobs,
)
from rig.clock import shared_now
from rig.ledger import START_WAIT_BUCKETS, START_WAIT_FIELDS
from rig.models import ACTIVE_STATES, JobState, Priority
from rig.pools import cluster_pools
from rig.replication import connected_replicas

if TYPE_CHECKING:
    from rig.client import Client
    from rig.redis_up import RedisUp

__all__ = ["FAILURE_WINDOW", "LATENCY_WINDOW", "RigCollector", "ended_by_label", "make_registry"]

log = logging.getLogger(__name__)

#: Ended jobs whose failure classes ``rig_recent_failures`` counts.
FAILURE_WINDOW = 500
#: Bucket bounds (s) of rig_job_start_wait_seconds (claim.lua counts them).
LATENCY_BUCKETS = START_WAIT_BUCKETS
#: End states of rig_jobs_ended_total.
ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)
#: Started jobs whose waits ``rig_dispatch_latency_seconds`` summarises.
LATENCY_WINDOW = 200
QUANTILES = (0.5, 0.95)

_CARD_LABELS = ["node", "card", "model"]


class RigCollector(Collector):
    """Reads rig's state from Redis on every ``collect()`` (no background thread)."""

    def __init__(self, client: Client, *, failure_window: int = FAILURE_WINDOW,
                 latency_window: int = LATENCY_WINDOW, pending_scan: int = PENDING_SCAN,
                 probe: RedisUp | None = None) -> None:
        self.client = client
        #: Asked first: an outage skips every read (None: the reads alone tell, tests).
        self.probe = probe
        self.failure_window = failure_window
        self.latency_window = latency_window
        self.pending_scan = pending_scan

    def describe(self) -> Iterable[Metric]:
        # Nothing up front: registering must not read Redis.
        return []

    def collect(self) -> Iterator[Metric]:
        down = self.probe.down() if self.probe is not None else None
        yield GaugeMetricFamily("rig_redis_up", "1 if rig's Redis answered a PING within about a second",
                                value=0.0 if down else 1.0)
        if down:
            log.warning("rig metrics: %s", down)
            yield GaugeMetricFamily("rig_scrape_success", "1 if rig's Redis could be read", value=0.0)
            return
        try:
            metrics = list(self._collect(shared_now(self.client.r)))
        except Exception as exc:  # noqa: BLE001 - a scrape must answer even when Redis is down
            log.warning("rig metrics: cannot read rig's state: %s", exc)
            metrics = []
            ok = 0.0
        else:
            ok = 1.0
        yield GaugeMetricFamily("rig_scrape_success", "1 if rig's Redis could be read", value=ok)
        yield from metrics
        yield from _refusal_families(self.client.r)

    # -- the families -------------------------------------------------------------------------
    def _collect(self, now: float) -> Iterator[Metric]:
        client = self.client
        store, r, keys = client.store, client.r, client.keys

        counts = store.count_by_state()
        fam = GaugeMetricFamily("rig_jobs", "Jobs per state", labels=["state"])
        for state in JobState:
            fam.add_metric([state.value], counts.get(state, 0))
        yield fam

        pending = store.pending_counts()
        by_prio = GaugeMetricFamily("rig_jobs_by_priority", "Live jobs per state and priority",
                                    labels=["state", "priority"])
        for prio in Priority:
            by_prio.add_metric([JobState.PENDING.value, prio.value], pending.get(prio, 0))
        live = self._live_jobs()
        for state in ACTIVE_STATES:
            per_prio = Counter(prio for st, prio, _, _ in live if st is state)
            for prio in Priority:
                by_prio.add_metric([state.value, prio.value], per_prio.get(prio, 0))
        yield by_prio

        fam = GaugeMetricFamily("rig_waiting_jobs", "Jobs waiting per priority",
                                labels=["priority"])
        for prio in Priority:
            fam.add_metric([prio.value], pending.get(prio, 0))
        yield fam

        yield from self._user_families(live)

        fam = GaugeMetricFamily("rig_oldest_wait_seconds",
                                "Longest wait of a waiting job per priority, since it last entered the queue (0 when none waits)",
                                labels=["priority"])
        for prio in Priority:
            since = store.waiting_since_earliest(prio)  # since it last entered the queue
            fam.add_metric([prio.value], max(0.0, now - since) if since is not None else 0.0)
        yield fam

        cards = client.ledger.cards()
        yield from _card_families(cards)
        yield _log_space_family(cards)

        roles = Counter(w.role for w in client.workers())
        fam = GaugeMetricFamily("rig_workers_alive", "Workers with a live heartbeat, per role",
                                labels=["role"])
        for role, n in sorted(roles.items()):
            fam.add_metric([role], n)
        yield fam

        yield GaugeMetricFamily("rig_error_queue_length", "Jobs in the error queue",
                                value=int(r.zcard(keys.errors)))

        nodes, problems = node_problems(client)
        firing = {a.key for a in problems}
        fam = GaugeMetricFamily(
            "rig_node_problem", "1 while a node has a problem rig alerts on (redis_auth, installation, "
            "unrecorded_jobs, clock_skew), else 0", labels=["node", "problem"])
        for node in nodes:
            for kind in NODE_PROBLEMS:
                fam.add_metric([node.name, kind], 1.0 if f"{kind}:{node.name}" in firing else 0.0)
        yield fam

        ended = recent_ended(client, self.failure_window)
        failures = Counter(j.failure or "unknown" for j in ended
                           if j.state in (JobState.FAILED, JobState.TIMEOUT))
        fam = GaugeMetricFamily(
            "rig_recent_failures",
            f"FAILED and TIMEOUT jobs by failure class among the last {self.failure_window} "
            "ended jobs", labels=["failure"])
        for failure, n in sorted(failures.items()):
            fam.add_metric([failure], n)
        yield fam

        waiting = waiting_jobs(client, self.pending_scan)
        yield GaugeMetricFamily(
            "rig_fragmentation_ratio",
            "Share of free memory on eligible cards in blocks smaller than the smallest "
            "waiting request, where moving running jobs could make room for it (0 where no "
            "repacking could: full, not fragmented)",
            value=fragmentation(cards, waiting, client.ledger.holdings_of(cards), cluster_pools(nodes).pools))

        waits = self._latencies()
        fam = GaugeMetricFamily(
            "rig_dispatch_latency_seconds",
            f"Submission to start (includes queueing) over the last {self.latency_window} "
            # "q", not "quantile": a gauge may not carry a summary's label (promtool).
            "started jobs", labels=["q"])
        for q in QUANTILES:
            fam.add_metric([str(q)], _quantile(waits, q) if waits else 0.0)
        yield fam
        yield GaugeMetricFamily("rig_dispatch_latency_samples",
                                "Started jobs behind rig_dispatch_latency_seconds",
                                value=len(waits))
        yield from self._counter_families()
        replicas = connected_replicas(r)
        if replicas is not None:
            yield GaugeMetricFamily("rig_redis_replicas", "Replicas connected to rig's Redis master",
                                    value=replicas)

    def _live_jobs(self) -> list[tuple[JobState, Priority, str, int]]:
        """(state, priority, user, bytes held) of every ASSIGNED and RUNNING job: few (bounded
        by the cards' job slots). Bytes held: the declaration on each of its cards."""
        store, r, keys = self.client.store, self.client.r, self.client.keys
        out = []
        for state in ACTIVE_STATES:
            ids = store.ids_in_state(state)
            pipe = r.pipeline(transaction=False)
            for jid in ids:
                pipe.hmget(keys.job(jid), "priority", "user", "gpu_memory", "cards")
            for prio, user, nbytes, cards in pipe.execute():
                if not prio:
                    continue  # the record is gone
                try:
                    ncards = max(1, len(json.loads(_s(cards)))) if cards else 1
                    held = int(float(_s(nbytes))) * ncards if nbytes else 0
                except (ValueError, TypeError):
                    held = 0
                out.append((state, Priority(_s(prio)), _s(user) if user else "unknown", held))
        return out

    def _user_families(self, live: list[tuple[JobState, Priority, str, int]]) -> Iterator[Metric]:
        """Per-user gauges: running jobs, memory held, waiting jobs (0 where the user has none of
        one kind but some of another, so a dashboard's series do not vanish and come back)."""
        r, keys = self.client.r, self.client.keys
        waiting_users = sorted(_s(u) for u in r.smembers(keys.pending_users))
        pipe = r.pipeline(transaction=False)
        for user in waiting_users:
            pipe.zcard(keys.pending_user(user))
        waiting = {u: int(n) for u, n in zip(waiting_users, pipe.execute(), strict=True)}
        running: Counter[str] = Counter()
        held: Counter[str] = Counter()
        for state, _, user, nbytes in live:
            held[user] += nbytes
            if state is JobState.RUNNING:
                running[user] += 1
        users = sorted({*waiting, *running, *held})
        for name, doc, values in (
                ("rig_user_running_jobs", "RUNNING jobs per user", running),
                ("rig_user_reserved_bytes", "Card memory held by the user's ASSIGNED and RUNNING jobs",
                 held),
                ("rig_user_waiting_jobs", "Waiting jobs per user", waiting)):
            fam = GaugeMetricFamily(name, doc, labels=["user"])
            for user in users:
                fam.add_metric([user], values.get(user, 0))
            yield fam

    def _counter_families(self) -> Iterator[Metric]:
        """The counters and the start-wait histogram, as claim.lua, transition.lua and the
        store keep them in Redis (monotonic: only ever incremented)."""
        r, keys = self.client.r, self.client.keys
        pipe = r.pipeline(transaction=False)
        pipe.hgetall(keys.metrics_counters)
        pipe.hgetall(keys.metrics_start_wait)
        raw_counters, raw_wait = pipe.execute()
        counters = {_s(k): _number(v) for k, v in raw_counters.items()}
        for name, field, doc in (
                ("rig_jobs_submitted", "submitted", "Jobs submitted"),
                ("rig_jobs_started", "started", "Job attempts started (ASSIGNED -> RUNNING)"),
                ("rig_jobs_requeued", "requeued",
                 "Live jobs put back in the queue (a retry, or a start that did not happen)")):
            yield CounterMetricFamily(name, doc, value=counters.get(field, 0.0))
        ended = CounterMetricFamily(
            "rig_jobs_ended", "Jobs that reached an end state, by state and failure class",
            labels=["state", "failure"])
        per_label = ended_by_label(counters)
        for state in ENDED:  # every end state has a series from the start (rate() needs one)
            if not any(st == state.value for st, _ in per_label):
                per_label[(state.value, "none" if state not in (JobState.FAILED, JobState.TIMEOUT)
                           else "unknown")] += 0
        for (state, failure), n in sorted(per_label.items()):
            ended.add_metric([state, failure], n)
        yield ended

        wait = {_s(k): _number(v) for k, v in raw_wait.items()}
        buckets = [(field, wait.get(f"le:{field}", 0.0)) for field in START_WAIT_FIELDS]
        count = wait.get("count", 0.0)
        buckets.append(("+Inf", count))
        yield HistogramMetricFamily(
            "rig_job_start_wait_seconds",
            "Submission to a job's first start (includes time queued), counted as jobs start",
            buckets=buckets, sum_value=wait.get("sum", 0.0))

    def _latencies(self) -> list[float]:
        """started_at - created_at of the newest ``latency_window`` started jobs."""
        states = (JobState.RUNNING, *(s for s in JobState if s.terminal))
        jobs = [j for j in recent_ended(self.client, 2 * self.latency_window, states)
                if j.started_at is not None and j.created_at is not None]
        jobs.sort(key=lambda j: j.started_at or 0.0, reverse=True)
        return sorted(max(0.0, (j.started_at or 0.0) - (j.created_at or 0.0))
                      for j in jobs[: self.latency_window])


def ended_by_label(counters: dict[str, float]) -> Counter[tuple[str, str]]:
    """The ``ended:<STATE>:<failure>`` fields of the counters hash (rig.keys
    ``metrics_counters``) as (state, failure) -> count: ``failure`` is the class for FAILED and
    TIMEOUT ("unknown" when none was recorded), "none" for the other states. The one reading of
    those fields (rig_jobs_ended_total, rig.timeline)."""
    per_label: Counter[tuple[str, str]] = Counter()
    for field, n in counters.items():
        kind, _, rest = field.partition(":")
        if kind != "ended":
            continue
        state, _, failure = rest.partition(":")
        if state in (JobState.FAILED.value, JobState.TIMEOUT.value):
            failure = failure or "unknown"
        else:
            failure = "none"
        per_label[(state, failure)] += n
    return per_label


def _card_families(cards: list[Any]) -> Iterator[Metric]:
    def family(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=_CARD_LABELS)

    usable = family("rig_card_usable_bytes", "Memory rig may hand out on the card")
    reserved = family("rig_card_reserved_bytes", "Memory reserved by rig's jobs")
    used = family("rig_card_used_bytes", "Memory in use as the card reports it")
    free = family("rig_card_free_bytes", "Reservable memory left")
    foreign = family("rig_card_foreign_bytes", "Memory used by processes rig did not start")
    total = family("rig_card_total_bytes", "The card's total memory")
    util = family("rig_card_utilization_ratio", "GPU utilisation, 0-1")
    temp = family("rig_card_temperature_celsius", "GPU temperature")
    healthy = family("rig_card_healthy", "1 if the card passed its health check")
    jobs = family("rig_card_jobs", "Jobs holding the card")
    max_jobs = family("rig_card_max_jobs", "Jobs the card may hold at once")
    for card in cards:
        labels = [card.node, str(card.index), card.model]
        total.add_metric(labels, card.total)
        usable.add_metric(labels, card.usable)
        reserved.add_metric(labels, card.reserved)
        free.add_metric(labels, card.free)
        foreign.add_metric(labels, card.foreign)
        healthy.add_metric(labels, 1 if card.checked_healthy else 0)
        jobs.add_metric(labels, card.jobs)
        max_jobs.add_metric(labels, card.max_jobs)
        if card.used is not None:
            used.add_metric(labels, card.used)
        if card.utilization is not None:
            util.add_metric(labels, card.utilization / 100.0)
        if card.temperature is not None:
            temp.add_metric(labels, card.temperature)
    yield from (total, usable, reserved, used, free, foreign, util, temp, healthy, jobs, max_jobs)


def _log_space_family(cards: list[Any]) -> GaugeMetricFamily:
    """rig_node_logs_writable{node}: 0 while the node cannot write its jobs' logs (rig.logspace)
    and so takes no new jobs, else 1."""
    from rig.logspace import is_log_space_reason

    family = GaugeMetricFamily("rig_node_logs_writable",
                               "0 while the node cannot write job logs (it takes no new jobs)", labels=["node"])
    nodes: dict[str, int] = {}
    for card in cards:
        bad = not card.healthy and is_log_space_reason(card.health_reason)
        nodes[card.node] = min(nodes.get(card.node, 1), 0 if bad else 1)
    for node, value in sorted(nodes.items()):
        family.add_metric([node], value)
    return family


def make_registry(client: Client, probe: RedisUp | None = None) -> CollectorRegistry:
    """A registry holding only rig's collector (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RigCollector(client, probe=probe))
    return registry


def answers(address: str, port: int, timeout_s: float = 2.0) -> bool:
    """True if something accepts a TCP connection at ``address:port`` now (a wildcard address,
    0.0.0.0 or ::, is tried on loopback): what `rig up` checks before it prints a URL."""
    import socket

    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(address.strip("[]"), address.strip("[]"))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _number(value: Any) -> float:
    try:
        return float(_s(value))
    except ValueError:
        return 0.0


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal_families(r: Any) -> Iterator[Metric]:  # noqa: ANN401 - a redis.Redis
    """rig_redis_refuses_writes{reason="full"|"read-only"|"cannot-persist"}: 1 for the reason
    Redis refuses rig's writes now (rig.refused_beats), 0 for the others; nothing when Redis
    cannot be read (rig_scrape_success says so)."""
    from rig.redis_writes import memory_state
    from rig.refused_beats import REASON_LABELS, refusal_reason

    try:
        if memory_state(r) is None:
            return
        reason = refusal_reason(r)
    except Exception as exc:  # noqa: BLE001 - a scrape must answer
        log.warning("rig metrics: cannot read whether Redis takes writes: %s", exc)
        return
    fam = GaugeMetricFamily("rig_redis_refuses_writes",
                            "1 while rig's Redis refuses writes, per reason (full: maxmemory with "
                            "noeviction; read-only: a replica; cannot-persist: MISCONF)", labels=["reason"])
    for label in REASON_LABELS:
        fam.add_metric([label], 1.0 if reason is not None and reason[0] == label else 0.0)
    yield fam
