#!/usr/bin/env python3
"""`rig usage` over months of history (issue 15): its time per --by and --since, before and
after, on SQLite or PostgreSQL.

Fills, once: a private redis-server (--port) with --redis-jobs finished jobs (the default
retention keeps 10,000 there) and an archive with --jobs finished jobs that ended over the last
--days days (10 users, 40 names, 3 templates, 3 pools, 8 nodes, 1 in 50 on two nodes; each
record ~1.5 KB with its environment, as bench_million's), written with this tree's
``Archive.add`` in batches of --batch (the archiving pass's transaction; the time the usage
rollup adds to it is printed). Then, alternating, one process per tree and round: the usage of
each --by x --since, as ``rig usage`` computes it in that tree (this tree: the CLI's
``History.usage``; --old, e.g. main: ``Client.usage``), printing CPU and wall seconds per call
and, for this tree, the Redis part alone. Last, the rollup is dropped and built again from the
rows (what an archive written by an older rig gets when this version first opens it), timed.

    .venv/bin/python scripts/bench_usage.py --jobs 100000 --port 6451
    .venv/bin/python scripts/bench_usage.py --jobs 100000 --port 6451 --cli all   # the whole command too
    .venv/bin/python scripts/bench_usage.py --jobs 1000000 --archive-url postgresql://postgres@127.0.0.1/rig_usage_bench
"""

from __future__ import annotations

import sys
from pathlib import Path

if "--child" in sys.argv:  # a timing process: the tree under test's rig, not this one's
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])
else:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import redis  # noqa: E402

WINDOWS = {"7d": 7 * 86400.0, "30d": 30 * 86400.0, "all": None}
GROUPS = ("user", "name", "template", "pool", "node")


def start_redis(port: int, folder: Path) -> subprocess.Popen:
    from rig.testing.throwaway_redis import start_redis as start

    return start(port, folder)


def a_job(rng: random.Random, job_id: int, ended: float, env: dict[str, str]):  # noqa: ANN201
    """A finished job ending at ``ended``: one attempt (two on two nodes, 1 in 50)."""
    from rig.memory import GIB
    from rig.models import Job, JobState, Priority

    gib = rng.choice((4, 8, 12, 24, 40, 80))
    gpus = rng.choice((1, 1, 1, 2, 4))
    run = rng.uniform(60, 6 * 3600)
    node = f"node{rng.randrange(8)}"
    attempts = [{"attempt": 1, "node": node, "cards": list(range(gpus)), "gpu_memory": gib * GIB,
                 "started_at": ended - run, "ended_at": ended, "exit_code": 0,
                 "vram_mean": rng.choice((None, int(gib * GIB * rng.uniform(0.3, 1.0))))}]
    if rng.random() < 0.02:
        first = dict(attempts[0], attempt=1, node=f"node{(int(node[4:]) + 1) % 8}", ended_at=ended - run,
                     started_at=ended - 2 * run)
        attempts = [first, dict(attempts[0], attempt=2)]
    roll = rng.random()
    state, failure = ((JobState.SUCCEEDED, None) if roll < 0.8 else (JobState.CANCELLED, None) if roll < 0.85
                      else (JobState.FAILED, rng.choice(("cuda_oom", "nonzero_exit", "killed"))) if roll < 0.97
                      else (JobState.TIMEOUT, "timeout"))
    user = f"user{rng.randrange(10)}"
    return Job(id=job_id, instance="b1", name=f"{user}-exp{rng.randrange(4)}", user=user,
               command=["python", "train.py", "--seed", str(job_id)], gpu_memory=gib * GIB, gpus=gpus,
               priority=Priority.MEDIUM, state=state, workdir="/data/exp", env=env,
               created_at=attempts[0]["started_at"] - rng.expovariate(1 / 600), started_at=attempts[-1]["started_at"],
               ended_at=ended, node=node, cards=list(range(gpus)), attempts=attempts, failure=failure,
               template=rng.choice((None, "finetune", "inference")), pool=rng.choice((None, "a100", "h100")),
               exit_code=0 if state is JobState.SUCCEEDED else 1)


