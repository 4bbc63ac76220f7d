"""The seeded mixed trace of the mixed-load benchmark (scripts/bench_mixed.py) and the metrics
computed from its run. Pure functions only: no Redis, no processes, no clock.

Units throughout: memory in bytes (per card unless said otherwise; 1 G = 1 GiB = 2**30 bytes as
everywhere in rig), times in seconds (arrivals are offsets from the start of the replay; run
records carry epoch seconds).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

GIB = 2**30

#: kind -> (share of jobs, memory per card in GiB (lo, hi), duration in s (lo, hi))
JOB_KINDS: dict[str, tuple[float, tuple[int, int], tuple[float, float]]] = {
    "inference": (0.50, (2, 8), (0.5, 2.5)),
    "finetune": (0.32, (12, 30), (2.0, 5.0)),
    "large": (0.18, (40, 76), (2.5, 6.0)),
}
#: kinds that may take 2 cards (the 2-card jobs are drawn among these)
MULTI_CARD_KINDS = ("finetune", "large")
#: priority -> share of jobs
PRIORITY_MIX: dict[str, float] = {"high": 0.2, "medium": 0.4, "low": 0.4}
PRIORITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class TraceJob:
    """One job of the trace: ``gpu_memory`` bytes on each of ``gpus`` cards, submitted
    ``arrival`` s after the replay starts, running (sleeping) for ``duration`` s."""

    index: int
    kind: str
    gpu_memory: int
    gpus: int
    priority: str
    arrival: float
    duration: float

    @property
    def name(self) -> str:
        return f"mix-{self.index:04d}-{self.kind}"


def _exact_mix(rng: random.Random, n: int, shares: Mapping[str, float]) -> list[str]:
    """``n`` names in the given shares (largest-remainder rounding), in a seeded random order."""
    names = list(shares)
    total = sum(shares.values())
    raw = [n * shares[k] / total for k in names]
    counts = [math.floor(x) for x in raw]
    by_remainder = sorted(range(len(names)), key=lambda i: (counts[i] - raw[i], i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    out = [name for name, count in zip(names, counts, strict=True) for _ in range(count)]
    rng.shuffle(out)
    return out


def generate_trace(
    n_jobs: int = 200,
    seed: int = 7,
    *,
    burst_fraction: float = 0.5,
    spread_s: float = 20.0,
    multi_card_fraction: float = 0.1,
    max_gib_per_card: int = 76,
    kinds: Mapping[str, tuple[float, tuple[int, int], tuple[float, float]]] = JOB_KINDS,
    priorities: Mapping[str, float] = PRIORITY_MIX,
) -> list[TraceJob]:
    """A seeded mixed trace, sorted by arrival (then index).

    Kinds and priorities come in exactly their shares (rounded), shuffled; a
    ``multi_card_fraction`` of all jobs (drawn among MULTI_CARD_KINDS) take 2 cards. Memory per
    card is a whole number of GiB, uniform in the kind's range and never more than
    ``max_gib_per_card``; durations are uniform in the kind's range, rounded to 10 ms.
    ``burst_fraction`` of the jobs (chosen at random) arrive at 0 s, the rest at uniform random
    times in (0, ``spread_s``] s. The same arguments always give the same trace.
    """
    if n_jobs < 0:
        raise ValueError("n_jobs must be >= 0")
    if not 0.0 <= burst_fraction <= 1.0 or not 0.0 <= multi_card_fraction <= 1.0:
        raise ValueError("burst_fraction and multi_card_fraction must be within [0, 1]")
    rng = random.Random(seed)
    job_kinds = _exact_mix(rng, n_jobs, {k: v[0] for k, v in kinds.items()})
    job_prios = _exact_mix(rng, n_jobs, priorities)
    could_span = [i for i, k in enumerate(job_kinds) if k in MULTI_CARD_KINDS]
    two_cards = set(rng.sample(could_span, min(len(could_span),
                                               int(round(n_jobs * multi_card_fraction)))))
    burst = set(rng.sample(range(n_jobs), int(round(n_jobs * burst_fraction))))
    jobs: list[TraceJob] = []
    for index, kind in enumerate(job_kinds):
        _share, (lo_gib, hi_gib), (lo_s, hi_s) = kinds[kind]
        gib = min(rng.randint(lo_gib, hi_gib), max_gib_per_card)
        duration = round(rng.uniform(lo_s, hi_s), 2)
        arrival = 0.0 if index in burst else max(0.001, round(rng.uniform(0.0, spread_s), 3))
        jobs.append(TraceJob(index, kind, gib * GIB, 2 if index in two_cards else 1,
                             job_prios[index], arrival, duration))
    return sorted(jobs, key=lambda j: (j.arrival, j.index))


def job_command(job: TraceJob) -> str:
    """A cheap ``/bin/sh`` command that "uses" ``job.gpu_memory`` bytes on each of its fake
    cards (files under $RIG_FAKE_GPU_DIR, see rig.gpus.fake) for ``job.duration`` s."""
    each = 'for c in $(echo "$CUDA_VISIBLE_DEVICES" | tr , " "); do'
    use = (f'{each} mkdir -p "$RIG_FAKE_GPU_DIR/$c" && echo {job.gpu_memory} '
           f'> "$RIG_FAKE_GPU_DIR/$c/$$"; done')
    free = f'{each} rm -f "$RIG_FAKE_GPU_DIR/$c/$$"; done'
    return f'if [ -n "$RIG_FAKE_GPU_DIR" ]; then {use}; fi; sleep {job.duration:.2f}; ' \
           f'if [ -n "$RIG_FAKE_GPU_DIR" ]; then {free}; fi'


# -- lower bound ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LowerBound:
    """Three lower bounds on the makespan (s) and their maximum ``value``.

    - ``memory_time``: total memory-time (bytes x s over all cards) / total usable capacity;
    - ``job_time``: total card-job-time / (cards x max jobs per card);
    - ``arrival``: the latest (arrival + duration) of any job, less the first arrival.

    All from the first arrival, as a run's makespan is measured from its first submission
    (``makespan``): from 0, a trace whose first job arrives at 2 s read "x 0.44 lower bound".
    """

    memory_time: float
    job_time: float
    arrival: float

    @property
    def value(self) -> float:
        return max(self.memory_time, self.job_time, self.arrival)

    @property
    def binding(self) -> str:
        """Which of the three bounds sets ``value``."""
        named = {"memory-time": self.memory_time, "job-time": self.job_time,
                 "arrival": self.arrival}
        return max(named, key=lambda k: named[k])


def lower_bound(jobs: Iterable[TraceJob], *, cards: int, usable_per_card: int,
                max_jobs_per_card: int) -> LowerBound:
    """Lower bound on the makespan of ``jobs`` (planned durations, s) on ``cards`` cards with
    ``usable_per_card`` reservable bytes and ``max_jobs_per_card`` job slots each."""
    if cards <= 0 or usable_per_card <= 0 or max_jobs_per_card <= 0:
        raise ValueError("cards, usable_per_card and max_jobs_per_card must be positive")
    memory_time = job_time = latest = 0.0
    first = math.inf
    for job in jobs:
        memory_time += job.gpu_memory * job.gpus * job.duration
        job_time += job.gpus * job.duration
        latest = max(latest, job.arrival + job.duration)
        first = min(first, job.arrival)
    return LowerBound(
        memory_time=memory_time / (cards * usable_per_card),
        job_time=job_time / (cards * max_jobs_per_card),
        arrival=latest - first if first != math.inf else 0.0,
    )


# -- run metrics ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRecord:
    """What one job's record said after the run. Epoch seconds; ``gpu_memory`` bytes per card;
    ``started_at``/``ended_at`` None when the job never started/ended."""

    priority: str
    gpu_memory: int
    gpus: int
    cards: tuple[int, ...]
    created_at: float
    started_at: float | None
    ended_at: float | None
    state: str
    node: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between order statistics
    (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def makespan(records: Iterable[RunRecord]) -> float:
    """Last end - first submission (s); NaN when no job ended."""
    recs = list(records)
    ends = [r.ended_at for r in recs if r.ended_at is not None]
    if not recs or not ends:
        return math.nan
    return max(ends) - min(r.created_at for r in recs)


def waits_by_priority(records: Iterable[RunRecord]) -> dict[str, list[float]]:
    """priority -> waits (started_at - created_at, s) of the jobs that started; every name in
    PRIORITIES is present."""
    out: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    for r in records:
        if r.started_at is not None:
            out.setdefault(r.priority, []).append(r.started_at - r.created_at)
    return out


def vram_time_utilisation(records: Iterable[RunRecord], *, capacity_bytes: int,
                          span_s: float) -> float:
    """Reserved memory-time of the jobs while they ran (sum of gpu_memory x gpus x run time)
    over ``capacity_bytes`` x ``span_s``; a fraction in [0, 1] when nothing oversubscribes."""
    if capacity_bytes <= 0 or not span_s > 0:
        return math.nan
    used = sum(r.gpu_memory * r.gpus * (r.ended_at - r.started_at) for r in records
               if r.started_at is not None and r.ended_at is not None)
    return used / (capacity_bytes * span_s)


def busy_utilisation(records: Iterable[RunRecord], *, capacity_bytes: int) -> float:
    """VRAM-time utilisation over the busy part of a run: from the first submission until the
    last job started (while jobs waited, idle memory was the scheduler's to fill). Memory-time
    of the jobs within that window over ``capacity_bytes`` x its length; NaN without starts."""
    recs = [r for r in records if r.started_at is not None]
    if not recs or capacity_bytes <= 0:
        return math.nan
    lo = min(r.created_at for r in recs)
    hi = max(r.started_at for r in recs)  # type: ignore[type-var]
    if not hi > lo:
        return math.nan
    used = 0.0
    for r in recs:
        end = r.ended_at if r.ended_at is not None else hi
        used += r.gpu_memory * r.gpus * max(0.0, min(end, hi) - max(r.started_at, lo))  # type: ignore[arg-type]
    return used / (capacity_bytes * (hi - lo))


def card_events_of(records: Iterable[RunRecord]) -> dict[tuple[str, int], list[tuple[float, int, int]]]:
    """Per card (node, index), the jobs' starts and ends as (time, order, +-bytes), sorted: an
    end (order 0) before a start (order 1) at the same instant, so they do not overlap. Jobs
    without both stamps, or with an end not after the start, are left out."""
    events: dict[tuple[str, int], list[tuple[float, int, int]]] = defaultdict(list)
    for r in records:
        if r.started_at is None or r.ended_at is None or r.ended_at <= r.started_at:
            continue
        for card in r.cards:
            events[(r.node, card)].append((r.started_at, 1, r.gpu_memory))
            events[(r.node, card)].append((r.ended_at, 0, -r.gpu_memory))
    for card_events in events.values():
        card_events.sort()
    return dict(events)


def interval_oversubscription(records: Iterable[RunRecord], *, usable_per_card: int,
                              max_jobs_per_card: int) -> float:
    """Card-seconds during which the jobs' [started_at, ended_at] intervals put more than
    ``usable_per_card`` bytes or more than ``max_jobs_per_card`` jobs on one card.

    Summed over cards (two cards over for 1 s count 2 s). An end and a start at the same
    instant do not overlap.
    """
    total = 0.0
    for card_events in card_events_of(records).values():
        nbytes = jobs = 0
        last = None
        for when, order, delta in card_events:
            if last is not None and (nbytes > usable_per_card or jobs > max_jobs_per_card):
                total += when - last
            nbytes += delta
            jobs += 1 if order == 1 else -1
            last = when
    return total


def refill_gaps(records: list[RunRecord], min_wait_s: float = 0.2) -> list[float]:
    """For each job that waited more than ``min_wait_s``: its start - the last end on any of
    its cards before that start (s). Small when freed room is taken at once; large when the
    job was held back by something else (strict order behind a head that does not fit)."""
    ends: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in records:
        if r.ended_at is not None:
            for c in r.cards:
                ends[(r.node, c)].append(r.ended_at)
    gaps = []
    for r in records:
        if r.started_at is None or r.started_at - r.created_at <= min_wait_s:
            continue
        before = [e for c in r.cards for e in ends.get((r.node, c), []) if e <= r.started_at]
        if before:
            gaps.append(r.started_at - max(before))
    return gaps


def snapshot_over(cards: Iterable[Mapping[str, str]]) -> list[int]:
    """Indexes (position in ``cards``) of the card hashes of one ledger snapshot that hold more
    than they may: ``reserved`` > ``usable`` bytes or ``jobs`` > ``max_jobs``."""
    over = []
    for pos, raw in enumerate(cards):
        try:
            reserved = int(float(raw.get("reserved", 0) or 0))
            usable = int(float(raw.get("usable", 0) or 0))
            jobs = int(float(raw.get("jobs", 0) or 0))
            max_jobs = int(float(raw.get("max_jobs", 1) or 1))
        except ValueError:
            continue
        if reserved > usable or jobs > max_jobs:
            over.append(pos)
    return over


def summary_stats(values: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 / max of ``values`` (NaN for none)."""
    return {
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
    }


# -- offline reference -----------------------------------------------------------------------------
_RANK = {p: i for i, p in enumerate(PRIORITIES)}


def fifo_order(job: TraceJob) -> tuple:
    """Priority, then arrival: rig's order before queue_order = largest-first."""
    return (_RANK.get(job.priority, len(_RANK)), job.arrival, job.index)


@dataclass(frozen=True)
class Policy:
    """A list-scheduling policy for ``simulate``: the queue's ``order`` (a sort key), after how
    long a blocked job holds cards, per priority rank (None: never), whether jobs may backfill
    held cards around a shadow time (EASY), and the expected duration a job declares
    (real duration x ``estimate``)."""

    name: str
    order: Callable[[TraceJob], tuple] = fifo_order
    hold_after: tuple[float | None, float | None, float | None] = (None, None, None)
    backfill: bool = False
    estimate: float = 1.0
    #: Estimate durations as rig does without declared ones (rig.estimates.Prior over the runs
    #: ended so far: unknown until enough have ended; a running job's conditional remaining
    #: time), instead of real duration x ``estimate``.
    prior: bool = False
    #: With ``prior``: the queue's order from the job and its estimated duration (s), instead
    #: of ``order``.
    order_by_estimate: Callable[[TraceJob, float], tuple] | None = None
    #: Whether a job may backfill in front of a held job on its (cautious) expected end; False:
    #: only by leaving room (rig's default without time limits).
    estimate_admits: bool = True


def simulate(jobs: Sequence[TraceJob], policy: Policy, *, cards: int, usable_per_card: int,
             max_jobs_per_card: int, start_overhead_s: float = 0.0) -> tuple[float, dict[str, list[float]]]:
    """Offline list scheduling with perfect knowledge of the trace: (makespan s from 0, waits
    by priority). At every arrival or end, waiting jobs are offered in ``policy.order`` and each
    one that fits starts on its best-fit cards (tightest, then fewest jobs, then lowest index);
    each runs ``duration + start_overhead_s`` s. A blocked job that has waited its
    ``hold_after`` holds ``gpus`` cards for the rest of that round: without backfill the cards
    closest to fitting it, closed to everyone; with backfill the cards expected to have room
    first, open to jobs expected to end by then or that leave it room (as rig's dispatcher)."""
    from rig.estimates import Prior, RecentRun  # the dispatcher's own estimator

    free, count = [usable_per_card] * cards, [0] * cards
    on_card: list[list[tuple[float, int, int]]] = [[] for _ in range(cards)]  # (expected end, bytes, index)
    started: dict[int, tuple[float, TraceJob]] = {}  # index -> (start, job), with ``prior``
    ended: list[RecentRun] = []
    arrivals = sorted(jobs, key=lambda j: (j.arrival, j.index))
    running: list[tuple[float, int, tuple[int, ...], int]] = []  # (end, index, cards, bytes)
    waiting: list[TraceJob] = []
    waits: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    now = last_end = 0.0
    nxt = 0
    while nxt < len(arrivals) or waiting or running:
        times = [running[0][0]] if running else []
        if nxt < len(arrivals):
            times.append(arrivals[nxt].arrival)
        if not times:  # only jobs that can never fit are left
            break
        now = max(now, min(times))
        while nxt < len(arrivals) and arrivals[nxt].arrival <= now:
            waiting.append(arrivals[nxt])
            nxt += 1
        while running and running[0][0] <= now:
            _end, index, used, nbytes = heapq.heappop(running)
            for c in used:
                free[c] += nbytes
                count[c] -= 1
                on_card[c] = [x for x in on_card[c] if x[2] != index]
            if policy.prior:
                began, done = started.pop(index)
                ended.append(RecentRun(done.duration, done.gpu_memory, done.gpus, "u"))
        prior = Prior(ended) if policy.prior else None

        def expect(job: TraceJob, cautious: bool = False, prior: Prior | None = prior) -> float:
            if prior is None:
                return job.duration * policy.estimate
            found = prior.estimate(user="u", nbytes=job.gpu_memory, gpus=job.gpus)
            return found.cautious if cautious else found.expected

        if prior is not None:  # running jobs' expected ends: their conditional remaining times
            for c in range(cards):
                on_card[c] = [(now + prior.estimate(user="u", nbytes=started[i][1].gpu_memory,
                                                    gpus=started[i][1].gpus).remaining(now - started[i][0]),
                               b, i) for _e, b, i in on_card[c]]
        if prior is not None and policy.order_by_estimate is not None:
            waiting.sort(key=lambda j: policy.order_by_estimate(j, expect(j)))  # type: ignore[misc]
        else:
            waiting.sort(key=policy.order)
        held: dict[int, tuple[float, int]] = {}  # card -> (shadow time, bytes the held job needs)
        still: list[TraceJob] = []
        for job in waiting:
            expected_end = now + expect(job, cautious=True) if policy.estimate_admits else math.inf

            def open_card(c: int, job: TraceJob = job, expected_end: float = expected_end,
                          held: dict[int, tuple[float, int]] = held) -> bool:
                if c not in held:
                    return True
                until, need = held[c]
                if not policy.backfill or until == math.inf:
                    return False
                if expected_end <= until:
                    return True
                gone = [x for x in on_card[c] if x[0] <= until]
                room = free[c] + sum(x[1] for x in gone)
                return room - job.gpu_memory >= need and count[c] - len(gone) + 2 <= max_jobs_per_card

            fit = [c for c in range(cards)
                   if free[c] >= job.gpu_memory and count[c] < max_jobs_per_card and open_card(c)]
            if len(fit) < job.gpus:
                still.append(job)
                after = policy.hold_after[_RANK.get(job.priority, len(_RANK) - 1)]
                if after is not None and now - job.arrival >= after:
                    _hold(job, held, free, count, on_card, now, policy.backfill,
                          usable_per_card, max_jobs_per_card)
                continue
            chosen = tuple(sorted(fit, key=lambda c: (free[c] - job.gpu_memory, count[c], c))[: job.gpus])
            for c in chosen:
                free[c] -= job.gpu_memory
                count[c] += 1
                on_card[c].append((now + expect(job), job.gpu_memory, job.index))
            if policy.prior:
                started[job.index] = (now, job)
            end = now + job.duration + start_overhead_s
            last_end = max(last_end, end)
            waits.setdefault(job.priority, []).append(now - job.arrival)
            heapq.heappush(running, (end, job.index, chosen, job.gpu_memory))
        waiting = still
    return last_end, waits


def _hold(job: TraceJob, held: dict[int, tuple[float, int]], free: list[int], count: list[int],
          on_card: list[list[tuple[float, int, int]]], now: float, backfill: bool,
          usable_per_card: int, max_jobs_per_card: int) -> None:
    """Hold ``job.gpus`` cards for a blocked job (see simulate)."""
    options = []
    for c in range(len(free)):
        if c in held or usable_per_card < job.gpu_memory:
            continue
        deficit = max(0, job.gpu_memory - free[c])
        if not backfill:
            options.append((deficit, count[c], c))
            continue
        when, room, n = math.inf, free[c], count[c]
        if room >= job.gpu_memory and n < max_jobs_per_card:
            when = now
        else:
            for end, nbytes, _ in sorted(on_card[c]):
                room, n = room + nbytes, n - 1
                if room >= job.gpu_memory and n < max_jobs_per_card:
                    when = end
                    break
        options.append((when, deficit, c))
    if len(options) < job.gpus:
        return
    chosen = sorted(options)[: job.gpus]
    until = max(o[0] for o in chosen) if backfill else math.inf
    for option in chosen:
        held[option[2]] = (until, job.gpu_memory)


def greedy_makespan(jobs: Sequence[TraceJob], *, cards: int, usable_per_card: int,
                    max_jobs_per_card: int, holds: bool = False,
                    start_overhead_s: float = 0.0) -> float:
    """Makespan (s from the first arrival, as ``makespan`` measures a run) of the offline
    greedy reference: ``simulate`` in (priority, arrival)
    order, best fit, no dispatch delay; with ``holds``, a job that does not fit holds the cards
    closest to fitting it at once (rig's dispatcher before backfill). A reference for the real
    run, not a bound."""
    policy = Policy("greedy", hold_after=(0.0, 0.0, 0.0) if holds else (None, None, None))
    first = min((job.arrival for job in jobs), default=0.0)
    span = simulate(jobs, policy, cards=cards, usable_per_card=usable_per_card,
                    max_jobs_per_card=max_jobs_per_card, start_overhead_s=start_overhead_s)[0]
    return max(0.0, span - first)
