"""Fault scenario: rig's Redis fills up (``maxmemory`` with ``noeviction``) while jobs run.

A private redis-server (never the shared one: this scenario sets its maxmemory) behind two real
nodes (n1, n2: one 80G card each, each with its own home, control worker and beat). A job runs
on each; a third waits for room. Then maxmemory is set below what Redis holds, so every write is
refused ("OOM command not allowed") while reads still work. While it is full:

- ``rig-submit`` says one line (exit 5, "Redis ... is full (used X of maxmemory Y, policy
  noeviction)") and never "submitted"; ``rig kill`` of a running job says the same one line;
- the Python API raises rig.RedisFull (a RedisUnavailable), and a refused ``submit_many`` of 300
  takes no job id;
- ``rig status`` works and says "Redis is full (used ... of maxmemory ..., policy noeviction)";
- the running jobs end by themselves: their endings cannot be written yet;
- no rig process dies (control workers, card workers, both beats: none restarted), for longer
  than health.timeout; each `rig up` says once that Redis is full, and once that it takes writes
  again; the leading dispatcher's control worker raises the "redis_full" alert, once for the
  cluster, and resolves it (workers.alert_check, rig.redis_writes.FullWatch).

Then maxmemory is raised: every ending is recorded with its true result (SUCCEEDED, attempt 1),
the waiting job runs once, nothing stays reserved, no node was declared down for its refused
heartbeats, new submissions get the next ids (none burnt), and `rig status` no longer says Redis
is full. The same for a read-only replica is covered by the unit tests of
rig.redis_writes (one refusal path).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from rig.errors import RedisFull
from rig.models import JobState
from rig.nodes import NodeRegistry
from rig.stack import settings_env
from rig.testing.faults import GATE, Scenario, ScenarioResult, _private_redis, _wait
from rig.testing.harness import RigCluster, RigHarness
from workers.health import HealthChecker

#: How long Redis stays full (s): longer than the scenario's health.timeout, so heartbeats
#: refused for that long must not make any check kill or conclude anything.
FULL_FOR_S = 8.0
HEALTH = {"check_interval": 1.0, "timeout": 4.0, "assigned_timeout": 10.0}
#: The alert check's period (s; its floor): the Redis-full alert is checked with the others
#: (workers.alert_check), and Redis stays full for FULL_FOR_S only.
ALERT_INTERVAL_S = 1.0


def _cli_env(sc: Scenario) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(sc.node.settings)}


def _cli(sc: Scenario, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a rig command (``rig-submit`` when args[0] is "submit") as a person would."""
    if args[0] == "submit":
        argv = [str(Path(sys.executable).parent / "rig-submit"), *args[1:]]
    else:
        argv = [sys.executable, "-m", "rig.cli.main", *args]
    return subprocess.run(argv, env={**_cli_env(sc), "COLUMNS": "400"}, cwd=sc.workdir, capture_output=True,
                          text=True, timeout=timeout)


def _one_clear_line(sc: Scenario, what: str, done: subprocess.CompletedProcess) -> None:
    """A refused action: exit 5, nothing on stdout, exactly one line on stderr saying Redis is
    full with its figures, no traceback."""
    lines = done.stderr.strip().splitlines()
    ok = (done.returncode == 5 and not done.stdout.strip() and len(lines) == 1
          and "is full (used" in lines[0] and "policy noeviction" in lines[0])
    if ok:
        sc.result.notes.append(f"{what}: {lines[0][:160]}")
    else:
        sc.result.problems.append(f"{what} while Redis is full: exit {done.returncode}, stdout "
                                  f"{done.stdout.strip()[:100]!r}, stderr {done.stderr.strip()[-400:]!r}")


