#!/usr/bin/env python3
"""The CPU of many starting passes of one version's dispatcher, clock frozen, for before/after
comparisons on a noisy host: scripts/bench_scale.py's cluster (N x 8 nearly full cards, waiting
jobs for U users), then COUNT times: 64 running jobs end, one pass starts what fits (timed: the
dispatcher thread's CPU, ms), the jobs it started are claimed. The same sequence of passes in
every version that decides the same (scripts/dispatch_sameness.py checks that), so run two trees
alternating, several times each, and compare pass by pass (the minimum over runs is the least
disturbed by other processes).

    git -C /work/main archive main rig workers | (mkdir -p /tmp/rig-old && tar -x -C /tmp/rig-old)
    for i in 1 2 3; do for tree in /tmp/rig-old .; do
      .venv/bin/python scripts/start_passes.py $tree --cards 512 --waiting 10000 --users 10 --count 8; done; done

Prints one JSON line: the tree, the load average, each pass's CPU ms and jobs started.
Uses a throwaway key prefix on --url (default $RIG_BENCH_REDIS_URL or 127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="a folder holding the version's rig/ and workers/ ('.' for this tree)")
    parser.add_argument("--cards", type=int, default=512)
    parser.add_argument("--waiting", type=int, default=10000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--count", type=int, default=8, help="starting passes timed")
    parser.add_argument("--url", default=os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    root = str(Path(args.root).resolve())
    sys.path.insert(0, root)
    for name in ("rig.client", "rig.ledger", "rig.nodes", "workers.card_runner", "workers.dispatcher",
                 "workers.health", "workers.outcomes"):
        importlib.import_module(name)
    spec = importlib.util.spec_from_file_location("bench_scale", HERE.with_name("bench_scale.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import rig.clock
    import workers.dispatcher

    if not workers.dispatcher.__file__.startswith(root):
        raise SystemExit(f"the dispatcher was imported from {workers.dispatcher.__file__}, not {root}")
    frozen = 1_900_000_000.0
    cluster = bench.Cluster(args.url, args.cards // 8, args.users, Path(tempfile.mkdtemp()))
    type(rig.clock.clock_for(cluster.r)).now = lambda self, refresh=True: frozen
    dispatcher = cluster.dispatcher
    passes = []
    try:
        cluster.build()
        cluster.add_waiting(args.waiting)
        for _ in range(3):  # the first passes word every reason: not the steady state
            dispatcher.dispatch_pass()
        for step in range(args.count):
            cluster.end_some(64, ended_at=frozen + 30 * (step + 1), runtime=30.0)
            began = time.thread_time()
            dispatcher.dispatch_pass()
            passes.append((round((time.thread_time() - began) * 1000, 1), len(cluster.started)))
            for job_id, token, node, card in cluster.started:
                cluster.ledger.claim(job_id, token, f"card{card}@{node}")
            cluster.started.clear()
    finally:
        cluster.delete()
    print(json.dumps({"root": root, "load": round(os.getloadavg()[0], 1), "passes": passes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
