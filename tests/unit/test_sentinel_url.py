"""A ``sentinel://`` redis_url: read by one function (rig.sentinel_url.parse), bad forms are one
ConfigError line (exit 6), and every client's form is derived from it: redis-py's Sentinel
master client, kombu's broker URL and options, redbeat's and Flower's. No Redis needed: the
clients are built, never connected. A Redis Cluster node, a sentinel's port and a plain Redis
listed as a sentinel are refused in tests/unit/test_server_kind.py."""

from __future__ import annotations

import socket
import time

import pytest
from kombu import Connection
from redbeat.schedulers import get_redis
from redis.sentinel import MasterNotFoundError, SentinelConnectionPool

from rig import sentinel_url
from rig.celery_config import make_celery
from rig.config import load_settings
from rig.errors import ConfigError, redact_url
from rig.init_config import init_config
from rig.redis_conn import (
    REPLY_TIMEOUT_S,
    client_options,
    connect,
    strip_password,
    unavailable,
    without_credentials,
)

URL = "sentinel://:m%40ster@10.0.0.1:26379,10.0.0.2,[::1]:26380/rigmaster/2?sentinel_password=sent"


@pytest.fixture(autouse=True)
def isolated_env(rig_home):
    """Every test here: no RIG_* of the shell, a home of its own (tests/conftest.py)."""


def test_one_reading_of_hosts_master_db_and_both_passwords():
    target = sentinel_url.parse(URL)
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (target.master_name, target.db) == ("rigmaster", 2)
    assert (target.password, target.sentinel_password, target.username) == ("m@ster", "sent", None)


@pytest.mark.parametrize(("url", "said"), [
    ("sentinel://h1:26379,h2:26379", "names no master"),
    ("sentinel:///rigmaster/0", "names no sentinel"),
    ("sentinel://h1:99999/rigmaster", "port that is not a number from 1 to 65535"),
    ("sentinel://h1:x/rigmaster", "port that is not a number"),
    ("sentinel://h1,,h2/rigmaster", "empty sentinel address"),
    ("sentinel://h1/rigmaster/x", "database 'x' is not a number"),
    ("sentinel://h1/rigmaster/0/extra", "only MASTER_NAME/DB"),
    ("sentinel://h1/rigmaster?master=x", "unknown option(s) master"),
    ("sentinel://h1:26379;sentinel://h2:26379", "kombu's way (';')"),
    # Issue 15, findings 11-12: an unencoded password, the master name left out, an empty password.
    ("sentinel://:p@ss:w/rd@h1,h2,h3/rigm/0", "percent-encode @ : / ? # in passwords (p@ss:w/rd is p%40ss%3Aw%2Frd)"),
    ("sentinel://:p@ss:w@h1:x/rigm/0", "percent-encode @ : /"),
    ("sentinel://h1,h2/0", "names no master: '0' after the hosts would be the master's name"),
    ("sentinel://h1/rigm/0?sentinel_password=", "sentinel_password is empty"),
])
def test_a_bad_sentinel_url_is_one_config_line_with_the_form(url, said):
    with pytest.raises(ConfigError) as info:
        load_settings(redis_url=url)
    text = str(info.value)
    assert said in text and "sentinel://" in text and "\n" not in text, text
    assert info.value.exit_code == 6


def test_redis_cluster_urls_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="does not run on Redis Cluster"):
        load_settings(redis_url="redis-cluster://h1:7000/0")


def test_passwords_never_printed():
    for shown in (strip_password(URL), redact_url(URL)):
        assert "m%40ster" not in shown and "m@ster" not in shown and "sent&" not in shown
        assert not shown.endswith("=sent"), shown


def test_the_redis_password_setting_fills_the_master_password():
    settings = load_settings(redis_url="sentinel://h1,h2/rigmaster/0", redis_password="pw")
    assert sentinel_url.parse(settings.redis_url).password == "pw"


def test_rigs_client_is_a_sentinel_master_client_with_rigs_options():
    client = connect(URL)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "rigmaster"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (2, "m@ster", 10.0)
    sentinel = pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_kwargs["password"] == "sent"  # never the master's
    # Every reconnect asks the sentinels (redis-py's own class would reuse the old address).
    assert pool.connection_class.__name__ == "FollowsMaster"
    # A fail-over takes seconds: a failed connection is retried for longer than that.
    assert kwargs["retry"].get_retries() > 10