def redis_full(workdir: Path) -> ScenarioResult:
    """See the module docstring."""
    workdir.mkdir(parents=True, exist_ok=True)
    url, server = _private_redis(workdir)
    cluster = RigCluster(workdir / "nodes", {"n1": "1x80G", "n2": "1x80G"}, redis_url=url, health=HEALTH,
                         alert_interval=ALERT_INTERVAL_S)
    nodes = list(cluster.nodes.values())
    sc = Scenario(workdir, "Redis full (maxmemory, noeviction), two nodes", "maxmemory below used memory "
                  f"for {FULL_FOR_S:.0f} s while jobs run, end and are submitted; then raised", node=nodes[0])
    admin = redis.Redis.from_url(sc.node.settings.redis_url, decode_responses=True)
    told: dict[str, list[str]] = {node.name: [] for node in nodes}  # what each `rig up` prints
    try:
        for node in nodes:
            node.up(beat=True)
            node.stack.say = told[node.name].append  # type: ignore[union-attr]
        ids = [sc.submit(body=f"{GATE}; sleep 0.2", gpu_memory="70G") for _ in range(2)]  # one per node
        sc.wait_running(ids)
        if sorted(j.node for j in sc.node.client.store.get_many(ids)) != ["n1", "n2"]:
            sc.result.problems.append("the first two jobs did not run one on each node")
        # No room for it until the others end, which they do while Redis is full: it is placed
        # around the outage (its start message may be refused after its reservation was taken).
        ids.append(sc.submit(body=f"{GATE}; sleep 0.2", gpu_memory="70G"))
        last_id = int(admin.get(sc.node.keys.next_job_id) or 0)

        admin.config_set("maxmemory", 1)  # every write refused from now on; reads still answer
        full_at = time.monotonic()
        try:
            admin.set(f"{sc.node.prefix}probe", "x")
            sc.result.problems.append("Redis took a write after maxmemory 1: the fault did not happen")
        except redis.exceptions.OutOfMemoryError:
            pass

        _one_clear_line(sc, "rig-submit", _cli(sc, "submit", "--gpu-memory", "1G", "--", "true"))
        _one_clear_line(sc, "rig kill", _cli(sc, "kill", str(ids[0])))
        try:
            sc.node.client.submit_many([{"command": ["true"], "gpu_memory": "1G"}] * 300)
            sc.result.problems.append("submit_many while Redis is full returned")
        except RedisFull as exc:
            sc.result.notes.append(f"submit_many: RedisFull: {str(exc)[:80]}")
        except Exception as exc:  # noqa: BLE001 - judged here
            sc.result.problems.append(f"submit_many while Redis is full raised {type(exc).__name__}: {exc}")
        status = _cli(sc, "status")
        said = [line for line in status.stdout.splitlines() if "Redis is full (used" in line]
        if status.returncode != 0 or not said:
            sc.result.problems.append(f"rig status while full: exit {status.returncode}, no 'Redis is full' "
                                      f"line: {status.stdout[-300:]!r} {status.stderr[-300:]!r}")
        else:
            sc.result.notes.append(f"rig status: {said[0].strip()[:120]}")

        sc.go.touch()  # the running jobs end while their endings cannot be written
        time.sleep(max(0.0, full_at + FULL_FOR_S - time.monotonic()))
        # A ledger script that has begun writing runs to its end even on a full Redis (it is
        # atomic), so an ending may land now; any other state would be false.
        wrong = {j.id: j.state.value for j in sc.node.client.store.get_many(ids)
                 if j.state not in (JobState.PENDING, JobState.ASSIGNED, JobState.RUNNING, JobState.SUCCEEDED)}
        if wrong:
            sc.result.problems.append(f"jobs in a false state while Redis was full: {wrong}")
        restarted = _restarted(nodes)
        if restarted:
            sc.result.problems.append(f"processes died while Redis was full (restarted): {restarted}")

        admin.config_set("maxmemory", 0)  # memory is back
        _wait(lambda: all(sc.node.client.get(j).state.terminal for j in ids), 90,
              "the endings to be recorded once Redis took writes again")
        after = sc.submit(body="true", gpu_memory="1G")
        if after != last_id + 1:
            sc.result.problems.append(f"the first job after the outage got id {after}, not {last_id + 1}: "
                                      f"{after - last_id - 1} id(s) burnt by refused submissions")
        finals = sc.finish()
        wrong = {j: f.state.value for j, f in finals.items() if f.state is not JobState.SUCCEEDED}
        if wrong:
            sc.result.problems.append(f"jobs not SUCCEEDED (their true result): {wrong}")
        again = {j: f.attempt for j, f in finals.items() if f.attempt != 1}
        if again:
            sc.result.problems.append(f"jobs run again (attempts) after the outage: {again}")
        restarted = _restarted(nodes)
        if restarted:
            sc.result.problems.append(f"processes died around the outage (restarted): {restarted}")
        gone = [n.name for n in NodeRegistry(admin, sc.node.keys).read() if n.down_since is not None]
        if gone:
            sc.result.problems.append(f"nodes declared down because Redis refused their heartbeats: {gone}")
        # Both are said by a loop of their own (rig up's supervision, the control worker's
        # checks), a pass after Redis takes writes again: under load, seconds after the endings
        # are recorded (CI read the log 4 s before the alert was resolved in it).
        try:
            _wait(lambda: _alerts(nodes)[2] and all(_back_lines(lines) for lines in told.values()), 60,
                  "each rig up and the alert to say Redis takes writes again")
        except TimeoutError:
            pass  # judged below
        for name, lines in told.items():
            full_lines = [line for line in lines if "Redis is full (used" in line]
            back_lines = _back_lines(lines)
            if len(full_lines) != 1 or len(back_lines) != 1:
                sc.result.problems.append(f"rig up of {name} during the outage said: {lines}")
            else:
                sc.result.notes.append(f"rig up ({name}): {full_lines[0][:90]} ... {back_lines[0]}")
        alerts, fired, resolved = _alerts(nodes)
        if len(fired) != 1 or len(resolved) != 1:
            sc.result.problems.append(f"Redis-full alerts of the cluster: {len(fired)} fired, {len(resolved)} "
                                      f"resolved (one each expected): {alerts}")
        else:
            sc.result.notes.append(f"alert: {fired[0].split('] ', 1)[-1][:110]}")
        status = _cli(sc, "status")
        if "Redis is full" in status.stdout:
            sc.result.problems.append("rig status still says Redis is full after maxmemory was raised")
        return sc.result
    finally:
        try:
            admin.config_set("maxmemory", 0)
        except redis.RedisError:
            pass
        sc.close()
        cluster.cleanup()
        server.terminate()
        server.wait(10)


