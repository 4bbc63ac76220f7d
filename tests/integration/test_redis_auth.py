"""`rig up` with no Redis around: the private Redis it starts requires a generated password
(0600 in the rig home, reused across restarts, never in argv); every rig command on this
machine uses it untyped, and a wrong or missing one is a one-line error with exit code 5 from
`rig status`, `rig-submit` and `rig up`. Needs no system Redis: it runs its own on a free port.
(`rig config` masking: tests/unit/test_redis_auth.py.)"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.errors import StackError
from rig.redis_server import redis_binary

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(env: dict[str, str], tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], env=env, capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("rig: error: ")]
    assert result.returncode == code, result.stdout + result.stderr
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def client(port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(port=port, password=password, decode_responses=True, retry=Retry(NoBackoff(), 0))


@pytest.mark.background
def test_private_redis_requires_its_generated_password(tmp_path):
    try:
        redis_binary()
    except StackError as exc:
        pytest.skip(str(exc))
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(RIG_HOME=str(home), RIG_REDIS_URL=url, RIG_NODE_NAME="authtest",
               RIG_KEY_PREFIX=f"rigtest:{uuid.uuid4().hex[:10]}:")
    up = run(env, "rig", "up", "--daemon", "--only", "redis")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        pw_file = home / "redis.password"
        assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        password = pw_file.read_text().strip()
        assert len(password) >= 40
        assert stat.S_IMODE((home / "redis" / "rig-redis.conf").stat().st_mode) == 0o600

        # Nothing on the command line: `ps` shows argv to every user.
        authed = client(port, password)
        pid = authed.info("server")["process_id"]
        assert password not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        up_log = (home / "logs/system/up.log").read_text()
        assert password not in up_log and f"started a private one at {url}" in up_log

        with pytest.raises(redis.AuthenticationError):
            client(port).ping()  # no password: refused
        assert authed.config_get("bind")["bind"] == "127.0.0.1"
        assert authed.config_get("protected-mode")["protected-mode"] == "yes"

        # Every rig command on this machine finds the password without being told.
        status = run(env, "rig", "status")
        assert status.returncode == 0, status.stderr

        wrong = run({**env, "RIG_REDIS_URL": f"redis://:wrong@127.0.0.1:{port}/0"}, "rig", "status")
        one_line_error(wrong, 5, f"Redis at {url} refused the password from the URL",
                       f"RIG_REDIS_URL=redis://:PASSWORD@127.0.0.1:{port}/0")
        elsewhere = {**env, "RIG_HOME": str(tmp_path / "other-home")}  # another user, say
        line = one_line_error(run(elsewhere, "rig", "status"), 5, "requires a password and rig has none",
                              str(tmp_path / "other-home" / "redis.password"))
        assert password not in line
        one_line_error(run(elsewhere, "rig-submit", "--gpu-memory", "1G", "--", "true"), 5,
                       "requires a password and rig has none")
        # `rig up` meets a Redis that refuses its password: it says so, and starts nothing.
        other_node = {**env, "RIG_NODE_NAME": "authtest2", "RIG_REDIS_PASSWORD": "wrong"}
        one_line_error(run(other_node, "rig", "up", "--daemon", "--only", "redis"), 5,
                       "refused the password from redis_password (RIG_REDIS_PASSWORD)")
        authed.set(f"{env['RIG_KEY_PREFIX']}marker", "kept")
    finally:
        down = run(env, "rig", "down")
    assert down.returncode == 0, down.stderr

    # The next bring-up reuses the password, so the AOF's data is still reachable. This time the
    # URL with the password comes as a flag: the daemon must not keep it in its argv.
    again = run(env, "rig", "up", "--daemon", "--only", "redis",
                "--redis-url", f"redis://:{password}@127.0.0.1:{port}/0")
    try:
        assert again.returncode == 0, again.stderr
        assert pw_file.read_text().strip() == password
        assert client(port, password).get(f"{env['RIG_KEY_PREFIX']}marker") == "kept"
        daemon = int(re.search(r"\(pid (\d+)\)", again.stdout).group(1))
        assert password not in Path(f"/proc/{daemon}/cmdline").read_bytes().decode(errors="replace")
    finally:
        assert run(env, "rig", "down").returncode == 0
