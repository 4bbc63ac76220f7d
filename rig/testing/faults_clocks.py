"""Fault scenarios about clocks (issue 11.4): stepped and skewed node clocks, and an end that
Redis hears of late.

The machine's own clock is never touched: each faked node is a real ``rig up --daemon`` run
under libfaketime (LD_PRELOAD, the ``libfaketime`` Python package's library, which handles
``clock_nanosleep``; the monotonic clock is left real), so its workers, dispatcher and health
checks see a wall clock that is off or that steps, while Redis, the jobs and this scenario keep
the true time.

- ``clock-step-time-limit``: the node's wall clock steps 30 s forward, then 60 s back, while
  two jobs with time limits run. The one that ends by itself within its limit SUCCEEDS (not
  TIMEOUT after the forward step) and its runtime and duration history are the real ones; the
  one past its limit is stopped on time (not a minute late after the backward step); the node
  is named in ``rig status`` as off Redis' clock.
- ``clock-skewed-nodes``: three nodes on one Redis, one 2 minutes ahead, one 2 minutes behind,
  one right; a job submitted from a host 2 minutes behind. Every job's submitted <= placed <=
  started <= ended on Redis' clock, runtimes are the real ones, nobody's "up since" is in the
  future, the waiting job is not held at once and its wait is seconds, not minutes; ``rig
  status`` and the alerts name exactly the two skewed nodes.
- ``clock-end-after-outage``: Redis is stopped while a job runs, the job ends, Redis comes back
  15 s later: the job's end time, runtime and duration history are when it ended, not when
  Redis took the write.

Each also counts the usual: 0 lost, 0 run twice, 0 stranded reservations, 0 orphans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from rig import estimates
from rig.alerts import evaluate
from rig.client import current_identity
from rig.clock import redis_time
from rig.models import Job, JobState
from rig.nodes import NodeRegistry
from rig.stack import settings_env
from rig.testing.faults import GATE, Scenario, ScenarioResult, _free_port, _private_redis, _wait
from rig.testing.harness import DEFAULT_REDIS_URL, RigHarness, delete_prefix, new_prefix

#: Slack on comparisons of times measured on different machines' views of one clock (s).
SLACK_S = 1.0


def faketime_library() -> str:
    """The libfaketime library to preload. The Python package ``libfaketime`` ships one that
    handles Python's clock_nanosleep (the Debian 0.9.10 one fails time.sleep with EINVAL when
    the monotonic clock is not faked)."""
    try:
        import libfaketime  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError("the clock scenarios need libfaketime: pip install libfaketime "
                           "(a test dependency: pip install -e '.[test]')") from exc
    lib = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    if not lib.exists():
        raise RuntimeError(f"libfaketime's library is not at {lib}")
    return str(lib)


def faketime_env(*, offset_s: float | None = None, stamp_file: Path | None = None) -> dict[str, str]:
    """Environment that runs a process on a faked wall clock: off by ``offset_s``, or as the
    ``stamp_file`` says (``+30``; re-read every second, so writing it steps the clock). The
    monotonic clock stays real (a step of the wall clock never moves it)."""
    env = {"LD_PRELOAD": faketime_library(), "FAKETIME_DONT_FAKE_MONOTONIC": "1", "DONT_FAKE_MONOTONIC": "1"}
    if stamp_file is not None:
        env["FAKETIME_TIMESTAMP_FILE"] = str(stamp_file)
        env["FAKETIME_CACHE_DURATION"] = "1"
    elif offset_s is not None:
        env["FAKETIME"] = f"{offset_s:+.0f}s"
    return env


class ClockNode:
    """One node run by the real ``rig up --daemon`` with a faked wall clock (its RigHarness is
    used for settings and counts only, never its in-process Stack)."""

    def __init__(self, root: Path, name: str, *, redis_url: str, prefix: str, fake_gpus: str,
                 faked: dict[str, str], **overrides) -> None:
        home = root / name
        home.mkdir(parents=True, exist_ok=True)
        self.harness = RigHarness(home, fake_gpus=fake_gpus, redis_url=redis_url, prefix=prefix,
                                  node_name=name, flower_port=_free_port(), **overrides)
        self.name = name
        self.settings = self.harness.settings
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RIG_", "FAKETIME", "LD_PRELOAD"))}
        self.env = {**base, **settings_env(self.settings), **faked}
        self.rig_bin = Path(sys.executable).parent
        self.cwd = root

    def cli(self, *args: str, program: str = "rig", timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.rig_bin / program), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=self.cwd, stdin=subprocess.DEVNULL)

    def up(self, *, beat: bool) -> None:
        result = self.cli("up", "--daemon", "--no-metrics", "--no-flower", *(() if beat else ("--no-beat",)))
        if result.returncode != 0:
            raise RuntimeError(f"rig up of {self.name} failed: {result.stdout}{result.stderr}")

    def down(self) -> None:
        try:
            self.cli("down", timeout=90)
        except subprocess.TimeoutExpired:
            pass


def _times(job: Job) -> str:
    return (f"created {job.created_at:.1f}, placed {job.assigned_at or 0:.1f}, started {job.started_at or 0:.1f}, "
            f"ended {job.ended_at or 0:.1f}")


def _check_order(sc: Scenario, job: Job, now: float, runtime: tuple[float, float]) -> None:
    """submitted <= placed <= started <= ended <= now on Redis' clock; runtime within bounds."""
    r = sc.result
    stamps = [job.created_at, job.assigned_at, job.started_at, job.ended_at]
    if any(t is None for t in stamps):
        r.problems.append(f"job {job.id}: a time is missing: {_times(job)}")
        return
    if any(b < a - SLACK_S for a, b in zip(stamps, stamps[1:], strict=False)) or stamps[-1] > now + SLACK_S:
        r.problems.append(f"job {job.id}: times out of order on Redis' clock (now {now:.1f}): {_times(job)}")
    took = job.ended_at - job.started_at  # type: ignore[operator]
    low, high = runtime
    if not low <= took <= high:
        r.problems.append(f"job {job.id}: runtime {took:.1f} s, it ran {low:.0f}-{high:.0f} s")


