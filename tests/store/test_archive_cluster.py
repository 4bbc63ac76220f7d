"""One archive per cluster, a short renewed lock, and a SQLite file deleted under rig
(rig.archive_cluster, rig.archiving, rig.archive, rig.history): fakeredis and real Redis,
SQLite in tmp_path."""

from __future__ import annotations

import pytest

from rig.archive import Archive, ArchiveMissing, default_url
from rig.archive_cluster import NotClusterArchive, claim, claim_at_up, cluster_url, late
from rig.archiving import LOCK_S, PeriodicArchiver, archive_pass
from rig.config import load_settings
from rig.errors import ConfigError
from rig.history import History
from rig.keys import Keys
from rig.ledger import Ledger
from rig.nodes import NodeRegistry
from tests.store.test_archive import DAY, NOW, finished, in_redis


@pytest.fixture
def ledger(redis_client, key_prefix) -> Ledger:
    return Ledger(redis_client, Keys(key_prefix))


def one_pass(ledger: Ledger, archive: Archive, batch: int = 1000):
    return archive_pass(ledger.store.r, ledger.keys, archive, after_seconds=DAY, keep=0, now=NOW, batch=batch)


def test_two_nodes_with_their_own_sqlite_split_nothing_and_the_other_is_told(ledger, tmp_path, key_prefix):
    r, keys = ledger.store.r, ledger.keys
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    a_home.mkdir()
    b_home.mkdir()
    a, b = Archive(default_url(a_home), key_prefix), Archive(default_url(b_home), key_prefix)
    assert claim(r, keys, a.url, alone=True) is None  # the first node up records its archive
    assert "will not archive" in claim(r, keys, b.url, alone=False)  # rig up of B: one line
    job = finished(ledger, ended=NOW - 2 * DAY)
    with pytest.raises(NotClusterArchive, match="this cluster archives finished jobs to sqlite:///.*/a/"):
        one_pass(ledger, b)
    assert in_redis(ledger, job.id) and b.count() == 0 and cluster_url(r, keys).endswith("/a/archive.sqlite3")
    # B set its own archive_url (a node that set none archives to the cluster's: rig.archive_cluster.archive_of).
    b_task = PeriodicArchiver(load_settings(key_prefix=key_prefix, home=b_home, archive_url=b.url,
                                            archive_after_days=1), r)
    assert b_task.run(NOW).startswith("skipped: this cluster archives") and in_redis(ledger, job.id)
    assert str(one_pass(ledger, a)) == "archived 1 finished job(s)" and a.count() == 1
    assert cluster_url(r, keys).endswith("/a/archive.sqlite3")  # never flips
    (b_home / "archive.sqlite3").unlink()  # B's own file is not the cluster's: its absence is no loss
    assert b_task.run(NOW).startswith("skipped: this cluster archives")
    reader_b = History(ledger.store, load_settings(key_prefix=key_prefix, home=b_home, archive_url=b.url))
    with pytest.raises(ConfigError, match="this cluster archives finished jobs to .* but this rig's archive_url"):
        reader_b.get(job.id)  # it set another archive itself: told, never "no job"
    # A reader who set no archive_url (another RIG_HOME) reads the cluster's archive.
    assert History(ledger.store, load_settings(key_prefix=key_prefix, home=b_home)).get(job.id).id == job.id
    reader_a = History(ledger.store, load_settings(key_prefix=key_prefix, home=a_home))
    assert reader_a.get(job.id).id == job.id
    # rig up of B while A is up: B will not archive, the record stays A's.
    NodeRegistry(r, keys).register("ba1", ttl=30)
    assert claim_at_up(r, keys, b.url, "ba2").startswith("warning: this node will not archive")
    assert cluster_url(r, keys).endswith("/a/archive.sqlite3")
    # The operator moves the cluster: every node down, rig up with the new archive re-records it.
    r.delete(keys.node_alive("ba1"))
    assert "now go to sqlite:///" in claim_at_up(r, keys, b.url, "ba2")
    assert cluster_url(r, keys).endswith("/b/archive.sqlite3")
    a.close()
    b.close()


