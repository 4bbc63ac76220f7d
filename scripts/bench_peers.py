#!/usr/bin/env python3
"""rig beside its peers: the same seeded mixed traces through rig, Ray and plain Celery, in one
run, side by side.

Machine of the measurement: 8 fake 80 GiB cards, at most 4 jobs a card (rig's rule; the peers
are measured against it), the seeded trace of rig.testing.trace (inference 2-8 GiB, finetunes
12-30 GiB, large 40-76 GiB, 10 % on 2 cards, priorities mixed, half at 0 s and the rest over
20 s), replayed in real time. Every job is the same shell command on every system: it stamps
its start (wall clock) and card(s) (CUDA_VISIBLE_DEVICES as the system gave it) as its first
instruction, sleeps its duration, stamps its end (on rig it also writes its memory into the fake
card's usage files, as in scripts/bench_mixed.py). Every figure is computed from those stamps the
same way for every system (rig.testing.peers):

  * makespan (first submission -> last end stamp) and x the lower bound of the trace;
  * VRAM-time utilisation: declared bytes x stamped run time / (8 x 76 GiB x makespan);
  * waits (submit -> start stamp) p50 / p95 of high and low priority, and of the 2-card jobs;
  * rule breaks: card-seconds with more than 80 GiB declared on a card (oversubscription; a
    real card's OOM), with more than rig's usable 76 GiB (80 GiB less vram_reserve_fraction
    0.05: the bound rig keeps itself to) and with more than 4 jobs on a card (cap), from the
    stamped intervals and cards;
  * 500 tiny jobs (``true``) submitted as fast as the API allows: jobs/s, first submission ->
    last completion; idle latency: 50 jobs one at a time, submit call -> the job's first
    instruction (p50 / p99).

The systems:
  * rig: a throwaway node (scripts/bench_mixed.py's run_trace and run_latency; Redis at
    $RIG_BENCH_REDIS_URL, else $RIG_REDIS_URL, else 127.0.0.1:6379), default
    strategy; with --time-limits F each job declares --time-limit = duration x F + 0.5 s; with
    --history on, names repeat per kind and memory bucket ("ft-24g");
  * ray: ray.init(num_gpus=8), fractional GPUs by memory (num_gpus = GiB / 80 for a 1-card job,
    2 for a 2-card job), the command run by subprocess with CUDA_VISIBLE_DEVICES from
    ray.get_gpu_ids(); no priorities (submitted in arrival order); no job cap per card; Ray's
    start and worker warm-up are not in the figures. `pip install '.[bench]'` installs it;
  * celery: a throwaway Celery app on Redis ($PEERS_BROKER_URL, else DB 11 of the Redis rig's
    node uses, below; a private key prefix, deleted at the end), 8 workers
    (-P solo, concurrency 1, prefetch 1, acks_late) on one shared queue, each running its jobs
    on its own card; priorities by Celery's Redis priority steps; a 2-card job runs on its
    worker's card and the next one, the second taken unreserved (rig.testing.peers_celery);
  * sgs: simple_gpu_scheduler (PyPI; in the bench extra too), one process fed the commands on
    its stdin at their arrival, one job per card, arrival order; a 2-card job gets one card
    (counted in "jobs given fewer/more cards than asked"; its utilisation still counts 2 cards).

The peers ignore time limits and names (rig's peers: ray, celery, sgs): they run each seed's trace once, and that run is shown
in every table of the seed.

    .venv/bin/python scripts/bench_peers.py [--seeds 8,3,5] [--systems rig,ray,celery,sgs]
        [--time-limits both|0|1.5] [--history both|off|on] [--jobs 200] [--skip-tiny]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rig.config import load_settings  # noqa: E402
from rig.testing.bench_args import (  # noqa: E402
    count_at_least,
    positive_seconds,
    time_limit_factor,
    writable_file,
)
from rig.testing.bench_redis import REDIS_EXIT, bench_redis_url, described, redis_problem, with_db  # noqa: E402
from rig.testing.harness import delete_prefix  # noqa: E402
from rig.testing.peers import (  # noqa: E402
    Stamp,
    job_name,
    parse_stamp,
    records_from_stamps,
    rule_breaks,
    stamped_command,
    trace_metrics,
)
from rig.testing.sigterm import exit_on_sigterm  # noqa: E402
from rig.testing.trace import (  # noqa: E402
    GIB,
    LowerBound,
    TraceJob,
    generate_trace,
    job_command,
    lower_bound,
    percentile,
)

_spec = importlib.util.spec_from_file_location("bench_mixed", ROOT / "scripts" / "bench_mixed.py")
assert _spec is not None and _spec.loader is not None
bench_mixed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_mixed)

CARDS = bench_mixed.CARDS
CARD_BYTES = bench_mixed.CARD_BYTES
MAX_JOBS = bench_mixed.MAX_JOBS
USABLE_BYTES = bench_mixed.USABLE_BYTES
SYSTEMS = ("rig", "ray", "celery", "sgs")
LABELS = {
    "rig": "rig",
    "ray": "Ray (frac. GPU)",
    "celery": "Celery 1/card",
    "sgs": "simple_gpu_sched.",
}
NOTES = {
    "rig": "priorities; 2 cards held",
    "ray": "arrival order; 2 GPUs",
    "celery": "prio steps; 2nd card taken",
    "sgs": "arrival order; 1 card",
}

Say = Callable[[str], None]


def read_stamps(stamp_dir: Path, trace: list[TraceJob]) -> dict[int, Stamp]:
    out = {}
    for job in trace:
        try:
            out[job.index] = parse_stamp((stamp_dir / str(job.index)).read_text())
        except FileNotFoundError:
            continue
    return out


def replay(trace: list[TraceJob], submit: Callable[[TraceJob], None]) -> dict[int, float]:
    """Submit each job at its arrival (real time); job index -> wall clock of its submit call."""
    submitted: dict[int, float] = {}
    t0 = time.monotonic()
    for job in trace:
        delay = t0 + job.arrival - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        submitted[job.index] = time.time()
        submit(job)
    return submitted


def small_jobs_result(latencies_ms: list[float], tiny: int, tiny_s: float, ok: int) -> dict[str, Any]:
    return {"latency_ms": {"p50": percentile(latencies_ms, 0.5),
                           "p99": percentile(latencies_ms, 0.99),
                           "max": max(latencies_ms, default=math.nan), "n": len(latencies_ms)},
            "tiny_jobs": tiny, "tiny_per_s": tiny / tiny_s if tiny_s > 0 else math.nan,
            "tiny_s": tiny_s, "tiny_ok": ok}


# -- rig ------------------------------------------------------------------------------------------
class RigSystem:
    name = "rig"

    def __init__(self, say: Say) -> None:
        self.say = say
        self.strategy = load_settings(home=Path(tempfile.gettempdir())).scheduler_type

    def trace(self, trace: list[TraceJob], bound: LowerBound, factor: float, history: bool,
              timeout_s: float) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="rig-peers-stamps-"))
        tag = uuid.uuid4().hex[:8]
        try:
            res = bench_mixed.run_trace(
                self.strategy, trace, bound, timeout_s, self.say, factor,
                command_of=lambda j: stamped_command(str(stamps / str(j.index)), job_command(j)),
                name_of=lambda j: job_name(j, history=history, run_tag=tag))
            first = res["first_created_at"]
            submitted = {tj.index: first + rec["created_s"]
                         for tj, rec in zip(trace, res["records"], strict=True)}
            out = stamped_metrics(trace, submitted, stamps, bound)
            out["rig_own"] = {k: res[k] for k in ("makespan_s", "oversubscription_card_s",
                                                  "succeeded", "failed", "sampler",
                                                  "leaked_bytes", "submit_lag_max_s")}
            return out
        finally:
            shutil.rmtree(stamps, ignore_errors=True)

    def small(self, latency_jobs: int, tiny_jobs: int) -> dict[str, Any]:
        lat = bench_mixed.run_latency(latency_jobs, tiny_jobs, self.say)
        return {"latency_ms": lat["latency_ms"], "tiny_jobs": tiny_jobs,
                "tiny_per_s": lat["completed_per_s"], "tiny_s": lat["all_ended_s"],
                "tiny_ok": lat["succeeded"]}

    def close(self) -> None:
        pass


def stamped_metrics(trace: list[TraceJob], submitted: dict[int, float], stamp_dir: Path, bound: LowerBound,
                    codes: list[int] | None = None) -> dict[str, Any]:
    """The figures of one run from its jobs' stamps (the same for every system); with the
    systems' exit ``codes``, how many were not 0."""
    records = records_from_stamps(trace, submitted, read_stamps(stamp_dir, trace))
    out = trace_metrics(records, bound, capacity_bytes=CARDS * USABLE_BYTES,
                        card_bytes=CARD_BYTES, max_jobs=MAX_JOBS)
    # Also against rig's usable memory (the card less vram_reserve_fraction), the bound rig
    # keeps itself to: above 80 GiB alone, a rig that broke its own reserve read as clean.
    out["rule_breaks"]["oversub_usable_card_s"] = rule_breaks(
        records, card_bytes=USABLE_BYTES, max_jobs=MAX_JOBS)["oversub_card_s"]
    if codes is not None:
        out["exit_codes_nonzero"] = sum(1 for c in codes if c != 0)
    return out


