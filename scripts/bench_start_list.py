#!/usr/bin/env python3
"""What the start list costs a card worker: CPU per tiny job (``true``) when ``run_job`` is
called directly, one job after another ('direct'), and when the same jobs are taken from the
card's start list by the runner's consumer (workers.start_list: BLMOVE, a thread per start, the
removal pipelined with the claim), one at a time ('list-1': max_task_per_gpu 1, the cost of the
list alone) and four at a time ('list-4', as a card worker runs them: adds the cost of running
jobs side by side, which Celery's pool of 4 threads had too). One CardRunner in this process, no Celery, one card (big enough
for every job at once), alternating the two ways; the CPU is this process's (getrusage), the
jobs' own processes not included.

    .venv/bin/python scripts/bench_start_list.py [--jobs 200] [--rounds 2]
        [--redis redis://127.0.0.1:6411/0]

Use a Redis of your own (keys go under a fresh prefix and are deleted at the end).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.client import current_identity  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from workers.card_runner import CardRunner  # noqa: E402


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_round(url: str, jobs: int, mode: str) -> tuple[float, float]:
    """(ms of CPU per job, jobs/s) of ``jobs`` tiny jobs run ``mode`` ('direct', 'list-1', 'list-4')."""
    home = Path(tempfile.mkdtemp(prefix="rig-startlist-"))
    prefix = f"rigsl:{uuid.uuid4().hex[:8]}:"
    settings = load_settings(key_prefix=prefix, redis_url=url, home=home / "home", node_name="n1",
                             max_task_per_gpu=1 if mode == "list-1" else 4)
    r = redis.Redis.from_url(url, decode_responses=True)
    ledger = Ledger(r, Keys(prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=(jobs + 1) * GIB),
                         max_jobs=jobs + 1, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    placed = []
    for _ in range(jobs):
        job = ledger.store.create(Job(
            id=0, name="t", user=current_identity().name, command=["true"], gpu_memory=GIB, gpus=1,
            priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(home), created_at=time.time()))
        ok, token = ledger.reserve(job.id, "n1", [0], GIB)
        assert ok, token
        placed.append((job.id, token))
    try:
        cpu0, wall0 = cpu_s(), time.monotonic()
        if mode == "direct":
            for job_id, token in placed:
                runner.run_job(job_id, token)
        else:
            runner.consumer.start()
            while r.llen(runner.starts.starts) or r.llen(runner.starts.taking) or runner.consumer.handling():
                time.sleep(0.005)
        cpu1, wall1 = cpu_s(), time.monotonic()
        states = {job.state for job in ledger.store.get_many([j for j, _ in placed])}
        assert states == {JobState.SUCCEEDED}, states
        return 1000 * (cpu1 - cpu0) / jobs, jobs / (wall1 - wall0)
    finally:
        runner.stop()
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--redis", default="redis://127.0.0.1:6411/0")
    args = parser.parse_args()
    print(f"{args.jobs} tiny jobs a round, load average {os.getloadavg()[0]:.1f} at start")
    print("| round | way | CPU ms per job (this process) | jobs/s |")
    print("|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        for mode in ("direct", "list-1", "list-4"):
            per_job, rate = one_round(args.redis, args.jobs, mode)
            print(f"| {n} | {mode} | {per_job:.2f} | {rate:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
