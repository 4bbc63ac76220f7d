"""Fault scenario: Redis' password changes under two nodes of one host (issue 11, item 7).

First ``CONFIG SET requirepass`` alone: the nodes' logged-in connections keep working, only new
logins are refused; `rig status` must say so at once ("new connections to Redis are refused").
Then ``CLIENT KILL TYPE normal`` and ``pubsub``: every process of both nodes is cut off and must wait out the
refused password (rig.authgate) instead of logging in again and again; Redis' ACL LOG counts
the refused logins, measured over 10 s. `rig status` names the host's refusals once for both
nodes; control.log grows by a line now and then. The old password back, the nodes come back
and the running jobs end once each.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from rig.nodes import NodeRegistry
from rig.testing.faults import Scenario, ScenarioResult, _free_port, _wait
from rig.testing.faults_nodes import Home, _close, _password_redis
from rig.testing.harness import new_prefix

#: Most refused logins per second both nodes together may cause once cut off (measured: ~45/s
#: from 4 nodes before the gate, ~0.2/s after it).
MAX_REFUSED_PER_S = 1.0
#: Seconds over which the refused logins are counted.
MEASURE_S = 10.0


def _refused(admin) -> int:  # noqa: ANN001 - redis.Redis
    """Refused logins Redis has counted (ACL LOG, reason auth)."""
    return sum(int(e.get("count", 1)) for e in admin.acl_log(1000) if e.get("reason") == "auth")


def _node_heads(status: str) -> list[str]:
    """Each node's heading in `rig status` text, on one line: rich wraps a long heading at its
    table's width (a node whose line named both nodes was seen split before "(nodes a, b)")."""
    flat = re.sub(r"\s*\n\s*", " ", status)
    heads = re.split(r"(?=\bnode \w+: (?:up|silent|down|stopped|frozen)\b)", flat)
    return [head.split("┏")[0].strip() for head in heads if head.startswith("node ")]


def password_change_storm(workdir: Path) -> ScenarioResult:
    import redis

    port = _free_port()
    server = _password_redis(workdir / "redis", port, "pw1")
    prefix = new_prefix()
    url = f"redis://:pw1@127.0.0.1:{port}/0"
    a = Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix, redis_url=url)
    b = Home(workdir, "homeB", node="b", fake_gpus="1x80G", prefix=prefix, redis_url=url)
    sc = Scenario(workdir, "Redis password changed under two nodes of one host",
                  "CONFIG SET requirepass; later CLIENT KILL TYPE normal and pubsub", node=a.harness)
    new_env = {"RIG_REDIS_URL": f"redis://:pw2@127.0.0.1:{port}/0", "COLUMNS": "1000"}
    admin = redis.Redis(port=port, password="pw1", decode_responses=True)
    try:
        for home, beat in ((a, True), (b, False)):
            if home.up(beat=beat).returncode != 0:
                sc.result.problems.append(f"rig up of {home.label} failed")
                return sc.result
        jobs = [sc.submit(gpu_memory="10G"), sc.submit(gpu_memory="10G")]
        sc.wait_running(jobs)

        # 1. The password changes; logged-in connections still work.
        admin.config_set("requirepass", "pw2")
        admin = redis.Redis(port=port, password="pw2", decode_responses=True)
        said: list[str] = []

        def status_says(text: str, nodes: int) -> bool:
            said[:] = [head for head in _node_heads(a.cli("status", env=new_env).stdout) if text in head]
            return len(said) >= nodes

        began = time.monotonic()
        _wait(lambda: status_says("to Redis are refused (password changed?)", 2), 90,
              "rig status to say both nodes' new connections are refused")
        sc.result.notes.append(f"rig status after {time.monotonic() - began:.0f} s: {said[0]}")

        # 2. The old connections are dropped: count the logins Redis refuses.
        admin.client_kill_filter(_type="normal", skipme=True)
        # And the subscribed ones: redis-py hands a PubSub's connection, still logged in with
        # the old password, back to its pool once it unsubscribes, and a node went on writing
        # (heartbeats: "up", truly) on it (1 run in ~5).
        admin.client_kill_filter(_type="pubsub", skipme=True)
        time.sleep(8.0)  # the first back-offs (1+2+4 s) (a measured interval, not a synchronisation)
        logs = [h.settings.rig_log_dir / "control.log" for h in (a, b)]
        size0 = sum(p.stat().st_size for p in logs)
        before = _refused(admin)
        time.sleep(MEASURE_S)  # a measured interval
        rate = (_refused(admin) - before) / MEASURE_S
        growth = (sum(p.stat().st_size for p in logs) - size0) / MEASURE_S
        sc.result.notes.append(f"refused logins, 2 nodes cut off: {rate:.2f}/s; control.log {growth:.0f} B/s")
        if rate > MAX_REFUSED_PER_S:
            sc.result.problems.append(f"{rate:.1f} refused logins/s from 2 nodes (at most {MAX_REFUSED_PER_S}/s)")
        if growth > 200:
            sc.result.problems.append(f"control.log grew {growth:.0f} B/s while Redis refused the nodes")
        tracebacks = sum(p.read_text(errors="replace").count("Traceback") for p in logs)
        if tracebacks:
            sc.result.problems.append(f"{tracebacks} traceback(s) in control.log")
        # Each node counts once it is silent, i.e. its own heartbeat's life after its last beat:
        # the two lives end apart (a loaded host spreads them), so wait for the line naming both.
        try:
            _wait(lambda: status_says("login(s) from", 1) and any("(nodes a, b)" in line for line in said), 60,
                  "rig status to count the host's refused logins for both nodes")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; rig status said: {a.cli('status', env=new_env).stdout}") from None
        if len(said) != 1 or "(nodes a, b)" not in said[0]:
            sc.result.problems.append(f"the host's refused logins are not said once for both nodes: {said}")
        sc.result.notes.append(f"rig status: {said[0]}")

        # 3. The old password back: the nodes return (within the 30 s back-off cap).
        admin.config_set("requirepass", "pw1")
        _wait(lambda: "refused" not in a.cli("status", env={"COLUMNS": "1000"}).stdout
              and sum(n.state == "up" for n in NodeRegistry(a.harness.redis, a.harness.keys).read()) == 2,
              120, "both nodes to come back")
        sc.finish(timeout=120)
        return sc.result
    except (TimeoutError, subprocess.TimeoutExpired) as exc:
        sc.result.problems.append(str(exc))
        return sc.result
    finally:
        try:
            admin.config_set("requirepass", "pw1")
        except redis.RedisError:
            pass
        _close(sc, [a, b])
        server.kill()
        server.wait()


SCENARIOS = [
    ("password-change-storm", password_change_storm),
]
