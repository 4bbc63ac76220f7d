"""Accounting (``rig usage``), like Slurm's ``sreport``: what finished jobs took, per group.

The figures (each computed once, by :func:`line_of`, from the jobs' sums), over jobs that ended
in the window, archived or still in Redis alike (rig.archive stores the per-job inputs as
columns, computed here by :func:`accounting_of`):

- **card-hours reserved**: for every attempt, the cards it held x the hours it ran
  (started_at -> ended_at); a 2-card job that ran 3 h is 6 card-hours, whatever it used;
- **GiB-hours reserved**: the same, weighted by the memory declared per card (GiB): what it
  kept other jobs from; a 12 GiB job on one card for 2 h is 24 GiB-hours;
- **GiB-hours used**: measured: for every measured attempt, its mean memory per card x cards x
  hours (rig's card readings, NVML or fake); attempts never measured count nothing and the
  jobs with none are not part of the efficiency;
- **jobs**, **cancelled** (a person's choice: never a failure), **failures by class**
  (rig.failures: ``cuda_oom``, ``timeout``, ...: jobs that neither succeeded nor were cancelled),
  **mean wait** (submission -> first start, of jobs that started).

How they are added up: each job's :class:`Sums` (:meth:`Sums.of`, the one rule), added per
group and outcome into a :data:`Tally`, from which :func:`line_of` computes a line. The archive
keeps the same sums per UTC day (:func:`day_of`) and group as jobs are archived (rig.archive's
rollup), so ``rig usage`` adds up days, not jobs: a window is its whole days from the rollup
plus the jobs of the part-day before them (:func:`first_whole_day`) summed by the database.

Pure functions: no Redis, no SQL.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rig.memory import GIB, measured
from rig.models import Job, JobState

#: What ``--by`` groups on: the column of Accounting each names.
GROUPS = ("user", "name", "template", "pool", "node")


@dataclass(frozen=True)
class Accounting:
    """One finished job's accounting inputs (field order = rig.archive's usage columns).

    Times in epoch seconds, durations in seconds, memory figures in byte-seconds."""

    id: int
    instance: str
    user: str
    name: str
    template: str | None
    pool: str | None
    node: str | None
    state: str
    failure: str | None
    submitted_at: float
    ended_at: float | None
    wait_seconds: float | None
    card_seconds: float
    reserved_byte_seconds: float
    used_byte_seconds: float | None
    #: Set when its attempts ran on more than one node: node -> (card_seconds,
    #: reserved_byte_seconds, used_byte_seconds) of the attempts there; None: all on ``node``.
    node_split: dict[str, NodeShare] | None = None


#: One node's share of a job: card-seconds, reserved byte-seconds, used byte-seconds (None: unmeasured).
NodeShare = tuple[float, float, float | None]


def accounting_of(job: Job) -> Accounting:
    """The accounting inputs of one finished job, from its attempts (see the module doc). Its
    ``node`` is the job's, else its last attempt's (a job cancelled between retries has none)."""
    card_s = reserved = 0.0
    used: float | None = None
    starts: list[float] = []
    shares: dict[str, list] = {}
    last_node: str | None = None
    for attempt in job.attempts:
        begin, end = _number(attempt.get("started_at")), _number(attempt.get("ended_at"))
        if begin is None or end is None or end < begin:
            continue
        starts.append(begin)
        cards = len(attempt.get("cards") or ()) or job.gpus
        seconds = end - begin
        mean = measured(_number(attempt.get("vram_mean")))  # an older record's 0: nothing measured
        this = (cards * seconds, cards * seconds * (_number(attempt.get("gpu_memory")) or job.gpu_memory),
                None if mean is None else cards * seconds * mean)
        card_s += this[0]
        reserved += this[1]
        if this[2] is not None:
            used = (used or 0.0) + this[2]
        last_node = str(attempt.get("node") or "") or last_node
        share = shares.setdefault(str(attempt.get("node") or ""), [0.0, 0.0, None])
        share[0] += this[0]
        share[1] += this[1]
        if this[2] is not None:
            share[2] = (share[2] or 0.0) + this[2]
    first = min(starts) if starts else job.started_at
    wait = max(0.0, first - job.created_at) if first is not None and job.created_at else None
    split = {n: (s[0], s[1], s[2]) for n, s in shares.items()} if len(shares) > 1 else None
    return Accounting(job.id, job.instance or "", job.user, job.name, job.template, job.pool,
                      job.node or last_node, job.state.value, job.failure, job.created_at, job.ended_at, wait,
                      card_s, reserved, used, split)


def per_node(rows: Iterable[Accounting]) -> list[Accounting]:
    """``rows`` with each job that ran on several nodes as one row per node, holding the hours
    of its attempts there (its job count, failure and wait then count on each of those nodes)."""
    out: list[Accounting] = []
    for row in rows:
        if not row.node_split:
            out.append(row)
            continue
        for node, (card_s, reserved, used) in row.node_split.items():
            out.append(replace(row, node=node or None, card_seconds=card_s, reserved_byte_seconds=reserved,
                               used_byte_seconds=used, node_split=None))
    return out


#: A rollup day's length (s): days are UTC days since the epoch.
DAY = 86400.0
#: The rollup's day of a job without an end time (counted only without --since, as before).
NULL_DAY = -(2**62)


def day_of(ended_at: float | None) -> int:
    """The rollup day of a job that ended at ``ended_at`` (epoch s): the largest d with
    d x DAY <= ended_at, exactly (no rounding puts a job on the other side of a window's
    first whole day, :func:`first_whole_day`); NULL_DAY for None."""
    if ended_at is None:
        return NULL_DAY
    day = math.floor(ended_at / DAY)
    if day * DAY > ended_at:
        day -= 1
    elif (day + 1) * DAY <= ended_at:
        day += 1
    return day


def first_whole_day(since: float) -> int:
    """The first rollup day wholly at or after ``since``: the smallest d with d x DAY >= since.
    A job with ended_at >= since is in the rollup at a day >= this one exactly when
    ended_at >= this day x DAY; the jobs before that are the window's part-day."""
    day = math.ceil(since / DAY)
    if day * DAY < since:
        day += 1
    elif (day - 1) * DAY >= since:
        day -= 1
    return max(day, NULL_DAY + 1)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- the figures: per-job sums, added up by group ------------------------------------------
