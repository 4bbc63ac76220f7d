#!/usr/bin/env python3
"""submit_many with many jobs waiting (issue 15: >= 1,000 jobs/s with 100,000 waiting).

Starts a private redis-server (--port, no persistence), registers 8 fake cards, fills the queue
with --waiting jobs (a sweep: one user, one environment, a command that differs per job), then
times --reps batches of --batch jobs through ``Client.submit_many`` and prints per batch: jobs/s
(wall), the submitter's CPU ms, Redis' CPU ms (INFO cpu), and the spread over the batches.
``--tree DIR`` runs another checkout's rig (e.g. main's, ``git archive main rig workers``) for
a before/after on the same machine, back to back.

    .venv/bin/python scripts/bench_submit.py --waiting 100000 --batch 1000 --reps 10 --port 6415
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiting", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--port", type=int, default=6415)
    ap.add_argument("--tree", help="the rig tree to import (default: this one)")
    args = ap.parse_args()
    # rig.testing.sigterm's rule, written out: --tree may name an older rig without that module.
    # SIGTERM (`timeout`, kill) raises SystemExit, so the finally below stops the redis-server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    sys.path.insert(0, args.tree or str(Path(__file__).resolve().parents[1]))

    import redis

    from rig.client import Client
    from rig.config import load_settings
    from rig.gpus import GpuReading

    folder = Path(tempfile.mkdtemp(prefix="rig-bench-submit-"))
    from rig.testing.throwaway_redis import start_redis

    server = start_redis(args.port, folder)
    url = f"redis://127.0.0.1:{args.port}/0"
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        client = Client(load_settings(key_prefix="rig:", home=folder, redis_url=url), redis_client=r)
        for index in range(8):
            client.ledger.register_card("n1", GpuReading(index, f"GPU-n1-{index}", "Fake 80G", 80 * 2**30, 0, 0, 40),
                                        max_jobs=5, reserve_fraction=0.0, allowed=True, fake=True)

        def requests(n: int, first: int) -> list[dict]:
            return [{"command": ["python", "train.py", "--lr", f"{(first + i) * 1e-7:.7f}"], "gpu_memory": "4G",
                     "name": "sweep", "workdir": "/tmp", "priority": "low"} for i in range(n)]

        for start in range(0, args.waiting, 5000):
            client.submit_many(requests(min(5000, args.waiting - start), start))

        def redis_cpu() -> float:
            info = r.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        print(f"rig from {args.tree or 'this tree'}; {r.zcard('rig:pending'):,} waiting; batches of {args.batch:,}; "
              f"load {os.getloadavg()[0]:.1f}")
        rates = []
        for rep in range(args.reps):
            t, c, rc = time.perf_counter(), time.process_time(), redis_cpu()
            client.submit_many(requests(args.batch, 10**7 + rep * args.batch))
            wall, cpu, rcpu = time.perf_counter() - t, time.process_time() - c, redis_cpu() - rc
            rates.append(args.batch / wall)
            print(f"  {args.batch / wall:>7,.0f} jobs/s   submitter CPU {cpu * 1000:>5.0f} ms   Redis CPU "
                  f"{rcpu * 1000:>5.0f} ms   wall {wall * 1000:>5.0f} ms")
        print(f"jobs/s: median {statistics.median(rates):,.0f}, min {min(rates):,.0f}, max {max(rates):,.0f}; "
              f"load {os.getloadavg()[0]:.1f}")
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