# -- Ray ------------------------------------------------------------------------------------------
class RaySystem:
    """One local Ray instance for the whole benchmark; fractional GPUs by memory."""

    name = "ray"

    def __init__(self, say: Say, warm_workers: int) -> None:
        import ray

        self.ray = ray
        self.say = say
        begin = time.monotonic()
        ray.init(num_gpus=CARDS, num_cpus=256, include_dashboard=False, log_to_driver=False,
                 object_store_memory=128 * 2**20, logging_level="ERROR")

        @ray.remote(num_cpus=1)
        def run(command: str) -> int:
            env = dict(os.environ,
                       CUDA_VISIBLE_DEVICES=",".join(str(g) for g in ray.get_gpu_ids()))
            return subprocess.run(["/bin/sh", "-c", command], env=env, check=False).returncode

        @ray.remote(num_cpus=1)
        def pause(seconds: float) -> int:
            time.sleep(seconds)
            return os.getpid()

        self.run = run
        self.version = ray.__version__
        up = time.monotonic() - begin
        # start a pool of workers so that the trace does not pay for starting them (Ray starts
        # a few at a time: repeat rounds of concurrent pauses until enough distinct workers ran)
        pids: set[int] = set()
        while len(pids) < warm_workers and time.monotonic() - begin < 180:
            pids |= set(ray.get([pause.remote(3.0) for _ in range(warm_workers)]))
        self.say(f"  [ray {self.version}] up in {up:.1f} s; {len(pids)} workers warm after "
                 f"{time.monotonic() - begin:.1f} s")

    @staticmethod
    def gpus_of(job: TraceJob) -> float:
        if job.gpus > 1:
            return float(job.gpus)
        return round(job.gpu_memory / CARD_BYTES, 4)

    def trace(self, trace: list[TraceJob], bound: LowerBound, timeout_s: float) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="ray-peers-stamps-"))
        refs = []
        try:
            def submit(job: TraceJob) -> None:
                cmd = stamped_command(str(stamps / str(job.index)), job_command(job))
                refs.append(self.run.options(num_gpus=self.gpus_of(job)).remote(cmd))

            submitted = replay(trace, submit)
            return stamped_metrics(trace, submitted, stamps, bound, self.ray.get(refs, timeout=timeout_s))
        finally:
            shutil.rmtree(stamps, ignore_errors=True)

    def small(self, latency_jobs: int, tiny_jobs: int) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="ray-peers-lat-"))
        try:
            latencies = []
            for n in range(latency_jobs):
                begin = time.time()
                ref = self.run.options(num_gpus=round(2 * GIB / CARD_BYTES, 4)).remote(
                    f"date +%s.%N > {stamps}/{n}")
                self.ray.get(ref, timeout=60)
                latencies.append((float((stamps / str(n)).read_text()) - begin) * 1000)
            begin = time.monotonic()
            refs = [self.run.options(num_gpus=round(GIB / CARD_BYTES, 4)).remote("true")
                    for _ in range(tiny_jobs)]
            codes = self.ray.get(refs, timeout=600)
            took = time.monotonic() - begin
            return small_jobs_result(latencies, tiny_jobs, took, sum(1 for c in codes if c == 0))
        finally:
            shutil.rmtree(stamps, ignore_errors=True)

    def close(self) -> None:
        self.ray.shutdown()