def _history(sc: Scenario, name: str) -> list[float]:
    return estimates.read_own(sc.node.redis, sc.node.keys, user=current_identity().name, name=name, template=None,
                              command=[])["name"]


def _cleanup(sc: Scenario, nodes: list[ClockNode], prefix: str) -> None:
    for node in nodes:
        node.down()
    sc.close()
    try:
        delete_prefix(sc.node.redis, prefix)
    except redis.RedisError:
        pass


# -- scenarios ---------------------------------------------------------------------------------
def clock_step_time_limit(workdir: Path) -> ScenarioResult:
    """The node's clock steps +30 s then -60 s while two jobs with time limits run."""
    workdir.mkdir(parents=True, exist_ok=True)
    stamp = workdir / "faketime"
    stamp.write_text("+0\n")
    prefix = new_prefix()
    node = ClockNode(workdir, "stepper", redis_url=DEFAULT_REDIS_URL, prefix=prefix, fake_gpus="2x80G",
                     faked=faketime_env(stamp_file=stamp), telemetry_interval=0.5,
                     health={"check_interval": 0.5, "timeout": 5.0})
    sc = Scenario(workdir, "node clock stepped +30 s, then -60 s, during jobs with time limits",
                  "libfaketime step of the node's wall clock", node=node.harness)
    try:
        node.up(beat=True)
        ends = sc.submit(body="sleep 6", gpu_memory="20G", time_limit="12s", name="ends-in-6s")
        overruns = sc.submit(body="sleep 60", gpu_memory="20G", time_limit="4s", name="limit-4s")
        sc.wait_running([ends, overruns])
        _wait(lambda: len(set(sc.node.job_processes().values())) == 2, 30, "the jobs' processes")
        began = time.monotonic()
        stamp.write_text("+30\n")  # a wall clock measure would TIMEOUT both now
        time.sleep(2.5)  # libfaketime re-reads the file every second
        stamp.write_text("-60\n")  # ... and would then stop the 4 s one only a minute late
        sc.node.wait_for_state(overruns, {JobState.TIMEOUT, JobState.FAILED, JobState.SUCCEEDED}, timeout=60)
        stopped_after = time.monotonic() - began
        grace = sc.node.settings.kill_grace_seconds
        if stopped_after > 4 + grace + 4:
            sc.result.problems.append(f"the 4 s time limit stopped its job {stopped_after:.0f} s after the step")
        sc.result.notes.append(f"the 4 s job ended {stopped_after:.1f} s after the clock step")
        nodes = NodeRegistry(sc.node.redis, sc.node.keys)
        _wait(lambda: bool(nodes.read()[0].clock_skew), 15, "the node to say its clock is off")
        # The line may wrap at the terminal's width, and a loaded machine may read the status
        # between two heartbeats: look at the words, a few times.
        status, said = "", False
        for _ in range(10):
            status = node.cli("status").stdout
            said = "behind Redis'" in " ".join(status.split())
            if said:
                break
            time.sleep(1.0)
        if not said:
            sc.result.problems.append(f"rig status does not say the node's clock is behind: {status[-600:]}")
        else:
            sc.result.notes.append("rig status: " + next((x.strip() for x in status.splitlines() if "Redis'" in x), "(wrapped)"))
        stamp.write_text("+0\n")
        finals = sc.finish(timeout=90)
        now = redis_time(sc.node.redis)
        if finals.get(ends) is None or finals[ends].state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"the 6 s job with a 12 s limit ended {finals[ends].state.value if ends in finals else 'never'}, "
                                      "not SUCCEEDED")
        else:
            _check_order(sc, finals[ends], now, (5.0, 9.0))
            hist = _history(sc, "ends-in-6s")
            if not hist or not 5.0 <= hist[0] <= 9.0:
                sc.result.problems.append(f"duration history of the 6 s job: {hist}")
        if finals.get(overruns) is None or finals[overruns].state is not JobState.TIMEOUT:
            sc.result.problems.append(f"the 4 s-limit job ended {finals[overruns].state.value if overruns in finals else 'never'}, "
                                      "not TIMEOUT")
        else:
            _check_order(sc, finals[overruns], now, (3.5, 4 + grace + 3))
        _wait(lambda: not nodes.read()[0].clock_skew, 15, "the node's clock line to go once its clock is right")
        return sc.result
    finally:
        _cleanup(sc, [node], prefix)


