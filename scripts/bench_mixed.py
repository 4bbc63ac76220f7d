#!/usr/bin/env python3
"""The mixed-load benchmark: a real rig on fake cards, a seeded mixed trace replayed in real time,
once per scheduling strategy, side by side.

For each strategy it starts a throwaway node (real Redis at $RIG_BENCH_REDIS_URL, else
$RIG_REDIS_URL, else 127.0.0.1:6379, under a private key prefix, real Celery workers on fake 8x80G cards, max 4 jobs a
card), replays the trace of rig.testing.trace (inference, finetunes, large jobs, some 2-card jobs,
priorities mixed; half at 0 s, the rest over 20 s; every job a shell command that writes its
memory into the fake card's usage files and sleeps) and prints:

  * makespan (s; first submission -> last end) and makespan / lower bound, where the lower bound
    is the largest of total memory-time / usable capacity, total job-time / (cards x
    max_task_per_gpu) and latest arrival + duration, from the *planned* durations;
  * waits (submit -> start, s), p50 / p95 per priority;
  * VRAM-time utilisation: reserved bytes x running seconds of the jobs / (usable capacity x
    makespan), usable = 8 x 76 GiB (80 GiB less the 5 % reserve);
  * oversubscription in card-seconds, three ways (all must be 0): the ledger sampled every 20 ms
    (reserved > usable or jobs > max_jobs on a card), the jobs' [started_at, ended_at] intervals
    per card, and the memory the jobs wrote into the fake usage files (> the card's 80 GiB);
  * jobs succeeded.

Then, once with the default strategy: dispatch latency on an idle node (submit() -> the job's
process has started, p50 / p99 over 50 jobs) and the throughput of 1,000 tiny jobs (submitted/s
and completed/s). Then, per strategy, without workers: the time of one dispatcher pass with
1,000 and 10,000 jobs waiting (cards nearly full: 1 GiB free each, so every job read is tried and none starts) and of one placement call.

    .venv/bin/python scripts/bench_mixed.py [--strategies multi-factor,best-fit,...] [--jobs 200]
        [--seed 8] [--skip-latency] [--skip-decision] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.config import load_settings  # noqa: E402
from rig.errors import ConfigError  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.models import CardState, Job, JobState, Priority  # noqa: E402
from rig.testing.bench_args import (  # noqa: E402
    count_at_least,
    count_list,
    positive_seconds,
    time_limit_factor,
    writable_file,
)
from rig.testing.bench_redis import REDIS_EXIT, bench_redis_url, described, redis_problem  # noqa: E402
from rig.testing.harness import RigHarness, delete_prefix  # noqa: E402
from rig.testing.sigterm import exit_on_sigterm  # noqa: E402
from rig.testing.trace import (  # noqa: E402
    GIB,
    PRIORITIES,
    LowerBound,
    RunRecord,
    TraceJob,
    busy_utilisation,
    generate_trace,
    greedy_makespan,
    interval_oversubscription,
    job_command,
    lower_bound,
    makespan,
    percentile,
    refill_gaps,
    snapshot_over,
    vram_time_utilisation,
    waits_by_priority,
)

DEFAULT_STRATEGIES = ("multi-factor", "best-fit", "least-loaded", "first-fit")
#: Settings given with --set NAME=VALUE, for the trace's node (e.g. backfill_estimate_delay_seconds=0).
EXTRA_SETTINGS: dict[str, str] = {}
CARDS = 8
CARD_BYTES = 80 * GIB
RESERVE_FRACTION = 0.05
MAX_JOBS = 4
USABLE_BYTES = int(CARD_BYTES * (1.0 - RESERVE_FRACTION))
#: ledger sampling period (s); the usage files are read every USAGE_EVERY-th sample
SAMPLE_S = 0.02
USAGE_EVERY = 5


def redis_url() -> str:
    """The Redis of the throwaway nodes (rig.testing.bench_redis: $RIG_BENCH_REDIS_URL, else
    $RIG_REDIS_URL, else 127.0.0.1:6379)."""
    return bench_redis_url()[0]


def strategy_problem(strategy: str) -> str | None:
    """Why this build cannot run ``strategy`` (None when it can)."""
    try:
        load_settings(home=Path(tempfile.gettempdir()), scheduler_type=strategy)
    except ConfigError as exc:
        return f"unavailable: {exc}"
    from rig import placement

    if strategy not in getattr(placement, "STRATEGIES", ()):
        return "unavailable: rig.placement does not know it"
    return None


#: Settings the benchmark fixes itself for every node it starts (``--set`` cannot change them).
FIXED_SETTINGS = frozenset({"fake_gpus", "redis_url", "key_prefix", "home", "scheduler_type", "max_task_per_gpu",
                            "vram_reserve_fraction", "telemetry_interval", "max_retries", "node_name"})


def settings_problem(extra: dict[str, str]) -> str | None:
    """Why ``--set``'s settings cannot be used (None when they can): one the benchmark fixes,
    or one rig refuses (unknown, a bad value). Each run would otherwise fail the same way, or
    silently measure rig with the setting left out."""
    fixed = sorted(FIXED_SETTINGS & set(extra))
    if fixed:
        return f"{', '.join(fixed)}: the benchmark sets it itself; leave it out"
    try:
        load_settings(home=Path(tempfile.gettempdir()), **extra)
    except ConfigError as exc:
        return str(exc)
    return None


# -- the oversubscription sampler -----------------------------------------------------------------
class Sampler(threading.Thread):
    """Every SAMPLE_S s: one MULTI/EXEC snapshot of every card hash; every USAGE_EVERY-th time
    also the bytes the jobs wrote into the fake usage files. Accumulates card-seconds over."""

    def __init__(self, harness: RigHarness) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.r = redis.Redis.from_url(harness.settings.redis_url, decode_responses=True)
        self.card_keys = [harness.keys.card(c.node, c.index) for c in harness.client.ledger.cards()]
        self.card_indexes = [c.index for c in harness.client.ledger.cards()]
        self.usage_dir = harness.settings.home / "fake-gpus"
        self.stop_event = threading.Event()
        self.samples = 0
        self.ledger_over_s = 0.0  # card-seconds
        self.usage_over_s = 0.0  # card-seconds
        self.peak_reserved = 0  # bytes, largest on any one card
        self.peak_jobs = 0
        self.peak_used = 0  # bytes written in usage files, largest on any one card
        self.max_gap_s = 0.0  # longest time between two ledger samples

    def _usage(self) -> list[int]:
        used = []
        for index in self.card_indexes:
            total = 0
            try:
                entries = list(os.scandir(self.usage_dir / str(index)))
            except FileNotFoundError:
                entries = []
            for entry in entries:
                try:
                    with open(entry.path) as fh:
                        total += int(fh.read().strip() or 0)
                except (OSError, ValueError):
                    continue
            used.append(total)
        return used

    def run(self) -> None:
        last = time.monotonic()
        last_usage = last
        while not self.stop_event.wait(SAMPLE_S):
            pipe = self.r.pipeline(transaction=True)
            for key in self.card_keys:
                pipe.hgetall(key)
            snapshot = pipe.execute()
            now = time.monotonic()
            self.samples += 1
            self.max_gap_s = max(self.max_gap_s, now - last)
            self.ledger_over_s += (now - last) * len(snapshot_over(snapshot))
            for raw in snapshot:
                self.peak_reserved = max(self.peak_reserved, int(float(raw.get("reserved", 0))))
                self.peak_jobs = max(self.peak_jobs, int(float(raw.get("jobs", 0))))
            last = now
            if self.samples % USAGE_EVERY == 0:
                used = self._usage()
                self.peak_used = max([self.peak_used, *used])
                self.usage_over_s += (now - last_usage) * sum(1 for u in used if u > CARD_BYTES)
                last_usage = now

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


# -- one strategy on the trace --------------------------------------------------------------------
def record_of(job: Job) -> RunRecord:
    return RunRecord(
        priority=job.priority.value, gpu_memory=job.gpu_memory, gpus=job.gpus,
        cards=tuple(job.cards), created_at=job.created_at, started_at=job.started_at,
        ended_at=job.ended_at, state=job.state.value, node=job.node or "",
    )


def run_trace(strategy: str, trace: list[TraceJob], bound: LowerBound, timeout_s: float,
              say: Callable[[str], None], time_limit_factor: float = 0.0, *,
              command_of: Callable[[TraceJob], str] = job_command,
              name_of: Callable[[TraceJob], str] | None = None) -> dict[str, Any]:
    """Replay ``trace`` in real time on a fresh node using ``strategy``; the metrics as a dict
    (seconds, bytes, fractions). With ``time_limit_factor`` > 0 each job declares
    ``--time-limit`` = its planned duration x that factor (as a user declares a limit), which
    gives the dispatcher expected end times for backfill. ``command_of`` and ``name_of`` give
    each job's command and name (default: job_command and the trace name); scripts/bench_peers.py
    wraps the command so that it stamps its own start and end."""
    home = Path(tempfile.mkdtemp(prefix="rig-mixed-"))
    harness = RigHarness(home, fake_gpus=f"{CARDS}x80G", redis_url=redis_url(),
                         scheduler_type=strategy, max_task_per_gpu=MAX_JOBS,
                         vram_reserve_fraction=RESERVE_FRACTION, telemetry_interval=2.0,
                         max_retries=0, node_name="mixed", **EXTRA_SETTINGS)
    sampler: Sampler | None = None
    try:
        t_up = time.monotonic()
        harness.up()
        client = harness.client
        client.submit("true", gpu_memory="1G", name="warm-up").wait(60)
        say(f"  [{strategy}] node up in {time.monotonic() - t_up:.1f} s; replaying "
            f"{len(trace)} jobs")
        sampler = Sampler(harness)
        sampler.start()
        load_start = os.getloadavg()[0]
        ids: list[int] = []
        lags: list[float] = []
        t0 = time.monotonic()
        for job in trace:
            delay = t0 + job.arrival - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            lags.append(time.monotonic() - t0 - job.arrival)
            limit = round(job.duration * time_limit_factor + 0.5, 1) if time_limit_factor > 0 else None
            handle = client.submit(command_of(job), gpu_memory=job.gpu_memory, gpus=job.gpus,
                                   priority=job.priority,
                                   name=name_of(job) if name_of else job.name, retries=0,
                                   time_limit=limit)
            ids.append(int(handle.id))
        deadline = time.monotonic() + timeout_s
        finals = []
        for jid in ids:
            try:
                finals.append(client.wait(jid, timeout=max(1.0, deadline - time.monotonic())))
            except TimeoutError:
                finals.append(client.get(jid))
        wall = time.monotonic() - t0
        sampler.stop()
        records = [record_of(j) for j in finals]
        span = makespan(records)
        first = min(r.created_at for r in records)
        two_card_waits = [r.started_at - r.created_at for r in records
                          if r.gpus > 1 and r.started_at is not None]
        waits = waits_by_priority(records)
        not_ok = [j for j in finals if j.state is not JobState.SUCCEEDED]
        gaps = refill_gaps(records)
        result: dict[str, Any] = {
            "strategy": strategy,
            "makespan_s": span,
            "x_lower_bound": span / bound.value if bound.value > 0 else math.nan,
            "wait_s": {p: {"p50": percentile(waits[p], 0.5), "p95": percentile(waits[p], 0.95),
                           "max": max(waits[p], default=math.nan), "n": len(waits[p])}
                       for p in PRIORITIES},
            "vram_time_utilisation": vram_time_utilisation(
                records, capacity_bytes=CARDS * USABLE_BYTES, span_s=span),
            "busy_utilisation": busy_utilisation(records, capacity_bytes=CARDS * USABLE_BYTES),
            "oversubscription_card_s": {
                "ledger_sampler": sampler.ledger_over_s,
                "job_intervals": interval_oversubscription(
                    records, usable_per_card=USABLE_BYTES, max_jobs_per_card=MAX_JOBS),
                "usage_files": sampler.usage_over_s,
            },
            "sampler": {"samples": sampler.samples, "max_gap_s": sampler.max_gap_s,
                        "peak_reserved_gib": sampler.peak_reserved / GIB,
                        "peak_jobs": sampler.peak_jobs, "peak_used_gib": sampler.peak_used / GIB},
            "refill_gap_s": {"p50": percentile(gaps, 0.5), "p95": percentile(gaps, 0.95),
                             "n": len(gaps)},
            "succeeded": len(finals) - len(not_ok),
            "jobs": len(finals),
            "failed": [f"{j.id} {j.name} {j.state.value}: {j.reason}" for j in not_ok[:5]],
            "submit_lag_max_s": max(lags, default=0.0),
            "wall_s": wall,
            "first_created_at": first,
            "leaked_bytes": harness.leaked_bytes(),
            "last_two_card_start_s": max(
                (r.started_at - first for r in records if r.gpus > 1 and r.started_at is not None),
                default=math.nan),
            "two_card_wait_s": {"p50": percentile(two_card_waits, 0.5),
                                "p95": percentile(two_card_waits, 0.95)},
            "load_average": {"start": load_start, "end": os.getloadavg()[0]},
            "records": [
                {"name": tj.name, "kind": tj.kind, "priority": r.priority, "gpus": r.gpus,
                 "gib": r.gpu_memory / GIB, "cards": list(r.cards), "planned_s": tj.duration,
                 "arrival_s": tj.arrival, "created_s": r.created_at - first,
                 "started_s": None if r.started_at is None else r.started_at - first,
                 "ended_s": None if r.ended_at is None else r.ended_at - first, "state": r.state}
                for tj, r in zip(trace, records, strict=True)],
        }
        say(f"  [{strategy}] done: makespan {span:.1f} s, {result['succeeded']}/{len(finals)} "
            f"succeeded, {sampler.samples} ledger samples")
        return result
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        harness.cleanup()
        shutil.rmtree(home, ignore_errors=True)


# -- idle latency and tiny-job throughput ---------------------------------------------------------
def run_latency(latency_jobs: int, tiny_jobs: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Idle dispatch latency (ms) and tiny-job throughput (jobs/s) on a fresh node with the
    default strategy (the approach of scripts/bench_dispatch.py)."""
    home = Path(tempfile.mkdtemp(prefix="rig-latency-"))
    harness = RigHarness(home, fake_gpus=f"{CARDS}x80G", redis_url=redis_url(),
                         max_task_per_gpu=MAX_JOBS, vram_reserve_fraction=RESERVE_FRACTION,
                         telemetry_interval=2.0, max_retries=0, node_name="latency")
    try:
        harness.up()
        client = harness.client
        client.submit("true", gpu_memory="1G").wait(60)
        stamps = home / "stamps"
        stamps.mkdir()
        latencies = []
        for _ in range(latency_jobs):
            begin = time.time()
            handle = client.submit(["sh", "-c", f'date +%s.%N > {stamps}/"$RIG_JOB_ID"'],
                                   gpu_memory="2G")
            handle.wait(60)
            started = float((stamps / str(handle.id)).read_text())
            latencies.append((started - begin) * 1000)
        say(f"  idle latency measured over {len(latencies)} jobs")
        begin = time.monotonic()
        handles = [client.submit(["true"], gpu_memory="1G", priority="low")
                   for _ in range(tiny_jobs)]
        submitted = time.monotonic() - begin
        finals = [client.wait(h.id, timeout=600) for h in handles]
        total = time.monotonic() - begin
        return {
            "strategy": harness.settings.scheduler_type,
            "latency_ms": {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
                           "max": max(latencies, default=math.nan), "n": len(latencies)},
            "tiny_jobs": tiny_jobs,
            "submitted_per_s": tiny_jobs / submitted if submitted > 0 else math.nan,
            "completed_per_s": tiny_jobs / total if total > 0 else math.nan,
            "submit_s": submitted,
            "all_ended_s": total,
            "succeeded": sum(1 for f in finals if f.state is JobState.SUCCEEDED),
        }
    finally:
        harness.cleanup()
        shutil.rmtree(home, ignore_errors=True)


