"""The archive (rig.archive, rig.archiving, rig.history, rig.accounting) on fakeredis and real
Redis, with SQLite in tmp_path: the move, its crash windows, reads that find archived jobs,
and the accounting figures."""

from __future__ import annotations

import sqlite3

import pytest

from rig import packed
from rig.accounting import accounting_of, total, usage
from rig.archive import Archive, default_url
from rig.archiving import Archiver, archive_pass
from rig.config import load_settings
from rig.errors import ConfigError, JobNotFound
from rig.history import History
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority

DAY = 86400.0
NOW = 1_800_000_000.0


def finished(ledger: Ledger, *, ended: float, state: JobState = JobState.SUCCEEDED, user: str = "ann",
             name: str = "train", gib: int = 10, gpus: int = 1, run_s: float = 3600.0, wait_s: float = 60.0,
             failure: str | None = None, mean: int | None = None, error_queue: bool = False) -> Job:
    """A job that waited ``wait_s``, ran one attempt of ``run_s`` s ending at ``ended`` and
    ended in ``state``, moved there by the ledger as a worker would."""
    start = ended - run_s
    job = ledger.store.create(Job(
        id=0, name=name, user=user, command=["python", "train.py"], gpu_memory=gib * GIB, gpus=gpus,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/w", created_at=start - wait_s,
        env={"A": "1"}, template="finetune"))
    attempt = {"attempt": 1, "node": "n1", "cards": list(range(gpus)), "gpu_memory": gib * GIB,
               "started_at": start, "ended_at": ended, "exit_code": 0 if failure is None else 1,
               "outcome": failure or "succeeded", "log": f"/logs/{job.id}/1.log", "vram_mean": mean}
    fields = {"attempts": [attempt], "started_at": start, "node": "n1", "cards": list(range(gpus)),
              "log_paths": [f"/logs/{job.id}/1.log"], "attempt": 1, "failure": failure}
    code, _ = ledger.transition(job.id, state, fields={k: v for k, v in fields.items() if v is not None},
                                now=ended, error_queue=error_queue)
    assert code == 1
    return ledger.store.get(job.id)


@pytest.fixture
def ledger(redis_client, key_prefix) -> Ledger:
    return Ledger(redis_client, Keys(key_prefix))


@pytest.fixture
def archive(tmp_path, key_prefix):
    with Archive(default_url(tmp_path), key_prefix) as arch:
        yield arch


def mover(ledger: Ledger, archive: Archive, *, keep: int = 0) -> Archiver:
    return Archiver(ledger.store.r, ledger.keys, archive, after_seconds=DAY, keep=keep)


def history(ledger: Ledger, tmp_path, key_prefix) -> History:
    return History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))


def in_redis(ledger: Ledger, job_id: int) -> bool:
    keys, r = ledger.keys, ledger.store.r
    return bool(r.exists(keys.job(job_id)) or r.zscore(keys.all_jobs, str(job_id)) is not None
                or any(r.zscore(keys.state_index(s.value), str(job_id)) is not None for s in JobState))


def test_old_finished_jobs_move_once_and_read_back_whole(ledger, archive, tmp_path, key_prefix):
    old = [finished(ledger, ended=NOW - 3 * DAY, state=s, failure=f)
           for s, f in ((JobState.SUCCEEDED, None), (JobState.FAILED, "cuda_oom"), (JobState.CANCELLED, "cancelled"))]
    recent = finished(ledger, ended=NOW - 3600)
    held = finished(ledger, ended=NOW - 3 * DAY, state=JobState.FAILED, failure="nonzero_exit", error_queue=True)
    waiting = ledger.store.create(Job(id=0, name="w", user="ann", command=["true"], gpu_memory=GIB, gpus=1,
                                      priority=Priority.LOW, state=JobState.PENDING, workdir="/", created_at=NOW))

    report = mover(ledger, archive).run(NOW)
    assert report.archived == 3 and not report.changed
    assert [in_redis(ledger, j.id) for j in old] == [False] * 3
    assert all(in_redis(ledger, j.id) for j in (recent, held, waiting))  # too young, error queue, live
    assert archive.count() == 3
    assert mover(ledger, archive).run(NOW).archived == 0  # idempotent: nothing moves twice
    assert archive.count() == 3

    reader = history(ledger, tmp_path, key_prefix)
    back = reader.get(old[1].id)  # rig show / log / metrics: the record as it was, from the archive
    assert (back.state, back.failure, back.log_paths, back.env, back.attempts) == (
        JobState.FAILED, "cuda_oom", old[1].log_paths, {"A": "1"}, old[1].attempts)
    assert not back.problems
    listed = [j.id for j in reader.list(limit=10)]
    assert sorted(listed) == sorted([j.id for j in (*old, recent, held, waiting)])
    assert [j.id for j in reader.list(JobState.FAILED, limit=10)] == sorted([held.id, old[1].id], reverse=True)
    assert [j.id for j in reader.list(limit=10, since=NOW - DAY)] == [waiting.id, recent.id]
    with pytest.raises(JobNotFound):
        reader.get(999_999)


