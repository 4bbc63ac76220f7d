"""Fault scenarios about identity: Redis that comes back empty while jobs run (issue 10.1-2).

A Redis without persistence (as the system one here: ``--save ""``) is SIGKILLed and started
again, empty, on the same port while two jobs run. What must hold:

- the node notices (installation identity), kills and concludes nothing, its jobs run on, and
  it says so in one line (node record -> ``rig status``, alert, log);
- ``rig recover --stop`` stops the old jobs and joins the new Redis;
- the new installation's job ids restart at 1, and each new job really runs its own command
  (never concluded from the old job 1's files on disk): 0 false SUCCEEDED;
- 0 lost, 0 run twice, 0 leaked, 0 orphans among the new jobs.

The second scenario is the same loss with no job running: the node joins the new Redis by
itself and new jobs run.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from rig.installation import SAME, Installation
from rig.models import JobState
from rig.nodes import NodeRegistry
from rig.testing.faults import GATE, Scenario, ScenarioResult, _free_port, _wait


def _volatile_redis(workdir: Path, port: int) -> subprocess.Popen:
    """A redis-server with no persistence at all, on ``port``: restarting it loses everything."""
    from rig.testing.throwaway_redis import start_redis

    return start_redis(port, workdir)


def redis_came_back_empty(workdir: Path, *, jobs_running: bool = True) -> ScenarioResult:
    port = _free_port()
    server = _volatile_redis(workdir / "redis", port)
    url = f"redis://127.0.0.1:{port}/0"
    what = "with 2 jobs running" if jobs_running else "with no job running"
    sc = Scenario(workdir, f"Redis came back empty {what}", "SIGKILL + empty restart of a Redis without persistence",
                  fake_gpus="2x80G", redis_url=url, health={"check_interval": 0.5, "timeout": 3.0})
    old_procs: dict[int, tuple[int, int]] = {}
    try:
        sc.node.up()
        old_ids: list[int] = []
        if jobs_running:
            old_ids = [sc.submit(gpu_memory="20G") for _ in range(2)]
            sc.wait_running(old_ids)
            # RUNNING is recorded at the claim, a moment before the process exists.
            _wait(lambda: len(set(sc.node.job_processes().values())) == len(old_ids), 30, "the jobs' processes")
            old_procs = sc.node.job_processes()
        server.send_signal(signal.SIGKILL)
        server.wait()
        server = _volatile_redis(workdir / "redis", port)
        nodes = NodeRegistry(sc.node.redis, sc.node.keys)
        if jobs_running:
            _wait(lambda: any(n.mismatch for n in nodes.read()), 30, "the node to say its Redis is not its installation")
            said = next(n.mismatch for n in nodes.read() if n.mismatch)
            sc.result.notes.append(f"rig status said: {said}")
            # Two more health passes: still nothing killed.
            time.sleep(1.5)
            alive = set(sc.node.job_processes().values())
            if alive != set(old_procs.values()):
                sc.result.problems.append(f"jobs killed from the mismatch: before {sorted(set(old_procs.values()))}, "
                                          f"after {sorted(alive)}")
            from workers.recovery import stop_and_join

            stop_and_join(sc.node.settings, say=lambda _line: None)
        else:
            inst = Installation(sc.node.redis, sc.node.keys, sc.node.settings.run_dir, sc.node.name)
            _wait(lambda: inst.check().kind == SAME and any(c.eligible for c in sc.node.client.ledger.cards()),
                  30, "the node to join the empty Redis by itself")
            sc.result.notes.append(f"joined a new installation by itself after {sc.elapsed():.1f} s")
        # The new installation: ids restart at 1; each job must run its own command.
        sc.job_ids = []
        sc.trace = workdir / "trace-new.txt"
        sc.go.unlink(missing_ok=True)
        new_ids = [sc.submit(body=f"{GATE}; echo ran-$RIG_JOB_ID > \"$GO.$RIG_JOB_ID\"", gpu_memory="20G")
                   for _ in range(3)]
        if jobs_running and min(new_ids) > max(old_ids):
            sc.result.problems.append(f"ids did not restart: old {old_ids}, new {new_ids}")
        finals = sc.finish(timeout=90)
        false_results = [jid for jid, job in finals.items()
                         if job.state is JobState.SUCCEEDED and not Path(f"{sc.go}.{jid}").exists()]
        if false_results:
            sc.result.problems.append(f"reported SUCCEEDED without running: {false_results}")
        not_ok = [jid for jid, job in finals.items() if job.state is not JobState.SUCCEEDED]
        if not_ok:
            sc.result.problems.append(f"new jobs that did not succeed: {not_ok}")
        if sc.node.job_processes():
            sc.result.orphans = len(sc.node.job_processes())
        return sc.result
    finally:
        sc.close()
        server.send_signal(signal.SIGKILL)
        server.wait()


def redis_rolled_back(workdir: Path) -> ScenarioResult:
    """Redis goes back to an older copy of the same installation (a restored backup, a lagging
    replica promoted) while a job it has no record of runs: the job is not killed; the node says
    so; `rig recover --stop` stops it; a new job that takes its id runs its own command."""
    import redis

    port = _free_port()
    server = _volatile_redis(workdir / "redis", port)
    url = f"redis://127.0.0.1:{port}/0"
    sc = Scenario(workdir, "Redis rolled back to an older copy", "keys restored from a copy taken before a job's submit",
                  fake_gpus="1x80G", redis_url=url, health={"check_interval": 0.5, "timeout": 3.0})
    try:
        sc.node.up()
        raw = redis.Redis.from_url(url)
        snapshot = {key: raw.dump(key) for key in raw.scan_iter(f"{sc.node.prefix}*")}
        jid = sc.submit(gpu_memory="20G")
        sc.wait_running([jid])
        _wait(lambda: bool(sc.node.job_processes()), 30, "the job's process")
        for key in raw.scan_iter(f"{sc.node.prefix}*"):
            raw.delete(key)
        for key, value in snapshot.items():
            if value is not None:
                raw.restore(key, 0, value, replace=True)
        nodes = NodeRegistry(sc.node.redis, sc.node.keys)
        _wait(lambda: any(n.unrecorded for n in nodes.read()), 30, "the node to say it runs a job Redis lost")
        sc.result.notes.append(next(n.unrecorded for n in nodes.read() if n.unrecorded))
        time.sleep(1.5)  # more health passes: still not killed
        if not sc.node.job_processes():
            sc.result.problems.append("the job Redis lost the record of was killed")
        from workers.recovery import stop_and_join

        done = stop_and_join(sc.node.settings, say=lambda _line: None)
        if done.stopped != [jid]:
            sc.result.problems.append(f"rig recover --stop stopped {done.stopped}, not [{jid}]")
        sc.job_ids = []
        sc.trace = workdir / "trace-new.txt"
        sc.go.unlink(missing_ok=True)
        new = sc.submit(body=f"{GATE}; touch \"$GO.$RIG_JOB_ID\"", gpu_memory="20G")
        if new != jid:
            sc.result.notes.append(f"the new job got id {new} (the lost one had {jid})")
        finals = sc.finish(timeout=60)
        if finals.get(new) is None or finals[new].state is not JobState.SUCCEEDED or not Path(f"{sc.go}.{new}").exists():
            sc.result.problems.append(f"the new job {new} did not run its own command to success")
        # The next health pass clears the running line (one in flight during the recover may
        # write it once more). An ending of the stopped attempt that its card worker could not
        # record (its record was lost) is a different, true line, kept until `rig recover`.
        def still_running() -> bool:
            return any(n.unrecorded and "still running" in n.unrecorded for n in nodes.read())

        deadline = time.monotonic() + 10
        while still_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        if still_running():
            sc.result.problems.append("the node still says it runs unrecorded jobs")
        left = [n.unrecorded for n in nodes.read() if n.unrecorded]
        if left:
            sc.result.notes.append(f"the node says: {left[0]}")
        return sc.result
    finally:
        sc.close()
        server.send_signal(signal.SIGKILL)
        server.wait()


def wrong_redis_url(workdir: Path) -> ScenarioResult:
    """rig down, then rig up pointed at another database (a typo in RIG_REDIS_URL) while a job
    runs: refused, nothing changed; rig up with the right URL adopts the job, which ends once."""
    from rig.errors import StackError
    from rig.testing.harness import RigHarness

    sc = Scenario(workdir, "rig up against the wrong Redis database", "rig down; rig up with /1 instead of /0",
                  fake_gpus="1x80G", health={"check_interval": 0.5, "timeout": 3.0})
    try:
        sc.node.up()
        jid = sc.submit(gpu_memory="20G")
        sc.wait_running([jid])
        _wait(lambda: bool(sc.node.job_processes()), 30, "the job's process")
        sc.node.down()
        base = sc.node.settings.redis_url.rsplit("/", 1)[0]
        wrong = RigHarness(sc.node.settings.home, fake_gpus="1x80G", redis_url=f"{base}/1", prefix=sc.node.prefix,
                           node_name=sc.node.name)
        try:
            wrong.up()
            sc.result.problems.append("rig up against the wrong database was accepted")
        except StackError as exc:
            sc.result.notes.append(f"refused: {exc}")
        finally:
            wrong.down()
            from rig.testing.harness import delete_prefix

            delete_prefix(wrong.redis, wrong.prefix)
        if not sc.node.job_processes():
            sc.result.problems.append("the job was killed")
        sc.node.up()  # the right database: adopts the job
        sc.finish(timeout=60)
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("redis-empty-jobs-running", redis_came_back_empty),
    ("redis-empty-idle", lambda w: redis_came_back_empty(w, jobs_running=False)),
    ("redis-rolled-back", redis_rolled_back),
    ("wrong-redis-url", wrong_redis_url),
]
