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
import heapq
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.testing.trace import GIB, PRIORITIES, TraceJob, generate_trace, lower_bound, percentile  # noqa: E402

CARDS, USABLE, MAX_JOBS = 8, 76 * GIB, 4
RANK = {p: i for i, p in enumerate(PRIORITIES)}
Order = Callable[[TraceJob], tuple]


@dataclass(frozen=True)
class Policy:
    name: str
    order: Order
    hold_after: tuple[float | None, float | None, float | None] = (None, None, None)  # per rank
    backfill: bool = False  # EASY: jobs that end before the shadow time may use held cards
    estimate: float = 1.0  # expected duration = real duration x this (a declared limit)


def simulate(jobs: list[TraceJob], policy: Policy, overhead: float) -> tuple[float, dict[str, list[float]]]:
    """(makespan s, waits by priority) of ``policy`` on ``jobs``; best-fit card choice."""
    free, count = [USABLE] * CARDS, [0] * CARDS
    on_card: list[list[tuple[float, int, int]]] = [[] for _ in range(CARDS)]  # (expected end, bytes, index)
    arrivals = sorted(jobs, key=lambda j: (j.arrival, j.index))
    running: list[tuple[float, int, tuple[int, ...], int]] = []
    waiting: list[TraceJob] = []
    waits: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    now = last = 0.0
    nxt = 0
    while nxt < len(arrivals) or waiting or running:
        times = [running[0][0]] if running else []
        if nxt < len(arrivals):
            times.append(arrivals[nxt].arrival)
        if not times:
            break
        now = max(now, min(times))
        while nxt < len(arrivals) and arrivals[nxt].arrival <= now:
            waiting.append(arrivals[nxt])
            nxt += 1
        while running and running[0][0] <= now:
            _end, index, used, nbytes = heapq.heappop(running)
            for c in used:
                free[c] += nbytes
                count[c] -= 1
                on_card[c] = [x for x in on_card[c] if x[2] != index]
        waiting.sort(key=policy.order)
        held: dict[int, tuple[float, int]] = {}  # card -> (shadow time, bytes needed)
        still = []
        for job in waiting:
            expected_end = now + job.duration * policy.estimate

            def open_card(c: int, job: TraceJob = job, expected_end: float = expected_end,
                          held: dict[int, tuple[float, int]] = held) -> bool:
                if c not in held:
                    return True
                if not policy.backfill or held[c][0] == math.inf:
                    return False
                until, need = held[c]
                if expected_end <= until:
                    return True
                gone = [x for x in on_card[c] if x[0] <= until]
                room = free[c] + sum(x[1] for x in gone)
                return room - job.gpu_memory >= need and count[c] - len(gone) + 2 <= MAX_JOBS

            fit = [c for c in range(CARDS) if free[c] >= job.gpu_memory and count[c] < MAX_JOBS and open_card(c)]
            if len(fit) < job.gpus:
                still.append(job)
                after = policy.hold_after[RANK[job.priority]]
                if after is not None and now - job.arrival >= after:
                    options = []
                    for c in range(CARDS):
                        if c in held:
                            continue
                        when, room, n = math.inf, free[c], count[c]
                        if room >= job.gpu_memory and n < MAX_JOBS:
                            when = now
                        else:
                            for end, nbytes, _ in sorted(on_card[c]):
                                room, n = room + nbytes, n - 1
                                if room >= job.gpu_memory and n < MAX_JOBS:
                                    when = end
                                    break
                        options.append((when, max(0, job.gpu_memory - free[c]), c))
                    options.sort()
                    if len(options) >= job.gpus:
                        until = max(o[0] for o in options[: job.gpus]) if policy.backfill else math.inf
                        for o in options[: job.gpus]:
                            held[o[2]] = (until, job.gpu_memory)
                continue
            chosen = tuple(sorted(fit, key=lambda c: (free[c] - job.gpu_memory, count[c], c))[: job.gpus])
            for c in chosen:
                free[c] -= job.gpu_memory
                count[c] += 1
                on_card[c].append((expected_end, job.gpu_memory, job.index))
            end = now + job.duration + overhead
            last = max(last, end)
            waits[job.priority].append(now - job.arrival)
            heapq.heappush(running, (end, job.index, chosen, job.gpu_memory))
        waiting = still
    return last, waits


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
    Policy("priority, FIFO; holds + backfill, limits 1.5x (rig now)", fifo, (0, 20, 40), True, 1.5),
    Policy("priority, FIFO; holds + backfill, exact durations", fifo, (0, 20, 40), True, 1.0),
    Policy("priority, largest first; no holds", largest_first),
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
    print(f"{'policy':58} {'x bound mean':>12} {'worst':>6} {'seed 8':>7} {'high/low p95 mean':>18} {'worst':>6}")
    for policy in POLICIES:
        ratios, balance = [], []
        for s, trace in traces.items():
            span, waits = simulate(trace, policy, args.overhead)
            ratios.append(span / bounds[s])
            balance.append(percentile(waits["high"], 0.95) / max(percentile(waits["low"], 0.95), 1e-9))
        s8 = f"{ratios[seeds.index(8)]:.3f}" if 8 in seeds else "-"
        print(f"{policy.name:58} {sum(ratios) / len(ratios):12.3f} {max(ratios):6.3f} {s8:>7} "
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

                span, _ = simulate(trace, Policy("search", order), 0.0)
                best = min(best, span / bounds[s])
            best_all.append(best)
        s8 = f"{best_all[seeds.index(8)]:.3f}" if 8 in seeds else "-"
        print(f"{'best of ' + str(args.search) + ' random orders, priorities ignored, no overhead':58} "
              f"{sum(best_all) / len(best_all):12.3f} {max(best_all):6.3f} {s8:>7}")


if __name__ == "__main__":
    main()
