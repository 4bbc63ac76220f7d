"""Day-one mistakes with a real Sentinel setup (a master, a replica and three sentinels on
loopback, started once for the module): each is one line naming its cause, at once, never a
wait for a fail-over window; and `rig up`'s warnings about a setup that would not fail over."""

from __future__ import annotations

import time

import pytest

from rig import sentinel_url
from rig.client import Client
from rig.config import load_settings
from rig.errors import RedisAuthFailed, RedisUnavailable
from rig.redis_conn import FAILOVER_WINDOW_S, client_options
from rig.testing.sentinel_set import MASTER_PASSWORD, SENTINEL_PASSWORD, SentinelSet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def redis_set(tmp_path_factory):
    started = SentinelSet(tmp_path_factory.mktemp("sentinels")).start()
    yield started
    started.stop()


def refusal(url: str, tmp_path) -> tuple[RedisUnavailable, float]:  # noqa: ANN001
    client = Client(load_settings(redis_url=url, home=tmp_path, key_prefix="setup-test:"))
    began = time.monotonic()
    with pytest.raises(RedisUnavailable) as info:
        client.ping()
    return info.value, time.monotonic() - began


def test_the_right_url_works_and_warns_of_nothing(redis_set, tmp_path):
    Client(load_settings(redis_url=redis_set.url, home=tmp_path, key_prefix="setup-test:")).ping()
    target = sentinel_url.parse(redis_set.url)
    assert target.notices(FAILOVER_WINDOW_S, client_options()) == []
    # Sentinels slower to call the master down than rig's clients wait for a new one:
    (slow,) = target.notices(5.0, client_options())
    assert "call 'rigmaster' down only after 1 s" in slow and "down-after-milliseconds" in slow


@pytest.mark.parametrize(("change", "said"), [
    (("rigmaster/", "rigmastr/"), "the sentinels monitor no master named 'rigmastr' (they monitor rigmaster)"),
    ((f"sentinel_password={SENTINEL_PASSWORD}", "sentinel_password=nope"), "refused the sentinel password"),
    ((f"?sentinel_password={SENTINEL_PASSWORD}", ""), "require a password and rig sent none"),
])
def test_a_wrong_sentinel_setting_is_one_line_at_once(redis_set, tmp_path, change, said):
    error, seconds = refusal(redis_set.url.replace(*change), tmp_path)
    assert said in str(error) and "\n" not in str(error)
    assert seconds < 5.0  # not FAILOVER_WINDOW_S: nothing will fail over


def test_a_wrong_master_password_says_so(redis_set, tmp_path):
    error, _ = refusal(redis_set.url.replace(MASTER_PASSWORD, "nope"), tmp_path)
    assert isinstance(error, RedisAuthFailed) and "refused the password" in str(error)
    assert "nope" not in str(error)


def test_one_sentinel_listed_is_warned_about(redis_set):
    first = redis_set.sentinel_ports[0]
    url = f"sentinel://127.0.0.1:{first}/rigmaster/0?sentinel_password={SENTINEL_PASSWORD}"
    (line,) = sentinel_url.parse(url).notices(FAILOVER_WINDOW_S, client_options())
    assert line.startswith("redis_url lists one sentinel")


def test_flower_gets_a_live_sentinel_first(redis_set):
    """Finding 9 of issue 15: Flower's Broker page asks only the first sentinel listed."""
    from rig.testing.sentinel_set import free_port

    dead = free_port()
    url = redis_set.url.replace("@127.0.0.1:", f"@127.0.0.1:{dead},127.0.0.1:", 1)
    first_live = redis_set.sentinel_ports[0]
    reordered = sentinel_url.parse(sentinel_url.live_first(url))
    assert reordered.sentinels[0] == ("127.0.0.1", first_live) and ("127.0.0.1", dead) in reordered.sentinels
    assert reordered.password == sentinel_url.parse(url).password and reordered.sentinel_password == SENTINEL_PASSWORD
    assert sentinel_url.live_first(redis_set.url) == redis_set.url  # the first answers: unchanged


def test_a_hung_sentinel_listed_first_costs_one_short_timeout(redis_set, tmp_path):
    """Issue 15: with the first-listed sentinel stopped (SIGSTOP), every command waited rig's
    10 s reply timeout for it. A socket that accepts and never answers stands in for it."""
    import socket

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    try:
        url = redis_set.url.replace("@127.0.0.1:", f"@127.0.0.1:{hung.getsockname()[1]},127.0.0.1:", 1)
        client = Client(load_settings(redis_url=url, home=tmp_path, key_prefix="setup-test:"))
        began = time.monotonic()
        client.ping()
        assert time.monotonic() - began < 2 * sentinel_url.SENTINEL_TIMEOUT_S + 1.0  # it was 10 s
    finally:
        hung.close()
