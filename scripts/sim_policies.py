#!/usr/bin/env python3
"""How far can any greedy scheduler get on the mixed trace? An offline study, no Redis.

Replays seeded mixed traces (rig.testing.trace, the trace of scripts/bench_mixed.py) through an
event simulator of list scheduling on 8 x 76 GiB usable cards, 4 jobs a card, with perfect
knowledge of arrivals and durations and a fixed start overhead per job, under several queue
orders and hold rules, and prints per policy: makespan / lower bound (mean and worst over the
seeds, and seed 8, the benchmark's), and high p95 wait / low p95 wait (the issue's second
target, <= 0.25), plus the best makespan found by a random search over orders that ignores
priorities altogether (an estimate of what is achievable at all).

    .venv/bin/python scripts/sim_policies.py [--seeds 1-12] [--overhead 0.05] [--search 300]

Units: seconds, bytes (GiB = 2**30).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.testing.trace import (  # noqa: E402
    GIB,
    PRIORITIES,
    Policy,
    TraceJob,
    generate_trace,
    lower_bound,
    percentile,
    simulate,
)

CARDS, USABLE, MAX_JOBS = 8, 76 * GIB, 4
RANK = {p: i for i, p in enumerate(PRIORITIES)}
SHAPE = {"cards": CARDS, "usable_per_card": USABLE, "max_jobs_per_card": MAX_JOBS}


def fifo(j: TraceJob) -> tuple:
    return (RANK[j.priority], j.arrival, j.index)


def largest_first(j: TraceJob) -> tuple:
    return (RANK[j.priority], -j.gpu_memory * j.gpus, j.index)


def high_then_longest(j: TraceJob) -> tuple:
    return (0 if j.priority == "high" else 1, -j.gpu_memory * j.gpus * j.duration, j.index)


def size_only(j: TraceJob) -> tuple:
    return (-j.gpu_memory * j.gpus, j.index)


POLICIES = [
    Policy("priority, FIFO; no holds", fifo),
    Policy("priority, FIFO; holds (rig before: now/20/40 s)", fifo, (0, 20, 40)),
    Policy("priority, FIFO; holds + backfill, limits 1.5x", fifo, (0, 20, 40), True, 1.5),
    Policy("priority, FIFO; holds + backfill, exact durations", fifo, (0, 20, 40), True, 1.0),
    Policy("priority, largest first; no holds", largest_first),
    Policy("priority, largest first; holds + backfill, limits 1.5x (rig, declared)", largest_first, (0, 20, 40), True,
           1.5),
    Policy("priority, largest first; holds, no backfill (rig before, nothing declared)", largest_first,
           (0, 20, 40), False),
    Policy("priority, largest first; holds + backfill on estimated ends (opt-in)", largest_first,
           (0, 20, 40), True, prior=True),
    Policy("priority, largest first; holds + room backfill, estimated (rig now, nothing declared)",
           largest_first, (0, 20, 40), True, prior=True, estimate_admits=False),
    Policy("arrival order, priorities ignored; no holds (as Ray)", lambda j: (j.arrival, j.index)),
    Policy("high first, then longest x largest; no holds", high_then_longest),
    Policy("largest first, priorities ignored; no holds", size_only),
]


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1-12", help="trace seeds, e.g. 1-12 or 3,8")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--overhead", type=float, default=0.05, help="per-job start overhead (s)")
    parser.add_argument("--search", type=int, default=300, help="random orders tried per seed (0: skip)")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    traces = {s: generate_trace(args.jobs, s) for s in seeds}
    bounds = {s: lower_bound(t, cards=CARDS, usable_per_card=USABLE, max_jobs_per_card=MAX_JOBS).value
              for s, t in traces.items()}
    print(f"{len(seeds)} seeds ({args.seeds}), {args.jobs} jobs each, {args.overhead:.2f} s start overhead; "
          f"8 x 76 GiB usable, 4 jobs a card; best-fit cards")
    print(f"{'policy':80} {'x bound mean':>12} {'worst':>6} {'seed 8':>7} {'high/low p95 mean':>18} {'worst':>6}")
    for policy in POLICIES:
        ratios, balance = [], []
        for s, trace in traces.items():
            span, waits = simulate(trace, policy, start_overhead_s=args.overhead, **SHAPE)
            ratios.append(span / bounds[s])
            balance.append(percentile(waits["high"], 0.95) / max(percentile(waits["low"], 0.95), 1e-9))
        s8 = f"{ratios[seeds.index(8)]:.3f}" if 8 in seeds else "-"
        print(f"{policy.name:80} {sum(ratios) / len(ratios):12.3f} {max(ratios):6.3f} {s8:>7} "
              f"{sum(balance) / len(balance):18.2f} {max(balance):6.2f}")
    if args.search:
        rng = random.Random(1)
        best_all = []
        for s, trace in traces.items():
            best = math.inf
            for _ in range(args.search):
                noise = {j.index: rng.random() for j in trace}
                a, b = rng.uniform(0, 3), rng.uniform(0, 2)

                def order(j: TraceJob, a: float = a, b: float = b, noise: dict = noise) -> tuple:
                    return (-a * j.gpu_memory * j.gpus / USABLE - b * j.duration / 6 + noise[j.index],)

                span, _ = simulate(trace, Policy("search", order), **SHAPE)
                best = min(best, span / bounds[s])
            best_all.append(best)
        s8 = f"{best_all[seeds.index(8)]:.3f}" if 8 in seeds else "-"
        print(f"{'best of ' + str(args.search) + ' random orders, priorities ignored, no overhead':80} "
              f"{sum(best_all) / len(best_all):12.3f} {max(best_all):6.3f} {s8:>7}")


if __name__ == "__main__":
    main()
