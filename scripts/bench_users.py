#!/usr/bin/env python3
"""One dispatcher pass with many users waiting: fair share's cost.

No workers: real Redis ($RIG_BENCH_REDIS_URL or 127.0.0.1:6379) under a private key prefix,
8 x 80 GiB cards with 4 job slots each (32 free), 3,000 waiting 1 GiB jobs spread over N users;
prints the time of a pass that starts 32 of them (median and max of 5; the started jobs are
ended between passes). Units: milliseconds.

    .venv/bin/python scripts/bench_users.py [--users 1,10,70] [--jobs 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.config import load_settings  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from rig.testing.harness import delete_prefix  # noqa: E402
from workers.dispatcher import Dispatcher  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", default="1,10,70")
    parser.add_argument("--jobs", type=int, default=3000)
    args = parser.parse_args()
    url = os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    r = redis.Redis.from_url(url, decode_responses=True)
    for users in (int(u) for u in args.users.split(",")):
        prefix = f"rigbench:{uuid.uuid4().hex[:8]}:"
        try:
            ledger = Ledger(r, Keys(prefix))
            for index in range(8):
                ledger.register_card("n", GpuReading(index=index, uuid=f"u{index}", model="m", total=80 * GIB),
                                     max_jobs=4, reserve_fraction=0.05, allowed=True, fake=True)
            ledger.store.create_many([(Job(
                id=0, name="t", user=f"user{n % users}", command=["true"], gpu_memory=GIB, gpus=1,
                priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time()), None)
                for n in range(args.jobs)])
            dispatcher = Dispatcher(load_settings(key_prefix=prefix, node_name="n", redis_url=url),
                                    lambda *a: None, client=r)
            times, started = [], 0
            for _ in range(5):
                begin = time.perf_counter()
                started = dispatcher.dispatch_pass()
                times.append((time.perf_counter() - begin) * 1000)
                for job_id in [int(i) for i in r.zrange(Keys(prefix).state_index("ASSIGNED"), 0, -1)]:
                    ledger.transition(job_id, JobState.SUCCEEDED)
            print(f"{users:4d} users, {args.jobs} waiting, 32 slots free: a pass starting {started} jobs: "
                  f"median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")
        finally:
            delete_prefix(r, prefix)


if __name__ == "__main__":
    main()
