"""An archive that cannot be reached or read never stops a node or hides Redis' jobs; URLs of
one archive written differently are one archive; a move and a recreated database are said
(rig.archive, rig.archive_cluster, rig.history). SQLite in tmp_path, fakeredis and real Redis;
the PostgreSQL cases in a database of their own (skipped without one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rig.archive import (
    Archive,
    ArchiveUnreachable,
    default_url,
    identity,
    safe_url,
    same_archive,
    unmasked,
)
from rig.archive_cluster import check_at_up, claim, cluster_url, require_cluster
from rig.config import load_settings
from rig.errors import ConfigError
from rig.history import ArchiveUnread, History
from tests.store.test_archive import DAY, NOW, finished, in_redis, mover
from tests.store.test_archive_postgres import pg_url  # noqa: F401 - the fixture

#: Nothing listens there (a port below the ephemeral range that no test opens).
DOWN = "postgresql://postgres@127.0.0.1:5999/x"


@pytest.fixture
def ledger(redis_client, key_prefix):
    from rig.keys import Keys
    from rig.ledger import Ledger

    return Ledger(redis_client, Keys(key_prefix))


@pytest.mark.parametrize("other", [
    "postgresql://postgres@127.0.0.1:5432/db", "postgresql://postgres@127.0.0.1/db/",
    "postgresql://postgres:pw@127.0.0.1/db", "postgres://postgres@127.0.0.1/db",
    "postgresql://postgres:***@127.0.0.1:5432/db?sslmode=require"])
def test_one_postgresql_archive_written_differently_is_one_archive(other):
    assert same_archive("postgresql://postgres@127.0.0.1/db", other)


@pytest.mark.parametrize("other", [
    "postgresql://postgres@127.0.0.1:5433/db", "postgresql://postgres@127.0.0.1/db2",
    "postgresql://rig@127.0.0.1/db", "postgresql://postgres@10.0.0.1/db"])
def test_another_server_database_or_user_is_another_archive(other):
    assert not same_archive("postgresql://postgres@127.0.0.1/db", other)


def test_a_sqlite_path_is_compared_resolved(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert same_archive(f"sqlite:///{tmp_path}/real/a.sqlite3", f"sqlite:///{tmp_path}/link/../real/a.sqlite3")
    assert same_archive(f"sqlite:///{tmp_path}/real/a.sqlite3", f"sqlite:///{tmp_path}/link/a.sqlite3")
    assert identity(f"sqlite:///{tmp_path}/real/a.sqlite3") != identity(f"sqlite:///{tmp_path}/real/b.sqlite3")


def test_the_cluster_check_takes_a_port_a_slash_or_a_password_as_the_same(ledger):
    r, keys = ledger.store.r, ledger.keys
    assert claim(r, keys, "postgresql://postgres@127.0.0.1/db", alone=True) is None
    for url in ("postgresql://postgres@127.0.0.1:5432/db", "postgresql://postgres:pw@127.0.0.1/db/"):
        require_cluster(r, keys, url)  # no NotClusterArchive
        assert claim(r, keys, url, alone=False) is None
    with pytest.raises(ConfigError, match="this cluster archives finished jobs to"):
        require_cluster(r, keys, "postgresql://postgres@127.0.0.1/other")


@pytest.mark.parametrize(("url", "shown", "connect"), [
    ("postgresql://rig:pw@db/rig", "postgresql://rig:***@db/rig", "postgresql://rig@db/rig"),
    # libpq reads a password given as a query option too: it was recorded in Redis as it was
    ("postgresql://rig@db/rig?sslmode=require&password=pw&connect_timeout=3",
     "postgresql://rig@db/rig?sslmode=require&password=***&connect_timeout=3",
     "postgresql://rig@db/rig?sslmode=require&connect_timeout=3"),
    ("postgresql://rig:pw@db/rig?password=pw", "postgresql://rig:***@db/rig?password=***", "postgresql://rig@db/rig"),
    ("postgresql:///rig?host=/run/a:b@c", "postgresql:///rig?host=/run/a:b@c", "postgresql:///rig?host=/run/a:b@c"),
    # a SQLite path is no password, whatever it holds
    ("sqlite:////srv/a:b@c/archive.sqlite3", "sqlite:////srv/a:b@c/archive.sqlite3",
     "sqlite:////srv/a:b@c/archive.sqlite3")])
def test_safe_url_hides_every_password_and_only_passwords(url, shown, connect):
    assert safe_url(url) == shown
    assert unmasked(safe_url(url)) == connect
    assert same_archive(safe_url(url), url)


@pytest.mark.parametrize("url", [
    "postgresql://rig:pa%zzss@127.0.0.1:5999/x",  # libpq: invalid percent-encoded token: "pa%zzss"
    "postgresql://rig:pa ss@127.0.0.1:5999/x",  # libpq: unexpected spaces found in "pa ss"
    "postgresql://rig@127.0.0.1:5999/x?password=pa%zzss"])
def test_libpqs_words_about_a_url_never_carry_its_password(url, key_prefix):
    """libpq quotes the part of a URL it cannot parse, the password included: rig printed it
    (rig up, readers) and the archiving pass logged it and recorded it in Redis (archive:pass)."""
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigError) as caught:
        Archive(url, key_prefix)
    assert "pa%zzss" not in str(caught.value) and "pa ss" not in str(caught.value)
    assert '"***"' in str(caught.value)


def test_a_password_an_older_rig_recorded_is_masked_by_the_next_rig_up(ledger):
    r, keys = ledger.store.r, ledger.keys
    url = "postgresql://rig@db/rig?sslmode=require&password=pw"
    r.set(keys.archive_url, url)  # an older rig's safe_url left the option as given
    assert claim(r, keys, url, alone=False) is None  # the same archive
    assert cluster_url(r, keys) == "postgresql://rig@db/rig?sslmode=require&password=***"


def test_a_sqlite_archive_under_a_folder_named_with_colon_and_at_is_the_clusters(ledger, tmp_path):
    """A RIG_HOME such as /srv/a:b@c: the recorded archive was 'sqlite:////srv/a:***@c/...',
    another file, and every pass skipped ('this cluster archives finished jobs to ...')."""
    r, keys = ledger.store.r, ledger.keys
    url = default_url(tmp_path / "a:b@c")
    assert claim(r, keys, url, alone=True) is None
    assert cluster_url(r, keys) == url
    require_cluster(r, keys, url)  # no NotClusterArchive: this node archives


def test_a_server_down_at_rig_up_is_a_warning_and_a_mistake_still_refuses(ledger, key_prefix, tmp_path):
    pytest.importorskip("psycopg")
    r, keys = ledger.store.r, ledger.keys
    with pytest.raises(ArchiveUnreachable):
        Archive(DOWN, key_prefix)
    lines = check_at_up(r, keys, DOWN, key_prefix, "n1", home=tmp_path)
    assert lines == ["warning: archive postgresql://postgres@127.0.0.1:5999/x unreachable now (" + lines[0].split(
        "unreachable now (", 1)[1]] and lines[0].endswith("finished jobs stay in Redis until it answers")
    assert cluster_url(r, keys) == DOWN  # the node is the cluster's archiver: each pass retries
    for bad in ("mysql://x", "sqlite:///relative.db", f"sqlite:///{tmp_path}/no/such/folder/a.sqlite3"):
        with pytest.raises(ConfigError) as caught:
            check_at_up(r, keys, bad, key_prefix, "n1", home=tmp_path / "home")
        assert not isinstance(caught.value, ArchiveUnreachable)


class RefusingServer:
    """A PostgreSQL server that refuses every login, as a real one does with a wrong password: it
    declines SSL and GSS encryption, reads the startup message and answers with a FATAL
    ErrorResponse (SQLSTATE ``code``), then closes. The tests' own server trusts every login."""

    def __init__(self, code: str = "28P01", message: str = 'password authentication failed for user "rig"') -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"postgresql://rig:wrong@127.0.0.1:{self.sock.getsockname()[1]}/rig"
        fields = b"SFATAL\0VFATAL\0C" + code.encode() + b"\0M" + message.encode() + b"\0\0"
        self.error = b"E" + (len(fields) + 4).to_bytes(4, "big") + fields
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    while True:
                        head = conn.recv(8, 0x100)  # MSG_WAITALL
                        if len(head) < 8:
                            break
                        length, code = int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")
                        if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not here
                            conn.sendall(b"N")
                            continue
                        conn.recv(max(0, length - 8), 0x100)  # the startup message's parameters
                        conn.sendall(self.error)
                        break
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_a_login_refused_at_rig_up_is_refused_in_one_line(ledger, key_prefix, tmp_path):
    """A wrong password (the server answered: authentication failed) is the operator's mistake:
    rig up refuses it in one line that says what to fix (exit 6), unlike a server that is down
    (a warning, above); a reader without the password still lists Redis' jobs with one warning."""
    pytest.importorskip("psycopg")
    from rig.archive import ArchiveRefused, unreadable

    r, keys = ledger.store.r, ledger.keys
    for code, words in (("28P01", 'password authentication failed for user "rig"'),
                        ("28000", 'role "rig" does not exist')):
        server = RefusingServer(code, words)
        try:
            with pytest.raises(ArchiveRefused) as caught:
                check_at_up(r, keys, server.url, key_prefix, "n1", home=tmp_path)
            assert caught.value.exit_code == 6 and unreadable(caught.value)
            message = str(caught.value)
            assert "\n" not in message and words in message and "wrong" not in message  # no password shown
            assert message.startswith(f"archive postgresql://rig:***@127.0.0.1:{server.url.rsplit(':', 1)[1]}: "
                                      "the server refused the login (")
            assert message.endswith("fix the user or password in archive_url (RIG_ARCHIVE_URL), ~/.pgpass or "
                                    "PGPASSWORD, then run rig up again")
            assert cluster_url(r, keys) is None  # refused before the node claimed anything
            live = finished(ledger, ended=NOW - 60)
            reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path,
                                                         archive_url=server.url))
            assert live.id in [j.id for j in reader.list()]
            assert reader.unread_line().startswith("warning: the archive could not be read (postgresql://rig:***@")
            assert "refused the login" in reader.unread_line()
        finally:
            server.close()


