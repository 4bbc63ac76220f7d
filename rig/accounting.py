"""Accounting (``rig usage``), like Slurm's ``sreport``: what finished jobs took, per group.

The figures, each computed in one function, over jobs that ended in the window, archived or
still in Redis alike (rig.archive stores the per-job inputs as columns, computed here by
:func:`accounting_of`):

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

Pure functions: no Redis, no SQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rig.memory import GIB
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
        mean = _number(attempt.get("vram_mean"))
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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- the figures, one function each ---------------------------------------------------------
def card_hours(rows: Sequence[Accounting]) -> float:
    """Cards held x hours run."""
    return sum(r.card_seconds for r in rows) / 3600


def reserved_gib_hours(rows: Sequence[Accounting]) -> float:
    """Declared GiB per card x cards x hours run."""
    return sum(r.reserved_byte_seconds for r in rows) / GIB / 3600


def used_gib_hours(rows: Sequence[Accounting]) -> float | None:
    """Measured mean GiB per card x cards x hours, over measured attempts; None if none was."""
    measured = [r.used_byte_seconds for r in rows if r.used_byte_seconds is not None]
    return sum(measured) / GIB / 3600 if measured else None


#: States that are no failure: succeeded, or cancelled by a person (counted apart).
_NOT_FAILED = (JobState.SUCCEEDED.value, JobState.CANCELLED.value)


def failures_by_class(rows: Sequence[Accounting]) -> dict[str, int]:
    """Jobs that failed (neither succeeded nor were cancelled), per failure class (most first)."""
    found = Counter(r.failure or r.state.lower() for r in rows if r.state not in _NOT_FAILED)
    return dict(found.most_common())


def cancelled(rows: Sequence[Accounting]) -> int:
    """Jobs a person cancelled (before or while they ran): never counted as failures."""
    return sum(1 for r in rows if r.state == JobState.CANCELLED.value)


def mean_wait_seconds(rows: Sequence[Accounting]) -> float | None:
    """Mean seconds from submission to first start, of the jobs that started."""
    waits = [r.wait_seconds for r in rows if r.wait_seconds is not None]
    return sum(waits) / len(waits) if waits else None


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
    if by not in GROUPS:
        raise ValueError(f"unknown group {by!r}")
    key: Callable[[Accounting], str | None] = lambda r: getattr(r, by)  # noqa: E731
    groups: dict[str, list[Accounting]] = {}
    for row in per_node(rows) if by == "node" else rows:
        groups.setdefault(key(row) or NONE_KEY, []).append(row)
    lines = [_line(k, g) for k, g in groups.items()]
    return sorted(lines, key=lambda ln: (-ln.card_hours, ln.key))


def total(rows: Sequence[Accounting]) -> UsageLine:
    """The whole window's figures (from the rows, so means are not means of means)."""
    return _line("total", rows)


def _line(key: str, rows: Sequence[Accounting]) -> UsageLine:
    return UsageLine(key, len(rows), card_hours(rows), reserved_gib_hours(rows), used_gib_hours(rows),
                     failures_by_class(rows), mean_wait_seconds(rows), cancelled(rows))
