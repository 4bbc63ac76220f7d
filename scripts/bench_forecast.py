#!/usr/bin/env python3
"""What an estimated start costs (rig.forecast): CPU time of the leader's forecast (simulate and
store, rig.forecast_store) and of a view's ``Client.start_estimates`` read, on fakeredis (no
server needed), one dispatcher pass having placed the running jobs.

Nodes of 8 fake 80 GiB cards (4 jobs a card); 40 jobs a node submitted and placed by a real
Dispatcher pass, then 300 waiting (seeded mix: 5-70 GiB, one in five on 2 cards, three users,
mixed priorities, each with an earlier run of 30 s to 1 h, or with ``--unknown`` a quarter with
none; with ``--sweeps``, 6 sweeps of 50 alike jobs). Prints the leader's CPU time (min and
median of 5, and its share of a core at one forecast every FORECAST_EVERY_S), what the jobs were
told, and a view's CPU time to read 50 jobs' and 1 job's estimates (median of 20).

    .venv/bin/python scripts/bench_forecast.py [--nodes 1] [--unknown] [--sweeps] [--beside redis://...]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fakeredis  # noqa: E402
import redis  # noqa: E402

from rig.client import Client  # noqa: E402
from rig.config import Settings, load_settings  # noqa: E402
from rig.forecast import forecast  # noqa: E402
from rig.forecast_store import FORECAST_EVERY_S, publish  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from workers.dispatcher import Dispatcher  # noqa: E402
from workers.forecaster import SWITCH_INTERVAL_S  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--unknown", action="store_true", help="a quarter of the jobs without earlier runs")
    parser.add_argument("--sweeps", action="store_true",
                        help="the waiting jobs are 6 sweeps of 50 alike jobs (one user, size and priority each)")
    parser.add_argument("--beside", metavar="REDIS_URL",
                        help="instead: a dispatcher pass's wall time on this Redis (a throwaway key prefix), "
                             "alone and with forecasts running in another thread, at Python's default GIL "
                             "switch interval and at the control worker's (workers.forecaster)")
    args = parser.parse_args()
    if args.beside:
        r = redis.Redis.from_url(args.beside, decode_responses=True)
        prefix = f"bench-forecast:{uuid.uuid4().hex[:8]}:"
        try:
            beside(*world(r, prefix, args))
        finally:
            for key in r.scan_iter(f"{prefix}*", count=1000):
                r.delete(key)
        return
    r = fakeredis.FakeRedis(decode_responses=True)
    client, _settings = world(r, "bench-forecast:", args)
    r.set(client.keys.sched_leader, "bench")  # a dispatcher runs
    # The leader's work (workers.forecaster): simulate, then store in one MULTI.
    took, stored = [], []
    for _ in range(5):
        start = time.process_time()
        found = forecast(client)
        middle = time.process_time()
        publish(r, client.keys, found)
        took.append(time.process_time() - start)
        stored.append(time.process_time() - middle)
    told: dict[str, int] = {}
    for estimate in found.starts.values():
        word = estimate.short(found.now).split(" ")[0].lstrip("~")
        word = "a time" if word[:1].isdigit() or word == "now" else word
        told[word] = told.get(word, 0) + 1
    print(f"{args.nodes * 8} cards, {len(found.starts)} waiting jobs estimated and stored: CPU min "
          f"{min(took) * 1000:.0f} ms, median {statistics.median(took) * 1000:.0f} ms (the leader, every "
          f"{FORECAST_EVERY_S:.0f} s: {statistics.median(took) / FORECAST_EVERY_S:.1%} of a core; storing it: "
          f"{statistics.median(stored) * 1000:.1f} ms); told: {told}")
    # A view's work: the web page's 50 waiting jobs, `rig show`'s one (fakeredis' server work
    # is in this process and counted: an upper bound of the client's share).
    shown = client.store.pending_head(50)
    for what, ids in (("the web page's 50", shown), ("rig show's 1", shown[:1])):
        reads = []
        for _ in range(20):
            start = time.process_time()
            rows = [row for got in [client.start_estimates(ids)] for row in map(got.row, ids)]
            reads.append(time.process_time() - start)
        assert all(row["estimated_at"] is not None for row in rows)
        print(f"  a view reading {what}: CPU median {statistics.median(reads) * 1000:.2f} ms")


def world(r: redis.Redis, prefix: str, args: argparse.Namespace) -> tuple[Client, Settings]:
    """The cards, the running jobs (placed by a real pass) and the waiting ones, under ``prefix``."""
    settings = load_settings(key_prefix=prefix, home=tempfile.mkdtemp(), node_name="n0")
    client = Client(settings, redis_client=r)
    for n in range(args.nodes):
        for i in range(8):
            client.ledger.register_card(f"n{n}", GpuReading(index=i, uuid=f"u{n}-{i}", model="fake", total=80 * GIB),
                                        max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    rnd = random.Random(1)
    runs = [None, 60.0, 600.0, 3600.0] if args.unknown else [30.0, 60.0, 600.0, 3600.0]

    def jobs(count: int) -> list[tuple[Job, None]]:
        return [(Job(id=0, name=f"j{k}", user=rnd.choice(("ann", "bob", "cy")), command=["true"],
                     gpu_memory=rnd.choice((5, 10, 20, 40, 70)) * GIB, gpus=rnd.choice((1, 1, 1, 1, 2)),
                     priority=rnd.choice(list(Priority)), state=JobState.PENDING, workdir="/",
                     created_at=time.time(), expected_seconds=rnd.choice(runs)), None) for k in range(count)]

    client.store.create_many(jobs(40 * args.nodes))
    Dispatcher(settings, lambda *a: None, client=r).dispatch_pass()
    if args.sweeps:
        sweeps = [jobs(1)[0][0] for _ in range(6)]
        client.store.create_many([(dataclasses.replace(sweep, name=f"{sweep.name}-{k}"), None)
                                  for sweep in sweeps for k in range(50)])
    else:
        client.store.create_many(jobs(300))
    return client, settings


def beside(client: Client, settings: Settings) -> None:
    """Dispatcher passes (wall ms), alone and while forecasts run in another thread."""
    dispatcher = Dispatcher(settings, lambda *a: None, client=client.r)
    client.r.set(client.keys.sched_leader, "bench")

    def passes() -> str:
        took = []
        for _ in range(30):
            start = time.perf_counter()
            dispatcher.dispatch_pass()
            took.append((time.perf_counter() - start) * 1000)
        return f"median {statistics.median(took):.1f} ms, max {max(took):.1f} ms"

    for interval in (0.005, SWITCH_INTERVAL_S):
        sys.setswitchinterval(interval)
        alone = passes()
        stop = threading.Event()
        thread = threading.Thread(target=_forecasts, args=(client, stop))
        thread.start()
        try:
            shared = passes()
        finally:
            stop.set()
            thread.join()
        print(f"GIL switch interval {interval * 1000:.1f} ms: a pass alone {alone}; beside a forecast {shared}")



def _forecasts(client: Client, stop: threading.Event) -> None:
    while not stop.is_set():
        forecast(client)


if __name__ == "__main__":
    main()