def test_a_move_is_said_with_the_old_archives_count(ledger, key_prefix, tmp_path):
    r, keys = ledger.store.r, ledger.keys
    a_url, b_url = default_url(tmp_path / "a"), default_url(tmp_path / "b")
    assert check_at_up(r, keys, a_url, key_prefix, "n1", home=tmp_path) == []
    finished(ledger, ended=NOW - 2 * DAY)
    finished(ledger, ended=NOW - 2 * DAY)
    with Archive(a_url, key_prefix) as a:
        assert mover(ledger, a).run(NOW).archived == 2
    (line,) = check_at_up(r, keys, b_url, key_prefix, "n1", home=tmp_path)
    assert line.startswith(f"warning: this cluster's finished jobs now go to {b_url} (they went to {a_url}): "
                           f"the 2 job(s) in {a_url} are no longer shown")


def test_an_unreadable_sqlite_archive_lists_redis_jobs_with_one_warning(ledger, key_prefix, tmp_path):
    old = finished(ledger, ended=NOW - 2 * DAY, user="ann")
    with Archive(default_url(tmp_path), key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    live = finished(ledger, ended=NOW - 60, user="bob")
    assert not in_redis(ledger, old.id) and in_redis(ledger, live.id)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert [j.id for j in reader.list()] == [live.id, old.id] and reader.unread is None
    reader.close()
    (tmp_path / "archive.sqlite3").rename(tmp_path / "moved.sqlite3")
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert [j.id for j in reader.list()] == [live.id]
    assert reader.unread_line().startswith("warning: the archive could not be read (archive missing at ")
    assert reader.unread_line().endswith("older finished jobs are not shown")
    lines, total = reader.usage(since=None)
    assert total.jobs == 1 and [line.key for line in lines] == ["bob"]  # what Redis holds
    with pytest.raises(ArchiveUnread, match=f"job {old.id} is not in Redis and the archive could not be read"):
        reader.get(old.id)  # never "no job with id N"
    assert reader.get(live.id).id == live.id
    (tmp_path / "moved.sqlite3").rename(tmp_path / "archive.sqlite3")  # back: the next listing has it all
    assert [j.id for j in reader.list()] == [live.id, old.id] and reader.unread_line() is None


def _one_archived_one_live(ledger, key_prefix, home):  # noqa: ANN001, ANN202
    """ann's job moved into the archive under ``home``, then bob's, still in Redis."""
    old = finished(ledger, ended=NOW - 2 * DAY, user="ann")
    with Archive(default_url(home), key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    return old, finished(ledger, ended=NOW - 60, user="bob")


@pytest.mark.skipif(os.geteuid() != 0, reason="seteuid needs root")
def test_an_archive_in_a_home_the_reader_cannot_enter_is_one_warning(ledger, key_prefix, request):
    """A user whose RIG_HOME is the admin's (mode 0700) got a PermissionError traceback from
    `rig jobs` (Path.exists on the archive there): the archive is unreadable to them, one
    warning, and Redis' jobs are listed."""
    import shutil
    import tempfile
    from pathlib import Path

    outer = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folders are root's only: not the case here
    request.addfinalizer(lambda: shutil.rmtree(outer, ignore_errors=True))
    outer.chmod(0o755)
    home = outer / "home"
    home.mkdir(mode=0o700)
    old, live = _one_archived_one_live(ledger, key_prefix, home)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=home))
    os.seteuid(40001)
    try:
        listed = [j.id for j in reader.list()]
    finally:
        os.seteuid(0)
    assert listed == [live.id] and old.id not in listed
    assert reader.unread_line().startswith("warning: the archive could not be read")


