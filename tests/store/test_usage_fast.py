"""rig usage's fast path (the archive's daily rollup and SQL sums, rig.archive; History.usage)
gives the figures the straightforward per-job computation gives (rig.accounting.usage and
total over every job's Accounting), on a randomized history, on SQLite and PostgreSQL; the
rollup follows the rows through replacements, rolled-back batches and a migration."""

from __future__ import annotations

import random
import sqlite3
import uuid

import pytest

from rig.accounting import (
    DAY,
    GROUPS,
    UsageLine,
    day_of,
    first_whole_day,
    lines_of,
    total,
    total_of,
    usage,
)
from rig.archive import USAGE_TABLE, Archive, default_url
from rig.archiving import Archiver
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.test_archive import NOW, finished, history, in_redis, ledger  # noqa: F401 - fixture
from tests.store.test_archive_postgres import pg_url  # noqa: F401 - fixture

STATES = (JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
FAILURES = (None, "", "cuda_oom", "timeout", "nonzero_exit", "killed")


@pytest.fixture(params=["sqlite", "postgresql"])
def archive(request, tmp_path):
    """An empty archive of each back end (PostgreSQL: a fresh database, skipped without one)."""
    url = default_url(tmp_path) if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with Archive(url, f"t{uuid.uuid4().hex[:6]}:") as arch:
        yield arch


def random_job(rng: random.Random, job_id: int, instance: str) -> Job:
    """A finished job with 0-3 attempts on random nodes, groups unset, empty or set, an end
    anywhere in 60 days (some exactly on a day's edge, a few with none)."""
    end = rng.choice([NOW - rng.uniform(0, 60 * DAY), (NOW // DAY - rng.randint(0, 60)) * DAY, None])
    gpus = rng.randint(1, 4)
    attempts = []
    begin = (end or NOW) - rng.uniform(0, 3 * DAY)
    for n in range(rng.choice([0, 1, 1, 1, 2, 3])):
        stop = begin + rng.uniform(0, 4 * 3600)
        attempts.append({"attempt": n + 1, "node": rng.choice(["n1", "n2", "n3", ""]),
                         "cards": list(range(rng.randint(0, gpus))), "started_at": begin, "ended_at": stop,
                         "gpu_memory": rng.choice([None, rng.randint(1, 80) * GIB]),
                         "vram_mean": rng.choice([None, rng.randint(0, 80) * GIB])})
        begin = stop + rng.uniform(0, 600)
    state = rng.choice(STATES)
    return Job(id=job_id, instance=instance, name=rng.choice(["bert", "gpt", "eval", "", "(none)"]),
               user=rng.choice(["ann", "bob", "cy"]), command=["true"], gpu_memory=rng.randint(1, 80) * GIB,
               gpus=gpus, priority=Priority.MEDIUM, state=state, workdir="/w",
               created_at=(end or NOW) - rng.uniform(3 * DAY, 5 * DAY), ended_at=end,
               started_at=attempts[-1]["started_at"] if attempts else None,
               node=rng.choice([None, "n1", "n2"]), pool=rng.choice([None, "", "a100", "h100"]),
               template=rng.choice([None, "finetune", "inference"]), attempts=attempts,
               failure=None if state in (JobState.SUCCEEDED, JobState.CANCELLED) else rng.choice(FAILURES))


def add(archive: Archive, jobs: list[Job]) -> None:
    archive.add([(job, {k: str(v) for k, v in job.to_redis().items()}) for job in jobs], now=NOW)


def assert_same(fast: list[UsageLine], slow: list[UsageLine]) -> None:
    """Counts, keys, order and failures exactly; sums to 1e-9 (added in another order)."""
    assert [ln.key for ln in fast] == [ln.key for ln in slow]
    for a, b in zip(fast, slow, strict=True):
        assert (a.key, a.jobs, a.cancelled, a.failures) == (b.key, b.jobs, b.cancelled, b.failures)
        assert list(a.failures) == list(b.failures)
        for name in ("card_hours", "reserved_gib_hours", "used_gib_hours", "mean_wait_seconds"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, rel=1e-9, abs=1e-9)), name


def windows(rng: random.Random) -> list[float | None]:
    edge = (NOW // DAY - 7) * DAY
    return [None, 0.0, NOW - 7 * DAY, NOW - 30 * DAY, edge, edge - 1e-6, edge + 1e-6, NOW + DAY,
            *(NOW - rng.uniform(0, 61 * DAY) for _ in range(4))]


def check(archive: Archive, since: float | None, besides: set[tuple[int, str]] = frozenset()) -> None:
    rows = [a for a in archive.accounting(since=since) if (a.id, a.instance) not in besides]
    for by in GROUPS:
        found = archive.usage(since=since, groups=(by, "user"), besides=set(besides))
        assert_same(lines_of(found[by]), usage(rows, by))
        assert_same([total_of(found["user"])], [total(rows)])


def test_the_rollup_gives_the_per_job_figures_on_a_random_history(archive):
    rng = random.Random(15)
    jobs = [random_job(rng, i, "i1") for i in range(1, 301)]
    for start in range(0, len(jobs), 70):
        add(archive, jobs[start:start + 70])
    # Archived again (a job retried after a first copy, or a pass that died before forgetting):
    # the row is replaced and counts once, with its new outcome.
    add(archive, [random_job(rng, j.id, "i1") for j in jobs[::7]])
    add(archive, [random_job(rng, i, "i2") for i in range(1, 40)])  # ids given again after Redis lost its data
    for since in windows(rng):
        check(archive, since)
    # Jobs counted from Redis are left out of the archive's sums, each exactly once.
    check(archive, NOW - 30 * DAY, besides={(3, "i1"), (5, "i2"), (9, "i1"), (999, "i1")})
    check(archive, None, besides={(k, "i1") for k in range(1, 301, 3)})


def test_days_and_windows_meet_exactly(archive):
    """A job on a day's first instant is in that day; a window's part-day and whole days
    together hold exactly the jobs that ended at or after ``since``."""
    for value in (0.0, DAY, DAY - 1e-9, 20_000 * DAY, 20_000 * DAY - 2.4e-7, NOW, -5.0):
        d = day_of(value)
        assert d * DAY <= value < (d + 1) * DAY
        w = first_whole_day(value)
        assert w * DAY >= value > (w - 1) * DAY
    assert day_of(None) < first_whole_day(-1e12)


def test_a_rolled_back_batch_changes_neither_rows_nor_sums(archive, monkeypatch):
    rng = random.Random(3)
    add(archive, [random_job(rng, i, "i") for i in range(1, 11)])
    before = archive.usage(since=None, groups=GROUPS)

    def crash(*_a, **_k):
        raise ConnectionError("the control worker died here")

    monkeypatch.setattr(Archive, "_roll", crash)  # after the rows' upsert, inside its transaction
    with pytest.raises(ConnectionError):
        add(archive, [random_job(rng, i, "i") for i in range(5, 30)])
    monkeypatch.undo()
    assert archive.count() == 10 and archive.usage(since=None, groups=GROUPS) == before
    check(archive, None)


def test_an_archive_written_before_the_rollup_gets_it_built_once(archive):
    rng = random.Random(7)
    add(archive, [random_job(rng, i, "i") for i in range(1, 201)])
    other = Archive(archive.url, "other:")  # a second installation in the same database
    add(other, [random_job(rng, i, "i") for i in range(1, 31)])
    other.close()
    with archive._transaction() as cur:  # what an older rig left: the rows, no rollup
        cur.execute(f"DROP TABLE {USAGE_TABLE}")
    again = Archive(archive.url, archive.prefix)
    try:
        assert again.rollup_built is not None and again.rollup_built[0] == 230
        for since in (None, NOW - 7 * DAY, NOW - 30 * DAY):
            check(again, since)
        other = Archive(archive.url, "other:")
        assert other.rollup_built is None  # once
        check(other, None)
        other.close()
    finally:
        again.close()


def test_history_usage_counts_redis_and_archive_once_each(ledger, tmp_path, key_prefix, monkeypatch):  # noqa: F811
    """Jobs in Redis only, in the archive only, and in both (a pass that died between its
    commit and its forget): History.usage is History.accounting's figures."""
    with Archive(default_url(tmp_path), key_prefix) as arch:
        old = [finished(ledger, ended=NOW - k * DAY - 600, user=u, state=s, failure=f, mean=m)
               for k, u, s, f, m in ((2, "ann", JobState.SUCCEEDED, None, 5 * GIB),
                                     (3, "bob", JobState.FAILED, "cuda_oom", None),
                                     (9, "ann", JobState.CANCELLED, None, None),
                                     (40, "cy", JobState.TIMEOUT, "timeout", GIB))]
        Archiver(ledger.store.r, ledger.keys, arch, after_seconds=DAY, keep=0).run(NOW)
        assert not any(in_redis(ledger, j.id) for j in old)
        both = [finished(ledger, ended=NOW - 2 * DAY - 5, user="bob") for _ in range(2)]
        monkeypatch.setattr(Archiver, "_forget_archived", lambda *_a, **_k: None)  # dies before forgetting
        Archiver(ledger.store.r, ledger.keys, arch, after_seconds=DAY, keep=0).run(NOW)
        monkeypatch.undo()
        assert all(in_redis(ledger, j.id) for j in both) and arch.count() == 6
        finished(ledger, ended=NOW - 60, user="cy", failure="cuda_oom", state=JobState.FAILED)  # Redis only
        reader = history(ledger, tmp_path, key_prefix)
        for since in (None, NOW - 7 * DAY, NOW - 2 * DAY, NOW - 30 * DAY):
            rows = reader.accounting(since)
            for by in GROUPS:
                lines, whole = reader.usage(since, by)
                assert_same(lines, usage(rows, by))
                assert_same([whole], [total(rows)])
        lines, whole = reader.usage(None, "user")
        assert whole.jobs == 7 and {ln.key: ln.jobs for ln in lines} == {"ann": 2, "bob": 3, "cy": 2}
        reader.close()


def test_the_rollup_is_the_rows_sums_in_sqlite_itself(tmp_path):
    """The rollup table, read with plain SQL, sums to the rows' card-seconds per user."""
    rng = random.Random(5)
    with Archive(default_url(tmp_path), "p:") as arch:
        add(arch, [random_job(rng, i, "i") for i in range(1, 51)])
        add(arch, [random_job(rng, i, "i") for i in range(20, 40)])
    db = sqlite3.connect(tmp_path / "archive.sqlite3")
    rows = dict(db.execute("SELECT owner, SUM(card_seconds) FROM rig_jobs GROUP BY owner").fetchall())
    rolled = dict(db.execute(f"SELECT grp, SUM(card_seconds) FROM {USAGE_TABLE} WHERE dim = 'user' "
                             "GROUP BY grp").fetchall())
    assert rolled == pytest.approx(rows)
    assert db.execute(f"SELECT SUM(jobs) FROM {USAGE_TABLE} WHERE dim = 'template'").fetchone()[0] == 50
    db.close()



def test_two_writers_of_the_same_jobs_at_once_count_them_once(archive, monkeypatch):
    """Two archiving passes at once (a lock expired) write the same batch: the second waits
    for the first's commit before it reads what is stored (SQLite: BEGIN IMMEDIATE;
    PostgreSQL: an advisory lock), so it replaces the rows and their sums instead of adding
    them again. The first holds its transaction open until the second has read what is stored
    or a second has passed (the second cannot read before the first commits: it is the point)."""
    import threading

    rng = random.Random(21)
    jobs = [random_job(rng, i, "i") for i in range(1, 21)]
    other = Archive(archive.url, archive.prefix)
    first_read, second_read = threading.Event(), threading.Event()
    stored = Archive._stored

    def watched(self, cur, keys):  # noqa: ANN001, ANN202
        found = stored(self, cur, keys)
        if self is archive:
            first_read.set()
            second_read.wait(1.0)  # only without serialization does this come before the commit
        else:
            second_read.set()
        return found

    monkeypatch.setattr(Archive, "_stored", watched)
    errors: list[BaseException] = []

    def second() -> None:
        first_read.wait(10)
        try:
            add(other, jobs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    add(archive, jobs)
    thread.join(30)
    other.close()
    assert not errors and archive.count() == 20
    found = archive.usage(since=None, groups=("user",))["user"]
    assert total_of(found).jobs == 20
    check(archive, None)


def test_a_reader_that_finds_the_rollup_being_built_is_told_in_one_line(tmp_path, monkeypatch):
    """An older archive being summed by another process (it holds SQLite's write lock): a
    second process opening it says so (ConfigError, exit 6) instead of a database traceback."""
    from rig.errors import ConfigError

    with Archive(default_url(tmp_path), "p:") as arch:
        add(arch, [random_job(random.Random(2), 1, "i")])
        with arch._transaction() as cur:
            cur.execute(f"DROP TABLE {USAGE_TABLE}")
    holder = sqlite3.connect(tmp_path / "archive.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the other process, mid-build
    real = sqlite3.connect
    with monkeypatch.context() as m:
        m.setattr(sqlite3, "connect", lambda *a, **k: real(*a, **{**k, "timeout": 0.05}))  # not 30 s here
        with pytest.raises(ConfigError, match="busy .*try again in a minute"):
            Archive(default_url(tmp_path), "p:")
    holder.execute("ROLLBACK")
    holder.close()
    with Archive(default_url(tmp_path), "p:") as arch:
        assert arch.rollup_built is not None and arch.rollup_built[0] == 1


def test_ids_are_read_by_runs_of_near_neighbours():
    from rig.archive import _runs

    assert _runs([], 16) == []
    assert _runs([1, 2, 3, 19, 20, 40, 1000], 16) == [(1, 20), (40, 40), (1000, 1000)]