# -- decision time with many waiting jobs ---------------------------------------------------------
#: What the decision benchmark leaves free on each card: less than any waiting job needs, so a
#: pass reads the queue, orders it, tries every job it reads and plans holds, but starts none.
DECISION_FREE_BYTES = GIB


def _fill_cards(ledger: Ledger, node: str, r: redis.Redis) -> None:
    """Make every card nearly full: one job of (usable - DECISION_FREE_BYTES) reserved on each
    (or, failing that, that much reserved in the card hash)."""
    nbytes = USABLE_BYTES - DECISION_FREE_BYTES
    for index in range(CARDS):
        job = ledger.store.create(Job(
            id=0, name=f"filler-{index}", user="bench", command=["true"], gpu_memory=nbytes,
            gpus=1, priority=Priority.HIGH, state=JobState.PENDING, workdir="/tmp",
            created_at=0.0))
        ok, _detail = ledger.reserve(job.id, node, [index], nbytes, user="bench")
        if not ok:
            r.hset(ledger.keys.card(node, index), "reserved", nbytes)


def _time_place(cards: list[CardState], strategy: str, repeats: int = 2000) -> float:
    """Microseconds per rig.placement.place call for a 12 GiB one-card job on half-loaded
    cards (NaN when the call fails)."""
    from rig import placement

    loaded = [dataclasses.replace(c, reserved=(c.index % 5) * 14 * GIB, jobs=c.index % 4)
              for c in cards]
    request = placement.Request(12 * GIB, 1)
    try:
        placement.place(loaded, request, strategy)
        begin = time.perf_counter()
        for _ in range(repeats):
            placement.place(loaded, request, strategy)
        return (time.perf_counter() - begin) / repeats * 1e6
    except (TypeError, ValueError):
        return math.nan