def test_rig_jobs_and_usage_exit_0_with_one_warning_when_the_archive_is_gone(ledger, key_prefix, tmp_path):
    from click.testing import CliRunner

    from rig.cli.main import cli
    from tests.conftest import REAL_REDIS, REDIS_URL

    if not REAL_REDIS or not hasattr(ledger.store.r, "connection_pool") or "Fake" in type(ledger.store.r).__name__:
        pytest.skip("the CLI reads a real Redis")
    old = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(default_url(tmp_path), key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    live = finished(ledger, ended=NOW - 60)
    (tmp_path / "archive.sqlite3").unlink()
    env = {"RIG_REDIS_URL": REDIS_URL, "RIG_KEY_PREFIX": key_prefix, "RIG_HOME": str(tmp_path), "COLUMNS": "200"}
    jobs = CliRunner().invoke(cli, ["jobs", "--json"], env=env)
    assert jobs.exit_code == 0, jobs.output
    assert [j["id"] for j in __import__("json").loads(jobs.stdout)] == [live.id]
    assert jobs.stderr.count("warning: the archive could not be read") == 1
    usage = CliRunner().invoke(cli, ["usage", "--since", "all"], env=env)
    assert usage.exit_code == 0, usage.output
    assert "the totals cover only the finished jobs Redis holds" in usage.stderr
    assert "usage of all finished jobs that Redis holds (the archive was not read" in " ".join(usage.stdout.split())
    show = CliRunner().invoke(cli, ["show", str(old.id)], env=env)
    assert show.exit_code == 6 and "the archive could not be read" in show.stderr


def test_accounting_and_a_stored_field_answer_from_redis_when_the_archive_cannot_be_read(ledger, key_prefix,
                                                                                      tmp_path):
    """History.accounting() and stored_field() as `rig jobs` does: Redis' part, ``unread`` set
    for the one warning line, never the database's exception."""
    old, live = _one_archived_one_live(ledger, key_prefix, tmp_path)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert {a.id for a in reader.accounting()} == {old.id, live.id} and reader.unread is None
    archived = reader.get(old.id)
    assert reader.stored_field(archived, "name") == old.name and reader.unread is None
    reader.close()
    (tmp_path / "archive.sqlite3").rename(tmp_path / "moved.sqlite3")
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert [a.id for a in reader.accounting()] == [live.id]
    assert reader.unread_line().startswith("warning: the archive could not be read (archive missing at ")
    assert reader.stored_field(archived, "name") is None and reader.unread is not None
    assert reader.stored_field(reader.get(live.id), "name") == live.name and reader.unread is None  # from Redis
    # A @rig.task's result read as None would be taken for the function's return value: the
    # client says the archive could not be read instead (the archive went between the two reads).
    from rig.client import Client

    client = Client(load_settings(key_prefix=key_prefix, home=tmp_path), redis_client=ledger.store.r)
    client.get = lambda job_id, instance=None: archived  # type: ignore[method-assign]
    with pytest.raises(ArchiveUnread, match=f"job {old.id}'s result is not in Redis and the archive could not"):
        client.result_of(old.id)
    (tmp_path / "moved.sqlite3").rename(tmp_path / "archive.sqlite3")
    assert client.result_of(old.id) is None  # readable again: the archived record has no result


def test_rig_jobs_and_usage_through_the_gateway_say_the_archive_could_not_be_read(ledger, key_prefix, tmp_path,
                                                                                monkeypatch):
    """A user who reads through the gateway gets the same one warning line as one who reads the
    archive directly: the node's answer carries why its archive could not be read."""
    import json
    import os
    import threading
    from pathlib import Path

    from click.testing import CliRunner

    from rig.cli.main import cli
    from rig.client import Client
    from rig.gateway.client import GatewayClient
    from rig.gateway.server import Gateway, bind

    finished(ledger, ended=NOW - 2 * DAY)
    with Archive(default_url(tmp_path), key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    live = finished(ledger, ended=NOW - 60)
    (tmp_path / "archive.sqlite3").unlink()
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, admins=[])
    gw = Gateway(settings, Client(settings, redis_client=ledger.store.r))
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-unread.sock")
    server = bind(path, gw)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        for module in ("rig.cli.main", "rig.cli.usage"):
            monkeypatch.setattr(f"{module}.client_from", lambda ctx: GatewayClient(settings, path))
        jobs = CliRunner().invoke(cli, ["jobs", "--json"], env={"COLUMNS": "200"})
        assert jobs.exit_code == 0, jobs.output
        assert [j["id"] for j in json.loads(jobs.stdout)] == [live.id]
        assert jobs.stderr.count("warning: the archive could not be read (archive missing at ") == 1, jobs.stderr
        usage = CliRunner().invoke(cli, ["usage", "--since", "all"], env={"COLUMNS": "200"})
        assert usage.exit_code == 0, usage.output
        assert usage.stderr.count("warning: the archive could not be read") == 1, usage.stderr
        assert "the totals cover only the finished jobs Redis holds" in usage.stderr
        assert "that Redis holds (the archive was not read" in " ".join(usage.stdout.split()), usage.stdout
    finally:
        server.shutdown()
        server.server_close()
        path.unlink(missing_ok=True)


def test_a_dropped_postgresql_database_lists_redis_jobs_with_one_warning(ledger, key_prefix, tmp_path,
                                                                       pg_url):  # noqa: F811
    import psycopg

    from tests.store.test_archive_postgres import ADMIN_URL

    old = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(pg_url, key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    live = finished(ledger, ended=NOW - 60)
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {pg_url.rsplit('/', 1)[1]} WITH (FORCE)")
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path, archive_url=pg_url))
    assert [j.id for j in reader.list()] == [live.id] and "could not be read" in reader.unread_line()
    with pytest.raises(ArchiveUnread):
        reader.get(old.id)


