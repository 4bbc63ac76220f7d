"""Pure helpers of the side-by-side benchmark (scripts/bench_peers.py): job names with and
without history, the self-stamping job command, reading the stamps back into RunRecords, and
the rule breaks measured from those stamps. No Redis, no processes, no clock.

Every system runs the same shell command per job; the command writes, as its first action, a
line ``S <epoch s> <CUDA_VISIBLE_DEVICES>`` and, as its last, ``E <epoch s>`` into its own stamp
file. The figures of every system are computed from those lines the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rig.testing.trace import (
    GIB,
    PRIORITIES,
    LowerBound,
    RunRecord,
    TraceJob,
    busy_utilisation,
    card_events_of,
    interval_oversubscription,
    makespan,
    percentile,
    vram_time_utilisation,
    waits_by_priority,
)

#: kind -> short name of the history names ("ft-24g")
SHORT_KIND = {"inference": "inf", "finetune": "ft", "large": "large"}
#: history names bucket the memory per card to this many GiB
HISTORY_BUCKET_GIB = 8


def job_name(job: TraceJob, *, history: bool, run_tag: str) -> str:
    """The name a job is submitted under. ``history`` False: a name no other job has (the
    trace name plus ``run_tag``); True: one name per kind, memory bucket and card count
    (``ft-24g``, ``large-64g-x2``), so a scheduler that learns by name sees earlier jobs of
    the same run."""
    if not history:
        return f"{job.name}-{run_tag}"
    gib = job.gpu_memory // GIB
    bucket = (gib // HISTORY_BUCKET_GIB) * HISTORY_BUCKET_GIB
    name = f"{SHORT_KIND.get(job.kind, job.kind)}-{bucket}g"
    return name + (f"-x{job.gpus}" if job.gpus > 1 else "")


def stamped_command(stamp_file: str, inner: str) -> str:
    """``inner`` (a /bin/sh command) wrapped so that it stamps its start, its card(s) and its
    end (wall clock) into ``stamp_file``. The start stamp is the job's first instruction."""
    return (f'echo "S $(date +%s.%N) ${{CUDA_VISIBLE_DEVICES:-}}" >> {stamp_file}; {inner}; '
            f'echo "E $(date +%s.%N)" >> {stamp_file}')


@dataclass(frozen=True)
class Stamp:
    """What one job's stamp file said: start and end (epoch s; None when missing) and the
    cards it was given."""

    started_at: float | None
    ended_at: float | None
    cards: tuple[int, ...]


def parse_stamp(text: str) -> Stamp:
    """Read a stamp file (see stamped_command). The first S line and the last E line count;
    cards are the comma list after the start time (empty: no card)."""
    started = ended = None
    cards: tuple[int, ...] = ()
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            if parts[0] == "S" and started is None and len(parts) >= 2:
                started = float(parts[1])
                if len(parts) >= 3:
                    cards = tuple(int(c) for c in parts[2].split(",") if c.strip())
            elif parts[0] == "E" and len(parts) >= 2:
                ended = float(parts[1])
        except ValueError:
            continue
    return Stamp(started, ended, cards)


def records_from_stamps(trace: Sequence[TraceJob], submitted: Mapping[int, float],
                        stamps: Mapping[int, Stamp]) -> list[RunRecord]:
    """One RunRecord per trace job (keyed by TraceJob.index): submitted at ``submitted``,
    started and ended as its stamps say, on the cards it stamped. State "ended" when both
    stamps are there, else "missing"."""
    out = []
    for job in trace:
        stamp = stamps.get(job.index, Stamp(None, None, ()))
        ok = stamp.started_at is not None and stamp.ended_at is not None
        out.append(RunRecord(
            priority=job.priority, gpu_memory=job.gpu_memory, gpus=job.gpus, cards=stamp.cards,
            created_at=submitted[job.index], started_at=stamp.started_at,
            ended_at=stamp.ended_at, state="ended" if ok else "missing"))
    return out


def card_peaks(records: Iterable[RunRecord]) -> tuple[int, int]:
    """(largest bytes, largest job count) on any one card at any instant, from the jobs'
    [started_at, ended_at] intervals (an end and a start at the same instant do not overlap)."""
    peak_bytes = peak_jobs = 0
    for card_events in card_events_of(records).values():
        nbytes = jobs = 0
        for _when, order, delta in card_events:
            nbytes += delta
            jobs += 1 if order == 1 else -1
            peak_bytes, peak_jobs = max(peak_bytes, nbytes), max(peak_jobs, jobs)
    return peak_bytes, peak_jobs


def rule_breaks(records: Sequence[RunRecord], *, card_bytes: int, max_jobs: int) -> dict[str, float]:
    """The two rules, measured from the jobs' own stamps: ``oversub_card_s``, card-seconds with
    more than ``card_bytes`` declared bytes on one card (the card's memory: an OOM on a real
    card); ``cap_card_s``, card-seconds with more than ``max_jobs`` jobs on one card; and the
    peaks (GiB, jobs) on any card."""
    peak_bytes, peak_jobs = card_peaks(records)
    return {
        "oversub_card_s": interval_oversubscription(records, usable_per_card=card_bytes,
                                                    max_jobs_per_card=2**31),
        "cap_card_s": interval_oversubscription(records, usable_per_card=2**62,
                                                max_jobs_per_card=max_jobs),
        "peak_gib": peak_bytes / GIB,
        "peak_jobs": peak_jobs,
    }


def trace_metrics(records: Sequence[RunRecord], bound: LowerBound, *, capacity_bytes: int,
                  card_bytes: int, max_jobs: int) -> dict:
    """The side-by-side figures of one run from its stamped records: makespan (first
    submission -> last end stamp) and x lower bound, VRAM-time utilisation over
    ``capacity_bytes`` x makespan, waits by priority and of the multi-card jobs (p50 / p95 /
    max), rule breaks, jobs ended."""
    span = makespan(records)
    waits = waits_by_priority(records)
    multi = [r.started_at - r.created_at for r in records
             if r.gpus > 1 and r.started_at is not None]
    # a job that stamped a different number of cards than it asked for
    wrong_cards = sum(1 for r in records if r.started_at is not None and len(r.cards) != r.gpus)

    def stats(values: list[float]) -> dict[str, float]:
        return {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
                "max": max(values, default=math.nan), "n": len(values)}

    return {
        "makespan_s": span,
        "x_lower_bound": span / bound.value if bound.value > 0 else math.nan,
        "vram_time_utilisation": vram_time_utilisation(records, capacity_bytes=capacity_bytes,
                                                       span_s=span),
        "busy_utilisation": busy_utilisation(records, capacity_bytes=capacity_bytes),
        "wait_s": {p: stats(waits[p]) for p in PRIORITIES},
        "two_card_wait_s": stats(multi),
        "rule_breaks": rule_breaks(records, card_bytes=card_bytes, max_jobs=max_jobs),
        "jobs_wrong_card_count": wrong_cards,
        "ended": sum(1 for r in records if r.state == "ended"),
        "jobs": len(records),
    }
