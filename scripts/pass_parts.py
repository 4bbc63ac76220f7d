#!/usr/bin/env python3
"""Where one version's dispatcher pass spends its CPU, with the shared clock frozen: on
scripts/bench_scale.py's cluster (N x 8 nearly full cards, waiting jobs for U users), REPS idle
passes and 3 passes after 64 jobs end, each pass's CPU (this thread's time, ms) and of it the
dispatcher's card read, its reservations/placed-jobs read (with their ends and fair share),
the waits noted with the holds closed to each job, and (since idlepass) their wording at the
round's end, the nodes' reads, the held_at marks written and the reservations, and each round's CPU and
starts ("rounds": a pass is 1-3 rounds) and parts ("round_parts"). ``--profile FILE``: a cProfile of the
starting passes, CPU time (``--profile-round N``: of their round N only). Run it for two trees one after the other,
alternating, for a before/after of the same passes (dispatch_sameness.py checks they decide the same).

    git archive main rig workers | (mkdir -p /tmp/rig-old && tar -x -C /tmp/rig-old)
    .venv/bin/python scripts/pass_parts.py /tmp/rig-old --cards 512 --waiting 10000 --users 10
    .venv/bin/python scripts/pass_parts.py . --cards 512 --waiting 10000 --users 10

Prints one JSON line (p50 and min of the idle passes, the parts' p50, each starting pass and its
parts). Uses a throwaway key prefix on --url (default $RIG_BENCH_REDIS_URL or 127.0.0.1:6379).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="a folder holding the version's rig/ and workers/ ('.' for this tree)")
    parser.add_argument("--cards", type=int, default=512)
    parser.add_argument("--waiting", type=int, default=10000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--reps", type=int, default=15, help="idle passes timed")
    parser.add_argument("--hold-now", action="store_true", help="hold_after_seconds 0: every blocked job holds")
    parser.add_argument("--real-clock", action="store_true",
                        help="the clock moves (idle passes 0.5 s apart, after --settle s): what repeats then")
    parser.add_argument("--settle", type=float, default=0.0, help="with --real-clock: seconds to wait first")
    parser.add_argument("--ends-first", type=int, default=0,
                        help="end this many jobs (30 s runs: the cluster's recent runs) before the idle passes")
    parser.add_argument("--profile", metavar="FILE",
                        help="write a cProfile of the 3 starting passes to FILE (pstats; their CPU then includes the profiler's)")
    parser.add_argument("--profile-round", type=int, metavar="N",
                        help="with --profile: profile only round N (0: the starts; 1: the round after them)")
    parser.add_argument("--profile-idle", metavar="FILE",
                        help="write a cProfile of the idle passes to FILE (pstats; their CPU then includes the profiler's)")
    parser.add_argument("--top", type=int, default=0,
                        help="also print the N costliest idle passes: CPU ms, repeated or not, their parts")
    parser.add_argument("--full-reads", action="store_true",
                        help="FULL_READ_S's full read (every card and placed job read again) before every idle pass")
    parser.add_argument("--gc-census", action="store_true",
                        help="after the idle passes: the objects the cycle collector tracks, in all and by type "
                             "(what a full collection walks), and those the dispatcher's own caches hold")
    parser.add_argument("--freeze", action="store_true",
                        help="gc.freeze() after the imports, as the control worker does once ready "
                             "(workers.app): start-up's objects out of the cycle collector's walk")
    parser.add_argument("--gc-threshold", type=int, nargs=3, metavar=("G0", "G1", "G2"),
                        help="gc.set_threshold(G0, G1, G2) before the passes (Python's default: 700 10 10)")
    parser.add_argument("--running-expected", type=float, metavar="S",
                        help="the running jobs' own estimate (s: expected_seconds, as submit stores it for a "
                             "command run before); default: none, the cluster's recent runs estimate them")
    parser.add_argument("--url", default=os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    root = str(Path(args.root).resolve())
    sys.path.insert(0, root)
    # bench_scale puts its own tree first on sys.path: what it imports is imported from ``root`` first.
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

    if args.freeze:
        import gc

        gc.collect()
        gc.freeze()
    if args.gc_threshold:
        import gc

        gc.set_threshold(*args.gc_threshold)
    frozen = 1_900_000_000.0
    cluster = bench.Cluster(args.url, args.cards // 8, args.users, Path(tempfile.mkdtemp()))
    cluster.running_expected = args.running_expected
    if not args.real_clock:
        type(rig.clock.clock_for(cluster.r)).now = lambda self, refresh=True: frozen
    dispatcher = cluster.dispatcher
    if args.hold_now:
        dispatcher.settings = cluster.settings.model_copy(update={"hold_after_seconds": 0.0})
    parts: dict[str, float] = {}

    def timed(obj: object, name: str, part: str) -> None:
        method = getattr(obj, name)

        def wrapper(*a, **kw):
            began = time.thread_time()
            try:
                return method(*a, **kw)
            finally:
                parts[part] = parts.get(part, 0.0) + (time.thread_time() - began) * 1000

        setattr(obj, name, wrapper)

    if hasattr(dispatcher, "_read_cards"):  # kept between passes (passcache); before: Ledger.cards
        timed(dispatcher, "_read_cards", "cards")
    else:
        timed(dispatcher.ledger, "cards", "cards")
    timed(dispatcher, "_read_holdings", "holdings")
    timed(dispatcher, "_note_wait", "sentences")
    if hasattr(dispatcher, "_word_waits"):  # idlepass: waits worded at the round's end
        timed(dispatcher, "_word_waits", "wording")
    timed(dispatcher, "_first_reads", "first_reads")
    timed(dispatcher, "_read_waiting", "heads")
    timed(dispatcher, "_flush_notes", "flush")
    node_registry = importlib.import_module("rig.nodes").NodeRegistry  # (the version's: imported from root)
    timed(node_registry, "read", "nodes")
    timed(dispatcher, "_write_marks", "marks")
    timed(dispatcher.ledger, "reserve", "reserve")
    dispatcher_module = importlib.import_module("workers.dispatcher")
    for owner, name, part in ((getattr(dispatcher_module, "_Holds", None), "plan", "plans"),
                              (getattr(dispatcher_module, "_View", None), "after_start", "after_start"),
                              (dispatcher_module, "place", "place"), (dispatcher_module, "placeable", "place")):
        if owner is not None and hasattr(owner, name):  # (older trees lack some)
            timed(owner, name, part)
    if hasattr(dispatcher, "_holdings_unchanged"):
        timed(dispatcher, "_holdings_unchanged", "holdings_check")
    flush = dispatcher._flush_notes

    def counted_flush(*a, **kw):  # reasons written (changed or re-stamped) in the pass
        parts["written"] = parts.get("written", 0) + len(dispatcher._notes)
        return flush(*a, **kw)

    dispatcher._flush_notes = counted_flush
    import gc
    gc_began: list[float] = []

    def gc_timed(phase: str, info: dict) -> None:  # the collector's CPU within a pass ("gc", ms; "gc2": full ones)
        if phase == "start":
            gc_began[:] = [time.thread_time()]
        elif gc_began:
            parts["gc"] = parts.get("gc", 0.0) + (time.thread_time() - gc_began.pop()) * 1000
            if info.get("generation") == 2:
                parts["gc2"] = parts.get("gc2", 0) + 1

    gc.callbacks.append(gc_timed)
    repeated = []  # idle passes that repeated the last one's decisions (idlepass: Dispatcher._repeats)
    if hasattr(dispatcher, "_repeats"):
        repeats = dispatcher._repeats
        dispatcher._repeats = lambda *a: repeated.append(repeats(*a)) or repeated[-1]

    # Each round's start (the dispatcher thread's CPU then, jobs started so before it): a pass is
    # 1-3 rounds (after a round that started jobs while holds exist, another reads and decides again).
    round_marks: list[tuple[float, int, dict]] = []  # (CPU s, started, the parts so far)
    in_starting_pass = False  # (--profile-round profiles a round of these only)
    first_reads = dispatcher._first_reads

    def marked_first_reads(*a, **kw):
        if profiler is not None and args.profile_round is not None and in_starting_pass:
            if len(round_marks) == args.profile_round:
                profiler.enable()
            elif len(round_marks) == args.profile_round + 1:
                profiler.disable()
        round_marks.append((time.thread_time(), len(cluster.started), {k: v for k, v in parts.items() if k != "rounds"}))
        return first_reads(*a, **kw)

    dispatcher._first_reads = marked_first_reads

    def one_pass() -> tuple[float, dict[str, float]]:
        parts.clear()
        round_marks.clear()
        began = time.thread_time()
        dispatcher.dispatch_pass()
        ended = time.thread_time()
        marks = [*round_marks, (ended, len(cluster.started), {k: v for k, v in parts.items() if k != "rounds"})]
        # "rounds": [CPU ms, jobs it started] of each round, in order
        parts["rounds"] = [[round((b[0] - a[0]) * 1000, 1), b[1] - a[1]] for a, b in zip(marks, marks[1:], strict=False)]
        # "round_parts": each round's parts (CPU ms; a part timed inside another counts in both)
        parts["round_parts"] = [{k: round(v - a[2].get(k, 0.0), 1) for k, v in b[2].items() if v - a[2].get(k, 0.0)}
                                for a, b in zip(marks, marks[1:], strict=False)]
        return (ended - began) * 1000, dict(parts)

    def end_some(count: int) -> None:  # bench_scale's, with the ends stamped on the frozen clock
        cluster.end_some(count, ended_at=None if args.real_clock else frozen + 30, runtime=30.0)

    idle_profiler = None
    if args.profile_idle:
        import cProfile
        idle_profiler = cProfile.Profile(time.thread_time)  # CPU: wall time puts a loaded host's waits in socket calls
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile(time.thread_time)  # CPU, as above
    idle, starting = [], []
    try:
        cluster.build()
        cluster.add_waiting(args.waiting)
        for _ in range(3):  # the first passes word every reason: not the steady state
            dispatcher.dispatch_pass()
        if args.ends_first:
            end_some(args.ends_first)
            dispatcher.dispatch_pass()
            for job_id, token, node, card in cluster.started:
                cluster.ledger.claim(job_id, token, f"card{card}@{node}")
            cluster.started.clear()
            dispatcher.dispatch_pass()
        if args.real_clock and args.settle:
            time.sleep(args.settle)
            for _ in range(2):  # what the clock changed meanwhile (holds begun, marks)
                dispatcher.dispatch_pass()
        repeated.clear()
        idle = []
        idle_repeats: list[bool | None] = []  # per idle pass: repeated (None: no _repeats in this tree)
        for _ in range(args.reps):
            before = len(repeated)
            if args.full_reads:
                dispatcher._full_read_at = -float("inf")
            if idle_profiler is not None:
                idle_profiler.enable()
            idle.append(one_pass())
            if idle_profiler is not None:
                idle_profiler.disable()
            idle_repeats.append(repeated[-1] if len(repeated) > before else None)
            if args.real_clock:
                time.sleep(0.5)
        idle_repeated = sum(repeated)
        census = _gc_census(dispatcher, one_pass) if args.gc_census else {}
        for _ in range(3):
            end_some(64)
            in_starting_pass = True
            if profiler is not None and args.profile_round is None:
                profiler.enable()
            cpu, its = one_pass()
            in_starting_pass = False
            if profiler is not None:
                profiler.disable()
            starting.append({"cpu_ms": round(cpu, 1), "started": len(cluster.started),
                             **{k: v if k in ("rounds", "round_parts") else round(v, 1) for k, v in its.items()}})
            for job_id, token, node, card in cluster.started:
                cluster.ledger.claim(job_id, token, f"card{card}@{node}")
            cluster.started.clear()
    finally:
        cluster.delete()
    if profiler is not None:
        profiler.dump_stats(args.profile)
    if idle_profiler is not None:
        idle_profiler.dump_stats(args.profile_idle)
    cpus = [cpu for cpu, _ in idle]
    print(json.dumps({
        "root": root, "load": round(os.getloadavg()[0], 1),
        "idle_p50_ms": round(statistics.median(cpus), 1), "idle_min_ms": round(min(cpus), 1),
        "idle_p95_ms": round(sorted(cpus)[min(len(cpus) - 1, int(0.95 * len(cpus)))], 1),
        "idle_repeated": f"{idle_repeated} of {len(cpus)}",
        **{f"idle_{k}_p50_ms": round(statistics.median(p.get(k, 0.0) for _, p in idle), 1)
           for k in ("cards", "holdings", "sentences", "wording")},
        "idle_rounds_p50": statistics.median(len(p["rounds"]) for _, p in idle),
        "after_64_ends": starting,
        **census,
        **({"idle_top": [{"cpu_ms": round(cpu, 1), "pass": i, "repeated": idle_repeats[i],
                          **{k: v if k in ("rounds", "round_parts") else round(v, 1) for k, v in p.items()}}
                         for i, (cpu, p) in sorted(enumerate(idle), key=lambda e: -e[1][0])[:args.top]]}
           if args.top else {})}))
    return 0


def _gc_census(dispatcher: object, one_pass: Callable[[], object]) -> dict:
    """The objects the cycle collector tracks now (a full collection walks them all): their
    number, the most common types, and how many the dispatcher's caches reach (its attributes'
    dicts and lists, one level down); and the garbage in reference cycles that 5 more idle passes
    leave (only a collection frees it), by type."""
    import collections
    import gc

    gc.set_debug(gc.DEBUG_SAVEALL)
    began = time.thread_time()
    gc.collect()
    first = [round((time.thread_time() - began) * 1000, 1), len(gc.garbage),
             collections.Counter(type(o).__name__ for o in gc.garbage).most_common(6)]
    gc.garbage.clear()
    gc.set_debug(0)
    began = time.thread_time()
    gc.collect()
    clean_ms = round((time.thread_time() - began) * 1000, 1)
    gc.disable()
    try:
        for _ in range(5):
            one_pass()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = collections.Counter(type(o).__name__ for o in gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
        gc.enable()
    tracked = gc.get_objects()
    kinds = collections.Counter(type(o).__name__ for o in tracked)
    mine = {}
    for name, value in vars(dispatcher).items():
        if isinstance(value, dict | list | set) and len(value) > 100:
            inner = value.items() if isinstance(value, dict) else ((v, None) for v in value)
            mine[name] = [len(value), sum(gc.is_tracked(k) + gc.is_tracked(v) for k, v in inner)]
    return {"gc_first_full_collection_ms_freed_types": first, "gc_full_collection_clean_ms": clean_ms,
            "gc_cyclic_garbage_of_5_passes": [sum(cyclic.values()), cyclic.most_common(10)],
            "gc_tracked": len(tracked), "gc_top_types": kinds.most_common(8),
            "dispatcher_caches_len_tracked": mine}


if __name__ == "__main__":
    sys.exit(main())