#: A job's outcome as the figures need it: (state, failure class or None).
Outcome = tuple[str, str | None]


@dataclass
class Sums:
    """The additive figures of a set of jobs (one job: :meth:`of`, the one rule). A group's
    line (:func:`line_of`) is computed from these, whether they were added up here, job by
    job, or by the archive's SQL (rig.archive's rollup and GROUP BY mirror :meth:`of`: SUM of
    each column, COUNT of the non-NULL ``used`` and ``wait`` ones; tests/store/test_usage_fast.py
    checks both against each other).

    Seconds and byte-seconds, as in :class:`Accounting`."""

    jobs: int = 0
    card_seconds: float = 0.0
    reserved_byte_seconds: float = 0.0
    #: Over the measured jobs only (``used_jobs`` of them): unmeasured jobs count nothing.
    used_byte_seconds: float = 0.0
    used_jobs: int = 0
    #: Over the jobs that started (``waited_jobs`` of them).
    wait_seconds: float = 0.0
    waited_jobs: int = 0

    @classmethod
    def of(cls, row: Accounting) -> Sums:
        """One job's contribution (see the module doc for what each figure means)."""
        used, wait = row.used_byte_seconds, row.wait_seconds
        return cls(1, row.card_seconds, row.reserved_byte_seconds, used or 0.0, int(used is not None),
                   wait or 0.0, int(wait is not None))

    def add(self, other: Sums, sign: int = 1) -> None:
        """Add ``other`` in place (``sign`` -1: take it away, e.g. a job counted twice)."""
        self.jobs += sign * other.jobs
        self.card_seconds += sign * other.card_seconds
        self.reserved_byte_seconds += sign * other.reserved_byte_seconds
        self.used_byte_seconds += sign * other.used_byte_seconds
        self.used_jobs += sign * other.used_jobs
        self.wait_seconds += sign * other.wait_seconds
        self.waited_jobs += sign * other.waited_jobs


#: Per group value ('(none)' where unset), per outcome: the sums. What rig usage adds up,
#: wherever the jobs are; merged with :func:`merge_into`.
Tally = dict[str, dict[Outcome, Sums]]

#: States that are no failure: succeeded, or cancelled by a person (counted apart).
_NOT_FAILED = (JobState.SUCCEEDED.value, JobState.CANCELLED.value)


