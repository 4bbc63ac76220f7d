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
- **jobs**, **failures by class** (rig.failures: ``cuda_oom``, ``timeout``, ...; cancelled jobs
  count as ``cancelled``), **mean wait** (submission -> first start, of jobs that started).

Pure functions: no Redis, no SQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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


def accounting_of(job: Job) -> Accounting:
    """The accounting inputs of one finished job, from its attempts (see the module doc)."""
    card_s = reserved = 0.0
    used: float | None = None
    starts: list[float] = []
    for attempt in job.attempts:
        begin, end = _number(attempt.get("started_at")), _number(attempt.get("ended_at"))
        if begin is None or end is None or end < begin:
            continue
        starts.append(begin)
        cards = len(attempt.get("cards") or ()) or job.gpus
        seconds = end - begin
        card_s += cards * seconds
        reserved += cards * seconds * (_number(attempt.get("gpu_memory")) or job.gpu_memory)
        mean = _number(attempt.get("vram_mean"))
        if mean is not None:
            used = (used or 0.0) + cards * seconds * mean
    first = min(starts) if starts else job.started_at
    wait = max(0.0, first - job.created_at) if first is not None and job.created_at else None
    return Accounting(job.id, job.instance or "", job.user, job.name, job.template, job.pool, job.node,
                      job.state.value, job.failure, job.created_at, job.ended_at, wait, card_s, reserved, used)


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


def failures_by_class(rows: Sequence[Accounting]) -> dict[str, int]:
    """Jobs that did not succeed, per failure class (most first)."""
    found = Counter(r.failure or r.state.lower() for r in rows if r.state != JobState.SUCCEEDED.value)
    return dict(found.most_common())


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
    for row in rows:
        groups.setdefault(key(row) or NONE_KEY, []).append(row)
    lines = [UsageLine(k, len(g), card_hours(g), reserved_gib_hours(g), used_gib_hours(g),
                       failures_by_class(g), mean_wait_seconds(g)) for k, g in groups.items()]
    return sorted(lines, key=lambda ln: (-ln.card_hours, ln.key))


def total(rows: Sequence[Accounting]) -> UsageLine:
    """The whole window's figures (from the rows, so means are not means of means)."""
    return UsageLine("total", len(rows), card_hours(rows), reserved_gib_hours(rows), used_gib_hours(rows),
                     failures_by_class(rows), mean_wait_seconds(rows))
