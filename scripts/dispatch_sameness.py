#!/usr/bin/env python3
"""Do two versions of rig's dispatcher decide the same? Runs each on the same simulated cluster
(scripts/bench_scale.py's: N x 8 nearly full cards, waiting jobs for U users) with the shared
clock frozen, through 3 passes with nothing to start and 3 passes after 64 jobs end, and
compares every start (job, node, card) and every stored wait reason and hold mark. Each
pass's CPU time (the thread's, ms) is printed for both: the same passes on the same cluster
and clock, so a before/after of the pass's cost is not swayed by a moving clock.

    git archive main rig workers | (mkdir -p /tmp/rig-old && tar -x -C /tmp/rig-old)
    .venv/bin/python scripts/dispatch_sameness.py /tmp/rig-old                      # this tree vs that one
    .venv/bin/python scripts/dispatch_sameness.py /tmp/rig-old --cards 128 --waiting 5000 --users 1 --hold-now
    .venv/bin/python scripts/dispatch_sameness.py /tmp/rig-old --full-reads     # FULL_READ_S's read before each pass

Exit 0 when every pass is the same, 1 with the first differences otherwise. Uses a throwaway
key prefix on $RIG_BENCH_REDIS_URL (default 127.0.0.1:6379), deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def run_one(root: str, url: str, cards: int, waiting: int, users: int, hold_now: bool,
            full_reads: bool = False, running_expected: float | None = None) -> list[dict]:
    """One tree's decisions (this script re-run with --child under that tree's rig)."""
    out = subprocess.run([sys.executable, str(HERE), "--child", root, "--url", url, "--cards", str(cards),
                          "--waiting", str(waiting), "--users", str(users)] + (["--hold-now"] if hold_now else [])
                         + (["--full-reads"] if full_reads else [])
                         + (["--running-expected", str(running_expected)] if running_expected is not None else []),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{root}: the run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def child(root: str, url: str, cards: int, waiting: int, users: int, hold_now: bool, full_reads: bool = False,
          running_expected: float | None = None) -> None:
    sys.path.insert(0, root)
    import importlib.util

    import rig
    if not rig.__file__.startswith(str(Path(root).resolve())):
        raise SystemExit(f"rig was imported from {rig.__file__}, not {root}")
    # bench_scale puts its own tree first on sys.path: what it imports is imported from ``root`` first.
    for name in ("rig.client", "rig.ledger", "rig.nodes", "workers.card_runner", "workers.dispatcher",
                 "workers.health", "workers.outcomes"):
        importlib.import_module(name)
    spec = importlib.util.spec_from_file_location("bench_scale", HERE.with_name("bench_scale.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import workers.dispatcher
    if not workers.dispatcher.__file__.startswith(str(Path(root).resolve())):
        raise SystemExit(f"the dispatcher was imported from {workers.dispatcher.__file__}, not {root}")
    import rig.clock


    frozen = 1_900_000_000.0
    cluster = bench.Cluster(url, cards // 8, users, Path(tempfile.mkdtemp()))
    cluster.running_expected = running_expected
    type(rig.clock.clock_for(cluster.r)).now = lambda self, refresh=True: frozen
    if hold_now:
        cluster.dispatcher.settings = cluster.settings.model_copy(update={"hold_after_seconds": 0.0})
    out = []

    def end_some(count: int) -> None:  # bench_scale's, with the ends stamped on the frozen clock
        cluster.end_some(count, ended_at=frozen + 30, runtime=30.0)

    def timed_pass() -> float:
        """One dispatcher pass; its CPU ms (this thread's: less swayed by other load than wall time)."""
        if full_reads:  # FULL_READ_S since the last full read: this pass reads every card and placed job
            cluster.dispatcher._full_read_at = -float("inf")
        began = time.thread_time()
        cluster.dispatcher.dispatch_pass()
        return (time.thread_time() - began) * 1000

    def snapshot(tag: str, cpu_ms: float) -> None:
        ids = [int(i) for i in cluster.r.zrange(cluster.keys.pending, 0, -1)]
        pipe = cluster.r.pipeline()
        for i in ids:
            pipe.hmget(cluster.keys.job(i), "wait_reason", "held_at")
        reasons = {str(i): [_comparable(r[0]), bool(r[1])] for i, r in zip(ids, pipe.execute(), strict=True)}
        out.append({"tag": tag, "started": sorted([s[0], s[2], s[3]] for s in cluster.started), "reasons": reasons,
                    "cpu_ms": cpu_ms})

    try:
        cluster.build()
        cluster.add_waiting(waiting)
        for k in range(3):
            snapshot(f"idle {k}", timed_pass())
        for k in range(3):
            end_some(64)
            snapshot(f"after 64 ends {k}", timed_pass())
            for job_id, token, node, card in cluster.started:
                cluster.ledger.claim(job_id, token, f"card{card}@{node}")
            cluster.started.clear()
    finally:
        cluster.delete()
    print(json.dumps(out))


def _comparable(reason: str | None) -> str | None:
    """A stored reason with each hold's expected free time left out: worded relative to the pass
    ("in ~5 min") before the ``idlepass`` round, as an absolute time ("~Dec 01 14:20 UTC") since,
    so the two versions word the same hold differently; the rest (which cards, held for whom,
    what is free) is compared as it is."""
    return None if reason is None else re.sub(r" \(expected free [^)]*\)", " (expected free ...)", reason)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", nargs="?", default="", help="a folder holding the other version's rig/ and workers/")
    parser.add_argument("--cards", type=int, default=64)
    parser.add_argument("--waiting", type=int, default=3000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--hold-now", action="store_true", help="hold_after_seconds 0: every blocked job holds")
    parser.add_argument("--full-reads", action="store_true",
                        help="the full read every FULL_READ_S falls before every pass (idlepass2: the repeat outlives it)")
    parser.add_argument("--running-expected", type=float, metavar="S",
                        help="the running jobs' own estimate (s: expected_seconds); default: the recent runs estimate them")
    parser.add_argument("--url", default=os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.cards, args.waiting, args.users, args.hold_now, args.full_reads,
              args.running_expected)
        return 0
    if not (Path(args.other) / "rig").is_dir():
        parser.error(f"{args.other}: no rig/ folder there (git archive COMMIT rig workers | tar -x -C {args.other})")
    import redis

    try:
        redis.Redis.from_url(args.url, socket_connect_timeout=3).ping()
    except (redis.RedisError, ValueError) as exc:
        parser.error(f"cannot use Redis at {args.url} ({exc}); start it or give --url")
    mine = run_one(str(HERE.parents[1]), args.url, args.cards, args.waiting, args.users, args.hold_now, args.full_reads,
                   args.running_expected)
    theirs = run_one(args.other, args.url, args.cards, args.waiting, args.users, args.hold_now, args.full_reads,
                     args.running_expected)
    same = True
    for a, b in zip(theirs, mine, strict=True):
        differ = [k for k in a["reasons"] if a["reasons"][k] != b["reasons"].get(k)]
        print(f"{a['tag']}: {len(a['started'])} started there, {len(b['started'])} here, "
              f"{'same' if a['started'] == b['started'] else 'DIFFERENT'} "
              f"starts; {len(differ)} of {len(a['reasons'])} stored reasons differ; pass CPU ms "
              f"{a['cpu_ms']:.0f} there, {b['cpu_ms']:.0f} here")
        for k in differ[:3]:
            print(f"  job {k}:\n    {a['reasons'][k]}\n    {b['reasons'].get(k)}")
        same = same and not differ and a["started"] == b["started"]
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
