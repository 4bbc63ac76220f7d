"""Fault scenario: the Redis master is SIGKILLed under load; Sentinel promotes the replica.

A master, a replica and three sentinels on loopback (rig.testing.sentinel_set); one rig node
(card workers and dispatcher on fake cards) against the ``sentinel://`` URL. A submitter thread
submits short jobs, each appending ``<job id> <epoch s>`` to a runs file as its first act; after
KILL_AFTER acknowledged submissions the master is SIGKILLed and submitting goes on. Then:

- lost: a job whose id was acknowledged to the submitter that does not end SUCCEEDED;
- duplicated: a job with more than one line in the runs file (it ran twice);
- leaked: bytes still reserved on a card after every job ended; orphans: job processes left;
- problems: a node that froze as "Redis lost its data" (the promoted replica is the same
  installation), a submission refused for longer than the fail-over window;
- notes: the recovery times measured from the kill: the first acknowledged submission, the
  first job started, and every card worker's first heartbeat on the new master.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import redis

from rig.errors import RigError
from rig.keys import card_worker_name
from rig.models import JobState
from rig.redis_conn import FAILOVER_WINDOW_S
from rig.testing.faults import ScenarioResult
from rig.testing.harness import RigHarness
from rig.testing.sentinel_set import SentinelSet

CARDS = 2
#: Jobs acknowledged before the master is killed, and in all.
KILL_AFTER = 12
TOTAL_JOBS = 30
#: Recovery slower than this after the kill is a problem (s): a fail-over takes about
#: DOWN_AFTER_MS + 1.5 s here; the rest is reconnecting (Celery's backoff: 0.5 s, 1 s, ...).
RECOVERY_BOUND_S = 15.0
#: What each job does: note its start (the first line is the proof it ran), then work a bit (s).
JOB_SECONDS = 0.3
JOB = 'echo "$RIG_JOB_ID $(date +%s.%N)" >> {runs}; sleep {seconds}'


class _Submitter(threading.Thread):
    """Submits TOTAL_JOBS jobs one by one; records each acknowledged id with its time, and each
    refused submission (not acknowledged: nothing was promised)."""

    def __init__(self, node: RigHarness, runs: Path, workdir: Path) -> None:
        super().__init__(name="submitter", daemon=True)
        self.node, self.runs, self.workdir = node, runs, workdir
        self.acked: list[tuple[int, float]] = []  # (job id, wall time of the acknowledgement)
        self.refused: list[str] = []
        self.unconfirmed: list[int] = []  # acknowledged with the no-replica warning
        self.reached = threading.Event()  # KILL_AFTER acknowledged
        self.killed = threading.Event()  # set by the scenario after the kill

    def run(self) -> None:
        command = JOB.format(runs=self.runs, seconds=JOB_SECONDS)
        while len(self.acked) < TOTAL_JOBS:
            try:
                handle = self.node.client.submit(command, gpu_memory="10G", workdir=str(self.workdir))
            except RigError as exc:
                self.refused.append(str(exc))
                if len(self.refused) > 5:
                    return
                continue
            self.acked.append((handle.id, time.time()))
            if self.node.client.last_durability_note:
                self.unconfirmed.append(handle.id)
            if len(self.acked) == KILL_AFTER:
                self.reached.set()
                self.killed.wait(30)



def sentinel_failover(workdir: Path) -> ScenarioResult:
    """See the module docstring."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = ScenarioResult("sentinel_failover", jobs=0,
                            faults="SIGKILL of the Redis master under load; Sentinel promotes the replica")
    began = time.monotonic()
    redis_set = SentinelSet(workdir / "redis")
    node: RigHarness | None = None
    try:
        redis_set.start()
        phases = [("sentinels up", time.monotonic())]
        # replica_wait_seconds short: after the kill the new master has no replica, so each
        # WAIT runs out (and says so); the scenario measures, it does not wait for a rebuild.
        node = RigHarness(workdir / "home", fake_gpus=f"{CARDS}x80G", redis_url=redis_set.url, node_name="sn1",
                          replica_wait_seconds=0.25, health={"timeout": 15.0, "check_interval": 2.0,
                                                     "assigned_timeout": 5.0})
        node.up()
        phases.append(("node up", time.monotonic()))
        runs = workdir / "runs.txt"
        submitter = _Submitter(node, runs, workdir)
        submitter.start()
        if not submitter.reached.wait(60):
            result.problems.append(f"only {len(submitter.acked)} submissions before the kill "
                                   f"(refused: {submitter.refused[:1]})")
            return result
        phases.append(("load before the kill", time.monotonic()))
        old_port = redis_set.master_port
        kill_wall = time.time()
        redis_set.kill_master()
        submitter.killed.set()
        beats = _HeartbeatWatch(node, kill_wall)
        beats.start()
        submitter.join(FAILOVER_WINDOW_S + 60)
        if submitter.is_alive():
            result.problems.append("the submitter hung after the kill")
        if submitter.refused:
            result.problems.append(f"{len(submitter.refused)} submission(s) refused across the fail-over: "
                                   f"{submitter.refused[0]}")
        new_port = redis_set.master_port_now()
        if new_port in (None, old_port):
            result.problems.append(f"no fail-over: the sentinels name port {new_port} as master")

        ids = [jid for jid, _ in submitter.acked]
        result.jobs = len(ids)
        finals = {}
        deadline = time.monotonic() + 90
        for jid in ids:
            try:
                finals[jid] = node.client.wait(jid, timeout=max(1.0, deadline - time.monotonic()))
            except (TimeoutError, RigError):
                pass
        phases.append(("submitting and running after the kill", time.monotonic()))
        since = [began] + [at for _, at in phases]
        result.notes.append("phases: " + ", ".join(f"{name} {at - prev:.1f} s"
                                                   for prev, (name, at) in zip(since, phases, strict=False)))
        result.lost = sum(1 for jid in ids if jid not in finals or finals[jid].state != JobState.SUCCEEDED)
        starts = _starts(runs)
        result.duplicated = sum(1 for jid in ids if len(starts.get(jid, [])) > 1)
        never_ran = [jid for jid in ids if not starts.get(jid)]
        if never_ran:
            result.problems.append(f"acknowledged jobs that never ran: {never_ran[:10]}")
        result.leaked = node.leaked_bytes()
        mismatch = node.redis.hget(node.keys.node(node.name), "installation_mismatch")
        if mismatch:
            result.problems.append(f"the node froze on the promoted replica: {mismatch}")

        after = [jid for jid, at in submitter.acked if at > kill_wall]
        # A job submitted after the kill went through the dispatcher and a card worker on the
        # new master (one submitted before may have been claimed before the kill).
        first_start = min((t for jid in after for t in starts.get(jid, [])), default=None)
        result.notes.append(f"{KILL_AFTER} acknowledged before the kill, {len(after)} after; "
                            f"{len(submitter.unconfirmed)} with the no-replica warning (the new master has no "
                            "replica)")
        first_ack = min((at for jid, at in submitter.acked if at > kill_wall), default=None)
        beats.join(1)
        for what, when in (("first acknowledged submission", first_ack), ("first job started", first_start),
                           ("every card worker's heartbeat on the new master",
                            None if beats.seconds is None else kill_wall + beats.seconds)):
            if when is None:
                result.problems.append(f"never after the kill: {what}")
                continue
            result.notes.append(f"{what} {when - kill_wall:.1f} s after the kill")
            if when - kill_wall > RECOVERY_BOUND_S:
                result.problems.append(f"{what} only {when - kill_wall:.1f} s after the kill "
                                       f"(bound {RECOVERY_BOUND_S:g} s)")
    except Exception as exc:  # noqa: BLE001 - reported as the scenario's problem, then cleaned up
        result.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if node is not None:
            result.orphans = len(node.orphans())
            node.cleanup()
        redis_set.stop()
        result.seconds = round(time.monotonic() - began, 1)
    return result