def clock_skewed_nodes(workdir: Path) -> ScenarioResult:
    """Three nodes on one Redis: 2 min ahead, 2 min behind, right; a submitter 2 min behind."""
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = new_prefix()
    common = dict(redis_url=DEFAULT_REDIS_URL, prefix=prefix, fake_gpus="1x40G", telemetry_interval=0.5,
                  health={"check_interval": 0.5, "timeout": 5.0}, hold_after_seconds=20.0)
    skews = {"ahead": 120.0, "behind": -120.0, "right": None}
    nodes = [ClockNode(workdir, name, faked=faketime_env(offset_s=skew) if skew else {}, **common)
             for name, skew in skews.items()]
    sc = Scenario(workdir, "3 nodes on one Redis: clocks 2 min ahead, 2 min behind, right",
                  "libfaketime +120 s / -120 s per node and for one submitter", node=nodes[2].harness)
    try:
        for i, node in enumerate(nodes):
            node.up(beat=i < 2)  # beats on the skewed nodes: the one ahead holds the lock first
        ids = [sc.submit(body="sleep 8", gpu_memory="30G", name="eight-seconds") for _ in range(3)]
        sc.wait_running(ids)
        # A fourth job, from a host 2 minutes behind (the CLI under libfaketime): it waits.
        submitted = nodes[1].cli("-c", "echo \"$RIG_JOB_ID 1 start\" >> \"$TRACE\"; sleep 1; "
                                 "echo \"$RIG_JOB_ID 1 end\" >> \"$TRACE\"",
                                 "-m", "30G", "-n", "late", "-e", f"TRACE={sc.trace}", "-w", str(workdir),
                                 program="rig-submit")
        late = next((int(w) for w in submitted.stdout.replace(":", " ").split() if w.isdigit()), None)
        if submitted.returncode != 0 or late is None:
            sc.result.problems.append(f"rig-submit from the skewed host failed: {submitted.stdout}{submitted.stderr}")
        else:
            sc.job_ids.append(late)
            time.sleep(1.5)  # several dispatcher passes on all three nodes while it waits
            job = sc.node.client.get(late)
            blockers_ended = [jid for jid in ids if sc.node.client.get(jid).state.terminal]
            if job.state is not JobState.PENDING and blockers_ended:
                # A machine so loaded that the 8 s jobs ended before this look: nothing to judge.
                sc.result.notes.append(f"job {late} not judged: jobs {blockers_ended} had already ended")
            elif job.state is not JobState.PENDING:
                sc.result.problems.append(f"job {late} is {job.state.value}, it should wait for a card")
            else:
                if job.held_at:
                    sc.result.problems.append(f"job {late}, 2 s old, was held at once (held_at {job.held_at:.1f})")
                wait = sc.node.client.status().oldest_wait
                worst = max((w for w in wait.values() if w is not None), default=0.0)
                if worst > 10.0:
                    sc.result.problems.append(f"rig status: oldest wait {worst:.0f} s for a job seconds old")
                else:
                    sc.result.notes.append(f"oldest wait shown: {worst:.1f} s")
        now = redis_time(sc.node.redis)
        registry = NodeRegistry(sc.node.redis, sc.node.keys)
        _wait(lambda: sum(1 for n in registry.read() if n.clock_skew) == 2, 15, "both skewed nodes to be reported")
        for info in registry.read():
            if info.started_at is None or info.started_at > now + SLACK_S:
                sc.result.problems.append(f"node {info.name}: up since {info.started_at}, after now ({now:.1f})")
            if bool(info.clock_skew) != (skews.get(info.name) is not None):
                sc.result.problems.append(f"node {info.name}: clock line {info.clock_skew!r}")
        status = nodes[2].cli("status").stdout
        said = [line.strip() for line in status.splitlines() if "Redis'" in line]
        if len(said) != 2:
            sc.result.problems.append(f"rig status has {len(said)} clock lines, not 2: {status[-800:]}")
        sc.result.notes.extend(said)
        alerts = {a.key for a in evaluate(sc.node.client)}
        if not {"clock_skew:ahead", "clock_skew:behind"} <= alerts or "clock_skew:right" in alerts:
            sc.result.problems.append(f"clock alerts: {sorted(a for a in alerts if a.startswith('clock'))}")
        finals = sc.finish(timeout=120)
        now = redis_time(sc.node.redis)
        for jid in ids:
            if jid in finals:
                _check_order(sc, finals[jid], now, (7.5, 10.5))
        if late in finals:
            _check_order(sc, finals[late], now, (0.5, 3.5))
        hist = _history(sc, "eight-seconds")
        if len(hist) != 3 or not all(7.5 <= h <= 10.5 for h in hist):
            sc.result.problems.append(f"duration history of the 8 s jobs: {hist}")
        bad = [jid for jid, job in finals.items() if job.state is not JobState.SUCCEEDED]
        if bad:
            sc.result.problems.append(f"jobs that did not succeed: {bad}")
        _beat_takeover(sc, nodes[0], nodes[1])
        return sc.result
    finally:
        _cleanup(sc, nodes, prefix)


