#!/usr/bin/env python3
"""Cluster-scale costs of rig, measured with rig's own classes on one real Redis, without
starting any worker (issue 15, item 4).

For each cluster size (N nodes x 8 fake 80 GiB cards, max 5 jobs per card) and number of users,
the script registers the cards in the ledger, fills every card nearly full with running jobs
(4 x 18 GiB: 8 GiB and one slot left, so no waiting job fits), queues waiting jobs (12-40 GiB,
10 % of them on 2 cards, priorities mixed) for U users, then prints for 1k / 10k / 100k waiting:

  * pass (idle): the dispatcher's real pass (workers.dispatcher.Dispatcher.dispatch_pass) when
    nothing can start, p50 / p95 in ms;
  * ends/s: 64 running jobs on 64 different cards ended through the real path
    (workers.outcomes.conclude), per second;
  * pass (start): the pass right after those ends, which starts what now fits (the count in
    brackets), ms; the jobs it started are then claimed, so the cluster is full again;
  * submit_many/s: rig.Client.submit_many of 1,000 jobs;
  * status: rig.Client.status() (what `rig status` reads), ms;
  * adopt: one card worker's periodic adoption (CardRunner.adopt), Redis commands and bytes
    sent back per call, and its Redis time (INFO commandstats usec);
  * health: the beat's cluster health pass (HealthChecker.run_cluster), ms and Redis time;
  * periodic: the Redis time of a cluster's periodic work per second of wall time (every card
    worker's adopt every health.check_interval, the health pass as often, the idle dispatcher
    pass every second), as a share of one Redis core (commandstats usec: the commands' own
    time, not the network);
  * memory/job: Redis used_memory per waiting job.

Then, per number of dispatchers D (one leader, D - 1 standing by, each a thread running the
real Dispatcher.run_forever with its own connection, on a small empty cluster): submit ->
placement (the dispatcher's on_start, right after the reservation that pushes the start) latency, p50 / p95 ms
of the jobs placed within WAKE_TIMEOUT_S; those not placed by then are counted as timed out, never
as a latency.

Which Redis: $RIG_BENCH_REDIS_URL, else $RIG_REDIS_URL (the Redis rig is told to use), else
redis://127.0.0.1:6379/0 (rig.testing.bench_redis, the rule of every benchmark here), or a
throwaway redis-server with ``--private-redis``. Every key is under a private prefix
(rigscale:<id>:), deleted at the end (SCAN + DEL; never FLUSHALL), also when the run is stopped
by Ctrl-C or SIGTERM (`timeout`, `kill`: rig.testing.sigterm), as are its temporary folders
(/tmp/rig-scale-*). With a shared Redis, commandstats and used_memory include other clients'
traffic: ``--private-redis`` gives clean figures.

    .venv/bin/python scripts/bench_scale.py --quick            # < 1 min: 8 and 64 cards, 1k waiting
    .venv/bin/python scripts/bench_scale.py --private-redis    # the full table (several minutes)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.client import Client  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from rig.nodes import NodeRegistry  # noqa: E402
from rig.testing.bench_redis import bench_redis_url, described  # noqa: E402
from rig.testing.sigterm import exit_on_sigterm  # noqa: E402
from workers.card_runner import CardRunner  # noqa: E402
from workers.dispatcher import Dispatcher  # noqa: E402
from workers.health import HealthChecker  # noqa: E402
from workers.outcomes import AttemptEnd, conclude  # noqa: E402

CARDS_PER_NODE = 8
CARD_BYTES = 80 * GIB
MAX_JOBS = 5
RUNNING_PER_CARD = 4
RUNNING_BYTES = 18 * GIB  # 4 x 18 = 72 of 80 GiB: 8 GiB and one slot left on every card
WAITING_SIZES_GIB = (12, 16, 20, 24, 40)  # none fits in 8 GiB; 12-24 fit a card one end frees
ENDS_PER_ROUND = 64
SUBMIT_BATCH = 1000
#: How long wake_latency waits for one submitted job to be placed (s); a job not placed by then
#: is counted as timed out (with 0 dispatchers nothing ever is).
WAKE_TIMEOUT_S = 5.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class RedisMeter:
    """Redis' own accounting between two points: commands run, their time (commandstats usec),
    bytes sent to clients, CPU seconds of the server."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def sample(self) -> tuple[int, int, int, float]:
        stats = self.r.info("commandstats")
        calls = sum(int(v["calls"]) for v in stats.values())
        usec = sum(int(v["usec"]) for v in stats.values())
        info = self.r.info()
        return calls, usec, int(info["total_net_output_bytes"]), float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    @contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        out: dict[str, float] = {}
        before = self.sample()
        t0 = time.perf_counter()
        yield out
        out["wall_s"] = time.perf_counter() - t0
        after = self.sample()
        # The two INFO calls of a sample are themselves commands: not counted.
        out["calls"] = after[0] - before[0] - 2
        out["usec"] = after[1] - before[1]
        out["bytes"] = after[2] - before[2]
        out["cpu_s"] = after[3] - before[3]