def test_beyond_the_cap_the_oldest_finished_jobs_move_whatever_their_age(ledger, archive):
    jobs = [finished(ledger, ended=NOW - 60) for _ in range(5)]
    assert mover(ledger, archive, keep=2).run(NOW).archived == 3
    assert [in_redis(ledger, j.id) for j in jobs] == [False, False, False, True, True]


def test_a_crash_between_commit_and_forget_loses_and_duplicates_nothing(ledger, archive, tmp_path, key_prefix,
                                                                        monkeypatch):
    jobs = [finished(ledger, ended=NOW - 2 * DAY) for _ in range(3)]

    def crash(*_a, **_k):
        raise ConnectionError("the control worker died here")

    with monkeypatch.context() as m:
        m.setattr(Archiver, "_forget_archived", crash)
        with pytest.raises(ConnectionError):
            mover(ledger, archive).run(NOW)
    assert archive.count() == 3 and all(in_redis(ledger, j.id) for j in jobs)  # in both now
    reader = history(ledger, tmp_path, key_prefix)
    assert sorted(j.id for j in reader.list(limit=10)) == [j.id for j in jobs]  # each once
    assert len(reader.accounting()) == 3
    assert reader.archived_count() == 0  # rig status: each counted once, as Redis'

    assert mover(ledger, archive).run(NOW).archived == 3  # the next pass forgets them
    assert not any(in_redis(ledger, j.id) for j in jobs) and reader.archived_count() == 3
    assert archive.count() == 3 and sorted(j.id for j in reader.list(limit=10)) == [j.id for j in jobs]


def test_a_crash_inside_the_archive_transaction_leaves_redis_as_it_was(ledger, archive, tmp_path, key_prefix):
    jobs = [finished(ledger, ended=NOW - 2 * DAY) for _ in range(3)]
    raw = sqlite3.connect(tmp_path / "archive.sqlite3")
    raw.execute(f"CREATE TRIGGER boom BEFORE INSERT ON rig_jobs WHEN NEW.id = {jobs[1].id} "
                "BEGIN SELECT RAISE(ABORT, 'disk gone'); END")
    raw.commit()
    with pytest.raises(sqlite3.DatabaseError, match="disk gone"):
        mover(ledger, archive).run(NOW)
    assert archive.count() == 0  # the first job's row went with the rollback
    assert all(in_redis(ledger, j.id) for j in jobs)
    raw.execute("DROP TRIGGER boom")
    raw.commit()
    raw.close()
    assert mover(ledger, archive).run(NOW).archived == 3


def test_a_job_retried_after_it_was_archived_stays_in_redis_and_is_archived_again(ledger, archive, monkeypatch):
    job = finished(ledger, ended=NOW - 2 * DAY, state=JobState.FAILED, failure="cuda_oom")
    real_add = Archive.add

    def add_then_retry(self, entries, *, now):
        done = real_add(self, entries, now=now)
        ledger.store.r.hset(ledger.keys.job(job.id), "ended_at", str(NOW - DAY - 5))  # it changed meanwhile
        return done

    monkeypatch.setattr(Archive, "add", add_then_retry)
    report = mover(ledger, archive).run(NOW)
    assert report.changed == [job.id] and report.archived == 0
    assert in_redis(ledger, job.id)
    monkeypatch.setattr(Archive, "add", real_add)
    assert mover(ledger, archive).run(NOW).archived == 1
    assert archive.count() == 1 and archive.get(job.id).ended_at == NOW - DAY - 5  # the row was replaced


def test_a_job_another_pass_moved_meanwhile_is_not_said_to_be_left_in_redis(ledger, archive, monkeypatch):
    """Two passes at once (a lapsed lock): the slower one logged the jobs the other had already
    moved as 'changed meanwhile and left in Redis', though Redis no longer held them."""
    jobs = [finished(ledger, ended=NOW - 2 * DAY) for _ in range(3)]
    real_add = Archive.add

    def add_then_other_pass(self, entries, *, now):
        done = real_add(self, entries, now=now)
        monkeypatch.setattr(Archive, "add", real_add)
        assert mover(ledger, archive).run(NOW).archived == 3  # the other pass, all of them
        return done

    monkeypatch.setattr(Archive, "add", add_then_other_pass)
    report = mover(ledger, archive).run(NOW)
    assert (report.archived, report.changed, report.gone) == (0, [], 3)
    assert str(report) == "archived 0 finished job(s), 3 already moved by another pass"
    assert archive.count() == 3 and not any(in_redis(ledger, j.id) for j in jobs)


