#!/usr/bin/env python3
"""What the start list costs a card worker: CPU per tiny job (``true``) when ``run_job`` is
called directly, one job after another ('direct'), and when the same jobs are taken from the
card's start list by the runner's consumer (workers.start_list: BLMOVE, a thread per start, the
removal pipelined with the claim), one at a time ('list-1': max_task_per_gpu 1, the cost of the
list alone) and four at a time ('list-4', as a card worker runs them: adds the cost of running
jobs side by side, which Celery's pool of 4 threads had too). One CardRunner in this process, no Celery, one card (big enough
for every job at once), alternating the two ways; the CPU is this process's (getrusage), the
jobs' own processes not included. Beside it, what the log keepers spent on the same jobs: the
card's keeper process (utime+stime from /proc) and any keeper that ended during the round (its
own CPU, marked at its end: rig.logkeeper, RIG_TRACE_DIR in the keepers' environment only).

    .venv/bin/python scripts/bench_start_list.py [--jobs 200] [--rounds 2] [--modes direct]
        [--redis redis://127.0.0.1:6411/0] [--tree DIR]

``--tree DIR`` runs the rig and workers packages found in DIR (e.g. another commit's, from
``git archive``) instead of this checkout's. Each row also counts this process's Redis round
trips per job (requests written to a connection: a pipeline is one; the BLMOVE waits of the
list ways included). ``--modes ending`` times a job's ending alone: ``workers.outcomes.conclude``
of each of the jobs, claimed and read beforehand (a success of ``runtime`` 0.01 s: its run
history is written), on the calling thread's CPU clock.

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


def _tree() -> str:
    """The folder whose rig and workers packages run: ``--tree DIR``, else this checkout."""
    for i, arg in enumerate(sys.argv):
        if arg == "--tree" and i + 1 < len(sys.argv):
            return str(Path(sys.argv[i + 1]).resolve())
        if arg.startswith("--tree="):
            return str(Path(arg.split("=", 1)[1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _tree())

import redis  # noqa: E402

from rig import jobtrace  # noqa: E402
from rig.client import current_identity  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from workers.card_runner import CardRunner  # noqa: E402
from workers.outcomes import AttemptEnd, conclude  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROUND_TRIPS = [0]  # requests this process wrote to a Redis connection


def _count_round_trips() -> None:
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):  # noqa: ANN001, ANN202
        ROUND_TRIPS[0] += 1
        return send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (s), 0 when gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0.0
    fields = data[data.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def keepers_ended_cpu_s(trace_dir: Path, since: float, until: float, but: int) -> float:
    """The own CPU (s) of the keepers that ended between ``since`` and ``until`` (epoch s),
    but process ``but`` (the card's keeper, counted from /proc)."""
    total = 0.0
    for path in trace_dir.glob("*.trace"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[1] == "keeper_end" and int(parts[3]) != but \
                    and since <= float(parts[2]) <= until:
                total += float(parts[5])
    return total


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_round(url: str, jobs: int, mode: str) -> tuple[float, float, float, float]:
    """(ms of CPU per job in this process, ms per job in the log keepers, jobs/s, round trips per
    job) of ``jobs`` tiny jobs run ``mode`` ('direct', 'list-1', 'list-4')."""
    home = Path(tempfile.mkdtemp(prefix="rig-startlist-"))
    trace_dir = home / "trace"
    trace_dir.mkdir()
    jobtrace.environ = lambda: {"RIG_TRACE_DIR": str(trace_dir)}  # the keepers mark their CPU; no one else
    prefix = f"rigsl:{uuid.uuid4().hex[:8]}:"
    settings = load_settings(key_prefix=prefix, redis_url=url, home=home / "home", node_name="n1",
                             max_task_per_gpu=1 if mode == "list-1" else 4)
    r = redis.Redis.from_url(url, decode_responses=True)
    ledger = Ledger(r, Keys(prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=(jobs + 1) * GIB),
                         max_jobs=jobs + 1, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    server = runner._keeper_server().proc.pid  # started before the round, as start_services does
    placed = []
    for _ in range(jobs):
        job = ledger.store.create(Job(
            id=0, name="t", user=current_identity().name, command=["true"], gpu_memory=GIB, gpus=1,
            priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(home), created_at=time.time()))
        ok, token = ledger.reserve(job.id, "n1", [0], GIB)
        assert ok, token
        placed.append((job.id, token))
    try:
        trips0 = ROUND_TRIPS[0]
        cpu0, wall0, server0, epoch0 = cpu_s(), time.monotonic(), proc_cpu_s(server), time.time()
        if mode == "ending":
            for job_id, token in placed:
                assert ledger.claim(job_id, token, "card0@n1")[0]
            ledger.load_scripts()
            running = [(ledger.store.get(job_id), token) for job_id, token in placed]
            trips0, cpu0, wall0 = ROUND_TRIPS[0], time.thread_time(), time.monotonic()
            for job, token in running:
                assert conclude(ledger, job, token, AttemptEnd(exit_code=0, ended_at=time.time(), runtime=0.01))[0] == 1
            cpu1, wall1 = time.thread_time(), time.monotonic()
            return 1000 * (cpu1 - cpu0) / jobs, 0.0, jobs / (wall1 - wall0), (ROUND_TRIPS[0] - trips0) / jobs
        if mode == "direct":
            for job_id, token in placed:
                runner.run_job(job_id, token)
        else:
            runner.consumer.start()
            while r.llen(runner.starts.starts) or r.llen(runner.starts.taking) or runner.consumer.handling():
                time.sleep(0.005)
        cpu1, wall1, server1 = cpu_s(), time.monotonic(), proc_cpu_s(server)
        trips = (ROUND_TRIPS[0] - trips0) / jobs
        time.sleep(0.2)  # the last keepers' end marks
        keepers = server1 - server0 + keepers_ended_cpu_s(trace_dir, epoch0, time.time(), server)
        states = {job.state for job in ledger.store.get_many([j for j, _ in placed])}
        assert states == {JobState.SUCCEEDED}, states
        return 1000 * (cpu1 - cpu0) / jobs, 1000 * keepers / jobs, jobs / (wall1 - wall0), trips
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
    parser.add_argument("--modes", default="direct,list-1,list-4", help="comma-separated, of direct, list-1, list-4, ending")
    parser.add_argument("--tree", default=None, help="run the rig and workers packages of DIR (read at import)")
    args = parser.parse_args()
    print(f"{args.jobs} tiny jobs a round, load average {os.getloadavg()[0]:.1f} at start, code from {_tree()}")
    _count_round_trips()
    print("| round | way | CPU ms per job: this process | log keepers | both | jobs/s | round trips per job |")
    print("|---|---|---|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        for mode in args.modes.split(","):
            per_job, keepers, rate, trips = one_round(args.redis, args.jobs, mode)
            print(f"| {n} | {mode} | {per_job:.2f} | {keepers:.2f} | {per_job + keepers:.2f} | {rate:.0f} | "
                  f"{trips:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