class Cluster:
    """N nodes x 8 cards under one private prefix, nearly full, with waiting jobs."""

    def __init__(self, url: str, nodes: int, users: int, home: Path) -> None:
        self.prefix = f"rigscale:{uuid.uuid4().hex[:8]}:"
        self.settings = load_settings(home=home, redis_url=url, key_prefix=self.prefix, node_name="bench-control",
                                      max_task_per_gpu=MAX_JOBS)
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.keys = Keys(self.prefix)
        self.ledger = Ledger(self.r, self.keys)
        self.store = self.ledger.store
        self.nodes = [f"n{i:03d}" for i in range(nodes)]
        self.users = [f"user{i}" for i in range(users)]
        self.rng = random.Random(15)
        self.waiting = 0
        self.started: list[tuple[int, str, str, int]] = []
        #: The running jobs' own estimate (s; expected_seconds, as submit stores it for a command
        #: run before, cautious 1.5 x): None, the default, leaves them to the cluster's recent runs.
        self.running_expected: float | None = None
        self.touched: set[tuple[str, int]] = set()  # cards a job ended on since the last restore
        self.dispatcher = Dispatcher(self.settings, lambda *start: self.started.append(start), client=self.r)

    @property
    def cards(self) -> list[tuple[str, int]]:
        return [(node, i) for node in self.nodes for i in range(CARDS_PER_NODE)]

    def build(self) -> None:
        registry = NodeRegistry(self.r, self.keys)
        for node in self.nodes:
            registry.register(node, ttl=3600)
            for index in range(CARDS_PER_NODE):
                reading = GpuReading(index, f"GPU-{node}-{index}", "Fake 80G", CARD_BYTES, 0, 0, 40)
                self.ledger.register_card(node, reading, max_jobs=MAX_JOBS, reserve_fraction=0.0,
                                          allowed=True, fake=True)
        for node, index in self.cards:
            self.fill(node, index, RUNNING_PER_CARD)

    def fill(self, node: str, index: int, count: int) -> None:
        """Start ``count`` running jobs of RUNNING_BYTES on one card (reserve + claim)."""
        if count <= 0:
            return
        expected = self.running_expected
        made = self.store.create_many([(replace(self._job(RUNNING_BYTES, 1, Priority.MEDIUM), expected_seconds=expected,
                                                cautious_seconds=None if expected is None else expected * 1.5), None)
                                       for _ in range(count)])
        for job in made:
            ok, token = self.ledger.reserve(job.id, node, [index], RUNNING_BYTES, user=job.user)
            assert ok, token
            ok, detail = self.ledger.claim(job.id, token, f"card{index}@{node}")
            assert ok, detail
            self.store.update(job.id, pid=1, proc_start=1)
        # A reservation pushed no wake; creating them did: drained so the first pass is not woken.
        self.r.delete(self.keys.sched_wake)

    def _job(self, nbytes: int, gpus: int, priority: Priority) -> Job:
        return Job(id=0, name=f"scale-{nbytes // GIB}g", user=self.rng.choice(self.users), command=["true"],
                   gpu_memory=nbytes, gpus=gpus, priority=priority, state=JobState.PENDING, workdir="/tmp",
                   created_at=0.0)

    def add_waiting(self, count: int) -> None:
        prios = [Priority.HIGH] + [Priority.MEDIUM] * 4 + [Priority.LOW] * 5
        batch: list[tuple[Job, None]] = []
        for _ in range(count):
            gpus = 2 if self.rng.random() < 0.1 else 1
            batch.append((self._job(self.rng.choice(WAITING_SIZES_GIB) * GIB, gpus, self.rng.choice(prios)), None))
            if len(batch) == 5000:
                self.store.create_many(batch)
                batch = []
        if batch:
            self.store.create_many(batch)
        self.waiting += count
        self.r.delete(self.keys.sched_wake)

    def end_some(self, count: int, ended_at: float | None = None, runtime: float | None = None) -> float:
        """End ``count`` running jobs, one on each of ``count`` cards spread over the cluster,
        through conclude(), stamped ``ended_at`` (default: just now) with ``runtime`` (s).
        Returns ends per second."""
        cards = self.cards
        step = max(1, len(cards) // count)
        chosen = cards[::step][:count]
        jobs = []
        for node, index in chosen:
            held = sorted(self.ledger.holdings(node, index))
            if held:
                jobs.append(self.store.get(held[0]))
                self.touched.add((node, index))
        t0 = time.perf_counter()
        for job in jobs:
            conclude(self.ledger, job, str(job.assignments),
                     AttemptEnd(exit_code=0, ended_at=time.time() - 0.001 if ended_at is None else ended_at,
                                runtime=runtime))
        return len(jobs) / (time.perf_counter() - t0)

    def restore(self) -> None:
        """Put the cluster back as it was built: what the last pass started runs and ends (claim,
        then SUCCEEDED), and each card ended on gets its 4 running jobs of 18 GiB again, so the
        next figures again start from every card nearly full."""
        for job_id, token, node, card in self.started:
            self.ledger.claim(job_id, token, f"card{card}@{node}")
            self.ledger.transition(job_id, JobState.SUCCEEDED, token=token)
        self.started.clear()
        for node, index in sorted(self.touched):
            self.fill(node, index, RUNNING_PER_CARD - len(self.ledger.holdings(node, index)))
        self.touched.clear()

    def delete(self) -> None:
        delete_prefix(self.settings.redis_url, self.prefix)


def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` over a connection of its own: the run's may have been
    cut mid-reply (SIGTERM, Ctrl-C) and would read that reply as the answer to SCAN."""
    r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30)
    batch = []
    for key in r.scan_iter(match=f"{prefix}*", count=2000):
        batch.append(key)
        if len(batch) >= 2000:
            r.delete(*batch)
            batch = []
    if batch:
        r.delete(*batch)
    r.close()


def timed(fn: Callable[[], object], reps: int, cpu: list[float] | None = None) -> list[float]:
    """Wall ms of ``reps`` calls; with ``cpu``, this thread's CPU ms of each call appended to it
    (what the pass costs on a machine whose other load stretches the wall time)."""
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) * 1000)
    return out


def measure_size(url: str, nodes: int, users: int, waiting_steps: list[int], reps: int, home: Path) -> None:
    cluster = Cluster(url, nodes, users, home)
    meter = RedisMeter(cluster.r)
    ncards = nodes * CARDS_PER_NODE
    try:
        t0 = time.perf_counter()
        cluster.build()
        print(f"\n## {ncards} cards ({nodes} nodes), {users} user(s): {ncards * RUNNING_PER_CARD} running jobs "
              f"(built in {time.perf_counter() - t0:.1f} s)")
        print("| waiting | pass idle p50/p95 ms (CPU p50) | ends/s | pass start ms, CPU (started) | submit_many/s | status ms "
              "| adopt calls/KiB/usec | health ms (usec) | periodic % core | memory/job B |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        client = Client(cluster.settings, redis_client=cluster.r)
        for target in waiting_steps:
            before_mem, added = int(cluster.r.info("memory")["used_memory"]), max(0, target - cluster.waiting)
            cluster.add_waiting(added)
            per_job = (int(cluster.r.info("memory")["used_memory"]) - before_mem) / max(1, added)
            cluster.dispatcher.dispatch_pass()  # the first pass words every reason: not the steady state
            idle_cpu: list[float] = []
            with meter.measure() as idle_cost:
                idle = timed(cluster.dispatcher.dispatch_pass, reps, idle_cpu)
            assert not cluster.started, "a job started while nothing should fit"
            ends, starts, starts_cpu, started = [], [], [], []
            for _ in range(max(1, reps // 5)):
                ends.append(cluster.end_some(ENDS_PER_ROUND))
                starts += timed(cluster.dispatcher.dispatch_pass, 1, starts_cpu)
                started.append(len(cluster.started))
                cluster.restore()
            t0 = time.perf_counter()
            client.submit_many([{"command": ["true"], "gpu_memory": "12G", "priority": "low"}] * SUBMIT_BATCH)
            submit_rate = SUBMIT_BATCH / (time.perf_counter() - t0)
            cluster.waiting += SUBMIT_BATCH
            status_ms = statistics.median(timed(client.status, 3))
            adopt = adopt_cost(cluster, meter)
            with meter.measure() as health_cost:
                HealthChecker(cluster.settings, cluster.r).run_cluster()
            interval = cluster.settings.health.check_interval
            periodic_usec_per_s = (adopt["usec"] * ncards / interval + health_cost["usec"] / interval
                                   + idle_cost["usec"] / reps)
            print(f"| {target:,} | {statistics.median(idle):.1f} / {percentile(idle, 0.95):.1f} "
                  f"({statistics.median(idle_cpu):.1f}) | {statistics.median(ends):.0f} "
                  f"| {statistics.median(starts):.1f}, {statistics.median(starts_cpu):.1f} ({min(started)}-{max(started)}) "
                  f"| {submit_rate:.0f} | {status_ms:.0f} "
                  f"| {adopt['calls']:.0f} / {adopt['bytes'] / 1024:.0f} / {adopt['usec']:.0f} "
                  f"| {health_cost['wall_s'] * 1000:.0f} ({health_cost['usec']:.0f}) "
                  f"| {periodic_usec_per_s / 1e4:.1f} | {per_job:.0f} |", flush=True)
    finally:
        cluster.delete()


def adopt_cost(cluster: Cluster, meter: RedisMeter) -> dict[str, float]:
    """One card worker's periodic adopt, its running jobs being supervised (as in a live worker):
    the median of 3 cards' Redis cost."""
    costs = []
    for node, index in cluster.cards[:: max(1, len(cluster.cards) // 3)][:3]:
        runner = CardRunner(cluster.settings, node, index, f"card{index}@{node}")
        runner.r = runner.store.r = runner.ledger.r = cluster.r  # one connection: no connect in the figures
        for job_id in cluster.ledger.holdings(node, index):
            runner._active[job_id] = None  # type: ignore[assignment] # supervised: adopt leaves it
        with meter.measure() as cost:
            runner.adopt(resend_after=3600.0)
        costs.append(cost)
    return min(costs, key=lambda c: c["usec"]) if len(costs) < 3 else sorted(costs, key=lambda c: c["usec"])[1]


def wake_latency(url: str, dispatchers: int, samples: int, home: Path) -> tuple[list[float], int]:
    """Submit -> reservation (on_start) with ``dispatchers`` dispatchers on one small empty
    cluster: (the latencies of the jobs placed within WAKE_TIMEOUT_S, in ms; how many were not)."""
    prefix = f"rigscale:{uuid.uuid4().hex[:8]}:"
    settings = load_settings(home=home, redis_url=url, key_prefix=prefix, node_name="bench-control",
                             max_task_per_gpu=MAX_JOBS)
    r = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(prefix)
    ledger = Ledger(r, keys)
    placed: dict[int, float] = {}
    arrived = threading.Condition()

    def on_start(job_id: int, _token: str, _node: str, _card: int) -> None:
        with arrived:
            placed[job_id] = time.perf_counter()
            arrived.notify_all()

    runners = [Dispatcher(settings, on_start) for _ in range(dispatchers)]
    try:
        NodeRegistry(r, keys).register("w0", ttl=3600)
        for index in range(CARDS_PER_NODE):
            ledger.register_card("w0", GpuReading(index, f"GPU-w0-{index}", "Fake 80G", CARD_BYTES, 0, 0, 40),
                                 max_jobs=MAX_JOBS, reserve_fraction=0.0, allowed=True, fake=True)
        for runner in runners:
            runner.start()
        deadline = time.monotonic() + 10
        while not r.exists(keys.sched_leader) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.5)  # every dispatcher past its first pass and waiting
        latencies, timed_out = [], 0
        for _ in range(samples):
            job = Job(id=0, name="wake", user="user0", command=["true"], gpu_memory=GIB, gpus=1,
                      priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/tmp", created_at=0.0)
            t0 = time.perf_counter()
            (job,) = ledger.store.create_many([(job, None)])
            with arrived:
                if not arrived.wait_for(lambda job=job: job.id in placed, timeout=WAKE_TIMEOUT_S):
                    timed_out += 1  # never a latency: it is how long we waited, not how long it took
                    continue
            latencies.append((placed[job.id] - t0) * 1000)
            ledger.transition(job.id, JobState.SUCCEEDED)
            time.sleep(random.uniform(0.01, 0.05))  # pacing: submissions do not come in lockstep
        return latencies, timed_out
    finally:
        for runner in runners:
            runner.stop()
        for runner in runners:
            if runner._thread is not None:
                runner._thread.join(5)
        delete_prefix(url, prefix)


def latency_row(dispatchers: int, latencies: list[float], timed_out: int) -> str:
    """One row of the wake latency table: p50 / p95 of the placed jobs, "timed out" where none
    was placed, and how many of them timed out."""
    if latencies:
        p50, p95 = f"{statistics.median(latencies):.1f}", f"{percentile(latencies, 0.95):.1f}"
    else:
        p50 = p95 = "timed out"
    return f"| {dispatchers} | {p50} | {p95} | {timed_out} of {len(latencies) + timed_out} |"


def counts(example: str, *, multiple_of: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: whole numbers above 0 (multiples of ``multiple_of``), comma-separated."""
    def parse(text: str) -> list[int]:
        items = text.split(",")
        if not all(item.strip().isdigit() and int(item) > 0 and int(item) % multiple_of == 0 for item in items):
            what = f"multiples of {multiple_of}" if multiple_of > 1 else "whole numbers above 0"
            raise argparse.ArgumentTypeError(f"{text!r}: give {what}, comma-separated, like {example}")
        return [int(item) for item in items]
    return parse


def positive(text: str) -> int:
    """An argparse type: a whole number above 0."""
    if not text.strip().isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number above 0, like 20")
    return int(text)


@contextmanager
def private_redis() -> Iterator[str]:
    from rig.testing.throwaway_redis import start_redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="rig-scale-redis-"))
    proc = start_redis(port, folder)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()  # `timeout` / kill: the finally blocks delete the keys and folders
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=described() + "; RIG_REDIS_URL is used only when RIG_BENCH_REDIS_URL "
                                     "is unset; --private-redis ignores both")
    parser.add_argument("--quick", action="store_true", help="8 and 64 cards, 1k waiting, 10 users, 8 dispatchers")
    parser.add_argument("--cards", default=[8, 64, 512], type=counts("8,64,512", multiple_of=CARDS_PER_NODE),
                        help=f"cluster sizes (cards; multiples of {CARDS_PER_NODE}), comma-separated")
    parser.add_argument("--waiting", default=[1000, 10000, 100000], type=counts("1000,10000,100000"),
                        help="waiting jobs, comma-separated (whole numbers: 1000, not 1k)")
    parser.add_argument("--users", default=[1, 10], type=counts("1,10"), help="users, comma-separated")
    parser.add_argument("--dispatchers", default=[1, 8, 64], type=counts("1,8,64"),
                        help="dispatchers for the wake latency, comma-separated, each at least 1")
    parser.add_argument("--reps", type=positive, default=20, help="passes timed per figure")
    parser.add_argument("--private-redis", action="store_true", help="a throwaway redis-server on a free port")
    args = parser.parse_args(argv)
    if args.quick:
        args.cards, args.waiting, args.users, args.dispatchers, args.reps = [8, 64], [1000], [10], [1, 8], 10
    steps = sorted(args.waiting)
    home = Path(tempfile.mkdtemp(prefix="rig-scale-"))
    try:
        with private_redis() if args.private_redis else _shared(bench_redis_url()[0]) as url:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=3).ping()
            except (redis.RedisError, ValueError) as exc:
                raise SystemExit(f"bench_scale: cannot use Redis at {url} ({exc}); start it, set "
                                 "RIG_BENCH_REDIS_URL, or pass --private-redis") from None
            print(f"Redis {url}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
            for ncards in args.cards:
                for users in args.users:
                    measure_size(url, ncards // CARDS_PER_NODE, users, steps, args.reps, home)
            print("\n## wake latency: submit -> placement, one leader and the others standing by")
            print(f"| dispatchers | p50 ms | p95 ms | not placed within {WAKE_TIMEOUT_S:g} s |\n|---|---|---|---|")
            for count in args.dispatchers:
                print(latency_row(count, *wake_latency(url, count, 10 if args.quick else 30, home)), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


@contextmanager
def _shared(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    sys.exit(main())
