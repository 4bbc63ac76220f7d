"""The archive seen from several hosts and over time (rig.archive_cluster, rig.archiving,
rig.history): a SQLite archive is one host's, a failing pass is said with its cause and the
archiving node's interval, a three-slash SQLite URL is explained, an id of a previous archive
is pointed there, and an error's lines are folded into one. fakeredis and real Redis; SQLite in
tmp_path; another host is this_host() made to answer another machine id."""

from __future__ import annotations

import sqlite3
import time

import pytest

import rig.archive_cluster
from rig.archive import Archive, ArchiveUnreachable, default_url, one_line
from rig.archive_cluster import (
    archive_host,
    check_node_at_up,
    claim,
    late,
    note_pass,
)
from rig.archive_host import Host
from rig.archiving import PeriodicArchiver
from rig.config import load_settings
from rig.errors import ConfigError, JobNotFound
from rig.history import ArchiveUnread, History
from rig.keys import Keys
from rig.ledger import Ledger
from rig.nodes import clock
from tests.store.test_archive import DAY, NOW, finished, in_redis

SA = Host("machine-a", "sa")
SC = Host("machine-c", "sc")


@pytest.fixture
def ledger(redis_client, key_prefix) -> Ledger:
    return Ledger(redis_client, Keys(key_prefix))


@pytest.fixture
def on_host(monkeypatch):
    """on_host(h): from now on this process is host ``h``."""
    def become(host: Host) -> None:
        monkeypatch.setattr(rig.archive_cluster, "this_host", lambda: host)
    return become


def test_a_sqlite_archive_is_one_hosts_and_another_host_never_writes_or_reads_its_own(
        ledger, tmp_path, key_prefix, on_host):
    r, keys = ledger.store.r, ledger.keys
    home = tmp_path / "x"  # the same RIG_HOME path on both hosts
    settings = load_settings(key_prefix=key_prefix, home=home, archive_after_days=1, node_name="sa")
    on_host(SA)
    assert check_node_at_up(r, keys, settings) == []  # the first node records the archive, and its host
    assert archive_host(r, keys) == SA
    job = finished(ledger, ended=NOW - 2 * DAY)
    assert PeriodicArchiver(settings, r).run(NOW) == "archived 1 finished job(s)"

    # Host sc, the same path: there /x is another folder (here: the file is not seen).
    on_host(SC)
    sc = load_settings(key_prefix=key_prefix, home=home, archive_after_days=1, archive_keep_finished=100,
                       node_name="sc")
    lines = check_node_at_up(r, keys, sc)
    assert len(lines) == 1 and lines[0].startswith("warning: this node does not archive: this cluster archives "
                                                   "finished jobs to a SQLite file on host sa (sqlite:///")
    assert "which this host (sc) cannot share" in lines[0] and 'archive_url = "postgresql://' in lines[0]
    (home / "archive.sqlite3").rename(tmp_path / "sa-file")  # sc's view: no such file at that path
    later = finished(ledger, ended=NOW - 2 * DAY)
    assert PeriodicArchiver(sc, r).run(NOW).startswith("skipped: this cluster archives finished jobs to a "
                                                        "SQLite file on host sa")
    assert not (home / "archive.sqlite3").exists() and in_redis(ledger, later.id)  # never its own file
    assert not r.hexists(keys.archive_pass, "skips")  # not the cluster's archive failing
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=home))
    with pytest.raises(ArchiveUnread, match="on host sa .*read archived jobs on sa, or for one archive"):
        reader.get(job.id)  # says where the archive is, never "holds none ... DEL"
    assert reader.list()[0].id == later.id and "SQLite file on host sa" in reader.unread_line()

    on_host(Host("machine-c", "sa"))  # another host of the same name: told apart by machine id
    assert "on host sa, machine id machine-a (" in check_node_at_up(r, keys, sc)[0]
    assert "which this host (sa, machine id machine-c) cannot share" in check_node_at_up(r, keys, sc)[0]

    # Back on sa: its file, its jobs; sc's node left them all to it.
    on_host(SA)
    (tmp_path / "sa-file").rename(home / "archive.sqlite3")
    assert PeriodicArchiver(settings, r).run(NOW) == "archived 1 finished job(s)"
    assert History(ledger.store, settings).get(job.id).id == job.id