def _recreated_case(ledger, key_prefix, tmp_path, url: str, recreate) -> None:
    """Archive one job to ``url``, ``recreate()`` the database empty, and check that nothing
    takes the empty one as the history: the pass, rig up, readers."""
    from rig.archiving import archive_pass

    r, keys = ledger.store.r, ledger.keys
    old = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(url, key_prefix) as archive:
        require_cluster(r, keys, archive.url)
        assert archive_pass(r, keys, archive, after_seconds=DAY, keep=0, now=NOW).archived == 1
    recreate()
    waiting = finished(ledger, ended=NOW - 2 * DAY)
    with Archive(url, key_prefix) as archive:  # rig makes its tables again: empty
        with pytest.raises(ConfigError, match="holds none of this cluster's jobs but 1 were archived to it"):
            archive_pass(r, keys, archive, after_seconds=DAY, keep=0, now=NOW)
    assert in_redis(ledger, waiting.id)  # not moved into the recreated archive
    (line,) = check_at_up(r, keys, url, key_prefix, "n1", home=tmp_path)
    assert line.startswith("warning: archive ") and "holds none of this cluster's jobs" in line
    # The command printed acts on rig's Redis and key, not on whatever 127.0.0.1:6379 holds.
    url_told = f"{r.connection_pool.connection_kwargs['host']}:{r.connection_pool.connection_kwargs['port']}"
    assert f"`redis-cli -u redis://{url_told}/" in line and f" DEL {keys.archive_held}`" in line, line
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path, archive_url=url))
    assert [j.id for j in reader.list()] == [waiting.id] and "holds none" in reader.unread_line()
    with pytest.raises(ArchiveUnread):
        reader.get(old.id)