def run_decision(strategies: list[str], sizes: list[int], seed: int, passes: int,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """Per waiting-queue size and strategy: one Dispatcher.dispatch_pass() (ms: median, p95 over
    ``passes`` after one warm-up) with every card nearly full (DECISION_FREE_BYTES free: every
    job read is tried, none fits), and one place() call (us)."""
    from workers.dispatcher import Dispatcher

    url = redis_url()
    r = redis.Redis.from_url(url, decode_responses=True)
    node = "decide"
    out: dict[str, Any] = {}
    home = Path(tempfile.mkdtemp(prefix="rig-decide-"))
    try:
        for size in sizes:
            prefix = f"rigbench:{uuid.uuid4().hex[:10]}:"
            try:
                ledger = Ledger(r, Keys(prefix))
                for index in range(CARDS):
                    ledger.register_card(node, GpuReading(index=index, uuid=f"FAKE-{index}",
                                                          model="Fake GPU", total=CARD_BYTES),
                                         max_jobs=MAX_JOBS, reserve_fraction=RESERVE_FRACTION,
                                         allowed=True, fake=True)
                _fill_cards(ledger, node, r)
                begin = time.monotonic()
                for tj in generate_trace(size, seed + size, burst_fraction=1.0):
                    ledger.store.create(Job(
                        id=0, name=tj.name, user="bench", command=["true"],
                        gpu_memory=tj.gpu_memory, gpus=tj.gpus, priority=Priority(tj.priority),
                        state=JobState.PENDING, workdir="/tmp", created_at=0.0))
                say(f"  {size} waiting jobs created in {time.monotonic() - begin:.1f} s")
                cards = ledger.cards()
                for strategy in strategies:
                    settings = load_settings(home=home, redis_url=url, key_prefix=prefix,
                                             node_name=node, scheduler_type=strategy,
                                             max_task_per_gpu=MAX_JOBS)
                    dispatcher = Dispatcher(settings, on_start=lambda *a: None, client=r)
                    started = dispatcher.dispatch_pass()  # warm-up (writes the wait reason)
                    times = []
                    for _ in range(passes):
                        t = time.perf_counter()
                        started += dispatcher.dispatch_pass()
                        times.append((time.perf_counter() - t) * 1000)
                    out.setdefault(strategy, {})[str(size)] = {
                        "pass_ms_p50": statistics.median(times),
                        "pass_ms_p95": percentile(times, 0.95),
                        "started": started,
                        "place_us": _time_place(cards, strategy),
                    }
            finally:
                delete_prefix(r, prefix)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return out


# -- output ---------------------------------------------------------------------------------------
def _f(value: float, fmt: str = "{:.1f}") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else fmt.format(value)


def print_table(results: dict[str, dict[str, Any]], bound: LowerBound) -> None:
    names = list(results)
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, get: Callable[[dict[str, Any]], str]) -> None:
        rows.append((label, [get(results[n]) if "error" not in results[n] else "-"
                             for n in names]))

    row("makespan (s)", lambda d: _f(d["makespan_s"]))
    row(f"x lower bound ({bound.value:.1f} s)", lambda d: _f(d["x_lower_bound"], "{:.2f}"))
    for p in PRIORITIES:
        row(f"wait {p} p50 / p95 (s)",
            lambda d, p=p: f"{_f(d['wait_s'][p]['p50'])} / {_f(d['wait_s'][p]['p95'])}")
    row("VRAM-time utilisation", lambda d: _f(100 * d["vram_time_utilisation"], "{:.0f} %"))
    row("  the same until the last start", lambda d: _f(100 * d["busy_utilisation"], "{:.0f} %"))
    row("oversub. ledger / intervals / usage (card-s)", lambda d: " / ".join(
        _f(d["oversubscription_card_s"][k], "{:.2f}")
        for k in ("ledger_sampler", "job_intervals", "usage_files")))
    row("jobs succeeded", lambda d: f"{d['succeeded']}/{d['jobs']}")
    row("wait 2-card jobs p50 / p95 (s)",
        lambda d: f"{_f(d['two_card_wait_s']['p50'])} / {_f(d['two_card_wait_s']['p95'])}")
    row("last 2-card job starts at (s)", lambda d: _f(d["last_two_card_start_s"]))
    row("refill gap p50 / p95 (s)",
        lambda d: f"{_f(d['refill_gap_s']['p50'], '{:.2f}')} / "
                  f"{_f(d['refill_gap_s']['p95'], '{:.2f}')}")
    row("peak jobs on a card / reserved (GiB)",
        lambda d: f"{d['sampler']['peak_jobs']} / {d['sampler']['peak_reserved_gib']:.0f}")
    row("replay: max submit lag (s)", lambda d: _f(d["submit_lag_max_s"], "{:.2f}"))
    row("load average (1 min) start / end",
        lambda d: f"{d['load_average']['start']:.1f} / {d['load_average']['end']:.1f}")
    width = max(len(label) for label, _ in rows) + 2
    col = max(14, *(len(n) + 2 for n in names), *(len(c) + 2 for _, cells in rows for c in cells))
    print("".ljust(width) + "".join(n.rjust(col) for n in names))
    for label, cells in rows:
        print(label.ljust(width) + "".join(c.rjust(col) for c in cells))
    for n in names:
        if "error" in results[n]:
            print(f"  {n}: {results[n]['error']}")
        elif results[n].get("failed"):
            print(f"  {n}: not succeeded: {'; '.join(results[n]['failed'])}")


