"""The node record's pid is its ``rig up``'s, also when the node rejoins by itself after Redis
restarted empty (workers/health.py) or ``rig recover`` registers it (workers/recovery.py): issue
13 saw `rig status` say "its rig up (pid N) no longer runs" with N the control worker that had
rejoined, after the real rig up was killed. fakeredis and real Redis."""

from __future__ import annotations

import os

import pytest

from rig.config import load_settings
from rig.installation import Installation
from rig.keys import Keys
from rig.registration import up_pid
from rig.supervision import SUPERVISOR_PID
from workers.health import HealthChecker

UP = 424242  # the rig up that started this worker (RIG_SUPERVISOR_PID)


@pytest.fixture
def settings(key_prefix, rig_home):
    return load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="1x40G")


def test_a_node_that_rejoins_an_emptied_redis_records_its_rig_up_not_the_worker(settings, redis_client,
                                                                                 monkeypatch):
    keys = Keys(settings.key_prefix)
    Installation(redis_client, keys, settings.run_dir, "n1").join()
    redis_client.delete(keys.installation)  # Redis restarted empty
    monkeypatch.setenv(SUPERVISOR_PID, str(UP))
    assert HealthChecker(settings, redis_client).installation_mismatch() is None  # it rejoined
    assert redis_client.hget(keys.node("n1"), "pid") in (str(UP), str(UP).encode())


def test_up_pid_is_the_supervisor_else_the_pid_files_live_rig_up_never_the_caller(settings, monkeypatch):
    monkeypatch.setenv(SUPERVISOR_PID, str(UP))
    assert up_pid(settings) == UP
    monkeypatch.delenv(SUPERVISOR_PID)
    assert up_pid(settings) is None  # no pid file: unknown, not os.getpid()
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    (settings.run_dir / "up-n1.pid").write_text(f"{os.getpid()}\nredis://x\nnode\n")
    assert up_pid(settings) == os.getpid()  # the pid file's live rig up (here: this test)


@pytest.mark.redis
def test_rig_recover_records_the_running_rig_ups_pid_not_its_own(key_prefix, rig_home, real_redis):
    """`rig recover` registers the node when its rig up runs: the record names that rig up (the
    pid file's), never the short-lived `rig recover` process."""
    import subprocess

    from tests.conftest import REDIS_URL
    from workers.recovery import stop_and_join

    settings = load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="1x40G", redis_url=REDIS_URL)
    keys = Keys(key_prefix)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    Installation(real_redis, keys, settings.run_dir, "n1").join()
    real_redis.delete(keys.installation)  # Redis restarted empty
    up = subprocess.Popen(["sleep", "60"])  # stands for the node's live rig up
    try:
        (settings.run_dir / "up-n1.pid").write_text(f"{up.pid}\n{REDIS_URL}\nnode\n")
        found = stop_and_join(settings, say=lambda _line: None)
        assert found.registered
        assert real_redis.hget(keys.node("n1"), "pid") in (str(up.pid), str(up.pid).encode())
    finally:
        up.kill()
        up.wait()