def test_the_lock_is_short_renewed_per_batch_and_a_killed_pass_blocks_it_briefly(ledger, tmp_path, key_prefix,
                                                                                 monkeypatch):
    r, keys = ledger.store.r, ledger.keys
    for _ in range(3):
        finished(ledger, ended=NOW - 2 * DAY)
    seen: list[int] = []
    with Archive(default_url(tmp_path), key_prefix) as archive:
        real_add = archive.add

        def add(entries, *, now):
            seen.append(r.pttl(keys.archive_lock))
            r.pexpire(keys.archive_lock, 1000)  # time passes: renewal must lift it again
            return real_add(entries, now=now)

        monkeypatch.setattr(archive, "add", add)
        assert one_pass(ledger, archive, batch=1).archived == 3  # three batches
    assert len(seen) == 3 and all(LOCK_S * 1000 - 5000 < ms <= LOCK_S * 1000 for ms in seen)
    assert not r.exists(keys.archive_lock)
    # A pass SIGKILLed mid-way leaves its lock: it lapses within LOCK_S (30 s), not 10 minutes.
    r.lock(keys.archive_lock, timeout=LOCK_S).acquire(blocking=False)
    assert 0 < r.pttl(keys.archive_lock) <= 30_000
    with Archive(default_url(tmp_path), key_prefix) as archive:
        assert one_pass(ledger, archive) is None
    # rig status tells when archiving is late (ok_at was set by the pass above, at NOW).
    assert late(r, keys, NOW + 60, 60.0) is None
    assert "archiving last succeeded 10 min ago: see the control" in late(r, keys, NOW + 600, 60.0)
    # No control worker up (no node): that is why, not "see the control workers' log".
    assert late(r, keys, NOW + 600, 60.0, control_up=False) == (
        "archiving last succeeded 10 min ago: no control worker is up to run it (`rig up` on a node starts one)")


def test_a_sqlite_file_deleted_or_replaced_under_rig_keeps_the_jobs_in_redis(ledger, tmp_path, key_prefix):
    path = tmp_path / "archive.sqlite3"
    first = finished(ledger, ended=NOW - 2 * DAY)
    archive = Archive(default_url(tmp_path), key_prefix)
    assert one_pass(ledger, archive).archived == 1
    path.unlink()  # the operator deletes it while rig is up: the connection still writes to it
    second = finished(ledger, ended=NOW - 2 * DAY)
    with pytest.raises(ArchiveMissing, match=f"archive missing at {path}"):
        one_pass(ledger, archive)
    assert in_redis(ledger, second.id)  # never forgotten in Redis unless in the file on disk
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    with pytest.raises(ConfigError, match=f"archive missing at {path}"):
        reader.get(first.id)  # said missing, never read as empty
    task = PeriodicArchiver(load_settings(key_prefix=key_prefix, home=tmp_path, archive_after_days=1), ledger.store.r)
    assert task.run(NOW).startswith("skipped: archive missing at") and not path.exists()  # not recreated empty
    path.write_bytes(b"")  # another file at the path (moved and replaced): also refused
    with pytest.raises(ArchiveMissing):
        one_pass(ledger, archive)
    assert in_redis(ledger, second.id)
    archive.close_quietly()


def test_a_mistyped_sqlite_folder_is_said_not_created(tmp_path, key_prefix):
    url = f"sqlite:///{tmp_path}/nonexistent/dir/a.sqlite3"
    with pytest.raises(ConfigError, match="folder .*/nonexistent/dir does not exist"):
        Archive(url, key_prefix)
    assert not (tmp_path / "nonexistent").exists()