def _back_lines(told: list[str]) -> list[str]:
    """What a rig up said when Redis took its writes again."""
    return [line for line in told if "Redis takes writes again" in line]


def _alerts(nodes: list[RigHarness]) -> tuple[list[str], list[str], list[str]]:
    """The cluster's Redis-full alert lines in its control workers' logs: (all, fired, resolved)."""
    alerts = [line for node in nodes for line in _log_lines(node, "control.log")
              if "rig alert" in line and "[redis_refuses_writes]" in line]
    fired = [line for line in alerts if "Redis is full (used" in line and "resolved" not in line]
    return alerts, fired, [line for line in alerts if "alert resolved" in line]


def _log_lines(node: RigHarness, name: str) -> list[str]:
    path = node.settings.rig_log_dir / name
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def _restarted(nodes: list[RigHarness]) -> list[str]:
    """The rig processes that died and were started again, as node/child."""
    return [f"{node.name}/{child.name}" for node in nodes if node.stack is not None
            for child in node.stack.children if child.restarts]


def redis_full_down(workdir: Path) -> ScenarioResult:
    """`rig down` while Redis is full: the stop mark cannot be written, and a node stopped
    unmarked would go silent, be declared DOWN and have its running job declared lost and run
    again on the other node while attempt 1 still runs (rig.stop_mark). Two real `rig up
    --daemon` nodes (lonely runs the job; watcher, with a card the job fits too, runs the health
    check). While full: `rig down --node lonely` says in one line (exit 5) that the node cannot be
    marked stopped and stays up; for longer than health.timeout nothing is declared down or lost.
    Once memory is freed, `rig down` stops it (marked stopped, exit 0); the job is not retried
    while the node is away, and when lonely comes back it ends SUCCEEDED, attempt 1, its marker
    written once."""
    from rig.testing.faults_nodes import Home, _close, _one_line
    from rig.testing.harness import new_prefix

    workdir.mkdir(parents=True, exist_ok=True)
    url, server = _private_redis(workdir)
    prefix = new_prefix()
    lonely = Home(workdir, "lonely", node="lonely", fake_gpus="1x80G", prefix=prefix, redis_url=url, health=HEALTH)
    watcher = Home(workdir, "watcher", node="watcher", fake_gpus="1x80G", prefix=prefix, redis_url=url,
                   health=HEALTH)
    sc = Scenario(workdir, "rig down while Redis is full", "maxmemory below used memory, then `rig down` of "
                  "the node running a job; a second node runs the health check", node=lonely.harness)
    admin = redis.Redis.from_url(url, decode_responses=True)
    marker = workdir / "marker"
    try:
        if lonely.up().returncode != 0:
            sc.result.problems.append("rig up of lonely failed")
            return sc.result
        jid = sc.submit(body=f'echo ran >> "{marker}"; {GATE}', gpu_memory="70G")
        sc.wait_running([jid])
        # Redis fills while watcher starts: once its node is registered, before its workers
        # consume (workers.consumer_backoff); `rig up --daemon` must say Redis is full.
        started: list[subprocess.CompletedProcess] = []
        starter = threading.Thread(target=lambda: started.append(watcher.up(beat=True)))
        starter.start()
        _wait(lambda: bool(admin.hget(sc.node.keys.node("watcher"), "started_at")), 60, "watcher to register")
        admin.config_set("maxmemory", 1)  # every write refused from now on
        full_at = time.monotonic()
        starter.join(150)
        if not started or started[0].returncode != 0:
            sc.result.problems.append(f"rig up of watcher while Redis filled: {started and _one_line(started[0])}")
            return sc.result
        said = [line for line in started[0].stderr.splitlines() if "Redis is full" in line]
        if not said:
            sc.result.problems.append(f"rig up --daemon did not say Redis is full: {started[0].stdout!r} "
                                      f"{started[0].stderr!r}")
        else:
            sc.result.notes.append(f"rig up while full: {said[0][:120]}")
        refused = lonely.cli("down", "--node", "lonely", timeout=120)
        line = _one_line(refused)
        if (refused.returncode != 5 or len(line.splitlines()) != 1 or "cannot be marked stopped" not in line
                or "is full" not in line or "rig stopped" in refused.stdout):
            sc.result.problems.append(f"rig down while Redis is full: exit {refused.returncode}, "
                                      f"stdout {refused.stdout.strip()!r}, stderr {refused.stderr.strip()[-300:]!r}")
        else:
            sc.result.notes.append(f"rig down while full: {line[:140]}")
        if lonely.supervisor() is None:
            sc.result.problems.append("lonely's rig up stopped although its stop mark was refused")
        time.sleep(max(0.0, full_at + 10.0 - time.monotonic()))  # outlasts health.timeout
        for path in sorted(watcher.settings.rig_log_dir.glob("*.log")):
            text = path.read_text(errors="replace")
            spin = text.count("Frequent restarts") + text.count("Traceback") + text.count("Cannot connect")
            if spin:
                sc.result.problems.append(f"watcher's {path.name} spun while Redis was full: {spin} "
                                          "restart/traceback/'Cannot connect' lines")
        admin.config_set("maxmemory", 0)
        HealthChecker(watcher.settings, watcher.harness.redis).run_once()
        job = sc.node.client.get(jid)
        if job.state is not JobState.RUNNING or job.attempt != 1:
            sc.result.problems.append(f"after the refused rig down the job is {job.state.value}, attempt {job.attempt}")
        gone = [n.name for n in NodeRegistry(admin, sc.node.keys).read() if n.down_since is not None]
        if gone:
            sc.result.problems.append(f"nodes declared down around the refused rig down: {gone}")
        stopped = lonely.cli("down", "--node", "lonely", timeout=120)
        if stopped.returncode != 0:
            sc.result.problems.append(f"rig down once Redis took writes: {_one_line(stopped)}")
        states = {n.name: n.state for n in NodeRegistry(admin, sc.node.keys).read()}
        if states.get("lonely") != "stopped":
            sc.result.problems.append(f"after rig down lonely is {states.get('lonely')}, not stopped")
        time.sleep(HEALTH["timeout"] * 2)  # the watcher's health check must leave its job alone
        job = sc.node.client.get(jid)
        if job.state is not JobState.RUNNING or job.attempt != 1:
            sc.result.problems.append(f"while lonely was stopped its job became {job.state.value}, "
                                      f"attempt {job.attempt}")
        if lonely.up().returncode != 0:
            sc.result.problems.append("rig up of lonely again failed")
        finals = sc.finish(timeout=90)
        runs = marker.read_text().count("ran") if marker.exists() else 0
        if runs != 1:
            sc.result.problems.append(f"the job's marker was written {runs} times (1 expected)")
        final = finals.get(jid)
        if final is None or final.state is not JobState.SUCCEEDED or final.attempt != 1:
            sc.result.problems.append(f"the job ended {final.state.value if final else 'never'}, "
                                      f"attempt {final.attempt if final else '-'}")
        return sc.result
    finally:
        try:
            admin.config_set("maxmemory", 0)
        except redis.RedisError:
            pass
        _close(sc, [lonely, watcher])
        server.terminate()
        server.wait(10)


SCENARIOS = [("redis-full", redis_full), ("redis-full-down", redis_full_down)]