def test_a_record_of_an_older_rig_gets_the_host_of_the_first_node_that_opens_the_file(
        ledger, tmp_path, key_prefix, on_host):
    r, keys = ledger.store.r, ledger.keys
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, archive_after_days=1)
    r.set(keys.archive_url, default_url(tmp_path))  # an older rig: no host
    assert archive_host(r, keys) is None
    on_host(SA)
    finished(ledger, ended=NOW - 2 * DAY)
    assert PeriodicArchiver(settings, r).run(NOW) == "archived 1 finished job(s)"
    assert archive_host(r, keys) == SA
    on_host(SC)
    assert PeriodicArchiver(settings, r).run(NOW).startswith("skipped: this cluster archives finished jobs to a "
                                                             "SQLite file on host sa")
    # An older rig's move rewrites archive:url only: the host named for the old URL is no host of the new.
    r.set(keys.archive_url, default_url(tmp_path / "moved"))
    assert archive_host(r, keys) is None


def test_postgresql_has_no_host_and_a_move_records_the_new_host_or_none(ledger, tmp_path, on_host):
    r, keys = ledger.store.r, ledger.keys
    on_host(SA)
    assert claim(r, keys, default_url(tmp_path), alone=True) is None and archive_host(r, keys) == SA
    on_host(SC)
    claim(r, keys, "postgresql://rig@db/rig", alone=True)
    assert archive_host(r, keys) is None and not r.exists(keys.archive_host)
    claim(r, keys, default_url(tmp_path / "c"), alone=True)
    assert archive_host(r, keys) == SC


def _full(*_args, **_kwargs):
    raise sqlite3.OperationalError("database or disk is full")


def test_a_failing_pass_is_said_with_its_cause_by_the_archiving_nodes_interval(ledger, tmp_path, key_prefix,
                                                                              monkeypatch):
    r, keys = ledger.store.r, ledger.keys
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, archive_after_days=1, archive_interval=5)
    task = PeriodicArchiver(settings, r)
    finished(ledger, ended=NOW - 2 * DAY)
    assert task.run(NOW) == "archived 1 finished job(s)"
    # A reader with the default 60 s interval: the archiving node's 5 s is the one that counts.
    assert late(r, keys, NOW + 5, 60) is None
    assert late(r, keys, NOW + 100, 60).startswith("archiving last succeeded 2 min ago")  # > 3 x 5 + 60
    finished(ledger, ended=NOW - 2 * DAY)
    monkeypatch.setattr(Archive, "add", _full)
    assert task.run(NOW + 5) == "skipped: database or disk is full"
    assert late(r, keys, NOW + 6, 60) is None  # one skip, not an interval old yet
    assert "database or disk is full" in late(r, keys, NOW + 11, 60)  # one interval late
    task.run(NOW + 10)
    line = late(r, keys, NOW + 10, 60)
    assert line == (f"archiving skipped since {clock(NOW + 5)}: database or disk is full "
                    f"({default_url(tmp_path)})")
    monkeypatch.undo()
    assert task.run(NOW + 15) == "archived 1 finished job(s)"
    assert late(r, keys, NOW + 16, 60) is None and not r.hexists(keys.archive_pass, "reason")


def test_skips_said_without_control_workers_say_no_control_worker_is_up(ledger):
    r, keys = ledger.store.r, ledger.keys
    note_pass(r, keys, NOW, interval=5, node="sa", skipped="database or disk is full", url="sqlite:////x/a")
    note_pass(r, keys, NOW + 5, interval=5, node="sa", skipped="database or disk is full", url="sqlite:////x/a")
    assert late(r, keys, NOW + 6, 60) == (f"archiving skipped since {clock(NOW)}: "
                                          "database or disk is full (sqlite:////x/a)")
    r.set(keys.archive_ok_at, repr(NOW - 600))
    assert "no control worker is up" in late(r, keys, NOW + 6, 60, control_up=False)


def test_skips_since_an_earlier_day_say_its_date(ledger):
    """Passes skipped for three days read `archiving skipped since 17:42`: today's time, not the
    day the archive stopped taking jobs."""
    r, keys = ledger.store.r, ledger.keys
    now = time.time()
    for at in (now - 3 * DAY, now - 3 * DAY + 60):
        note_pass(r, keys, at, interval=60, node="sa", skipped="database or disk is full", url="sqlite:////x/a")
    line = late(r, keys, now, 60)
    day = time.strftime("%Y-%m-%d", time.localtime(now - 3 * DAY))
    assert line.startswith(f"archiving skipped since {day} ") and line.endswith(": database or disk is full "
                                                                               "(sqlite:////x/a)")


