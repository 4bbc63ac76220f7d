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
    .venv/bin/python scripts/sim_policies.py --fair-holders [--seeds 1-12]

``--fair-holders`` (issue 13, item 2) replays the same traces with each job drawn for one of two
users and rig's fair share (recent usage in GiB-hours: each running job counted as at least
rig.fairshare.MIN_CHARGE_S, ended ones by their run time), under rig's policy without declared
durations (aged ranks aside: no aging in a trace of a minute), with the jobs holding cards
first in their priority either the first to hold first (rig's order) or by their users' fair
share, then the first to hold first; and once more with user a starting with a usage of
--heavy GiB-hours. It prints makespan / bound, the longest wait, and for the holders of the
user with more usage the most starts of the other user between its first hold and its start.

Units: seconds, bytes (GiB = 2**30).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.fairshare import MIN_CHARGE_S  # noqa: E402
from rig.testing.trace import (  # noqa: E402
    _RANK,
    GIB,
    PRIORITIES,
    Policy,
    TraceJob,
    _hold,
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


def simulate_fair(jobs: list[TraceJob], user_of: dict[int, str], fair_holders: bool, *,
                  heavy: float = 0.0, overhead: float = 0.05,
                  hold_after: tuple[float, float, float] = (0.0, 20.0, 40.0), tick: float = 0.0) -> dict:
    """rig's policy without declared durations (scripts/sim_policies.py's "rig now" row: estimated
    shadow times, room backfill, largest first) with two users' fair share and holders first in
    their priority: by (held_at, priority, index) as rig orders them, or with ``fair_holders``
    by (user's usage, held_at, ...). ``heavy``: user a's usage (GiB-hours) at the start. Returns
    makespan (s), waits, the start order by user, and per started holder the other user's starts
    made between its first hold and its start. ``tick`` (s, 0: none): a pass at least that often,
    as rig's dispatcher runs at least once a second. Units: s, bytes, GiB-hours."""
    from rig.estimates import Prior, RecentRun

    free, count = [USABLE] * CARDS, [0] * CARDS
    on_card: list[list[tuple[float, int, int]]] = [[] for _ in range(CARDS)]
    started: dict[int, tuple[float, TraceJob]] = {}
    ended: list[RecentRun] = []
    history = {u: 0.0 for u in sorted(set(user_of.values()))}  # GiB-hours of ended runs
    history["a"] = history.get("a", 0.0) + heavy
    arrivals = sorted(jobs, key=lambda j: (j.arrival, j.index))
    running: list[tuple[float, int, tuple[int, ...], int]] = []
    waiting: list[TraceJob] = []
    held_at: dict[int, float] = {}
    starts: list[str] = []  # users in start order
    passed: dict[int, int] = {}  # holder index -> the other user's starts while it held
    starts_at: list[tuple[str, float]] = []  # (user, when) of every start
    order: list[int] = []  # job indexes in start order
    waits: list[float] = []
    now = last_end = 0.0
    nxt = 0

    def usage(user: str) -> float:
        return history[user] + sum(j.gpu_memory * j.gpus / GIB * max(now - t0, MIN_CHARGE_S) / 3600.0
                                   for t0, j in started.values() if user_of[j.index] == user)

    while nxt < len(arrivals) or waiting or running:
        times = [running[0][0]] if running else []
        if nxt < len(arrivals):
            times.append(arrivals[nxt].arrival)
        if not times:
            break
        if tick and waiting:
            times.append((math.floor(now / tick) + 1) * tick)
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
            began, done = started.pop(index)
            ended.append(RecentRun(done.duration, done.gpu_memory, done.gpus, "u"))
            history[user_of[index]] += done.gpu_memory * done.gpus / GIB * done.duration / 3600.0
        prior = Prior(ended)
        for c in range(CARDS):
            on_card[c] = [(now + prior.estimate(user="u", nbytes=started[i][1].gpu_memory,
                                                gpus=started[i][1].gpus).remaining(now - started[i][0]), b, i)
                          for _e, b, i in on_card[c]]
        loads = {u: usage(u) for u in history}

        def in_order(waiting: list[TraceJob], loads: dict[str, float]) -> Iterator[TraceJob]:
            """Run order, made lazily: fair share (``loads``, charged by the caller at every
            start) is re-read after every start, as rig's."""
            for rank in sorted({_RANK[j.priority] for j in waiting}):
                group = [j for j in waiting if _RANK[j.priority] == rank]
                holders = sorted((j for j in group if j.index in held_at),
                                 key=lambda j: (held_at[j.index], j.index))
                others = sorted((j for j in group if j.index not in held_at), key=largest_first)
                for part in (holders, others):
                    if part is holders and not fair_holders:
                        yield from part
                        continue
                    queue = {u: [j for j in part if user_of[j.index] == u] for u in history}
                    while any(queue.values()):
                        user = min((u for u in queue if queue[u]),
                                   key=lambda u: (loads[u], part.index(queue[u][0])))
                        yield queue[user].pop(0)

        held: dict[int, tuple[float, int]] = {}
        still: list[TraceJob] = []
        for job in in_order(waiting, loads):
            def open_card(c: int, job: TraceJob = job, held: dict[int, tuple[float, int]] = held) -> bool:
                if c not in held:
                    return True
                until, need = held[c]
                if until == math.inf:
                    return False
                gone = [x for x in on_card[c] if x[0] <= until]
                room = free[c] + sum(x[1] for x in gone)
                return room - job.gpu_memory >= need and count[c] - len(gone) + 2 <= MAX_JOBS

            fit = [c for c in range(CARDS) if free[c] >= job.gpu_memory and count[c] < MAX_JOBS and open_card(c)]
            if len(fit) < job.gpus:
                still.append(job)
                if now - job.arrival >= hold_after[_RANK[job.priority]]:
                    before = len(held)
                    _hold(job, held, free, count, on_card, now, True, USABLE, MAX_JOBS)
                    if len(held) > before:
                        held_at.setdefault(job.index, now)
                continue
            chosen = tuple(sorted(fit, key=lambda c: (free[c] - job.gpu_memory, count[c], c))[: job.gpus])
            found = prior.estimate(user="u", nbytes=job.gpu_memory, gpus=job.gpus)
            for c in chosen:
                free[c] -= job.gpu_memory
                count[c] += 1
                on_card[c].append((now + found.expected, job.gpu_memory, job.index))
            started[job.index] = (now, job)
            user = user_of[job.index]
            loads[user] += job.gpu_memory * job.gpus / GIB * MIN_CHARGE_S / 3600.0
            if job.index in held_at:
                passed[job.index] = sum(1 for u, t in starts_at if u != user and t >= held_at[job.index])
            starts.append(user)
            order.append(job.index)
            starts_at.append((user, now))
            end = now + job.duration + overhead
            last_end = max(last_end, end)
            waits.append(now - job.arrival)
            heapq.heappush(running, (end, job.index, chosen, job.gpu_memory))
        waiting = still
    return {"span": last_end, "waits": waits, "starts": starts, "passed": passed, "order": order}


def fair_holders_study(seeds: list[int], n_jobs: int, overhead: float, heavy: float) -> None:
    """--fair-holders: rig's holder order against fair share among holders (see the docstring)."""
    print(f"{len(seeds)} seeds, {n_jobs} jobs each, two users (each job drawn at random), {overhead:.2f} s "
          f"start overhead; 8 x 76 GiB usable, 4 jobs a card; rig's policy, nothing declared")
    print(f"{'holders ordered':44} {'a usage':>8} {'x bound mean':>12} {'worst':>6} {'max wait':>9} "
          f"{'heavier holder passed by, max':>30} {'alternations':>12}")
    for start in (0.0, heavy):
        for fair in (False, True):
            ratios, longest, passed_max, switches = [], 0.0, 0, 0
            for s in seeds:
                trace = generate_trace(n_jobs, s)
                rng = random.Random(1000 + s)
                user_of = {j.index: rng.choice("ab") for j in trace}
                got = simulate_fair(trace, user_of, fair, heavy=start, overhead=overhead)
                bound = lower_bound(trace, cards=CARDS, usable_per_card=USABLE, max_jobs_per_card=MAX_JOBS).value
                ratios.append(got["span"] / bound)
                longest = max(longest, max(got["waits"]))
                heavier = "a" if start > 0 else None
                passed_max = max([passed_max] + [n for i, n in got["passed"].items()
                                                 if heavier is None or user_of[i] == heavier])
                switches += sum(1 for x, y in zip(got["starts"], got["starts"][1:], strict=False) if x != y)
            name = "by fair share, then first to hold" if fair else "first to hold first (rig)"
            print(f"{name:44} {start:8.1f} {sum(ratios) / len(ratios):12.3f} {max(ratios):6.3f} "
                  f"{longest:9.1f} {passed_max:30d} {switches / len(seeds):12.1f}")


def tester_case(overhead: float) -> None:
    """The tester's case (issue 13): 8 cards busy with 60 GiB jobs of user c (ending at 40-47 s),
    then 70 GiB jobs: fb0 at 1 s, fa0-fa3 at 2 s, fb1-fb3 at 3 s; each holds a card 20 s after
    it arrived (passes once a second, as rig's). Prints the start order under both holder
    orders."""
    jobs = [TraceJob(i, "large", 60 * GIB, 1, "medium", 0.0, 40.0 + i) for i in range(8)]
    user_of = {i: "c" for i in range(8)}
    names = {}
    for k, (user, n, at) in enumerate([("b", 0, 1.0)] + [("a", n, 2.0) for n in range(4)]
                                      + [("b", n, 3.0) for n in range(1, 4)]):
        index = 8 + k
        jobs.append(TraceJob(index, "large", 70 * GIB, 1, "medium", at, 5.0))
        user_of[index] = user
        names[index] = f"f{user}{n}"
    for fair in (False, True):
        got = simulate_fair(jobs, user_of, fair, overhead=overhead, tick=1.0)
        order = [names[i] for i in got["order"] if i in names]
        print(f"tester's case, holders {'by fair share' if fair else 'first to hold first (rig)'}: "
              f"{', '.join(order)}; makespan {got['span']:.1f} s")


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
    parser.add_argument("--fair-holders", action="store_true",
                        help="two users: holders in rig's order against by fair share (issue 13, item 2)")
    parser.add_argument("--heavy", type=float, default=5.0,
                        help="with --fair-holders: user a's usage at the start of the second run (GiB-hours)")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    if args.fair_holders:
        fair_holders_study(seeds, args.jobs, args.overhead, args.heavy)
        tester_case(args.overhead)
        return
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