def test_a_sqlite_archive_replaced_by_an_empty_one_is_said_not_used(ledger, key_prefix, tmp_path):
    url = default_url(tmp_path)

    def recreate() -> None:
        for name in ("archive.sqlite3", "archive.sqlite3-wal", "archive.sqlite3-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        Archive(url, key_prefix).close()  # an empty archive put in its place

    _recreated_case(ledger, key_prefix, tmp_path, url, recreate)


def test_a_postgresql_database_dropped_and_recreated_is_said_not_used(ledger, key_prefix, tmp_path,
                                                                    pg_url):  # noqa: F811
    import psycopg

    from tests.store.test_archive_postgres import ADMIN_URL

    def recreate() -> None:
        name = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name}")

    _recreated_case(ledger, key_prefix, tmp_path, pg_url, recreate)


def test_a_node_without_archive_url_uses_the_clusters_archive(ledger, key_prefix, tmp_path):
    """A tester ran `rig up` from a folder without the rig.toml: the cluster's archive moved
    from PostgreSQL to this home's SQLite file with one warning. A node that set no
    archive_url uses the cluster's recorded one, as readers do; its archiving pass too."""
    from rig.archive_cluster import archive_of
    from rig.archiving import PeriodicArchiver

    r, keys = ledger.store.r, ledger.keys
    a_url = default_url(tmp_path / "a")
    assert check_at_up(r, keys, a_url, key_prefix, "n1", home=tmp_path / "a") == []  # the cluster's: a
    bare = load_settings(key_prefix=key_prefix, home=tmp_path / "b", archive_url=None)  # no rig.toml
    assert archive_of(r, keys, bare) == a_url
    assert check_at_up(r, keys, archive_of(r, keys, bare), key_prefix, "n1", home=bare.home) == []
    assert cluster_url(r, keys) == a_url  # not moved
    job = finished(ledger, ended=NOW - 2 * DAY)
    said = PeriodicArchiver(bare.model_copy(update={"archive_after_days": 1}), r).run(NOW)
    assert not said.startswith("skipped"), said
    with Archive(a_url, key_prefix) as a:
        assert a.get(job.id) is not None  # archived into the cluster's archive, not b's
    # Set on purpose, another archive still moves the cluster (said, with the count).
    b_url = default_url(tmp_path / "b")
    moved = load_settings(key_prefix=key_prefix, home=tmp_path / "b", archive_url=b_url)
    (line,) = check_at_up(r, keys, archive_of(r, keys, moved), key_prefix, "n1", home=moved.home)
    assert line.startswith(f"warning: this cluster's finished jobs now go to {b_url}"), line


