#!/usr/bin/env python3
"""`rig kill` of a sweep: the CLI itself, as a user runs it, on N waiting jobs.

Starts a private redis-server (--port, no persistence), registers one fake 80 GiB card, queues
--jobs jobs of 70 GiB (no dispatcher runs: they all wait), then times one `rig kill --no-wait
ID...` of all of them (wall seconds, as the user waits) and checks every job ended CANCELLED and nothing stays
reserved. ``--tree DIR`` runs another checkout's `rig` (its rig/ and workers/ first on
PYTHONPATH) for a before/after on the same machine.

    .venv/bin/python scripts/bench_kill.py --jobs 10000 --port 6416
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--port", type=int, default=6416)
    ap.add_argument("--tree", help="another checkout's folder holding rig/ and workers/ (its rig kill is timed)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs: at least 1")
    from rig.client import Client
    from rig.config import load_settings
    from rig.gpus.base import GpuReading
    from rig.models import JobState
    from rig.testing.sigterm import exit_on_sigterm
    from rig.testing.throwaway_redis import start_redis

    exit_on_sigterm()
    folder = Path(tempfile.mkdtemp(prefix="rig-bench-kill-"))
    server = start_redis(args.port, folder / "redis")
    try:
        url = f"redis://127.0.0.1:{args.port}/0"
        settings = load_settings(redis_url=url, key_prefix="rig:", home=folder / "home")
        client = Client(settings)
        client.ledger.register_card("n1", GpuReading(index=0, uuid="GPU-n1-0", model="Fake 80G", total=80 * 2**30),
                                    max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
        ids = [h.id for h in client.submit_many([{"command": ["python", "train.py", f"--seed={i}"],
                                                  "gpu_memory": "70G", "name": f"sweep-{i}"}
                                                 for i in range(args.jobs)])]
        env = {**os.environ, "RIG_REDIS_URL": url, "RIG_KEY_PREFIX": "rig:", "RIG_HOME": str(folder / "home")}
        if args.tree:
            env["PYTHONPATH"] = str(Path(args.tree).resolve())
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "rig.cli.main", "kill", "--no-wait", *map(str, ids)],
                              env=env, capture_output=True, text=True, cwd=folder)  # -m puts the cwd first
        wall = time.monotonic() - began
        states = [job.state for job in client.store.get_many(ids)]
        reserved = sum(card.reserved for card in client.ledger.cards())
        print(f"rig kill --no-wait of {args.jobs:,} waiting jobs: {wall:.2f} s wall ({wall / args.jobs * 1000:.2f} ms a "
              f"job), exit {done.returncode}; cancelled {states.count(JobState.CANCELLED):,}; reserved after: "
              f"{reserved} bytes; load {os.getloadavg()[0]:.1f}")
        return 0 if done.returncode == 0 and states.count(JobState.CANCELLED) == args.jobs else 1
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