def test_usage_counts_archived_and_live_jobs_with_one_rule(ledger, archive, tmp_path, key_prefix):
    finished(ledger, ended=NOW - 3 * DAY, user="ann", gib=20, gpus=2, run_s=7200, wait_s=100, mean=10 * GIB)
    finished(ledger, ended=NOW - 3 * DAY, user="ann", state=JobState.FAILED, failure="cuda_oom", run_s=1800,
             wait_s=300)
    finished(ledger, ended=NOW - 60, user="bob", gib=40, run_s=3600, wait_s=0, mean=30 * GIB)
    mover(ledger, archive).run(NOW)
    reader = history(ledger, tmp_path, key_prefix)
    rows = reader.accounting(since=NOW - 7 * DAY)
    assert len(rows) == 3
    ann, bob = usage(rows, "user")
    assert (ann.key, ann.jobs, ann.failures, bob.key) == ("ann", 2, {"cuda_oom": 1}, "bob")
    assert ann.card_hours == pytest.approx(2 * 2 + 0.5)  # 2 cards x 2 h + 1 card x 0.5 h
    assert ann.reserved_gib_hours == pytest.approx(20 * 2 * 2 + 10 * 0.5)
    assert ann.used_gib_hours == pytest.approx(10 * 2 * 2)  # only the measured attempt
    assert ann.mean_wait_seconds == pytest.approx(200)
    assert (bob.card_hours, bob.used_gib_hours, bob.mean_wait_seconds) == (1.0, 30.0, 0.0)
    assert len(reader.accounting(since=NOW - DAY)) == 1  # only bob's ended in the last day
    assert [ln.key for ln in usage(rows, "template")] == ["finetune"]


def test_accounting_of_a_job_never_started_has_no_wait_and_no_hours():
    job = Job(id=1, name="x", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.LOW,
              state=JobState.CANCELLED, workdir="/", created_at=NOW, ended_at=NOW + 5)
    acc = accounting_of(job)
    assert (acc.wait_seconds, acc.card_seconds, acc.used_byte_seconds) == (None, 0.0, None)


def test_bad_archive_urls_and_a_reader_pointed_elsewhere_get_one_line(ledger, archive, tmp_path, key_prefix,
                                                                       monkeypatch):
    with pytest.raises(ConfigError, match="absolute path"):
        Archive("sqlite:///relative.db", key_prefix)
    with pytest.raises(ConfigError, match="expected sqlite"):
        Archive("mysql://x", key_prefix)
    monkeypatch.setitem(__import__("sys").modules, "psycopg", None)
    with pytest.raises(ConfigError, match=r"pip install 'psycopg\[binary\]'"):
        Archive("postgresql://postgres@127.0.0.1/x", key_prefix)
    finished(ledger, ended=NOW - 2 * DAY)
    archive_pass(ledger.store.r, ledger.keys, archive, after_seconds=DAY, keep=0, now=NOW)  # records it
    other = default_url(tmp_path / "other")  # set by the reader itself: its mistake is said
    elsewhere = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path / "other", archive_url=other))
    with pytest.raises(ConfigError, match="this cluster archives finished jobs to sqlite:///.*but this rig's"):
        elsewhere.list()


def test_the_record_column_is_the_redis_hash_and_the_file_its_owners_only(archive, ledger, tmp_path):
    job = finished(ledger, ended=NOW - 2 * DAY, user="cy")
    mover(ledger, archive).run(NOW)
    assert all((tmp_path / name).stat().st_mode & 0o077 == 0 for name in ("archive.sqlite3", "archive.sqlite3-wal"))
    (record,), = archive._query("SELECT record FROM rig_jobs WHERE owner = ?", ("cy",))
    assert packed.unpack(record)["instance"] == job.instance == archive.record(job.id, job.instance)["instance"]


def test_the_periodic_task_says_once_what_is_wrong_with_the_archive_and_recovers(ledger, tmp_path, key_prefix,
                                                                                monkeypatch, caplog):
    import logging

    from rig.archiving import PeriodicArchiver

    job = finished(ledger, ended=NOW - 2 * DAY)
    monkeypatch.setitem(__import__("sys").modules, "psycopg", None)
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, archive_url="postgresql://postgres@127.0.0.1/x")
    task = PeriodicArchiver(settings, ledger.store.r)
    with caplog.at_level(logging.ERROR, "rig.archiving"):
        assert task.run(NOW).startswith("skipped: archive_url is a PostgreSQL URL but psycopg is not installed")
        task.run(NOW)
    assert len(caplog.records) == 1 and in_redis(ledger, job.id)  # said once; nothing moved
    task.settings = load_settings(key_prefix=key_prefix, home=tmp_path, archive_after_days=1)  # fixed
    assert task.run(NOW) == "archived 1 finished job(s)" and not in_redis(ledger, job.id)