def test_celery_broker_redbeat_and_flower_forms(tmp_path):
    app = make_celery(load_settings(redis_url=URL, home=tmp_path))
    conn = Connection(app.conf.broker_url)
    assert conn.transport_cls == "sentinel" and len(conn.alt) == 3
    assert (conn.password, conn.virtual_host) == ("m@ster", "2")
    options = app.conf.broker_transport_options
    assert options["master_name"] == "rigmaster"  # kombu and Flower refuse to start without it
    assert options["sentinel_kwargs"]["password"] == "sent"
    beat = get_redis(app)
    pool = beat.wrapped_connection.connection_pool
    assert pool.service_name == "rigmaster" and pool.connection_kwargs["password"] == "m@ster"
    assert pool.sentinel_manager.sentinels[1].connection_pool.connection_kwargs["port"] == 26379


def test_no_sentinel_answering_is_said_at_once_not_retried_for_a_failover_window():
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])  # closed again: nothing listens there
    url = f"sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/rigmaster/0"
    began = time.monotonic()
    with pytest.raises(MasterNotFoundError) as info:
        connect(url).ping()
    assert time.monotonic() - began < 5.0  # FAILOVER_WINDOW_S is for a fail-over, not for this
    message = str(unavailable(url, info.value))
    assert message.startswith(f"no Redis master behind {url}: no sentinel answers at 127.0.0.1:{ports[0]}")


def test_rig_up_without_a_usable_sentinel_exits_5_like_every_command(tmp_path):
    # It exited 7 (bring-up failed) where rig status, rig-submit and the rest say 5 (README:
    # sentinels that cannot be used are one line and exit 5); a wrong password was 5 there too.
    from rig.errors import RedisUnavailable
    from rig.stack import Stack, UpOptions

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"sentinel://127.0.0.1:{port}/rigmaster/0"
    stack = Stack(load_settings(home=tmp_path / "home", redis_url=url), UpOptions(), say=lambda _line: None)
    with pytest.raises(RedisUnavailable) as info:
        stack._ensure_redis()
    assert info.value.exit_code == 5 and str(info.value).startswith(f"no Redis master behind {url}: no sentinel")
    # `rig up --only` without redis too (it said 7, and "no Redis answers" without which sentinel).
    only = Stack(load_settings(home=tmp_path / "home", redis_url=url), UpOptions(only=("flower",)),
                 say=lambda _line: None)
    with pytest.raises(RedisUnavailable) as info:
        only._ensure_redis()
    assert info.value.exit_code == 5 and str(info.value).startswith(f"no Redis master behind {url}: no sentinel")
    local = f"redis://127.0.0.1:{port}/0"
    only = Stack(load_settings(home=tmp_path / "home", redis_url=local), UpOptions(only=("flower",)),
                 say=lambda _line: None)
    with pytest.raises(RedisUnavailable) as info:
        only._ensure_redis()  # a local URL: not started by an --only without redis
    assert info.value.exit_code == 5 and str(info.value).startswith(f"no Redis answers at {local}")


def test_the_sentinel_password_file_fills_the_sentinels_password(tmp_path):
    secret = tmp_path / "sentinel.password"
    secret.write_text("from-file\n")
    secret.chmod(0o600)
    settings = load_settings(redis_url="sentinel://h1/rigmaster/0", redis_sentinel_password_file=secret)
    assert sentinel_url.parse(settings.redis_url).sentinel_password == "from-file"
    settings = load_settings(redis_url="sentinel://h1/rigmaster/0?sentinel_password=url",
                             redis_sentinel_password_file=secret)
    assert sentinel_url.parse(settings.redis_url).sentinel_password == "url"  # the URL's own wins
    with pytest.raises(ConfigError, match="redis_sentinel_password_file names .* which does not exist"):
        load_settings(redis_url="sentinel://h1/rigmaster/0", redis_sentinel_password_file=tmp_path / "none")