# -- plain Celery ---------------------------------------------------------------------------------
class CelerySystem:
    """8 plain Celery workers, one per card (rig.testing.peers_celery), on a private DB and
    key prefix of the benchmark's Redis."""

    name = "celery"

    def __init__(self, say: Say, url: str) -> None:
        self.say = say
        self.url = url
        self.prefix = f"rigpeers:{uuid.uuid4().hex[:10]}:"
        self.home = Path(tempfile.mkdtemp(prefix="celery-peers-"))
        ready = self.home / "ready"
        ready.mkdir()
        env = {"PEERS_BROKER_URL": url, "PEERS_PREFIX": self.prefix,
               "PEERS_QUEUE": f"peers-{uuid.uuid4().hex[:6]}", "PEERS_CARDS": str(CARDS),
               "PEERS_READY_DIR": str(ready)}
        os.environ.update(env)  # read by the app module, imported below
        from rig.testing import peers_celery

        self.mod = peers_celery
        self.procs: list[subprocess.Popen] = []
        celery_bin = str(Path(sys.executable).with_name("celery"))
        begin = time.monotonic()
        for card in range(CARDS):
            log = open(self.home / f"worker-{card}.log", "wb")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen(
                [celery_bin, "-A", "rig.testing.peers_celery", "worker", "-P", "solo",
                 "-c", "1", "--prefetch-multiplier", "1", "-n", f"card{card}@{self.prefix.replace(':', '-').strip('-')}",
                 "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "-l", "WARNING"],
                env=dict(os.environ, PEERS_CARD=str(card)), stdout=log, stderr=log,
                cwd=str(ROOT), start_new_session=True))
            log.close()
        deadline = time.monotonic() + 120
        while len(list(ready.iterdir())) < CARDS:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                raise RuntimeError(f"celery workers did not start; logs in {self.home}")
            time.sleep(0.1)
        say(f"  [celery] {CARDS} workers ready in {time.monotonic() - begin:.1f} s")

    def submit(self, command: str, gpus: int, priority: str):  # noqa: ANN201 - AsyncResult
        return self.mod.run.apply_async(args=[command, gpus],
                                        priority=self.mod.PRIORITY_STEPS[priority])

    def trace(self, trace: list[TraceJob], bound: LowerBound, timeout_s: float) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="celery-peers-stamps-"))
        results = []
        try:
            def submit(job: TraceJob) -> None:
                cmd = stamped_command(str(stamps / str(job.index)), job_command(job))
                results.append(self.submit(cmd, job.gpus, job.priority))

            submitted = replay(trace, submit)
            deadline = time.monotonic() + timeout_s
            codes = [r.get(timeout=max(1.0, deadline - time.monotonic())) for r in results]
            for r in results:
                r.forget()
            return stamped_metrics(trace, submitted, stamps, bound, codes)
        finally:
            shutil.rmtree(stamps, ignore_errors=True)

    def small(self, latency_jobs: int, tiny_jobs: int) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="celery-peers-lat-"))
        try:
            latencies = []
            for n in range(latency_jobs):
                begin = time.time()
                res = self.submit(f"date +%s.%N > {stamps}/{n}", 1, "high")
                res.get(timeout=60)
                res.forget()
                latencies.append((float((stamps / str(n)).read_text()) - begin) * 1000)
            begin = time.monotonic()
            results = [self.submit("true", 1, "low") for _ in range(tiny_jobs)]
            codes = [r.get(timeout=600) for r in results]
            took = time.monotonic() - begin
            for r in results:
                r.forget()
            return small_jobs_result(latencies, tiny_jobs, took, sum(1 for c in codes if c == 0))
        finally:
            shutil.rmtree(stamps, ignore_errors=True)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        try:
            self.mod.app.close()
        except Exception:  # noqa: BLE001 - closing connections only
            pass
        delete_prefix(redis.Redis.from_url(self.url), self.prefix)
        shutil.rmtree(self.home, ignore_errors=True)


