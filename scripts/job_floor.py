#!/usr/bin/env python3
"""The floor of a tiny job's cost on this machine, process by process (issue 13's 300 jobs/s).

300 tiny jobs a second on 2 cores leave 6.7 ms of CPU per job for every process together.
This script measures, on this machine and in one run, what the parts a rig job cannot do
without cost when each is done alone and as cheaply as Python and the kernel allow, then adds
them up the way rig's design needs them per job (the round trips counted in
docs/PERFORMANCE.md, "The per-job cost, round 5"). CPU is the calling thread's
(``time.thread_time``, kernel time included) or, for processes it starts, their reaped CPU
(``RUSAGE_CHILDREN``); Redis's own CPU from ``INFO cpu`` of a private redis-server. Every
figure is the median of ``--rounds`` rounds of ``--n`` calls each (ms per call).

    .venv/bin/python scripts/job_floor.py [--port 6432] [--n 300] [--rounds 5] [--dir /tmp]

Needs ``redis-server`` on PATH (started on ``--port``, no persistence, stopped at the end).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.logs import AttemptFiles  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from workers.log_space import prepare_attempt  # noqa: E402
from workers.process_tree import ExitWatcher, job_leftovers, wrapper_argv  # noqa: E402


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def per_call(fn: Callable[[int], None], n: int, rounds: int) -> tuple[float, float]:
    """(median over rounds of this thread's CPU ms per call, of reaped children's CPU ms per call)."""
    own, kids = [], []
    fn(0)  # warm
    for _ in range(rounds):
        t0, c0 = time.thread_time(), children_cpu_s()
        for i in range(n):
            fn(i)
        own.append(1000 * (time.thread_time() - t0) / n)
        kids.append(1000 * (children_cpu_s() - c0) / n)
    return statistics.median(own), statistics.median(kids)


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=6432)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/tmp", help="where the attempt files are made (the log dir's file system)")
    args = parser.parse_args()
    n, rounds = args.n, args.rounds
    from rig.testing.throwaway_redis import start_redis

    work = Path(tempfile.mkdtemp(prefix="rig-floor-", dir=args.dir))
    server = start_redis(args.port, work / "redis")
    shm = Path(tempfile.mkdtemp(prefix="rig-floor-", dir="/dev/shm"))
    rows: dict[str, tuple[float, float]] = {}
    try:
        r = redis.Redis(port=args.port, decode_responses=True)
        print(f"load average {os.getloadavg()[0]:.1f} at start; {n} calls a round, median of {rounds} rounds")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RIG_EXIT_FD": "0", "RIG_EXIT_FILE": str(work / "x")}

        def popen(argv: list[str]) -> Callable[[int], None]:
            def run(_i: int) -> None:
                exit_fd = os.open(work / "x", os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    p = subprocess.Popen(argv, env=env, stdin=exit_fd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         start_new_session=True, close_fds=True)
                finally:
                    os.close(exit_fd)
                watcher = ExitWatcher(p.pid)
                watcher.wait(10)
                watcher.close()
                p.wait()
            return run

        rows["process: `true` (vfork + exec), watched by a pidfd, reaped"] = per_call(popen(["true"]), n, rounds)
        rows["process: rig's wrapper (`sh -c WRAPPER`) running `true`"] = per_call(popen(wrapper_argv(["true"])), n, rounds)
        rows["process: a `--cmd` job, `sh -c true` under the wrapper"] = per_call(
            popen(wrapper_argv(["sh", "-c", "true"])), n, rounds)

        def attempt(base: Path) -> Callable[[int], None]:
            def run(i: int) -> None:
                os.close(prepare_attempt(AttemptFiles(base / f"{time.monotonic_ns()}-{i}", 1)))
            return run

        rows[f"files: an attempt's folder + exit, pid, note, log (`prepare_attempt`) in {args.dir}"] = \
            per_call(attempt(work), n, rounds)
        rows["files: the same in /dev/shm (tmpfs)"] = per_call(attempt(shm), n, rounds)

        def one_file(i: int) -> None:
            fd = os.open(work / f"one-{time.monotonic_ns()}-{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
        rows[f"files: one empty file created in {args.dir}"] = per_call(one_file, n, rounds)

        rows["thread: start + join (a job's own thread)"] = per_call(
            lambda _i: (lambda t: (t.start(), t.join()))(threading.Thread(target=lambda: None)), n, rounds)

        p = subprocess.Popen(["true"])
        p.wait()
        rows["/proc: the end's sweep, window walked (`job_leftovers`, young job)"] = per_call(
            lambda _i: job_leftovers(p.pid, "RIG_EXIT_FILE", "none", None, first_pid=p.pid, age=0.001), n, rounds)
        import workers.process_tree as process_tree
        walk_max = process_tree.WINDOW_WALK_MAX
        process_tree.WINDOW_WALK_MAX = 0  # the listing of /proc, filtered by the window (before round 5)
        try:
            rows["/proc: the same sweep from a listing of /proc (before round 5)"] = per_call(
                lambda _i: job_leftovers(p.pid, "RIG_EXIT_FILE", "none", None, first_pid=p.pid, age=0.001), n, rounds)
        finally:
            process_tree.WINDOW_WALK_MAX = walk_max

        record = Job(id=7, name="t", user="u", command=["true"], gpu_memory=2**30, gpus=1, priority=Priority.MEDIUM,
                     state=JobState.RUNNING, workdir="/tmp", created_at=time.time(), env={"HOME": "/root", "LANG": "C"},
                     node="n1", cards=[0], assignments=1, attempt=1, instance="0123456789abcdef").to_redis()
        rows[f"parse: a job's record (`Job.from_redis`, {len(record)} fields)"] = per_call(
            lambda _i: Job.from_redis(record), n, rounds)

        key = "floor:h"
        r.hset(key, mapping={f"f{i}": "x" * 20 for i in range(50)})
        sha = r.script_load("return redis.call('HGET', KEYS[1], ARGV[1])")

        def server_side(fn: Callable[[int], None]) -> tuple[float, float, float]:
            s0 = redis_cpu_s(r)
            own, _ = per_call(fn, n, rounds)
            return own, 1000 * (redis_cpu_s(r) - s0) / (n * (rounds + 1)), 0.0

        for name, fn in (
            ("redis: one round trip (HGET), redis-py + hiredis", lambda _i: r.hget(key, "f1")),
            ("redis: one round trip (EVALSHA of a one-line script)", lambda _i: r.evalsha(sha, 1, key, "f1")),
            ("redis: HGETALL of a 50-field hash (a job record's size)", lambda _i: r.hgetall(key)),
            ("redis: a pipeline of 4 commands (one round trip)",
             lambda _i: (lambda p: (p.hget(key, "f1"), p.hget(key, "f2"), p.hmget(key, "f3", "f4"), p.exists(key),
                                    p.execute()))(r.pipeline(transaction=False))),
        ):
            own, srv, _ = server_side(fn)
            rows[name] = (own, srv)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    print("\n| part, done alone | this process (ms of CPU per call) | its children / redis-server (ms) |")
    print("|---|---|---|")
    for name, (own, other) in rows.items():
        print(f"| {name} | {own:.3f} | {other:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
