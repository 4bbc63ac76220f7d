#!/usr/bin/env python3
"""What the archive does for Redis' memory, and what it costs (issue 15, item 2).

Starts a private redis-server (a free loopback port, no persistence; --redis-url to use
another) so INFO used_memory counts rig's keys only, and an archive (SQLite in a temporary
folder by default; --archive-url postgresql://... for PostgreSQL). Then:

1. **Waiting jobs**: submits --waiting jobs with ``submit_many`` (batches of --batch) and
   prints Redis' memory per waiting job (the used_memory delta, and MEMORY USAGE of one job's
   hash and spec) and the rate of the last batch (with that many waiting).
2. **Flat over N**: submits --jobs more, batch by batch; each batch is finished through the
   ledger (``Ledger.transition``, as a card worker ends a job, with one attempt's record) and
   an archiving pass runs (``rig.archiving.Archiver``, the beat task's code) with the default
   retention (archive_after_days, archive_keep_finished; --retention and --keep change them):
   the jobs are minutes old, so the cap on finished jobs in Redis is what moves them.
   Prints used_memory every tenth of the way: flat means the archive keeps Redis bounded.
3. **Move rate**: jobs archived per second of archiving passes (read, insert + commit, forget).
4. **`rig usage`**: the time of ``Client.usage`` (what `rig usage --since 30d` calls) over
   everything archived.

    .venv/bin/python scripts/bench_archive.py [--jobs 100000] [--waiting 100000] [--batch 2000]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.archive import Archive, default_url  # noqa: E402
from rig.archiving import Archiver  # noqa: E402
from rig.client import Client  # noqa: E402
from rig.config import Settings, load_settings  # noqa: E402
from rig.models import JobState  # noqa: E402
from rig.testing.harness import delete_prefix  # noqa: E402
from rig.testing.sigterm import exit_on_sigterm  # noqa: E402

KEEP_DEFAULT = Settings.model_fields["archive_keep_finished"].default
AFTER_DEFAULT_S = Settings.model_fields["archive_after_days"].default * 86400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def private_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    from rig.testing.throwaway_redis import start_redis

    port = free_port()
    return start_redis(port, folder), f"redis://127.0.0.1:{port}/0"


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def requests(n: int) -> list[dict]:
    return [{"command": ["python", "train.py", "--lr", f"{i * 1e-5:.5f}"], "gpu_memory": "4G", "name": "sweep",
             "workdir": "/tmp", "priority": "low"} for i in range(n)]


def finish(client: Client, ids: list[int], now: float) -> None:
    """End each job as a card worker would: one attempt of 60 s that ended 60 s ago."""
    for job in client.store.get_many(ids):
        attempt = {"attempt": 1, "node": "n1", "cards": [0], "gpu_memory": job.gpu_memory, "started_at": now - 120,
                   "ended_at": now - 60, "exit_code": 0, "outcome": "succeeded", "summary": "exit code 0",
                   "log": f"/tmp/logs/{job.id}/1.log", "vram_peak": 3 * 2**30, "vram_mean": 2 * 2**30}
        client.ledger.transition(job.id, JobState.SUCCEEDED, read=job, now=now - 60,
                                 fields={"attempts": [attempt], "started_at": now - 120, "exit_code": 0,
                                         "node": "n1", "log_paths": [attempt["log"]], "reason": "exit code 0"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000, help="jobs submitted, finished and archived")
    ap.add_argument("--waiting", type=int, default=100_000, help="waiting jobs for the memory and rate figures")
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--retention", type=float, default=AFTER_DEFAULT_S, help="archive_after_days, in seconds here")
    ap.add_argument("--keep", type=int, default=KEEP_DEFAULT, help="archive_keep_finished")
    ap.add_argument("--redis-url", help="use this Redis (a private prefix) instead of a private redis-server")
    ap.add_argument("--archive-url", help="default: SQLite in a temporary folder")
    args = ap.parse_args()
    exit_on_sigterm()  # `timeout` / kill: the finally below stops the redis-server, deletes the folder

    folder = Path(tempfile.mkdtemp(prefix="rig-bench-archive-"))
    server = None
    url = args.redis_url
    if url is None:
        server, url = private_redis(folder)
    prefix = f"rigbench:{uuid.uuid4().hex[:8]}:"
    r = redis.Redis.from_url(url, decode_responses=True)
    client = Client(load_settings(key_prefix=prefix, home=folder, redis_url=url), redis_client=r)
    archive = Archive(args.archive_url or default_url(folder), prefix)
    try:
        base = used(r)
        print(f"redis: {url} ({'private' if server else 'shared'}); archive: {archive.dialect.name}")

        # 1. waiting jobs
        rate = 0.0
        for start in range(0, args.waiting, args.batch):
            n = min(args.batch, args.waiting - start)
            t = time.perf_counter()
            handles = client.submit_many(requests(n))
            rate = n / (time.perf_counter() - t)
        per_job = (used(r) - base) / max(1, args.waiting)
        one = handles[-1].id
        hash_b = r.memory_usage(client.keys.job(one), samples=0)
        spec_b = r.memory_usage(client.keys.job_spec(one), samples=0) or 0
        print(f"waiting jobs: {args.waiting:,}; Redis per waiting job {per_job:,.0f} B (used_memory delta, "
              f"indexes included); one job: hash {hash_b} B ({r.object('encoding', client.keys.job(one))}) "
              f"+ spec {spec_b} B")
        print(f"submit_many with {args.waiting:,} waiting: {rate:,.0f} jobs/s (batch of {args.batch})")
        for _ in range(0, args.waiting, 10_000):  # out of the way: phase 2 measures finished jobs
            ids = client.store.ids_in_state(JobState.PENDING, limit=10_000)
            finish(client, ids, client_now(client))
            Archiver(r, client.keys, archive, after_seconds=0, keep=0).run(client_now(client))
        base = used(r)
        archive_count = archive.count()

        # 2. flat over N
        mover = Archiver(r, client.keys, archive, after_seconds=args.retention, keep=args.keep)
        moved, move_s = 0, 0.0
        step = max(args.batch, args.jobs // 10)
        print(f"\n{'submitted':>10} {'finished in Redis':>18} {'archived':>9} {'used_memory MB':>15}")
        for start in range(0, args.jobs, args.batch):
            n = min(args.batch, args.jobs - start)
            ids = [h.id for h in client.submit_many(requests(n))]
            now = client_now(client)
            finish(client, ids, now)
            t = time.perf_counter()
            moved += mover.run(now).archived
            move_s += time.perf_counter() - t
            done = start + n
            if done % step < args.batch or done == args.jobs:
                in_redis = sum(client.store.count_by_state()[s] for s in JobState if s.terminal)
                print(f"{done:>10,} {in_redis:>18,} {archive.count() - archive_count:>9,} "
                      f"{(used(r) - base) / 2**20:>15.1f}")
        # 3. move rate
        print(f"\narchive move: {moved:,} jobs in {move_s:.1f} s of passes = {moved / move_s:,.0f} jobs/s")
        # 4. rig usage
        t = time.perf_counter()
        lines, total = client.usage(since=0.0, by="user")
        print(f"rig usage over {archive.count():,} archived jobs: {time.perf_counter() - t:.2f} s "
              f"({total.jobs:,} jobs, {total.card_hours:,.0f} card-hours)")
        files = list(folder.glob("archive.sqlite3*"))
        if files:
            size = sum(f.stat().st_size for f in files)
            print(f"archive on disk: {size / 2**20:,.0f} MiB, {size / archive.count():,.0f} B per job")
    finally:
        archive.close()
        if server is not None:
            server.kill()
            server.wait()
        else:
            delete_prefix(r, prefix)
        shutil.rmtree(folder, ignore_errors=True)


def client_now(client: Client) -> float:
    from rig.clock import shared_now

    return shared_now(client.r)


if __name__ == "__main__":
    main()