# -- simple_gpu_scheduler -------------------------------------------------------------------------
class SgsSystem:
    """simple_gpu_scheduler (PyPI): one process reading commands from its stdin, one job per
    card at a time (CUDA_VISIBLE_DEVICES = that card), in arrival order. It knows no memory,
    no priorities and no multi-card jobs: a 2-card job runs on the one card it is given."""

    name = "sgs"

    def __init__(self, say: Say) -> None:
        import simple_gpu_scheduler  # noqa: F401 - fail early when it is not installed

        self.say = say
        self.version = _dist_version("simple-gpu-scheduler")

    @staticmethod
    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-u", "-m", "simple_gpu_scheduler.scheduler",
             "--gpus", ",".join(str(c) for c in range(CARDS))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)

    @staticmethod
    def finish(proc: subprocess.Popen, timeout_s: float) -> None:
        """Close its stdin and wait until every job it started has ended (its threads)."""
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise

    def trace(self, trace: list[TraceJob], bound: LowerBound, timeout_s: float) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="sgs-peers-stamps-"))
        proc = self.start()
        try:
            time.sleep(1.0)  # its start is not in the figures

            def submit(job: TraceJob) -> None:
                assert proc.stdin is not None
                proc.stdin.write(stamped_command(str(stamps / str(job.index)),
                                                 job_command(job)) + "\n")
                proc.stdin.flush()

            submitted = replay(trace, submit)
            self.finish(proc, timeout_s)
            return stamped_metrics(trace, submitted, stamps, bound)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            shutil.rmtree(stamps, ignore_errors=True)

    def small(self, latency_jobs: int, tiny_jobs: int) -> dict[str, Any]:
        stamps = Path(tempfile.mkdtemp(prefix="sgs-peers-lat-"))
        proc = self.start()
        try:
            assert proc.stdin is not None
            time.sleep(1.0)
            latencies = []
            for n in range(latency_jobs):
                stamp = stamps / str(n)
                begin = time.time()
                proc.stdin.write(f"date +%s.%N > {stamp}.tmp && mv {stamp}.tmp {stamp}\n")
                proc.stdin.flush()
                deadline = time.monotonic() + 60
                while not stamp.exists() and time.monotonic() < deadline:
                    time.sleep(0.001)
                latencies.append((float(stamp.read_text()) - begin) * 1000)
            self.finish(proc, 60)
            proc = self.start()
            assert proc.stdin is not None
            time.sleep(1.0)
            begin = time.monotonic()
            for _ in range(tiny_jobs):
                proc.stdin.write("true\n")
            proc.stdin.flush()
            self.finish(proc, 600)
            took = time.monotonic() - begin
            return small_jobs_result(latencies, tiny_jobs, took, tiny_jobs)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            shutil.rmtree(stamps, ignore_errors=True)

    def close(self) -> None:
        pass


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