def fill_archive(url: str, prefix: str, n: int, days: float, now: float, batch: int, fast: bool = False) -> None:
    """``fast``: every row's record is one packed record of the same size (packed once), and
    the rollup is left to migrate() (an older rig's archive): the time of a million rows."""
    from rig import archive as archive_module
    from rig.archive import Archive

    rng = random.Random(15)
    env = {f"VAR{i}": uuid.uuid4().hex * 2 for i in range(20)}  # ~1.5 KB, as a real environment
    archive = Archive(url, prefix)
    rolled = [0.0]
    roll = getattr(archive, "_roll", None)
    if fast:
        blob = archive_module.packed.pack({k: str(v) for k, v in a_job(rng, 1, now, env).to_redis().items()})
        archive_module.packed = type("Packed", (), {"pack": staticmethod(lambda _raw: blob)})
        archive._roll = lambda *_a, **_k: None  # noqa: SLF001
    elif roll is not None:  # how much of the move's transaction the usage rollup takes
        def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202
            t = time.process_time()
            try:
                return roll(*a, **k)
            finally:
                rolled[0] += time.process_time() - t
        archive._roll = timed  # noqa: SLF001
    began, cpu = time.perf_counter(), time.process_time()
    for start in range(1, n + 1, batch):
        ids = range(start, min(n + 1, start + batch))
        jobs = [a_job(rng, i, now - 2 * 86400 - (days - 2) * 86400 * (n - i) / n, env) for i in ids]
        entries = [(j, {k: str(v) for k, v in j.to_redis().items()}) for j in jobs]
        if fast and archive.dialect.name == "postgresql":  # COPY: PostgreSQL's bulk load, no upsert
            with archive._transaction() as cur, cur.copy(  # noqa: SLF001
                    f"COPY {archive_module.TABLE} ({', '.join(archive_module._NAMES)}) FROM STDIN") as copy:
                for job, raw in entries:
                    copy.write_row(archive._row(job, raw, now)[0])  # noqa: SLF001
        else:
            archive.add(entries, now=now)
        if start // batch % 50 == 0:
            print(f"  archived {start + len(ids) - 1:,} ({time.perf_counter() - began:.0f} s)", flush=True)
    cpu = time.process_time() - cpu
    print(f"archive: {n:,} jobs over {days:g} days in {time.perf_counter() - began:.0f} s wall, "
          f"{cpu / n * 1e6:.0f} us CPU a job in all, of which the usage rollup {rolled[0] / n * 1e6:.1f} us",
          flush=True)
    archive.close()


def fill_redis(url: str, prefix: str, n: int, now: float) -> None:
    """``n`` finished jobs in Redis, ended in the last two days, with the ids after the archive's."""
    from rig.client import Client
    from rig.config import load_settings
    from rig.models import JobState

    client = Client(load_settings(key_prefix=prefix, redis_url=url), redis_client=redis.Redis.from_url(url))
    rng = random.Random(16)
    env = {f"VAR{i}": uuid.uuid4().hex * 2 for i in range(20)}
    for _ in range(n):
        template = a_job(rng, 0, now - rng.uniform(0, 2 * 86400), env)
        template.state = JobState.PENDING
        ended, fields = template.ended_at, {"attempts": template.attempts, "started_at": template.started_at,
                                            "node": template.node, "failure": template.failure}
        template.ended_at = None
        job = client.store.create(template)
        state = JobState.SUCCEEDED if template.failure is None else JobState.FAILED
        client.ledger.transition(job.id, state, fields={k: v for k, v in fields.items() if v is not None}, now=ended)


def child(args: argparse.Namespace) -> None:
    """One timing round in the tree given: each combo once, JSON lines out."""
    import rig
    from rig.client import Client
    from rig.config import load_settings
    from rig.history import History

    settings = load_settings(key_prefix=args.prefix, redis_url=args.redis_url, archive_url=args.archive_url,
                             home=Path(args.home))
    client = Client(settings, redis_client=redis.Redis.from_url(args.redis_url))
    fast = hasattr(History, "usage")
    client.history.archive()  # opened (and, for an older archive, its rollup built) before timing
    now = time.time()
    out = {"rig": str(Path(rig.__file__).parent), "fast": fast, "calls": {}}
    for combo in args.combos.split(","):
        by, window = combo.split(":")
        since = None if WINDOWS[window] is None else now - WINDOWS[window]
        wall, cpu = time.perf_counter(), time.process_time()
        if fast:
            lines, whole = client.history.usage(since, by)
        else:
            lines, whole = client.usage(since=since, by=by)
        out["calls"][combo] = (time.perf_counter() - wall, time.process_time() - cpu, whole.jobs, len(lines))
    if fast:  # the Redis part alone: every finished job's record read and its figures computed
        wall, cpu = time.perf_counter(), time.process_time()
        n = len(client.history._live_accounting(None))  # noqa: SLF001
        out["redis_part"] = (time.perf_counter() - wall, time.process_time() - cpu, n)
    print(json.dumps(out))


def cli_round(label: str, tree: str, combos: str, env: dict[str, str], folder: Path, rnd: int) -> None:
    """The whole command, as a person runs it: one ``rig usage --json`` process per combo with
    ``tree``'s rig (imports, settings, ping and rendering included), its CPU seconds (user +
    system, from the kernel's accounting of the finished child) and wall seconds."""
    for combo in combos.split(","):
        by, window = combo.split(":")
        cmd = [sys.executable, "-m", "rig.cli.main", "usage", "--since", window, "--by", by, "--json"]
        before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=folder)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - wall
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        jobs = json.loads(done.stdout)["total"]["jobs"]
        print(f"{label:<4} {rnd + 1:>5} {'cli ' + combo:<14} {wall:>8.3f} {cpu:>8.3f} {jobs:>10,}", flush=True)