def _health_runs(sc: Scenario) -> int:
    """How many times beat has sent the cluster health check (RedBeat's own count)."""
    raw = sc.node.redis.hget(f"{sc.node.keys.redbeat_prefix}rig-health", "meta")
    try:
        return int(json.loads(raw or "{}").get("total_run_count") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


def _beat_takeover(sc: Scenario, ahead: ClockNode, behind: ClockNode) -> None:
    """The node 2 minutes ahead (beat's lock holder) stops: the beat of the node 2 minutes
    behind takes over and sends the health check every interval, not after 4 minutes (RedBeat
    compares the last run, stamped by the other beat, with its own now)."""
    ahead.down()
    began = time.monotonic()
    before = _health_runs(sc)
    try:
        _wait(lambda: _health_runs(sc) >= before + 3, 40, "the other beat to send health checks")
        sc.result.notes.append(f"beat moved to the node 2 minutes behind: 3 health checks sent within "
                               f"{time.monotonic() - began:.0f} s")
    except TimeoutError:
        sc.result.problems.append(f"after beat moved to the node 2 minutes behind, {_health_runs(sc) - before} "
                                  "health checks in 40 s")


def clock_end_after_outage(workdir: Path) -> ScenarioResult:
    """Redis stops while a 4 s job runs; the job ends; Redis returns 8 s later (an end stamped
    when Redis came back would read 8 s too long)."""
    url, server = _private_redis(workdir)
    sc = Scenario(workdir, "job ended while Redis was away; Redis back 8 s later",
                  "SIGTERM of redis-server for 8 s across a job's end", fake_gpus="1x80G", redis_url=url,
                  health={"check_interval": 0.5, "timeout": 5.0})
    try:
        sc.node.up()
        jid = sc.submit(body=f"{GATE}; sleep 4", gpu_memory="20G", name="four-seconds")
        sc.wait_running([jid])
        _wait(lambda: bool(sc.node.job_processes()), 30, "the job's process")
        sc.go.touch()
        time.sleep(1.0)
        server.send_signal(signal.SIGTERM)  # a clean stop: its AOF has everything
        server.wait(30)
        _wait(lambda: not sc.node.job_processes(), 30, "the job to end while Redis is away")
        time.sleep(8.0)  # the outage goes on after the end
        _url, server = _private_redis(workdir, url)
        finals = sc.finish(timeout=120)
        job = finals.get(jid)
        if job is None or job.state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"the job ended {job.state.value if job else 'never'}, not SUCCEEDED")
        else:
            _check_order(sc, job, redis_time(sc.node.redis), (3.5, 6.5))
            attempt_end = job.attempts[-1].get("ended_at") if job.attempts else None
            if attempt_end is None or abs(float(attempt_end) - (job.ended_at or 0)) > 0.01:
                sc.result.problems.append(f"the attempt's end {attempt_end} is not the job's {job.ended_at}")
            hist = _history(sc, "four-seconds")
            if hist[:1] and 3.5 <= hist[0] <= 6.5:
                sc.result.notes.append(f"runtime {job.ended_at - job.started_at:.1f} s, history {hist[0]:.1f} s "
                                       "(Redis was back 15 s after the end)")
            else:
                sc.result.problems.append(f"duration history after the outage: {hist}")
        return sc.result
    finally:
        sc.close()
        server.terminate()
        server.wait(10)


SCENARIOS = [
    ("clock-step-time-limit", clock_step_time_limit),
    ("clock-skewed-nodes", clock_skewed_nodes),
    ("clock-end-after-outage", clock_end_after_outage),
]