def test_the_clusters_archive_unusable_here_is_a_warning_not_a_move(ledger, key_prefix, tmp_path):
    """The cluster's archive, used because this node set none, may be out of its reach (a
    SQLite file of another host): rig up goes on with one warning and moves nothing. The same
    archive set here on purpose is the operator's mistake: exit 6, as before."""
    from rig.archive_cluster import check_node_at_up

    r, keys = ledger.store.r, ledger.keys
    far = default_url(tmp_path / "other-host" / "home")  # its folder does not exist here
    r.set(keys.archive_url, far)
    bare = load_settings(key_prefix=key_prefix, home=tmp_path / "b", archive_url=None, node_name="n1")
    (line,) = check_node_at_up(r, keys, bare)
    assert line.startswith(f"warning: this node does not archive: the cluster's archive {far} cannot be used "
                           "here (") and "set archive_url" in line, line
    assert cluster_url(r, keys) == far  # not moved to b's own file
    with pytest.raises(ConfigError):
        check_node_at_up(r, keys, load_settings(key_prefix=key_prefix, home=tmp_path / "b", archive_url=far))


def _archived_one(ledger, key_prefix, tmp_path):
    """One job moved into the default SQLite archive under ``tmp_path``; returns it."""
    old = finished(ledger, ended=NOW - 2 * DAY, user="ann")
    with Archive(default_url(tmp_path), key_prefix) as archive:
        require_cluster(ledger.store.r, ledger.keys, archive.url)
        mover(ledger, archive).run(NOW)
    assert not in_redis(ledger, old.id)
    return old


