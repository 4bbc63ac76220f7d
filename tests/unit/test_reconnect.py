"""Riding out a Redis blip while watching a job (rig.reconnect): `rig-submit --wait` and
`rig log -f` ended with exit 5 at once when Redis restarted for a second (a tester's finding).
A fake clock and sleep: nothing waits on time."""

from __future__ import annotations

import pytest
import redis

from rig.errors import RedisAuthFailed, RedisUnavailable
from rig.reconnect import RideOut, lost_connection


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _unavailable() -> RedisUnavailable:
    """What rig.client.Client._guard raises for a refused connection (the redis-py error as
    its context)."""
    try:
        try:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        except redis.ConnectionError as exc:
            raise RedisUnavailable("redis://127.0.0.1:6379/0", exc) from None
    except RedisUnavailable as err:
        return err


def _flaky(fails: int, error: Exception | None = None):  # noqa: ANN202
    calls = {"n": 0}

    def read() -> str:
        calls["n"] += 1
        if calls["n"] <= fails:
            raise error or _unavailable()
        return "job"
    return read, calls


def test_a_blip_is_ridden_out_with_one_line_lost_and_one_back() -> None:
    clock, said = Clock(), []
    read, calls = _flaky(5)
    ride = RideOut(said.append, 30.0, clock=clock, sleep=clock.sleep)
    assert ride.call(read) == "job" and calls["n"] == 6
    assert len(said) == 2, said
    assert said[0].startswith("rig: lost the connection to Redis (Error 111 connecting") and "30 s" in said[0]
    assert said[1].startswith("rig: Redis is back (lost for ")
    assert clock.slept == sorted(clock.slept) and max(clock.slept) <= 2.0  # backing off, capped


def test_an_outage_longer_than_the_limit_raises_after_it() -> None:
    clock, said = Clock(), []
    read, _ = _flaky(10**6)
    with pytest.raises(RedisUnavailable):
        RideOut(said.append, 30.0, clock=clock, sleep=clock.sleep).call(read)
    assert 30.0 <= clock.now <= 32.0, clock.now  # gave up at the limit, not before, not much after
    assert len(said) == 1  # lost, never back


@pytest.mark.parametrize("error", [
    RedisAuthFailed("Redis refuses rig's password", "redis://x"),
    redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    ValueError("a bug"),
])
def test_what_is_no_blip_goes_on_at_once(error: Exception) -> None:
    clock, said = Clock(), []
    read, calls = _flaky(1, error)
    with pytest.raises(type(error)):
        RideOut(said.append, 30.0, clock=clock, sleep=clock.sleep).call(read)
    assert calls["n"] == 1 and said == [] and not lost_connection(error)


def test_zero_seconds_is_a_plain_call() -> None:
    said: list[str] = []
    read, calls = _flaky(1)
    with pytest.raises(RedisUnavailable):
        RideOut(said.append, 0.0).call(read)
    assert calls["n"] == 1 and said == []


def test_client_wait_rides_out_a_blip(monkeypatch) -> None:
    """Client.wait (what `rig-submit --wait` calls) goes on through a lost connection."""
    import dataclasses

    import fakeredis

    from rig import reconnect
    from rig.client import Client
    from rig.config import load_settings
    from rig.models import JobState

    monkeypatch.setattr(reconnect, "BACKOFF_BASE_S", 0.001)
    settings = load_settings(key_prefix="rigtest:reconnect:", admins=[])
    client = Client(settings, redis_client=fakeredis.FakeRedis(decode_responses=True))
    job = client.submit(["true"], gpu_memory="1G", workdir="/tmp")
    real_get = client.get_instance
    calls = {"n": 0}

    def get_instance(jid, instance):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] in (2, 3):
            raise _unavailable()
        job = real_get(jid, instance)
        return dataclasses.replace(job, state=JobState.SUCCEEDED) if calls["n"] >= 4 else job

    monkeypatch.setattr(client, "get_instance", get_instance)
    said: list[str] = []
    final = client.wait(job.id, say=said.append, timeout=60)
    assert final.state is JobState.SUCCEEDED
    assert [line.split(" (")[0] for line in said] == ["rig: lost the connection to Redis", "rig: Redis is back"]
