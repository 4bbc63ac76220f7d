"""rig.authgate on a real private redis-server with requirepass: a refused password is retried
with back-off (1 s, doubling, 30 s cap), never at once; a password change seen only by NEW
logins is recorded on the node through a logged-in connection and named by `rig status`'s
annotate; a periodic task logs one line on a refused password; the ACL LOG count of one host
is said once."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from rig.authgate import FIELD, AuthGate, probe, quiet_on_auth, refused_since, report
from rig.authwatch import annotate
from rig.nodes import NodeInfo
from rig.redis_conn import connect

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


@pytest.fixture
def private(tmp_path) -> Iterator[int]:
    """A private redis-server with requirepass "pw1" (never the shared one): its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "pw1"],
                            stdout=subprocess.DEVNULL)
    admin = redis.Redis(port=port, password="pw1", decode_responses=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            admin.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


def _denied(port: int, password: str) -> int:
    """Refused logins Redis counted so far (its ACL LOG, reason auth; INFO's
    acl_access_denied_auth needs Redis 7.2)."""
    entries = redis.Redis(port=port, password=password, decode_responses=True).acl_log(1000)
    return sum(int(e["count"]) for e in entries if e["reason"] == "auth")


def test_backoff_doubles_to_the_cap_and_a_good_login_resets_it():
    gate = AuthGate(first=1.0, cap=30.0)
    assert [gate.refused() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert gate.since is not None
    with pytest.raises(redis.AuthenticationError, match="rig tries a new login after 1 s, doubling up to 30 s"):
        gate.check()
    gate.accepted()
    gate.check()  # open again
    assert gate.since is None and gate.refused() == 1.0


def test_password_change_and_kill_make_no_storm(private):
    """The tester's slip: CONFIG SET requirepass pw2 + CLIENT KILL TYPE normal. A client that
    keeps calling (as heartbeat, telemetry and supervise loops do) logs in at most ~log2(t)+1
    times, not once per call."""
    port = private
    old = connect(f"redis://:pw1@127.0.0.1:{port}/0")
    old.ping()
    admin = redis.Redis(port=port, password="pw1")
    admin.config_set("requirepass", "pw2")
    admin.client_kill_filter(_type="normal", skipme=True)
    before = _denied(port, "pw2")
    calls = errors = 0
    texts: set[str] = set()
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        calls += 1
        try:
            old.ping()
        except redis.AuthenticationError as exc:
            errors += 1
            assert "invalid username-password pair" in str(exc)  # Redis' words, kept by the gate
            texts.add(str(exc))
        time.sleep(0.01)
    refused = _denied(port, "pw2") - before
    assert calls > 100 and errors == calls
    # One text for a refused login and a held one: a logger that says a repeated line once
    # (rig.lograte) said the two in turn every second (control.log grew ~200 B/s).
    assert len(texts) == 1, texts
    # 0 s, 1 s, 3 s: three logins (the old code: redis-py's Retry made 3 per call, ~300/s).
    assert 1 <= refused <= 3, refused
    assert refused_since() is not None


def test_a_new_password_seen_only_by_new_logins_is_recorded_and_named(private):
    """Logged-in connections keep working after CONFIG SET requirepass (no kill): rig up's
    probe finds the refusal and writes auth_refused_since through its logged-in connection."""
    port = private
    url = f"redis://:pw1@127.0.0.1:{port}/0"
    client = connect(url)
    assert probe(url) is True
    report(client, "t:node:a", refused_since())
    assert client.hget("t:node:a", FIELD) is None
    redis.Redis(port=port, password="pw1").config_set("requirepass", "pw2")
    assert probe(url) is False
    since = refused_since()
    assert since is not None
    report(client, "t:node:a", since)  # the old, logged-in connection still writes
    assert float(client.hget("t:node:a", FIELD)) == pytest.approx(since, abs=0.01)
    node = NodeInfo(name="a", alive=True, state="up", since=1.0, host=socket.gethostname(),
                    auth_refused_since=since)
    annotate(redis.Redis(port=port, password="pw2", decode_responses=True), [node])
    assert node.auth_refused and node.auth_refused.startswith(
        "new connections from node a to Redis are refused (password changed?) since ")
    assert "new connections from node a to Redis are refused" in node.describe
    # The password comes back: the next probe (after the back-off) clears the field.
    redis.Redis(port=port, password="pw2").config_set("requirepass", "pw1")
    time.sleep(1.05)  # the gate's first back-off (a time, not a synchronisation)
    assert probe(url) is True and refused_since() is None
    report(client, "t:node:a", refused_since())
    assert client.hget("t:node:a", FIELD) is None


def test_a_periodic_task_logs_one_line_on_a_refused_password(private, caplog):
    port = private
    bad = connect(f"redis://:nope@127.0.0.1:{port}/0")

    @quiet_on_auth("cluster health check", logging.getLogger("t.worker"))
    def task() -> str:
        bad.ping()
        return "ran"

    with caplog.at_level(logging.ERROR, logger="t.worker"):
        results = [task() for _ in range(5)]
    assert results == ["skipped: Redis refused the password"] * 5
    lines = [r for r in caplog.records if r.name == "t.worker"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert lines[0].getMessage().startswith("cluster health check skipped: Redis refused rig's password (")

    @quiet_on_auth("alert check", logging.getLogger("t.worker"))
    def broken() -> None:
        raise ValueError("a bug stays a bug")

    with pytest.raises(ValueError):
        broken()


def test_one_host_is_counted_once(private):
    port = private
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, password="old").ping()
    here = socket.gethostname()
    a, b = (NodeInfo(name=n, alive=False, state="silent", since=1.0, last_seen=1.0, host=here) for n in "ab")
    annotate(redis.Redis(port=port, password="pw1", decode_responses=True), [a, b])
    assert a.auth_refused and "login(s) from 127.0.0.1 (nodes a, b)" in a.auth_refused
    assert b.auth_refused and "login(s)" not in b.auth_refused and "see node a" in b.auth_refused


def test_a_refused_command_says_redis_words_not_the_gates_back_off(private):
    """`rig status` with a wrong password said '(invalid username-password pair or user is
    disabled. (rig tries a new login after 1 s, doubling up to 30 s))' and exited 5: a one-shot
    command tries no new login. The line a person reads carries Redis' words alone, for a
    refused login and a held one alike; the error itself keeps the gate's one text."""
    from rig.redis_conn import unavailable

    url = f"redis://:wrong@127.0.0.1:{private}/0"
    client = connect(url)
    for _ in ("refused", "held"):
        with pytest.raises(redis.AuthenticationError) as info:
            client.ping()
        assert "rig tries a new login" in str(info.value)  # the daemons' one text (rig.lograte)
        line = str(unavailable(url, info.value))
        assert "invalid username-password pair" in line and "rig tries" not in line, line
