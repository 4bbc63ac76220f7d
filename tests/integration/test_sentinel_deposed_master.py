"""A master that hung while the sentinels promoted its replica, then answers again (SIGSTOP and
SIGCONT; a network partition that heals): until the sentinels turn it into a replica (~10 s) it
takes writes as a master and then drops them. rig must not acknowledge a submission there."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from rig.call import store_result
from rig.client import Client
from rig.config import load_settings
from rig.errors import RedisUnavailable
from rig.keys import Keys
from rig.redis_conn import connect
from rig.replication import replica_wait
from rig.testing.sentinel_set import MASTER_PASSWORD, SentinelSet

pytestmark = pytest.mark.slow


def _hang_master_until_promoted(redis_set: SentinelSet) -> None:
    """SIGSTOP the master until a sentinel promoted its replica, then SIGCONT it: back at once
    when the leading sentinel promoted the replica, still a master until the sentinels demote
    it; redis-py's look-up (SENTINEL MASTERS) still names it then (12 of 15 submissions were
    acknowledged there)."""
    master = redis_set.procs["master"]
    master.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while not redis_set.promoted_anywhere():
            assert time.monotonic() < deadline, "the sentinels never promoted the replica"
            time.sleep(0.05)  # polling the sentinels: no event says when they promote
    finally:
        master.send_signal(signal.SIGCONT)


def test_no_submission_is_acknowledged_on_a_deposed_master(tmp_path):
    redis_set = SentinelSet(tmp_path / "redis").start()
    try:
        client = Client(load_settings(redis_url=redis_set.url, home=tmp_path, key_prefix="deposed-test:",
                                      replica_wait_seconds=0.5))
        client.submit("true", gpu_memory="1G")  # the client's connection is to the first master
        _hang_master_until_promoted(redis_set)
        try:
            handle = client.submit("true", gpu_memory="1G")
        except RedisUnavailable as exc:  # refused: nothing promised
            assert "lost in a Redis fail-over" in str(exc)
            return
        # Acknowledged: then the master the sentinels name holds it.
        with redis.Redis(port=redis_set.replica_port, password=MASTER_PASSWORD, decode_responses=True) as new:
            assert new.hget(f"deposed-test:job:{handle.id}", "instance") == handle.instance
    finally:
        redis_set.stop()


def test_a_task_result_stored_on_a_deposed_master_is_written_again_on_the_new_one(tmp_path):
    """A @rig.task call that returns while its master hangs through a fail-over: its result
    (rig.call.store_result) went to the old master once it answered again, and was dropped when
    it was demoted: the job ended SUCCEEDED and its submitter heard the function never returned."""
    redis_set = SentinelSet(tmp_path / "redis").start()
    try:
        url = redis_set.url
        keys = Keys("deposed-result:")
        client = connect(url)
        replicas = replica_wait(client, keys, url, 0.5)
        client.hset(keys.job(7), "instance", "i7")
        assert replicas is not None and replicas.confirm()  # the record is on the replica: it survives
        _hang_master_until_promoted(redis_set)
        note = store_result(client, keys, replicas, 7, "cmVzdWx0")
        with redis.Redis(port=redis_set.replica_port, password=MASTER_PASSWORD, decode_responses=True) as new:
            assert new.hget(keys.job(7), "result") == "cmVzdWx0"
        assert note is None or "no replica" in note  # the new master has none until the old one is demoted
    finally:
        redis_set.stop()
