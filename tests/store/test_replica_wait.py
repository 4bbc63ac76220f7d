"""Under Sentinel a submission is acknowledged once a replica has it (rig.replication): without
one in time the job stands and the submitter is told, in one line, what a fail-over now would
cost. The shared test Redis has no replica, so no WAIT here is answered."""

from __future__ import annotations

import time

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import RedisUnavailable
from rig.keys import Keys
from rig.models import JobState
from rig.replication import ReplicaWait, replica_wait

SENTINEL_URL = "sentinel://127.0.0.1:1/rigmaster/0"  # never connected: the client is given


@pytest.fixture
def lonely_redis(real_redis):
    if int(real_redis.info("replication").get("connected_slaves", 0)):
        pytest.skip("the test Redis has a replica: WAIT would be answered")
    return real_redis


def test_wait_only_under_sentinel_and_with_a_positive_timeout(real_redis, key_prefix):
    keys = Keys(key_prefix)
    assert replica_wait(real_redis, keys, "redis://127.0.0.1:6379/0", 2.0) is None  # no replica to wait for
    assert replica_wait(real_redis, keys, SENTINEL_URL, 0) is None  # turned off
    assert isinstance(replica_wait(real_redis, keys, SENTINEL_URL, 2.0), ReplicaWait)


def test_no_replica_in_time_is_false_after_the_timeout(lonely_redis, key_prefix, monkeypatch):
    # A replica is connected but does not confirm in time (lagging): WAIT runs out.
    monkeypatch.setattr("rig.replication.connected_replicas", lambda client: 1)
    wait = ReplicaWait(lonely_redis, Keys(key_prefix), timeout_s=0.05)
    began = time.monotonic()
    assert wait.confirm() is False
    assert 0.04 <= time.monotonic() - began < 2.0
    assert lonely_redis.get(Keys(key_prefix).replication_mark) == "1"  # the mark lives under the prefix


def test_no_replica_connected_is_false_at_once(lonely_redis, key_prefix):
    """connected_slaves:0: WAIT could only cost its whole timeout on every write (finding 8)."""
    wait = ReplicaWait(lonely_redis, Keys(key_prefix), timeout_s=3.0)
    began = time.monotonic()
    assert wait.confirm() is False
    assert time.monotonic() - began < 1.0


def test_an_unconfirmed_submission_stands_and_says_so(lonely_redis, key_prefix, tmp_path, monkeypatch):
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, redis_url=SENTINEL_URL,
                             replica_wait_seconds=0.05)
    client = Client(settings, redis_client=lonely_redis)
    handle = client.submit(["true"], gpu_memory="1G")
    assert client.get(handle.id).state is JobState.PENDING
    note = client.last_durability_note
    assert note and note.startswith("warning: job(s) ") and str(handle.id) in note
    assert "no replica is connected to it" in note and "\n" not in note  # none: not waited for
    handles = client.submit_many([{"command": ["true"], "gpu_memory": "1G"}] * 2)
    assert all(str(h.id) in client.last_durability_note for h in handles)


def test_a_plain_redis_url_never_waits(real_redis, key_prefix, tmp_path, monkeypatch):
    client = Client(load_settings(key_prefix=key_prefix, home=tmp_path), redis_client=real_redis)
    client.submit(["true"], gpu_memory="1G")
    assert client.replicas is None and client.last_durability_note is None


def test_a_submission_a_failover_lost_is_refused_not_acknowledged(lonely_redis, key_prefix, tmp_path, monkeypatch):
    settings = load_settings(key_prefix=key_prefix, home=tmp_path, redis_url=SENTINEL_URL,
                             replica_wait_seconds=0.05)
    client = Client(settings, redis_client=lonely_redis)

    class FailoverDuringWait:
        """The master dies during the WAIT; the promoted replica never had the records."""

        def confirm(self) -> bool:
            for key in lonely_redis.scan_iter(match=f"{key_prefix}job:*"):
                lonely_redis.delete(key)
            return False

    client.replicas = FailoverDuringWait()  # type: ignore[assignment]
    with pytest.raises(RedisUnavailable, match=r"job\(s\) \d+ were lost in a Redis fail-over before a replica "
                                               r"had them: nothing of this submission is queued; submit again"):
        client.submit(["true"], gpu_memory="1G")


def test_a_submission_written_to_a_deposed_master_is_refused(lonely_redis, key_prefix, tmp_path):
    """The master the records went to was replaced in a fail-over (MasterDeposed): it still holds
    them, and would answer the read-back, until the sentinels demote it and it drops them."""
    from rig.replication import MasterDeposed

    settings = load_settings(key_prefix=key_prefix, home=tmp_path, redis_url=SENTINEL_URL,
                             replica_wait_seconds=0.05)
    client = Client(settings, redis_client=lonely_redis)

    class Deposed:
        def confirm(self) -> bool:
            raise MasterDeposed("the Redis master 127.0.0.1:1 was replaced in a fail-over")

    client.replicas = Deposed()  # type: ignore[assignment]
    with pytest.raises(RedisUnavailable, match=r"job\(s\) \d+ were lost in a Redis fail-over before a replica "
                                               r"had them: nothing of this submission is queued; submit again"):
        client.submit(["true"], gpu_memory="1G")
