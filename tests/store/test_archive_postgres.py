"""The archive on PostgreSQL (psycopg 3): the same move, crash window and reads as on SQLite,
in a database of its own that the test creates and drops. Skipped when psycopg is missing or
no PostgreSQL answers at RIG_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres)."""

from __future__ import annotations

import os
import uuid

import pytest

from rig.archive import Archive
from rig.archiving import Archiver
from rig.history import History
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import JobState
from tests.store.test_archive import DAY, NOW, finished, in_redis

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'psycopg[binary]'")

ADMIN_URL = os.environ.get("RIG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def pg_url():
    """A fresh database, dropped afterwards."""
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at {ADMIN_URL}: {str(exc).strip().splitlines()[0]}")
    name = f"rigtest_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE DATABASE {name}")
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def test_move_crash_window_and_reads_on_postgresql(pg_url, redis_client, key_prefix, tmp_path, monkeypatch):
    from rig.config import load_settings

    ledger = Ledger(redis_client, Keys(key_prefix))
    jobs = [finished(ledger, ended=NOW - 2 * DAY, state=s, failure=f)
            for s, f in ((JobState.SUCCEEDED, None), (JobState.FAILED, "cuda_oom"))]
    with Archive(pg_url, key_prefix) as archive:
        move = Archiver(redis_client, ledger.keys, archive, after_seconds=DAY, keep=0)
        with monkeypatch.context() as m:
            m.setattr(Archiver, "_forget_archived", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("died")))
            with pytest.raises(ConnectionError):
                move.run(NOW)
        assert archive.count() == 2 and all(in_redis(ledger, j.id) for j in jobs)
        assert move.run(NOW).archived == 2 and archive.count() == 2  # the upsert wrote nothing twice
        assert not any(in_redis(ledger, j.id) for j in jobs)

        reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path, archive_url=pg_url))
        back = reader.get(jobs[1].id)
        assert (back.failure, back.attempts, back.problems) == ("cuda_oom", jobs[1].attempts, [])
        assert [j.id for j in reader.list(limit=5)] == [jobs[1].id, jobs[0].id]
        assert [a.failure for a in reader.accounting(since=NOW - 7 * DAY)].count("cuda_oom") == 1
        reader.close()
