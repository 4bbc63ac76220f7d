#!/usr/bin/env python3
"""Dispatch latency and throughput of a real rig node on fake cards.

Starts a throwaway node (real Redis at $RIG_BENCH_REDIS_URL or 127.0.0.1:6379 under a private
key prefix, real Celery workers on fake 8x80G cards, no Flower, no beat) and prints:

  * submissions/s through the Python API with no node running (Redis and the client alone,
    the jobs only queued, under a second private prefix), before the node starts;
  * idle dispatch latency: submit() call -> the job's process has started, p50 / p99 over
    N sequential jobs (each job records its own start time);
  * throughput of M tiny jobs (`true`) submitted as fast as the Python API allows, one
    submit() call each and then once more with one submit_many() call: submissions/s while the
    node runs them on the same machine, and completions/s from the first submit to the last
    job ending.

    .venv/bin/python scripts/bench_dispatch.py [--latency-jobs 50] [--tiny-jobs 1000]

With ``--idle-passes N`` it measures only the dispatcher's pass after one submission, in this
process, with no workers: 8 x 80 GiB cards (4 jobs a card), 0..31 running jobs (each pass starts
the one new 2 GiB job, which is then claimed), N times over; per number of running jobs, the
pass's CPU (this thread's, ms) and its requests written to Redis (round trips: a pipeline is
one; the shared clock's TIME anchor counted too), and over all passes the wall time. ``--tree DIR``: the dispatcher of another
tree (a folder holding its rig/ and workers/, e.g. main's ``git archive``), to alternate with:

    .venv/bin/python scripts/bench_dispatch.py --idle-passes 5 [--tree /tmp/ip-old]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--tree" in sys.argv:  # another tree's rig and workers (--idle-passes): imported from there
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()))

import redis  # noqa: E402

from rig.client import Client  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.models import JobState  # noqa: E402
from rig.stack import Stack, UpOptions  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-jobs", type=int, default=50)
    parser.add_argument("--tiny-jobs", type=int, default=1000)
    parser.add_argument("--fake-gpus", default="8x80G")
    parser.add_argument("--idle-passes", type=int, default=0, help="only the pass after one submission, N times")
    parser.add_argument("--tree", default="", help="with --idle-passes: the dispatcher of this tree")
    args = parser.parse_args()
    if args.idle_passes:
        return idle_passes(args.idle_passes, args.tree)

    url = os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"rigbench:{uuid.uuid4().hex[:8]}:"
    home = Path(tempfile.mkdtemp(prefix="rig-bench-"))
    settings = load_settings(home=home, redis_url=url, key_prefix=prefix, fake_gpus=args.fake_gpus,
                             node_name="bench", max_task_per_gpu=4)
    stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=lambda m: None)
    r = redis.Redis.from_url(url)
    try:
        alone = load_settings(home=home, redis_url=url, key_prefix=f"rigbench:{uuid.uuid4().hex[:8]}:",
                              node_name="bench")
        api = Client(alone)
        api.submit("true", gpu_memory="1G")  # warm the Celery producer
        begin = time.monotonic()
        for _ in range(args.tiny_jobs):
            api.submit(["true"], gpu_memory="1G", priority="low")
        queued = time.monotonic() - begin
        api.flush(60)
        sent = time.monotonic() - begin
        print(f"Python API alone (no node): {args.tiny_jobs} submissions, {args.tiny_jobs / queued:.0f}/s "
              f"({args.tiny_jobs / sent:.0f}/s counting the Celery messages sent in the background)")
        begin = time.monotonic()
        api.submit_many([{"command": ["true"], "gpu_memory": "1G", "priority": "low"}] * args.tiny_jobs)
        queued = time.monotonic() - begin
        api.flush(60)
        print(f"Python API alone (no node): submit_many of {args.tiny_jobs}: {args.tiny_jobs / queued:.0f}/s "
              f"({args.tiny_jobs / (time.monotonic() - begin):.0f}/s counting the Celery messages)")
        _delete(r, alone.key_prefix)

        t0 = time.monotonic()
        stack.up()
        missing = stack.wait_ready(timeout=180)
        if missing:
            print(f"workers did not start: {missing}", file=sys.stderr)
            return 1
        print(f"node up with {args.fake_gpus} in {time.monotonic() - t0:.1f} s")
        client = Client(settings)
        client.submit("true", gpu_memory="1G").wait(60)  # warm the Celery producer

        stamp_dir = home / "stamps"
        stamp_dir.mkdir()
        latencies = []
        for _ in range(args.latency_jobs):
            begin = time.time()
            handle = client.submit(["sh", "-c", f'date +%s.%N > {stamp_dir}/"$RIG_JOB_ID"'], gpu_memory="2G")
            handle.wait(60)
            started = float((stamp_dir / str(handle.id)).read_text())
            latencies.append((started - begin) * 1000)
        print(f"idle dispatch latency (submit -> process start), {len(latencies)} jobs: "
              f"p50 {statistics.median(latencies):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms, "
              f"max {max(latencies):.1f} ms")

        tiny = {"command": ["true"], "gpu_memory": "1G", "priority": "low"}
        _tiny_jobs("", args.tiny_jobs, client,
                   lambda n: [client.submit(tiny["command"], gpu_memory="1G", priority="low") for _ in range(n)])
        _tiny_jobs(" with submit_many", args.tiny_jobs, client, lambda n: client.submit_many([tiny] * n))
        over = [c.id for c in client.ledger.cards() if c.reserved or c.jobs]
        print(f"reservations left after the run: {over or 'none'}")
        return 0
    finally:
        stack.down()
        _delete(r, prefix)


def _tiny_jobs(label: str, count: int, client: Client, submit_all) -> None:  # noqa: ANN001
    """Submit ``count`` tiny jobs with ``submit_all(count)``; print submissions/s and completions/s."""
    begin = time.monotonic()
    handles = submit_all(count)
    submitted = time.monotonic() - begin
    finals = [client.wait(h.id, timeout=600) for h in handles]
    total = time.monotonic() - begin
    ok = sum(1 for f in finals if f.state is JobState.SUCCEEDED)
    print(f"{count} tiny jobs{label}: submitted {count / submitted:.0f} jobs/s ({submitted:.2f} s); "
          f"all ended after {total:.2f} s = {count / total:.0f} jobs/s; succeeded {ok}/{count}")


def idle_passes(reps: int, tree: str) -> int:
    """The dispatcher's pass after one submission on 8 cards with 0..31 running jobs (see the
    module doc): CPU ms and requests written per pass."""
    import redis.connection

    from rig.gpus.base import GpuReading
    from rig.keys import Keys
    from rig.ledger import Ledger
    from rig.memory import GIB
    from rig.models import Job, Priority
    from rig.nodes import NodeRegistry
    from workers import dispatcher as module
    if tree and not module.__file__.startswith(str(Path(tree).resolve())):
        raise SystemExit(f"the dispatcher was imported from {module.__file__}, not {tree}")
    print(f"dispatcher: {module.__file__}; load average {os.getloadavg()[0]:.1f}")
    sent = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):  # noqa: ANN001
        sent[0] += 1
        return original(self, command, check_health)
    redis.connection.AbstractConnection.send_packed_command = counting
    url = os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    cpu: dict[int, list[float]] = {}
    wall: list[float] = []
    trips: dict[int, list[int]] = {}
    for _ in range(reps):
        prefix = f"rigbench:{uuid.uuid4().hex[:8]}:"
        settings = load_settings(home=Path(tempfile.mkdtemp(prefix="rig-bench-")), redis_url=url, key_prefix=prefix,
                                 node_name="bench", max_task_per_gpu=4)
        r = redis.Redis.from_url(url, decode_responses=True)
        keys = Keys(prefix)
        ledger = Ledger(r, keys)
        NodeRegistry(r, keys).register("bench", ttl=3600)
        for index in range(8):
            ledger.register_card("bench", GpuReading(index, f"GPU-{index}", "Fake 80G", 80 * GIB, 0, 0, 40),
                                 max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
        starts: list = []
        dispatcher = module.Dispatcher(settings, lambda *start, starts=starts: starts.append(start), client=r)
        try:
            dispatcher.dispatch_pass()  # nothing waits: the cards are read and kept
            for running in range(32):
                ledger.store.create_many([(Job(id=0, name="idle", user="alice", command=["true"], gpu_memory=2 * GIB,
                                               gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING,
                                               workdir="/tmp", created_at=0.0), None)])
                sent[0] = 0
                began, clock = time.thread_time(), time.perf_counter()
                placed = dispatcher.dispatch_pass()
                cpu.setdefault(running, []).append((time.thread_time() - began) * 1000)
                wall.append((time.perf_counter() - clock) * 1000)
                trips.setdefault(running, []).append(sent[0])
                if placed != 1:
                    raise SystemExit(f"the pass started {placed} jobs, not 1")
                job_id, token, _node, card = starts[-1]
                ok, detail = ledger.claim(job_id, token, f"card{card}@bench")
                if not ok:
                    raise SystemExit(f"job {job_id}: claim refused: {detail}")
        finally:
            _delete(r, prefix)
    print("running jobs | pass CPU ms p50 / p90 | requests written (round trips) per pass, mean (min-max)")
    for running in (0, 1, 4, 8, 16, 24, 31):
        print(f"{running:12d} | {statistics.median(cpu[running]):.3f} / {percentile(cpu[running], 0.9):.3f} | "
              f"{statistics.mean(trips[running]):.2f} ({min(trips[running])}-{max(trips[running])})")
    every = [x for values in cpu.values() for x in values]
    counts = [x for values in trips.values() for x in values]
    print(f"all {len(every)} passes | {statistics.median(every):.3f} / {percentile(every, 0.9):.3f} | "
          f"{statistics.mean(counts):.2f} ({min(counts)}-{max(counts)}); wall ms p50 / p90 "
          f"{statistics.median(wall):.3f} / {percentile(wall, 0.9):.3f}")
    return 0


def _delete(r: redis.Redis, prefix: str) -> None:
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 1000):
        r.delete(*keys[i:i + 1000])


if __name__ == "__main__":
    sys.exit(main())