def migrate(url: str, prefix: str) -> None:
    """Drop the rollup and open the archive: the build an older rig's archive gets, timed."""
    from rig.archive import USAGE_TABLE, Archive

    with Archive(url, prefix) as archive, archive._transaction() as cur:  # noqa: SLF001
        cur.execute(f"DROP TABLE {USAGE_TABLE}")
    cpu = time.process_time()
    with Archive(url, prefix) as archive:
        jobs, wall = archive.rollup_built or (0, 0.0)
    print(f"rollup built from an older archive's {jobs:,} rows (every prefix in it): {wall:.1f} s wall, "
          f"{time.process_time() - cpu:.1f} s CPU", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000, help="archived jobs")
    ap.add_argument("--days", type=float, default=365.0, help="they ended over this many days")
    ap.add_argument("--redis-jobs", type=int, default=10_000, help="finished jobs still in Redis")
    ap.add_argument("--batch", type=int, default=2000, help="jobs per archive transaction")
    ap.add_argument("--archive-url", help="default: SQLite in a temporary folder")
    ap.add_argument("--port", type=int, default=6451, help="the private redis-server's port")
    ap.add_argument("--old", default="/work/main", help="the tree timed as 'before' ('' for none)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (old, new) each")
    ap.add_argument("--combos", default=",".join(f"{g}:{w}" for g in GROUPS for w in WINDOWS),
                    help="by:window,... timed in this tree")
    ap.add_argument("--old-combos", help="by:window,... timed in --old (default: --combos)")
    ap.add_argument("--no-migrate", action="store_true",
                    help="skip the last step: the rollup dropped and built again from the rows, as an "
                         "archive written by an older rig gets it")
    ap.add_argument("--fast-fill", action="store_true",
                    help="fill with one packed record for every row and no rollup, then build the rollup "
                         "as for an older archive (timed): a million rows in minutes")
    ap.add_argument("--reuse", metavar="PREFIX",
                    help="time over the jobs an earlier run left under PREFIX in --archive-url (PostgreSQL)")
    ap.add_argument("--cli", metavar="BY:WINDOW,...",
                    help="also time the whole command (`python -m rig.cli.main usage --json`, a process "
                         "each) of each tree for these combos, e.g. user:all,node:7d ('all': every combo)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    ap.add_argument("--redis-url", help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from rig.testing.sigterm import exit_on_sigterm

    exit_on_sigterm()  # `timeout` / kill: the finally below stops the redis-server (a running child with it)

    folder = Path(tempfile.mkdtemp(prefix="rig-bench-usage-"))
    server = start_redis(args.port, folder)
    url = f"redis://127.0.0.1:{args.port}/0"
    prefix = args.reuse or f"rigbench:{uuid.uuid4().hex[:8]}:"
    archive_url = args.archive_url or f"sqlite:///{folder / 'archive.sqlite3'}"
    now = time.time()
    try:
        print(f"redis: {url}; archive: {archive_url}; prefix {prefix}", flush=True)
        if not args.reuse:
            fill_archive(archive_url, prefix, args.jobs, args.days, now, args.batch, args.fast_fill)
        if args.fast_fill:
            migrate(archive_url, prefix)
        began = time.perf_counter()
        fill_redis(url, prefix, args.redis_jobs, now)
        print(f"redis: {args.redis_jobs:,} finished jobs in {time.perf_counter() - began:.0f} s", flush=True)
        if archive_url.startswith("sqlite"):
            size = sum(f.stat().st_size for f in folder.glob("archive.sqlite3*"))
            print(f"archive on disk: {size / 2**20:,.0f} MiB", flush=True)
        trees = [("new", str(Path(__file__).resolve().parents[1]), args.combos)]
        if args.old:
            trees.insert(0, ("old", args.old, args.old_combos or args.combos))
        print(f"{'tree':<4} {'round':>5} {'by:window':<14} {'wall s':>8} {'CPU s':>8} {'jobs':>10} {'lines':>6}")
        for rnd in range(args.rounds):
            for label, tree, combos in trees:
                cmd = [sys.executable, __file__, "--child", "--tree", tree, "--prefix", prefix, "--redis-url", url,
                       "--archive-url", archive_url, "--home", str(folder), "--combos", combos]
                env = dict(os.environ, PYTHONPATH=tree)
                result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                   env=env).stdout.strip().splitlines()[-1])
                if not result["rig"].startswith(tree):
                    raise SystemExit(f"{label}: imported rig from {result['rig']}, not {tree}")
                for combo, (wall, cpu, jobs, lines) in result["calls"].items():
                    print(f"{label:<4} {rnd + 1:>5} {combo:<14} {wall:>8.3f} {cpu:>8.3f} {jobs:>10,} {lines:>6}",
                          flush=True)
                if "redis_part" in result:
                    wall, cpu, n = result["redis_part"]
                    print(f"{label:<4} {rnd + 1:>5} {'redis part':<14} {wall:>8.3f} {cpu:>8.3f} {n:>10,}", flush=True)
                if args.cli:
                    cli_env = dict(env, RIG_REDIS_URL=url, RIG_KEY_PREFIX=prefix, RIG_ARCHIVE_URL=archive_url,
                                   RIG_HOME=str(folder))
                    cli_round(label, tree, args.combos if args.cli == "all" else args.cli, cli_env, folder, rnd)
        if not (args.no_migrate or args.fast_fill or args.reuse):
            migrate(archive_url, prefix)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