def _clean(value: Any) -> Any:
    """NaN -> None, for JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=described(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help="comma list of scheduler_type values to compare")
    parser.add_argument("--jobs", type=count_at_least(1), default=200, help="jobs in the mixed trace")
    parser.add_argument("--time-limits", type=time_limit_factor, default=1.5, metavar="FACTOR",
                        help="each job declares --time-limit = planned duration x FACTOR + 0.5 s, "
                        "as users declare limits (0: none; the dispatcher then knows no end times)")
    parser.add_argument("--seed", type=int, default=8, help="seed of the mixed trace")
    parser.add_argument("--skip-latency", action="store_true",
                        help="skip idle dispatch latency and tiny-job throughput")
    parser.add_argument("--skip-decision", action="store_true",
                        help="skip the decision time with many waiting jobs")
    parser.add_argument("--latency-jobs", type=count_at_least(1), default=50)
    parser.add_argument("--tiny-jobs", type=count_at_least(1), default=1000)
    parser.add_argument("--decision-sizes", type=count_list, default="1000,10000",
                        help="comma list of waiting-queue sizes")
    parser.add_argument("--decision-passes", type=count_at_least(1), default=30)
    parser.add_argument("--timeout", type=positive_seconds, default=600.0,
                        help="per strategy: seconds to wait for the trace's jobs to end")
    parser.add_argument("--json", type=writable_file, help="also write every figure to this file")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a rig setting for the trace's node, e.g. backfill_estimate_delay_seconds=0")
    args = parser.parse_args()
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: write it as NAME=VALUE")
        EXTRA_SETTINGS[name.strip()] = value.strip()
    problem = settings_problem(EXTRA_SETTINGS)
    if problem:
        parser.error(f"--set: {problem}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unavailable = {s: p for s in strategies if (p := strategy_problem(s))}
    if not strategies or unavailable:
        parser.error("--strategies: " + ("; ".join(f"{s}: {p}" for s, p in unavailable.items())
                                         or f"give one or more of {', '.join(DEFAULT_STRATEGIES)}"))
    unusable = redis_problem(redis_url())
    if unusable:
        print(f"bench_mixed.py: {unusable}", file=sys.stderr)
        return REDIS_EXIT
    # SIGTERM (`timeout`, `kill`) runs the finally blocks: the throwaway node's workers stop, its
    # key prefix leaves Redis (by default the shared one) and its folder goes (killed outright,
    # a run left ~390 keys, its home folder and sometimes its control worker behind).
    exit_on_sigterm()

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print("$ " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    trace = generate_trace(args.jobs, args.seed)
    bound = lower_bound(trace, cards=CARDS, usable_per_card=USABLE_BYTES,
                        max_jobs_per_card=MAX_JOBS)
    kinds = {k: sum(1 for j in trace if j.kind == k) for k in ("inference", "finetune", "large")}
    prios = {p: sum(1 for j in trace if j.priority == p) for p in PRIORITIES}
    print(f"trace: {len(trace)} jobs, seed {args.seed}: "
          + ", ".join(f"{n} {k}" for k, n in kinds.items())
          + f"; {sum(1 for j in trace if j.gpus > 1)} on 2 cards; "
          + ", ".join(f"{n} {p}" for p, n in prios.items())
          + f"; {sum(1 for j in trace if j.arrival == 0)} at 0 s, the rest over "
          f"{max((j.arrival for j in trace), default=0):.1f} s")
    print(f"cards: {CARDS} x 80 GiB fake, {USABLE_BYTES / GIB:.0f} GiB usable each, "
          f"max {MAX_JOBS} jobs a card")
    print(f"lower bound {bound.value:.1f} s ({bound.binding}; planned durations): memory-time / "
          f"usable capacity {bound.memory_time:.1f} s, job-time / ({CARDS} x {MAX_JOBS}) "
          f"{bound.job_time:.1f} s, latest arrival + duration {bound.arrival:.1f} s")
    kw = {"cards": CARDS, "usable_per_card": USABLE_BYTES, "max_jobs_per_card": MAX_JOBS}
    reference = {"greedy_best_fit_s": greedy_makespan(trace, **kw),
                 "greedy_best_fit_holds_s": greedy_makespan(trace, holds=True, **kw)}
    print(f"offline greedy best-fit, perfect knowledge, no dispatch delay: "
          f"{reference['greedy_best_fit_s']:.1f} s "
          f"(x {reference['greedy_best_fit_s'] / bound.value:.2f}); with card holds for "
          f"blocked jobs: {reference['greedy_best_fit_holds_s']:.1f} s "
          f"(x {reference['greedy_best_fit_holds_s'] / bound.value:.2f})")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print("VRAM-time utilisation = sum(gpu_memory x gpus x run time) / "
          f"({CARDS} x {USABLE_BYTES / GIB:.0f} GiB usable x makespan)")
    sys.stdout.flush()

    results: dict[str, dict[str, Any]] = {}
    for strategy in strategies:  # each one checked by strategy_problem above
        try:
            results[strategy] = run_trace(strategy, trace, bound, args.timeout, say, args.time_limits)
        except Exception as exc:  # noqa: BLE001 - one broken strategy must not hide the others
            results[strategy] = {"strategy": strategy, "error": f"failed: {exc!r}"}
            say(f"  [{strategy}] failed: {exc!r}")
    print()
    print_table(results, bound)
    report: dict[str, Any] = {
        "command": sys.argv, "seed": args.seed, "jobs": len(trace),
        "lower_bound_s": dataclasses.asdict(bound) | {"value": bound.value},
        "offline_reference": reference,
        "trace": [dataclasses.asdict(j) for j in trace], "strategies": results,
    }

    if not args.skip_latency:
        lat = run_latency(args.latency_jobs, args.tiny_jobs, say)
        report["latency"] = lat
        print()
        print(f"idle dispatch latency ({lat['strategy']}; submit -> process start, "
              f"{lat['latency_ms']['n']} jobs): p50 {lat['latency_ms']['p50']:.1f} ms, "
              f"p99 {lat['latency_ms']['p99']:.1f} ms, max {lat['latency_ms']['max']:.1f} ms")
        print(f"{lat['tiny_jobs']} tiny jobs: submitted {lat['submitted_per_s']:.0f} jobs/s "
              f"({lat['submit_s']:.2f} s); all ended after {lat['all_ended_s']:.2f} s = "
              f"{lat['completed_per_s']:.0f} jobs/s; succeeded {lat['succeeded']}/"
              f"{lat['tiny_jobs']}")

    if not args.skip_decision:
        decision = run_decision(strategies, args.decision_sizes, args.seed, args.decision_passes, say)
        report["decision"] = decision
        print()
        print(f"decision time, cards nearly full (one dispatcher pass, median / p95 of "
              f"{args.decision_passes}; one place() call):")
        for strategy, per_size in decision.items():
            cells = [f"{size} waiting {d['pass_ms_p50']:.2f} / {d['pass_ms_p95']:.2f} ms"
                     for size, d in per_size.items()]
            place_us = next(iter(per_size.values()))["place_us"]
            started = sum(d["started"] for d in per_size.values())
            print(f"  {strategy:<14}" + "; ".join(cells) + f"; place() {_f(place_us)} us"
                  + (f"; STARTED {started} (cards were meant to be full)" if started else ""))

    if args.json:
        args.json.write_text(json.dumps(_clean(report), indent=2))
        print(f"\nfigures written to {args.json}")
    # A strategy that could not run is a failed run too (its row says why), not exit 0.
    bad = [n for n, d in results.items() if "error" in d or d["succeeded"] != d["jobs"]
           or any(v > 0 for v in d["oversubscription_card_s"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
