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
    args = parser.parse_args()

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


def _delete(r: redis.Redis, prefix: str) -> None:
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 1000):
        r.delete(*keys[i:i + 1000])


if __name__ == "__main__":
    sys.exit(main())