# -- output ---------------------------------------------------------------------------------------
def _f(value: Any, fmt: str = "{:.1f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def print_table(title: str, columns: dict[str, dict[str, Any] | None],
                small: dict[str, dict[str, Any]], bound: LowerBound) -> None:
    names = list(columns)
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, get: Callable[[dict[str, Any]], str], src: str = "trace") -> None:
        cells = []
        for n in names:
            data = columns[n] if src == "trace" else small.get(n)
            if not data or "error" in data:
                cells.append("-")
            else:
                try:
                    cells.append(get(data))
                except (KeyError, TypeError):
                    cells.append("-")
        rows.append((label, cells))

    row("makespan (s)", lambda d: _f(d["makespan_s"]))
    row(f"x lower bound ({bound.value:.1f} s)", lambda d: _f(d["x_lower_bound"], "{:.2f}"))
    row("VRAM-time utilisation", lambda d: _f(100 * d["vram_time_utilisation"], "{:.0f} %"))
    row("  the same until the last start", lambda d: _f(100 * d["busy_utilisation"], "{:.0f} %"))
    for p in ("high", "low"):
        row(f"wait {p} p50 / p95 (s)",
            lambda d, p=p: f"{_f(d['wait_s'][p]['p50'])} / {_f(d['wait_s'][p]['p95'])}")
    row("wait 2-card jobs p50 / p95 (s)",
        lambda d: f"{_f(d['two_card_wait_s']['p50'])} / {_f(d['two_card_wait_s']['p95'])}")
    row(f"oversubscription > {CARD_BYTES / GIB:.0f} GiB (card-s)",
        lambda d: _f(d["rule_breaks"]["oversub_card_s"], "{:.2f}"))
    row(f"  > rig's usable {USABLE_BYTES / GIB:.0f} GiB (card-s)",
        lambda d: _f(d["rule_breaks"]["oversub_usable_card_s"], "{:.2f}"))
    row(f"cap breaks > {MAX_JOBS} jobs (card-s)",
        lambda d: _f(d["rule_breaks"]["cap_card_s"], "{:.2f}"))
    row("peak on a card: GiB / jobs",
        lambda d: f"{d['rule_breaks']['peak_gib']:.0f} / {d['rule_breaks']['peak_jobs']}")
    row("jobs ended (stamps)", lambda d: f"{d['ended']}/{d['jobs']}")
    row("jobs given fewer/more cards than asked", lambda d: str(d["jobs_wrong_card_count"]))
    row("tiny jobs (true) /s", lambda d: _f(d["tiny_per_s"], "{:.0f}"), src="small")
    row("idle submit -> 1st instr. p50 / p99 (ms)",
        lambda d: f"{_f(d['latency_ms']['p50'])} / {_f(d['latency_ms']['p99'])}", src="small")
    rows.append(("order / 2-card jobs", [NOTES[n] for n in names]))
    width = max(len(label) for label, _ in rows) + 2
    col = max(16, *(len(LABELS[n]) + 2 for n in names),
              *(len(c) + 2 for _, cells in rows for c in cells))
    print(f"\n{title}")
    print("".ljust(width) + "".join(LABELS[n].rjust(col) for n in names))
    for label, cells in rows:
        print(label.ljust(width) + "".join(c.rjust(col) for c in cells))
    for n in names:
        data = columns[n]
        if data and "error" in data:
            print(f"  {n}: {data['error']}")