def test_redis_back_empty_gets_the_cluster_archive_back_from_a_node_not_its_own_default(ledger, tmp_path,
                                                                                         key_prefix):
    """Redis came back empty; node c (no archive_url of its own, following the record) was up
    first: it recorded its own home's SQLite file, and every reader showed 0 archived jobs,
    silently (the history was in node a's archive)."""
    from rig.archive_cluster import MEMORY_FILE, archive_of, check_node_at_up

    r, keys = ledger.store.r, ledger.keys
    a_set = load_settings(key_prefix=key_prefix, home=tmp_path / "a")
    c_set = load_settings(key_prefix=key_prefix, home=tmp_path / "c")
    assert check_node_at_up(r, keys, a_set) == []  # the first node up records its archive
    assert check_node_at_up(r, keys, c_set) == []  # c follows the record
    job = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(default_url(a_set.home), key_prefix) as a:
        assert str(one_pass(ledger, a)) == "archived 1 finished job(s)"
    assert (c_set.run_dir / MEMORY_FILE).exists()
    for key in r.scan_iter(match=f"{key_prefix}*"):  # Redis restarted empty (this test's keys only)
        r.delete(key)
    # Another cluster (another prefix) on the same home is not given this one's archive.
    other = load_settings(key_prefix=key_prefix + "other:", home=tmp_path / "c")
    assert archive_of(r, Keys(other.key_prefix), other) == other.archive_location
    assert cluster_url(r, Keys(other.key_prefix)) is None
    (line,) = check_node_at_up(r, keys, c_set)  # c's rig up, first after the loss
    assert "recorded again" in line and "/a/archive.sqlite3" in line
    assert cluster_url(r, keys).endswith("/a/archive.sqlite3")
    assert History(ledger.store, c_set).get(job.id).id == job.id
    r.delete(keys.archive_url, keys.archive_host)  # lost again; a pass of c before any rig up
    task = PeriodicArchiver(load_settings(key_prefix=key_prefix, home=tmp_path / "c", archive_after_days=1), r)
    task.run(NOW)
    assert cluster_url(r, keys).endswith("/a/archive.sqlite3") and not (c_set.home / "archive.sqlite3").exists()


def test_a_second_cluster_with_the_same_prefix_on_one_archive_is_told_at_rig_up(ledger, tmp_path, key_prefix):
    """Two rig clusters (each its own Redis) with the default key prefix and one team PostgreSQL
    database: the second one's rig up said nothing, and its rig jobs/show/usage listed the
    first one's archived jobs (on nodes it never had) as its own."""
    from rig.archive_cluster import check_node_at_up

    r, keys = ledger.store.r, ledger.keys
    (tmp_path / "db").mkdir()
    shared = default_url(tmp_path / "db")
    first = load_settings(key_prefix=key_prefix, home=tmp_path / "a", archive_url=shared)
    assert check_node_at_up(r, keys, first) == []  # an archive holding nothing yet: nothing to say
    job = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(shared, key_prefix) as a:
        assert str(one_pass(ledger, a)) == "archived 1 finished job(s)"
    for key in r.scan_iter(match=f"{key_prefix}*"):  # the second cluster's Redis: none of these keys
        r.delete(key)
    second = load_settings(key_prefix=key_prefix, home=tmp_path / "b", archive_url=shared)
    (line,) = check_node_at_up(r, keys, second)
    assert line.startswith(f"warning: archive {shared} already holds 1 job(s) under key prefix {key_prefix!r}")
    assert "give each cluster its own key_prefix (RIG_KEY_PREFIX) or database" in line
    assert History(ledger.store, second).get(job.id).id == job.id  # what it warns of
    assert check_node_at_up(r, keys, second) == []  # said once: the record is this node's now
    # Redis lost its data under the first cluster: its node remembers the archive, no warning.
    for key in r.scan_iter(match=f"{key_prefix}*"):
        r.delete(key)
    assert check_node_at_up(r, keys, first) == []


def test_a_node_is_told_when_the_cluster_archive_moved_while_it_was_down(ledger, tmp_path, key_prefix):
    """An older rig up alone (no archive_url) took its own default for a move and recorded its
    home's SQLite file; the next rig up of a newer node followed it without a word, and
    rig usage --since all went from 433 jobs to 15."""
    from rig.archive_cluster import check_node_at_up

    r, keys = ledger.store.r, ledger.keys
    a_set = load_settings(key_prefix=key_prefix, home=tmp_path / "a")
    assert check_node_at_up(r, keys, a_set) == []
    (tmp_path / "d").mkdir()
    r.set(keys.archive_url, default_url(tmp_path / "d"))  # what the older rig recorded
    r.delete(keys.archive_host)
    (line,) = check_node_at_up(r, keys, a_set)
    assert line.startswith("warning: this cluster's finished jobs now go to sqlite:///") and "/d/" in line
    assert f'archive_url = "{default_url(tmp_path / "a")}"' in line
    assert check_node_at_up(r, keys, a_set) == []  # said once: it is what this node knows now
