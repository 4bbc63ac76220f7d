#!/usr/bin/env python3
"""Redis over a million jobs' whole lives, with the default retention (issue 15, item 2).

No worker runs: every step is rig's own call, in the order a live cluster makes them.

- **submit**: ``Client.submit_many`` in batches of --batch (a sweep: one user, one environment,
  a command of ~40 bytes that differs per job, as a learning-rate sweep's does);
- **place**: ``Ledger.reserve`` on one of 8 fake 80 GiB cards of node ``n1`` (the dispatcher's
  reservation);
- **claim**: ``Ledger.claim`` with the reservation's token, then the log path the card runner
  writes (``JobStore.update``) and one memory sample (``Ledger.observe``);
- **end**: ``workers.outcomes.conclude`` with exit code 0, the card runner's own ending (the
  attempt row, the per-name peak history, the run-time estimates, the dispatcher's wake-up);
- **archive**: ``rig.archiving.Archiver`` after every batch with the default retention
  (``archive_after_days``, ``archive_keep_finished``): the jobs are minutes old, so the cap on
  finished jobs in Redis is what moves them (the beat runs it once a minute; here once per
  batch, so Redis holds at most ``keep`` + one batch of finished jobs); the dispatcher's
  wake-up list is deleted after each batch, as the leading dispatcher's pass does.

Every --every jobs it prints Redis' ``used_memory``, its key count, the finished jobs still in
Redis, the archived count and the archive's size on disk, and the key families that grew most
since the start (keys grouped with their digits and hex ids replaced by ``#``): anything that
grows with the number of jobs shows there.

A private redis-server (--port, no persistence) so that used_memory counts rig's keys only.

    .venv/bin/python scripts/bench_million.py --jobs 1000000 --port 6403      # ~1-2 h on 2 busy cores
    .venv/bin/python scripts/bench_million.py --jobs 20000 --every 5000       # a quick look
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.archive import Archive, default_url  # noqa: E402
from rig.archiving import Archiver  # noqa: E402
from rig.client import Client  # noqa: E402
from rig.clock import shared_now  # noqa: E402
from rig.config import Settings, load_settings  # noqa: E402
from rig.gpus import GpuReading  # noqa: E402
from rig.models import JobState  # noqa: E402
from rig.testing.sigterm import exit_on_sigterm  # noqa: E402
from workers.outcomes import AttemptEnd, conclude  # noqa: E402

KEEP_DEFAULT = Settings.model_fields["archive_keep_finished"].default
AFTER_DEFAULT_S = Settings.model_fields["archive_after_days"].default * 86400
CARDS = 8
CARD_BYTES = 80 * 2**30
NODE = "n1"


def start_redis(port: int, folder: Path) -> subprocess.Popen:
    from rig.testing.throwaway_redis import start_redis as start

    return start(port, folder)


def requests(first: int, n: int, unique_names: bool = False) -> list[dict]:
    """A sweep: a command per job; with ``unique_names`` a name per job too (`sweep-17`)."""
    return [{"command": ["python", "train.py", "--lr", f"{(first + i) * 1e-7:.7f}"], "gpu_memory": "4G",
             "name": f"sweep-{first + i}" if unique_names else "sweep", "workdir": "/tmp", "priority": "low"}
            for i in range(n)]


def live(client: Client, ids: list[int], card_of: int) -> None:
    """Place, claim, sample and end each job as the dispatcher and a card worker would."""
    ledger, store = client.ledger, client.store
    for n, job_id in enumerate(ids):
        index = (card_of + n) % CARDS
        ok, token = ledger.reserve(job_id, NODE, [index], 4 * 2**30, user=None)
        if not ok:
            raise SystemExit(f"job {job_id}: not placed: {token}")
        ok, detail = ledger.claim(job_id, token, f"card{index}@{NODE}")
        if not ok:
            raise SystemExit(f"job {job_id}: not claimed: {detail}")
        log_file = f"/tmp/rig-bench-logs/{job_id}/1.log"
        store.update(job_id, log_path=log_file, log_paths=[log_file])
        ledger.observe(NODE, index, job_id, 3 * 2**30, 90, 4 * 2**30)
        job = store.get(job_id)
        now = shared_now(client.r)
        conclude(ledger, job, token, AttemptEnd(exit_code=0, ended_at=now, runtime=60.0))


def families(r: redis.Redis, prefix: str) -> Counter:
    """Key count per family: the key with its digits and hex ids replaced by '#'."""
    out: Counter = Counter()
    for key in r.scan_iter(count=5000):
        text = key.decode() if isinstance(key, bytes) else key
        if text.startswith(prefix):
            text = text[len(prefix):]
        out[re.sub(r"[0-9a-f]{8,}|\d+", "#", text)] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--every", type=int, default=50_000, help="print a line every this many jobs")
    ap.add_argument("--port", type=int, default=6403, help="the private redis-server's port")
    ap.add_argument("--keep", type=int, default=KEEP_DEFAULT, help="archive_keep_finished")
    ap.add_argument("--archive-url", help="default: SQLite in a temporary folder")
    ap.add_argument("--unique-names", action="store_true", help="every job its own name, as many sweeps do")
    args = ap.parse_args()
    exit_on_sigterm()  # `timeout` / kill: the finally below stops the redis-server, deletes the folder

    folder = Path(tempfile.mkdtemp(prefix="rig-bench-million-"))
    server = start_redis(args.port, folder)
    url = f"redis://127.0.0.1:{args.port}/0"
    prefix = "rig:"
    r = redis.Redis.from_url(url, decode_responses=True)
    client = Client(load_settings(key_prefix=prefix, home=folder, redis_url=url), redis_client=r)
    archive = Archive(args.archive_url or default_url(folder), prefix)
    mover = Archiver(r, client.keys, archive, after_seconds=AFTER_DEFAULT_S, keep=args.keep)
    for index in range(CARDS):
        client.ledger.register_card(NODE, GpuReading(index, f"GPU-{NODE}-{index}", "Fake 80G", CARD_BYTES, 0, 0, 40),
                                    max_jobs=5, reserve_fraction=0.0, allowed=True, fake=True)
    try:
        base_mem = int(r.info("memory")["used_memory"])
        base_fam = families(r, prefix)
        print(f"redis: {url} (private, redis-server {r.info('server')['redis_version']}); archive: "
              f"{archive.dialect.name}; retention {AFTER_DEFAULT_S / 86400:g} days, keep {args.keep:,} finished; "
              f"batch {args.batch:,}", flush=True)
        print(f"{'submitted':>10} {'used_memory MB':>15} {'keys':>8} {'finished in Redis':>18} {'archived':>9} "
              f"{'archive MiB':>12} {'jobs/s':>7}  key families grown since the start (top 4)", flush=True)
        t0 = last_t = time.perf_counter()
        last_done = 0
        for start in range(0, args.jobs, args.batch):
            n = min(args.batch, args.jobs - start)
            ids = [h.id for h in client.submit_many(requests(start, n, args.unique_names))]
            live(client, ids, start)
            mover.run(shared_now(r))
            r.delete(client.keys.sched_wake)  # the nudges the leading dispatcher's pass deletes
            done = start + n
            if done % args.every < args.batch or done == args.jobs:
                now_t = time.perf_counter()
                counts = client.store.count_by_state()
                finished = sum(counts[s] for s in JobState if s.terminal)
                fam = families(r, prefix)
                grown = sorted(((fam[k] - base_fam.get(k, 0), k) for k in fam), reverse=True)[:4]
                size = sum(f.stat().st_size for f in folder.glob("archive.sqlite3*"))
                print(f"{done:>10,} {(int(r.info('memory')['used_memory']) - base_mem) / 2**20:>15.1f} "
                      f"{r.dbsize():>8,} {finished:>18,} {archive.count():>9,} {size / 2**20:>12,.0f} "
                      f"{(done - last_done) / (now_t - last_t):>7,.0f}  "
                      + ", ".join(f"{k} +{g:,}" for g, k in grown if g), flush=True)
                last_t, last_done = now_t, done
        print(f"\n{args.jobs:,} jobs in {time.perf_counter() - t0:,.0f} s", flush=True)
    finally:
        archive.close()
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