def print_ratios(systems: list[str], seeds: list[int], factors: list[float], histories: list[bool],
                 column: Callable[[str, int, float, bool], dict[str, Any] | None]) -> dict[str, Any]:
    """Print rig's makespan over each peer's, per seed, and return them ("limits ..., history
    ... / peer" -> seed -> ratio). Nothing, not even the heading, without rig and a peer."""
    summary: dict[str, Any] = {}
    peers = [s for s in systems if s != "rig"]
    if "rig" not in systems or not peers:  # a ratio needs both: a lone heading said nothing
        return summary
    print("\nmakespan ratio rig / peer per seed (below 1: rig ends first)")
    for factor in factors:
        for history in histories:
            label = f"limits {'x' + str(factor) if factor else 'none'}, history " \
                    f"{'on' if history else 'off'}"
            for peer in peers:
                ratios = {}
                for seed in seeds:
                    a, b = column("rig", seed, factor, history), column(peer, seed, 0, False)
                    if a and b and "error" not in a and "error" not in b:
                        ratios[seed] = a["makespan_s"] / b["makespan_s"]
                summary[f"{label} / {peer}"] = ratios
                cells = ", ".join(f"seed {s}: {r:.2f}" for s, r in ratios.items())
                mean = sum(ratios.values()) / len(ratios) if ratios else math.nan
                print(f"  {label:<28} rig / {peer:<7} {cells}; mean {_f(mean, '{:.2f}')}")
    return summary


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def seed_list(text: str) -> list[int]:
    """``--seeds 8,3,5``: whole numbers, comma-separated (``""``: none, only the tiny jobs'
    figures); anything else is refused by argparse in one line, exit 2."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give whole numbers separated by commas, e.g. 8,3,5 (got {text!r})") from None


def broker_url() -> tuple[str, str]:
    """The Celery peer's broker and where it came from: $PEERS_BROKER_URL, else DB 11 of the
    Redis rig's nodes use (rig.testing.bench_redis)."""
    if os.environ.get("PEERS_BROKER_URL", "").strip():
        return os.environ["PEERS_BROKER_URL"].strip(), "$PEERS_BROKER_URL"
    url, source = bench_redis_url()
    return with_db(url, 11), f"DB 11 of {'$' + source if source != 'default' else 'the default'}"