def _starts(runs: Path) -> dict[int, list[float]]:
    """Job id -> the wall times at which a process of it started (one line per run)."""
    out: dict[int, list[float]] = {}
    if not runs.exists():
        return out
    for line in runs.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.setdefault(int(parts[0]), []).append(float(parts[1]))
    return out


class _HeartbeatWatch(threading.Thread):
    """From the kill on, reads every card worker's heartbeat (``seen_at``: Redis' clock, epoch
    s) until each was written after ``since``; ``seconds``: the last one's delay, or None."""

    def __init__(self, node: RigHarness, since: float, timeout: float = FAILOVER_WINDOW_S) -> None:
        super().__init__(name="heartbeat-watch", daemon=True)
        self.node, self.since, self.timeout = node, since, timeout
        self.seconds: float | None = None

    def run(self) -> None:
        names = [card_worker_name(self.node.name, index) for index in range(CARDS)]
        first: dict[str, float] = {}
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and len(first) < len(names):
            try:
                for name, raw in zip(names, self.node.redis.mget([self.node.keys.worker(n) for n in names]),
                                     strict=True):
                    # seen_at is when the beat was composed; one composed before the fail-over
                    # may land after it: count when it is seen here (0.1 s sampling).
                    stamp = float(json.loads(raw).get("seen_at", 0)) if raw else 0.0
                    if stamp > self.since + 0.5:
                        first.setdefault(name, time.time())
            except (RigError, OSError, ValueError, redis.RedisError):
                pass
            time.sleep(0.1)  # heartbeats are overwritten every telemetry_interval: sample them
        if len(first) == len(names):
            self.seconds = max(first.values()) - self.since


SCENARIOS = [("sentinel_failover", sentinel_failover)]
