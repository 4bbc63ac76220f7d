"""Issue 11 (minor): `rig down` of a SIGSTOPped `rig up` says it is stopped and that a plain
kill does nothing to it (kill -CONT), instead of "kill it with kill PID"."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from rig.config import load_settings
from rig.errors import RedisUnavailable
from rig.stack import StackError, pid_file, stop_node
from workers.process_tree import is_stopped


def test_rig_down_of_a_stopped_rig_up_says_kill_cont(tmp_path):
    settings = load_settings(home=tmp_path / "home", node_name="a", redis_url="redis://127.0.0.1:1/0")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc.send_signal(signal.SIGSTOP)
        # The stop takes effect when the child next runs; a SIGTERM that arrived first would
        # be taken first (lower number) and end it (CI, once, under load): wait for state T.
        deadline = time.monotonic() + 30
        while not is_stopped(proc.pid):
            assert time.monotonic() < deadline, "the child never stopped"
            time.sleep(0.01)
        pid_file(settings).write_text(f"{proc.pid}\n")
        with pytest.raises(StackError) as err:
            stop_node(settings, timeout=0.3)
        message = str(err.value)
        assert f"rig up (pid {proc.pid}) is stopped (SIGSTOP)" in message
        assert f"kill -CONT {proc.pid}" in message and "\n" not in message
    finally:
        proc.kill()
        proc.wait(10)


def test_rig_down_while_redis_is_away_says_it_stops_once_redis_is_back(tmp_path):
    """Finding 5 (issue 15): rig up cannot mark the node stopped without Redis and waits for it;
    rig down must say so, and never advise a kill (its jobs would be declared lost)."""
    settings = load_settings(home=tmp_path / "home", node_name="a", redis_url="redis://127.0.0.1:1/0")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    # Stands for a rig up waiting for Redis: it does not stop on SIGTERM yet.
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # its handler is in place
        pid_file(settings).write_text(f"{proc.pid}\n")
        said: list[str] = []
        with pytest.raises(RedisUnavailable) as err:
            stop_node(settings, timeout=0.3, say=said.append)
        assert len(said) == 1 and "rig up stops once it can mark node a stopped there" in said[0]  # at once
        message = str(err.value)
        assert f"rig up (pid {proc.pid}) is still stopping" in message and "once Redis is back" in message
        assert "kill it with" not in message and "do not kill it" in message and "\n" not in message
    finally:
        proc.kill()
        proc.wait(10)


def test_rig_down_with_another_redis_url_does_not_say_rig_up_waits_for_it(tmp_path):
    """A tester ran `rig down` with a wrong RIG_REDIS_URL (nothing listening there): it said
    rig up would stop once it could mark the node stopped *there*, then `rig stopped` at once:
    the node marks itself stopped in its own Redis, which rig up records in its pid file."""
    settings = load_settings(home=tmp_path / "home", node_name="a", redis_url="redis://127.0.0.1:1/0")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stops on SIGTERM
    try:
        pid_file(settings).write_text(f"{proc.pid}\nredis://127.0.0.1:6379/0\n")  # its own Redis
        said: list[str] = []
        report = stop_node(settings, timeout=10, say=said.append)
        assert report.supervisors == [proc.pid]
        assert not any("Redis does not answer" in line or "stopped there" in line for line in said), said
    finally:
        proc.kill()
        proc.wait(10)


def test_rig_up_records_the_redis_it_uses_in_its_pid_file(tmp_path):
    from rig.stack import up_redis_elsewhere, write_pid_file

    up = load_settings(home=tmp_path / "home", node_name="a", redis_url="redis://:pw@127.0.0.1:6380/2")
    up.run_dir.mkdir(parents=True, exist_ok=True)
    write_pid_file(up)
    assert "pw" not in pid_file(up).read_text()
    assert up_redis_elsewhere(up) is None  # the same Redis (its password aside)
    other = load_settings(home=tmp_path / "home", node_name="a", redis_url="redis://127.0.0.1:1/0")
    assert up_redis_elsewhere(other) == "redis://127.0.0.1:6380/2"
