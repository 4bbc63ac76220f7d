"""A master that hung while the sentinels promoted its replica, then answers again (SIGSTOP and
SIGCONT; a network partition that heals): until the sentinels turn it into a replica (~10 s) it
takes writes as a master and then drops them. rig must not acknowledge a submission there."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from rig.client import Client
from rig.config import load_settings
from rig.errors import RedisUnavailable
from rig.testing.sentinel_set import MASTER_PASSWORD, SentinelSet

pytestmark = pytest.mark.slow


def test_no_submission_is_acknowledged_on_a_deposed_master(tmp_path):
    redis_set = SentinelSet(tmp_path / "redis").start()
    try:
        client = Client(load_settings(redis_url=redis_set.url, home=tmp_path, key_prefix="deposed-test:",
                                      replica_wait_seconds=0.5))
        client.submit("true", gpu_memory="1G")  # the client's connection is to the first master
        master = redis_set.procs["master"]
        master.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            # Back at once when the leading sentinel promoted the replica: redis-py's look-up
            # (SENTINEL MASTERS) still names the old master then (12 of 15 were acknowledged there).
            while not redis_set.promoted_anywhere():
                assert time.monotonic() < deadline, "the sentinels never promoted the replica"
                time.sleep(0.05)
        finally:
            master.send_signal(signal.SIGCONT)  # back, still a master, until the sentinels demote it
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