def test_after_redis_lost_its_data_a_reused_id_is_another_job_in_the_archive(ledger, archive, tmp_path, key_prefix):
    old = finished(ledger, ended=NOW - 3 * DAY, name="before")
    mover(ledger, archive).run(NOW)
    ledger.store.r.delete(ledger.keys.next_job_id)  # Redis restarted empty: ids start again at 1
    new = finished(ledger, ended=NOW - 2 * DAY, name="after")
    assert new.id == old.id and new.instance != old.instance
    reader = history(ledger, tmp_path, key_prefix)
    assert reader.get(new.id).name == "after"  # the live one
    assert sorted(j.name for j in reader.list(limit=5)) == ["after", "before"]
    mover(ledger, archive).run(NOW)
    assert archive.count() == 2 and reader.get(new.id).name == "after"  # the newer submission
    assert reader.get(old.id, old.instance[:6]).name == "before"  # rig show ID --instance HEX
    bad = "ffff" if not old.instance.startswith("ffff") else "0000"
    with pytest.raises(JobNotFound, match=f"no job {old.id} of instance {bad}"):
        reader.get(old.id, bad)


def test_usage_by_node_puts_each_attempts_hours_on_its_node_and_cancelled_apart(ledger, archive, tmp_path,
                                                                                 key_prefix):
    job = ledger.store.create(Job(id=0, name="r", user="ann", command=["true"], gpu_memory=GIB, gpus=1,
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                  created_at=NOW - 3 * DAY))
    attempts = [{"attempt": k + 1, "node": node, "cards": [3], "gpu_memory": GIB, "started_at": NOW - 3 * DAY + k * 7200,
                 "ended_at": NOW - 3 * DAY + k * 7200 + 3600, "exit_code": 1, "outcome": "nonzero_exit"}
                for k, node in enumerate(("ba1", "ba1", "ba2"))]
    # Cancelled between retries: the job has no node of its own any more.
    code, _ = ledger.transition(job.id, JobState.CANCELLED, fields={"attempts": attempts, "attempt": 3,
                                "failure": "nonzero_exit"}, now=NOW - 2 * DAY)
    assert code == 1
    finished(ledger, ended=NOW - 2 * DAY, state=JobState.CANCELLED, failure="cancelled", run_s=0)
    finished(ledger, ended=NOW - 2 * DAY, state=JobState.FAILED, failure="cuda_oom")
    reader = history(ledger, tmp_path, key_prefix)
    for _ in ("in Redis", "archived"):
        rows = reader.accounting(since=NOW - 7 * DAY)
        by_node = {ln.key: ln for ln in usage(rows, "node")}
        assert "(none)" not in by_node and by_node["ba1"].card_hours == pytest.approx(2.0)
        assert by_node["ba2"].card_hours == pytest.approx(1.0)
        whole = total(rows)
        assert (whole.jobs, whole.cancelled, whole.failed, whole.failures) == (3, 2, 1, {"cuda_oom": 1})
        assert whole.card_hours == pytest.approx(4.0)
        mover(ledger, archive).run(NOW)
    assert archive.count() == 3


def test_an_archive_made_before_node_split_gets_the_column(tmp_path, key_prefix):
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        old = [c for c in _columns() if c[0] != "node_split"]
        conn.execute(f"CREATE TABLE rig_jobs ({', '.join(f'{n} {t}' for n, t in old)}, PRIMARY KEY (prefix, id, instance))")
    with Archive(f"sqlite:///{path}", key_prefix) as arch:
        assert "node_split" in {r[1] for r in arch._query("PRAGMA table_info(rig_jobs)")}
        assert arch.accounting() == []


def _columns():
    from rig.archive import COLUMNS

    return COLUMNS


def test_a_mean_of_zero_is_no_measurement_in_usage_as_in_rig_metrics(ledger, archive, tmp_path, key_prefix):
    """An attempt an older rig recorded with vram_mean 0 (no sample saw the job's memory):
    rig metrics shows '-' (rig.memory.measured), and rig usage counted 0 GiB-h used, as if
    measured, from Redis and from the archive alike."""
    from rig.cli.render import measured_memory

    job = finished(ledger, ended=NOW - 3 * DAY, mean=0)
    assert measured_memory(job.attempts[0]["vram_mean"]) == "-"
    assert accounting_of(job).used_byte_seconds is None
    reader = history(ledger, tmp_path, key_prefix)
    assert reader.usage()[1].used_gib_hours is None  # from Redis
    mover(ledger, archive).run(NOW)
    assert not in_redis(ledger, job.id)
    assert reader.usage()[1].used_gib_hours is None  # from the archive's sums
    finished(ledger, ended=NOW - 3 * DAY, mean=2 * GIB, run_s=1800.0)
    assert reader.usage()[1].used_gib_hours == pytest.approx(1.0)  # a measured one counts
