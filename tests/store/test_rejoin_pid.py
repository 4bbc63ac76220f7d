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
def test_rig_recover_leaves_the_cards_to_the_node_s_control_worker(key_prefix, rig_home, real_redis, monkeypatch):
    """`rig recover --stop` while the node's rig up runs: the node's control worker (rig up's
    settings) joins and registers the cards; recover waits for it. It registered them itself,
    with its own settings: 8 fake 80G cards on a node run with --fake-gpus 2x24G (a 60G job
    then ran on a 24G card), and its own pid as the node's rig up before that."""
    import subprocess
    import threading

    from tests.conftest import REDIS_URL
    from workers.recovery import stop_and_join

    quick = {"kill_grace_seconds": 1, "health": {"check_interval": 1, "timeout": 30}}
    # The command's settings: no --fake-gpus (rig up had it on its command line).
    settings = load_settings(key_prefix=key_prefix, node_name="n1", redis_url=REDIS_URL, **quick)
    node = load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="2x24G", redis_url=REDIS_URL, **quick)
    keys = Keys(key_prefix)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    Installation(real_redis, keys, settings.run_dir, "n1").join()
    real_redis.delete(keys.installation)  # Redis restarted empty
    up = subprocess.Popen(["sleep", "60"])  # stands for the node's live rig up
    try:
        (settings.run_dir / "up-n1.pid").write_text(f"{up.pid}\n{REDIS_URL}\nnode\n")
        # No control worker: recover joins, and the cards wait for the next rig up.
        found = stop_and_join(settings, say=lambda _line: None)
        assert found.joined and not found.registered and not real_redis.hexists(keys.node("n1"), "backend")
        real_redis.delete(keys.installation)  # empty again; now the node's control worker acts
        monkeypatch.setenv(SUPERVISOR_PID, str(up.pid))
        worker = threading.Timer(0.5, lambda: HealthChecker(node, real_redis).installation_mismatch())
        worker.start()
        found = stop_and_join(settings, say=lambda _line: None)
        worker.join()
        assert found.registered and found.joined
        assert real_redis.hget(keys.node("n1"), "pid") in (str(up.pid), str(up.pid).encode())
        totals = {int(real_redis.hget(keys.card("n1", i), "total")) for i in (0, 1)}
        assert real_redis.hget(keys.node("n1"), "cards") in ("2", b"2") and totals == {24 * 1024**3}
    finally:
        up.kill()
        up.wait()