def main() -> int:
    from rig.redis_conn import strip_password

    broker, broker_source = broker_url()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"{described()}\nCelery's broker: $PEERS_BROKER_URL, else DB 11 of that Redis; now "
               f"{broker_source}: {strip_password(broker)}")
    parser.add_argument("--seeds", type=seed_list, default="8,3,5", help="comma list of trace seeds")
    have_sgs = importlib.util.find_spec("simple_gpu_scheduler") is not None
    parser.add_argument("--systems", default=",".join(s for s in SYSTEMS if s != "sgs" or have_sgs),
                        help=f"comma list of {', '.join(SYSTEMS)} (default: all installed)")
    parser.add_argument("--time-limits", default="both",
                        help="both (0 and 1.5), or one factor: rig's --time-limit = duration x "
                        "FACTOR + 0.5 s (0: none); the peers ignore it")
    parser.add_argument("--history", default="both", choices=("both", "off", "on"),
                        help="off: every job a new name; on: names repeat per kind and memory "
                        "bucket, so rig can learn from earlier jobs of the run")
    parser.add_argument("--jobs", type=count_at_least(1), default=200)
    parser.add_argument("--skip-tiny", action="store_true",
                        help="skip the tiny jobs' throughput and the idle latency")
    parser.add_argument("--tiny-jobs", type=count_at_least(1), default=500)
    parser.add_argument("--latency-jobs", type=count_at_least(1), default=50)
    parser.add_argument("--ray-warm-workers", type=count_at_least(0), default=128,
                        help="Ray workers started before the trace (not timed)")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0)
    parser.add_argument("--json", type=writable_file)
    args = parser.parse_args()
    # SIGTERM (`timeout`) runs the finally blocks: the throwaway node stops and its key prefix
    # leaves Redis (by default the shared one; killed outright, 57 keys stayed).
    exit_on_sigterm()

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    print("$ " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))
    seeds: list[int] = args.seeds
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if not systems:
        parser.error(f"--systems: give one or more of {', '.join(SYSTEMS)} (got {args.systems!r})")
    if args.time_limits == "both":
        factors = [0.0, 1.5]
    else:
        try:
            factors = [time_limit_factor(args.time_limits)]
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--time-limits: give both, or {str(exc).removeprefix('give ')}")
    histories = {"both": [False, True], "off": [False], "on": [True]}[args.history]
    url = broker
    if seeds or not args.skip_tiny:  # something will run: on rig's Redis and Celery's broker
        used = ([bench_redis_url()[0]] if "rig" in systems else []) + ([broker] if "celery" in systems else [])
        unusable = next(filter(None, map(redis_problem, used)), None)
        if unusable:
            print(f"bench_peers.py: {unusable}", file=sys.stderr)
            return REDIS_EXIT
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = "?"
    print(f"rig commit {commit}; {CARDS} x 80 GiB fake cards, max {MAX_JOBS} jobs a card; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    traces = {seed: generate_trace(args.jobs, seed) for seed in seeds}
    bounds = {seed: lower_bound(t, cards=CARDS, usable_per_card=USABLE_BYTES,
                                max_jobs_per_card=MAX_JOBS) for seed, t in traces.items()}
    for seed, trace in traces.items():
        print(f"seed {seed}: {len(trace)} jobs, {sum(1 for j in trace if j.gpus > 1)} on 2 cards, "
              f"{sum(1 for j in trace if j.arrival == 0)} at 0 s; lower bound "
              f"{bounds[seed].value:.1f} s ({bounds[seed].binding})")
    sys.stdout.flush()

    # figures[system]["peer"][seed] or figures["rig"][(seed, factor, history)]
    runs: dict[str, dict[Any, dict[str, Any]]] = {s: {} for s in systems}
    small: dict[str, dict[str, Any]] = {}
    versions: dict[str, str] = {}
    # one system at a time, so that none idles beside another's run
    for name in systems:
        system: Any = None
        try:
            if name == "rig":
                system = RigSystem(say)
                versions["rig"] = f"{commit} ({system.strategy})"
            elif name == "ray":
                system = RaySystem(say, args.ray_warm_workers)
                versions["ray"] = system.version
            elif name == "sgs":
                system = SgsSystem(say)
                versions["sgs"] = system.version
            else:
                system = CelerySystem(say, url)
                import celery

                versions["celery"] = celery.__version__
            for seed in seeds:
                trace, bound = traces[seed], bounds[seed]
                keys = [(seed, f, h) for f in factors for h in histories] if name == "rig" \
                    else [seed]
                for key in keys:
                    say(f"  [{name}] seed {seed}" + (f", time limits x{key[1]}, history "
                                                     f"{'on' if key[2] else 'off'}"
                                                     if name == "rig" else ""))
                    try:
                        if name == "rig":
                            runs[name][key] = system.trace(trace, bound, key[1], key[2],
                                                           args.timeout)
                        else:
                            runs[name][key] = system.trace(trace, bound, args.timeout)
                        say(f"  [{name}] makespan {runs[name][key]['makespan_s']:.1f} s")
                    except Exception as exc:  # noqa: BLE001 - one broken run must not hide the rest
                        runs[name][key] = {"error": f"failed: {exc!r}"}
                        say(f"  [{name}] failed: {exc!r}")
            if not args.skip_tiny:
                try:
                    small[name] = system.small(args.latency_jobs, args.tiny_jobs)
                except Exception as exc:  # noqa: BLE001
                    small[name] = {"error": f"failed: {exc!r}"}
                    say(f"  [{name}] small jobs failed: {exc!r}")
        except Exception as exc:  # noqa: BLE001
            say(f"  [{name}] could not run: {exc!r}")
            for seed in seeds:
                runs[name].setdefault(seed, {"error": f"could not run: {exc!r}"})
        finally:
            if system is not None:
                system.close()

    def column(name: str, seed: int, factor: float, history: bool) -> dict[str, Any] | None:
        if name == "rig":
            return runs[name].get((seed, factor, history)) or runs[name].get(seed)
        return runs[name].get(seed)

    print(f"\nversions: {versions}")
    print("peers (Ray, Celery, simple_gpu_scheduler) ignore time limits and names: one run per seed, repeated in "
          "each table of that seed")
    for seed in seeds:
        for factor in factors:
            for history in histories:
                title = (f"== seed {seed}, {args.jobs} jobs, rig time limits "
                         f"{'x' + str(factor) if factor else 'none'}, name history "
                         f"{'on' if history else 'off'}")
                print_table(title, {n: column(n, seed, factor, history) for n in systems},
                            small, bounds[seed])

    summary = print_ratios(systems, seeds, factors, histories, column)

    if args.json:
        report = {
            "command": sys.argv, "commit": commit, "versions": versions, "seeds": seeds,
            "jobs": args.jobs, "factors": factors, "histories": histories,
            "lower_bounds_s": {s: b.value for s, b in bounds.items()},
            "runs": {n: {("/".join(str(x) for x in k) if isinstance(k, tuple) else str(k)): v
                         for k, v in d.items()} for n, d in runs.items()},
            "small_jobs": small, "summary": summary,
        }
        args.json.write_text(json.dumps(_clean(report), indent=2))
        print(f"\nfigures written to {args.json}")
    failed = [n for n, d in runs.items() for v in d.values() if "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