def test_a_bad_sentinel_password_file_is_named_as_such(tmp_path):
    # It was "the Redis password file ... set RIG_REDIS_PASSWORD / delete it to have `rig up`
    # generate one": the master's file, which this is not, and rig up generates no sentinel password.
    secret = tmp_path / "sentinel.password"
    secret.write_text("from-file\n")
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^the sentinel password file \(redis_sentinel_password_file\) .* is open"):
        load_settings(redis_url="sentinel://h1/rigmaster/0", redis_sentinel_password_file=secret)
    secret.write_text("\n")
    secret.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty; write the sentinels' password") as info:
        load_settings(redis_url="sentinel://h1/rigmaster/0", redis_sentinel_password_file=secret)
    assert "rig up" not in str(info.value)


def test_rig_init_never_writes_a_password_into_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_REDIS_URL", URL)
    written = init_config(str(tmp_path / "config.toml"), "n1", force=False)
    text = (tmp_path / "config.toml").read_text()
    assert "sentinel://10.0.0.1:26379,10.0.0.2,[::1]:26380/rigmaster/2" in text, written
    assert "sent" not in text.replace("sentinel", "") and "m%40ster" not in text


def test_a_url_without_credentials_still_works_but_holds_no_password():
    assert without_credentials(URL) == "sentinel://10.0.0.1:26379,10.0.0.2,[::1]:26380/rigmaster/2"
    assert without_credentials("redis://:pw@h:6379/0") == "redis://h:6379/0"


def test_sentinels_are_asked_with_short_timeouts_whatever_rigs_reply_timeout():
    """Issue 15: a sentinel that accepts and never answers (SIGSTOP) cost every command rig's
    10 s reply timeout per sentinel (90 s with three hung)."""
    kwargs = sentinel_url.parse(URL).sentinel_kwargs(client_options())
    assert kwargs["socket_timeout"] <= sentinel_url.SENTINEL_TIMEOUT_S
    assert kwargs["socket_connect_timeout"] <= sentinel_url.SENTINEL_TIMEOUT_S
    pool = connect(URL).connection_pool
    for sentinel in pool.sentinel_manager.sentinels:
        assert sentinel.connection_pool.connection_kwargs["socket_timeout"] <= sentinel_url.SENTINEL_TIMEOUT_S


@pytest.mark.slow
def test_hung_sentinels_are_said_to_be_hung_within_the_documented_bound():
    """Listening sockets never accepted from: the kernel completes the connection, nothing
    ever answers, as with a sentinel stopped by SIGSTOP."""
    hung = [socket.socket() for _ in range(3)]
    try:
        for s in hung:
            s.bind(("127.0.0.1", 0))
            s.listen(8)
        hosts = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in hung)
        url = f"sentinel://{hosts}/rigmaster/0"
        began = time.monotonic()
        with pytest.raises(MasterNotFoundError) as info:
            connect(url).ping()
        message = str(unavailable(url, info.value))
        # The README's bound for a Redis host that vanished (REPLY_TIMEOUT_S); it took 90 s.
        assert time.monotonic() - began < REPLY_TIMEOUT_S
        assert f"the sentinel(s) at {hosts.replace(',', ', ')} accept connections but do not answer" in message
        assert "SIGSTOP" in message
    finally:
        for s in hung:
            s.close()


def test_the_failover_retry_stops_at_its_window_not_at_a_count(monkeypatch):
    """Each try asks the sentinels (up to 1 s each when one is hung): a count of tries made of
    the 30 s window was 100 s for a tester's command. The window is now a deadline."""
    import redis

    import rig.redis_conn as rc

    clock = [0.0]
    monkeypatch.setattr(rc.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr("redis.retry.sleep", lambda _s: None)
    retry = rc._retry("sentinel://127.0.0.1:1,127.0.0.1:2/rigm/0")
    tries = []

    def do():  # noqa: ANN202 - each try costs 3 s of the (fake) clock: a hung sentinel and the backoff
        tries.append(clock[0])
        clock[0] += 3.0
        raise redis.ConnectionError("connection refused")

    with pytest.raises(redis.ConnectionError):
        retry.call_with_retry(do, lambda _error: None)
    assert len(tries) == 10 and tries[-1] == 27.0, tries  # at 0, 3, ..., 27 s: at 30 s the window is over (was 33 tries)