def test_a_three_slash_sqlite_url_is_said_to_be_relative(ledger, tmp_path, key_prefix):
    r, keys = ledger.store.r, ledger.keys
    claim(r, keys, "sqlite:////tmp/x/archive.sqlite3", alone=True)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path,
                                                 archive_url="sqlite:///tmp/x/archive.sqlite3"))
    with pytest.raises(ConfigError, match="three slashes is a relative path, tmp/x/archive.sqlite3; an absolute "
                                          "one takes four: sqlite:////tmp/x/archive.sqlite3"):
        reader.location()
    with pytest.raises(ConfigError, match="three slashes is a relative path"):
        Archive("sqlite:///tmp/x/archive.sqlite3", key_prefix)


def test_an_id_of_the_previous_archive_is_pointed_there(ledger, tmp_path, key_prefix):
    r, keys = ledger.store.r, ledger.keys
    old_home, new_home = tmp_path / "old", tmp_path / "new"
    old = load_settings(key_prefix=key_prefix, home=old_home, archive_after_days=1)
    claim(r, keys, old.archive_location, alone=True)
    job = finished(ledger, ended=NOW - 2 * DAY)
    assert PeriodicArchiver(old, r).run(NOW) == "archived 1 finished job(s)"
    new = load_settings(key_prefix=key_prefix, home=new_home, archive_url=default_url(new_home))
    claim(r, keys, new.archive_location, alone=True)  # the cluster moved on
    with pytest.raises(JobNotFound, match=f"may be in the archive the cluster used before, {old.archive_location}"
                       ) as caught:
        History(ledger.store, new).get(job.id)
    assert caught.value.exit_code == 4


def test_an_id_below_every_id_redis_knows_may_be_in_an_earlier_archive(ledger, tmp_path, key_prefix):
    r, keys = ledger.store.r, ledger.keys
    gone, kept = finished(ledger, ended=NOW), finished(ledger, ended=NOW)
    r.delete(keys.job(gone.id))
    r.zrem(keys.all_jobs, gone.id)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    with pytest.raises(JobNotFound, match="though the id was handed out: it may be in an archive the cluster used"):
        reader.get(gone.id)
    with pytest.raises(JobNotFound, match="^no job with id"):
        reader.get(kept.id + 10)  # never handed out


def test_an_errors_lines_are_folded_into_one():
    two = Exception('connection failed: connection to server at "127.0.0.1", port 5432 failed:\n'
                    'FATAL:  database "nope" does not exist')
    assert one_line(two) == ('connection failed: connection to server at "127.0.0.1", port 5432 failed: '
                             'FATAL: database "nope" does not exist')
    assert one_line(Exception()) == "Exception"
    assert "\n" not in str(ArchiveUnreachable("postgresql://u@h/d", one_line(two)))


def test_the_periodic_task_logs_a_two_line_error_as_one_line(ledger, tmp_path, key_prefix, monkeypatch, caplog):
    import logging

    def two_lines(*_a, **_k):
        raise sqlite3.OperationalError("disk I/O error\nsecond line")

    monkeypatch.setattr(Archive, "add", two_lines)
    finished(ledger, ended=NOW - 2 * DAY)
    task = PeriodicArchiver(load_settings(key_prefix=key_prefix, home=tmp_path, archive_after_days=1), ledger.store.r)
    with caplog.at_level(logging.ERROR, "rig.archiving"):
        assert task.run(NOW) == "skipped: disk I/O error second line"
    assert "disk I/O error second line" in caplog.records[0].getMessage()


def test_postgresql_errors_of_several_lines_are_one_line_wherever_archive_errors_are_worded(
        ledger, tmp_path, key_prefix):
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed")
    from tests.store.test_archive_postgres import ADMIN_URL

    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at {ADMIN_URL}: {one_line(exc)}")
    name = f"rigtest_gone_{key_prefix.strip(':').replace('-', '_')[-10:]}"
    admin.execute(f"CREATE DATABASE {name}")
    admin.execute(f"DROP DATABASE {name}")  # a database of its own, dropped: "does not exist"
    admin.close()
    dropped = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    refused = "postgresql://postgres@127.0.0.1:1/rig"  # nothing listens: libpq's two lines
    for url, words in ((dropped, "does not exist"), (refused, "Is the server running")):
        with pytest.raises(ArchiveUnreachable) as caught:
            Archive(url, key_prefix)
        assert "\n" not in str(caught.value) and words in str(caught.value)
        settings = load_settings(key_prefix=key_prefix, home=tmp_path, archive_url=url)
        lines = check_node_at_up(ledger.store.r, ledger.keys, settings)  # rig up: a warning, one line
        assert len(lines) == 1 and "\n" not in lines[0] and words in lines[0]
        reader = History(ledger.store, settings)
        reader.list()
        assert "\n" not in reader.unread_line() and words in reader.unread_line()
        ledger.store.r.delete(ledger.keys.archive_url)