def failure_class(state: str, failure: str | None) -> str | None:
    """The class a job of this outcome counts under in ``failures`` (rig.failures' class, else
    its state in lower case), None when it is no failure (succeeded or cancelled)."""
    return None if state in _NOT_FAILED else (failure or state.lower())


def outcome_of(row: Accounting) -> Outcome:
    """What the figures need of a job's end: its state, and its failure class (None for none,
    an empty one included)."""
    return row.state, row.failure or None


def group_of(row: Accounting, by: str) -> str:
    """The line ``row`` counts in when grouped ``by`` (group_value of its field)."""
    return group_value(getattr(row, by))


def group_value(value: str | None) -> str:
    """A group's line key: its value, NONE_KEY where unset or empty."""
    return value or NONE_KEY


def tally(rows: Iterable[Accounting], by: str = "user", sign: int = 1, into: Tally | None = None) -> Tally:
    """The sums of ``rows`` per value of ``by`` and outcome, added (``sign`` -1: taken away)
    into ``into`` (a new Tally by default). Grouped by node, a job that ran on several nodes
    counts on each (per_node)."""
    if by not in GROUPS:
        raise ValueError(f"unknown group {by!r}")
    out: Tally = {} if into is None else into
    for row in per_node(rows) if by == "node" else rows:
        parts = out.setdefault(group_of(row, by), {})
        parts.setdefault(outcome_of(row), Sums()).add(Sums.of(row), sign)
    return out


def merge_into(into: Tally, other: Tally, sign: int = 1) -> Tally:
    """Add ``other`` to ``into`` (``sign`` -1: take it away); returns ``into``."""
    for key, parts in other.items():
        mine = into.setdefault(key, {})
        for outcome, sums in parts.items():
            mine.setdefault(outcome, Sums()).add(sums, sign)
    return into


@dataclass
class UsageLine:
    """One group's figures (``key`` is the group's value, '(none)' where unset)."""

    key: str
    jobs: int
    card_hours: float
    reserved_gib_hours: float
    used_gib_hours: float | None
    failures: dict[str, int] = field(default_factory=dict)
    mean_wait_seconds: float | None = None
    cancelled: int = 0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


NONE_KEY = "(none)"


def usage(rows: Iterable[Accounting], by: str = "user") -> list[UsageLine]:
    """The figures per value of ``by`` (one of GROUPS), most card-hours first."""
    return lines_of(tally(rows, by))


def total(rows: Iterable[Accounting]) -> UsageLine:
    """The whole window's figures (from the jobs' sums, so means are not means of means)."""
    return total_of(tally(rows, "user"))


def lines_of(found: Tally) -> list[UsageLine]:
    """One line per group of ``found`` that holds jobs, most card-hours first."""
    lines = [line_of(key, parts) for key, parts in found.items()]
    return sorted((ln for ln in lines if ln.jobs), key=lambda ln: (-ln.card_hours, ln.key))


def total_of(found: Tally) -> UsageLine:
    """The total line of a Tally in which every job counts once (grouped by user, not node)."""
    whole: dict[Outcome, Sums] = {}
    for parts in found.values():
        for outcome, sums in parts.items():
            whole.setdefault(outcome, Sums()).add(sums)
    return line_of("total", whole)


def line_of(key: str, parts: Mapping[Outcome, Sums]) -> UsageLine:
    """A line from its sums per outcome. The figures, each once:

    - card-hours: card-seconds / 3600; GiB-hours reserved: byte-seconds / GiB / 3600;
    - GiB-hours used: over measured jobs, None when none was;
    - failures: jobs per failure_class, most first (ties by name); cancelled: apart;
    - mean wait: seconds, over the jobs that started, None when none did."""
    whole = Sums()
    failures: Counter[str] = Counter()
    cancelled = 0
    for (state, failure), sums in parts.items():
        whole.add(sums)
        kind = failure_class(state, failure)
        if kind is not None and sums.jobs:
            failures[kind] += sums.jobs
        if state == JobState.CANCELLED.value:
            cancelled += sums.jobs
    return UsageLine(key, whole.jobs, whole.card_seconds / 3600, whole.reserved_byte_seconds / GIB / 3600,
                     whole.used_byte_seconds / GIB / 3600 if whole.used_jobs else None,
                     dict(sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))),
                     whole.wait_seconds / whole.waited_jobs if whole.waited_jobs else None, cancelled)