def _refuse_writes(patcher: pytest.MonkeyPatch, path: str) -> None:
    """Every open of ``path`` to write fails EPERM (an immutable file, a read-only mount), even
    for its owner; opens to read and other files are left alone."""
    import errno
    import os

    real_open = os.open

    def no_writes(file, flags, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(file) == path and flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return real_open(file, flags, *args, **kwargs)

    patcher.setattr(os, "open", no_writes)
    _sqlite_fails(patcher, path, "attempt to write a readonly database", reads=False)


def _sqlite_fails(patcher: pytest.MonkeyPatch, path: str, words: str, *, reads: bool) -> None:
    """SQLite's own open of ``path`` fails as it would where the OS refuses it (its C code
    opens the file, out of reach of os.open's patch): every open with ``reads``, else the open
    to write (a plain path; a ``mode=ro`` URI reads)."""
    import sqlite3

    real_connect = sqlite3.connect

    def connect(database, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        text = str(database)
        if text == path or (reads and text.startswith(Path(path).as_uri())):
            raise sqlite3.OperationalError(words)
        return real_connect(database, *args, **kwargs)

    patcher.setattr(sqlite3, "connect", connect)


def test_a_reader_reads_an_archive_it_may_not_write(ledger, key_prefix, tmp_path, monkeypatch):
    """A reader opens the SQLite file read-only: one that refuses every open to write (an
    immutable file, a read-only mount: EPERM/EROFS, even for its owner) still reads."""

    old = _archived_one(ledger, key_prefix, tmp_path)
    path = str(tmp_path / "archive.sqlite3")
    _refuse_writes(monkeypatch, path)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert reader.get(old.id).id == old.id
    assert [j.id for j in reader.list()] == [old.id] and reader.unread is None
    reader.close()


def test_an_archive_that_cannot_be_opened_is_said_in_the_oss_words(ledger, key_prefix, tmp_path, monkeypatch):
    """Never a guess at ownership: the OS's reason, and the owner named only when another user
    owns the file and the OS said permission denied."""
    import errno
    import os

    old = _archived_one(ledger, key_prefix, tmp_path)
    path = str(tmp_path / "archive.sqlite3")
    real_open = os.open
    raised = {"errno": errno.EIO, "text": "Input/output error"}

    def failing(file, flags, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(file) == path:
            raise OSError(raised["errno"], raised["text"], path)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    _sqlite_fails(monkeypatch, path, "unable to open database file", reads=True)
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    with pytest.raises(ArchiveUnread, match=r"cannot be read by this user \(\[Errno 5\] Input/output error\)") as e:
        reader.get(old.id)
    assert "owner" not in str(e.value).split("(", 1)[1].split(")")[0]
    raised.update(errno=errno.EACCES, text="Permission denied")
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)  # another user than the file's
    assert reader.list() == []  # Redis holds none: the one job is archived
    assert "[Errno 13] Permission denied; it is uid" in reader.unread and "jobs' environments" in reader.unread


@pytest.mark.parametrize("put_there", ["folder", "text"])
def test_something_else_in_the_archives_place_is_said_for_what_it_is(ledger, key_prefix, tmp_path, put_there):
    """A folder or another file where the SQLite archive was: SQLite says "disk I/O error" or
    "file is not a database", and readers and the pass advised fixing permissions."""
    old = _archived_one(ledger, key_prefix, tmp_path)
    path = tmp_path / "archive.sqlite3"
    for part in tmp_path.glob("archive.sqlite3*"):
        part.rename(tmp_path / f"aside-{part.name}")
    if put_there == "folder":
        path.mkdir()
    else:
        path.write_text("notes\n")
    what = "a folder" if put_there == "folder" else "not a SQLite database"
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    with pytest.raises(ArchiveUnread, match=f"archive {path} is {what}, not rig's archive: move it aside"):
        reader.get(old.id)
    assert reader.list() == [] and f"is {what}" in reader.unread and "permissions" not in reader.unread
    reader.close()
    with pytest.raises(ConfigError, match=f"is {what}, not rig's archive") as caught:
        Archive(default_url(tmp_path), key_prefix)
    assert "permissions" not in str(caught.value) and "writable" not in str(caught.value)


def test_the_archiving_pass_on_a_file_it_may_not_write_logs_one_line_with_the_oss_reason(
        ledger, key_prefix, tmp_path, monkeypatch, caplog):

    from rig.archiving import PeriodicArchiver

    _archived_one(ledger, key_prefix, tmp_path)
    finished(ledger, ended=NOW - 2 * DAY)
    path = str(tmp_path / "archive.sqlite3")
    _refuse_writes(monkeypatch, path)
    archiver = PeriodicArchiver(load_settings(key_prefix=key_prefix, home=tmp_path), ledger.store.r)
    with caplog.at_level("ERROR", logger="rig.archiving"):
        first = archiver.run(NOW)
        second = archiver.run(NOW + 60)
    assert first == second and first.startswith("skipped: ") and "[Errno 1] Operation not permitted" in first
    lines = [r.getMessage() for r in caplog.records if "archiving pass skipped" in r.getMessage()]
    assert len(lines) == 1 and "Operation not permitted" in lines[0]


def test_a_reader_of_an_older_archive_adds_its_tables_or_says_why_it_cannot(ledger, key_prefix, tmp_path,
                                                                          monkeypatch):
    """Read-only readers still read an archive an older rig wrote (no usage rollup): they add
    the tables as the writer would when they may write it, and say why not when they may not."""

    from rig.archive import USAGE_TABLE

    old = _archived_one(ledger, key_prefix, tmp_path)
    with Archive(default_url(tmp_path), key_prefix) as archive, archive._transaction() as cur:
        cur.execute(f"DROP TABLE {USAGE_TABLE}")
    path = str(tmp_path / "archive.sqlite3")
    with monkeypatch.context() as m:
        _refuse_writes(m, path)
        reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
        assert reader.list() == []
        assert "was written by an older rig and adding this version's tables to it failed here" in reader.unread
        assert "Operation not permitted" in reader.unread
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    assert [j.id for j in reader.list()] == [old.id] and reader.unread is None
    assert reader.archive().rollup_built is not None  # summed once, by this reader
    reader.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_an_existing_archive_is_opened_by_sqlite_alone(ledger, key_prefix, tmp_path, monkeypatch, readonly):
    """POSIX locks belong to the process: closing any descriptor of the file drops every lock it
    holds there, a live SQLite connection's too. _connect opened and closed the existing file
    itself (to make it 0600, to read its header, to find the OS's reason first), so a second
    archive opened in a process whose first one read or wrote dropped its locks (rows were lost,
    seen live). An existing archive that opens is now opened by SQLite alone."""
    _archived_one(ledger, key_prefix, tmp_path)
    path = tmp_path / "archive.sqlite3"
    first = Archive(default_url(tmp_path), key_prefix)  # the live connection whose locks would go
    raw: list[str] = []
    real_os_open, real_path_open = os.open, type(path).open

    def os_open(name, *args, **kwargs):
        if os.fspath(name) == str(path):
            raw.append("os.open")
        return real_os_open(name, *args, **kwargs)

    def path_open(self, *args, **kwargs):
        if str(self) == str(path):
            raw.append("Path.open")
        return real_path_open(self, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(type(path), "open", path_open)
    try:
        second = Archive(default_url(tmp_path), key_prefix, create=False, readonly=readonly)
        second.close()
    finally:
        first.close()
    assert raw == []
