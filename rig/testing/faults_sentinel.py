"""Fault scenario: the Redis master is SIGKILLed under load while its replica lags; Sentinel
promotes the replica.

A master, a replica and three sentinels on loopback (rig.testing.sentinel_set); one rig node
(card workers and dispatcher on fake cards) against the ``sentinel://`` URL. A submitter thread
submits short jobs one by one, each appending ``<job id> <instance> <epoch s>`` to a runs file as
its first act. After KILL_AFTER acknowledged submissions the replica is cut off (SIGSTOP, and
its link closed: the master's writes from then on never reach it), LAG_JOBS more are submitted in one batch (rig must
acknowledge them *with* the no-replica warning), the master is SIGKILLed, the replica continued,
and submitting goes on. Then:

- lost: an acknowledged job that does not end SUCCEEDED, except one acknowledged with the
  no-replica warning before the kill (a warned job the fail-over lost is what the warning said:
  counted in the notes, not here); jobs acknowledged after the kill count, warned or not (the
  new master has no replica, but no second failure comes: see _verdict);
- duplicated: a job (id and instance) with more than one line in the runs file;
- leaked: bytes still reserved on a card after every job ended; orphans: job processes left;
- problems: the lag batch acknowledged without a warning, a node that froze as "Redis lost its
  data" (the promoted replica is the same installation), a submission refused across the
  fail-over, a recovery slower than RECOVERY_BOUND_S;
- notes: the recovery times from the kill (first acknowledged submission, first job started,
  every card worker's heartbeat on the new master) and the phases' durations.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from rig.client import Client
from rig.errors import JobNotFound, RigError
from rig.keys import card_worker_name
from rig.models import JobState
from rig.redis_conn import FAILOVER_WINDOW_S
from rig.testing.faults import ScenarioResult
from rig.testing.harness import RigHarness
from rig.testing.sentinel_set import SentinelSet

CARDS = 2
#: Jobs acknowledged before the replica is stopped, submitted while it is stopped, in all.
KILL_AFTER = 12
LAG_JOBS = 3
TOTAL_JOBS = 30
#: Recovery slower than this after the kill is a problem (s): a fail-over takes about
#: DOWN_AFTER_MS + 1.5 s here; the rest is reconnecting (Celery's backoff: 0.5 s, 1 s, ...).
RECOVERY_BOUND_S = 15.0
#: What each job does: note its start (the first line is the proof it ran), then work a bit (s).
JOB_SECONDS = 0.3
JOB = 'echo "$RIG_JOB_ID $RIG_JOB_INSTANCE $(date +%s.%N)" >> {runs}; sleep {seconds}'


@dataclass(frozen=True)
class Ack:
    """A job id given to the submitter."""

    job_id: int
    instance: str
    at: float  # wall time of the acknowledgement (epoch s)
    warned: bool  # given with the no-replica warning


class _Submitter(threading.Thread):
    """Submits jobs one by one until TOTAL_JOBS are acknowledged (pausing after KILL_AFTER until
    the scenario says go on); records each acknowledgement, and each refusal (nothing promised)."""

    def __init__(self, node: RigHarness, command: str, workdir: Path) -> None:
        super().__init__(name="submitter", daemon=True)
        self.client, self.command, self.workdir = node.client, command, workdir
        self.acked: list[Ack] = []
        self.refused: list[str] = []
        self.reached = threading.Event()  # KILL_AFTER acknowledged: the submitter waits
        self.go_on = threading.Event()  # set by the scenario after the kill

    def run(self) -> None:
        while len(self.acked) < TOTAL_JOBS:
            try:
                handle = self.client.submit(self.command, gpu_memory="10G", workdir=str(self.workdir))
            except RigError as exc:
                self.refused.append(str(exc))
                if len(self.refused) > 5:
                    return
                continue
            self.acked.append(Ack(handle.id, handle._job.instance, time.time(),
                                  bool(self.client.last_durability_note)))
            if len(self.acked) == KILL_AFTER:
                self.reached.set()
                self.go_on.wait(30)


def sentinel_failover(workdir: Path) -> ScenarioResult:
    """See the module docstring."""
    result, began, redis_set = _begin(workdir, "sentinel_failover",
                                      "replica cut off, then SIGKILL of the Redis master under load; "
                                      "Sentinel promotes the replica")
    node: RigHarness | None = None
    try:
        redis_set.start()
        phases = [("sentinels up", time.monotonic())]
        node = _node(workdir, redis_set, "sn1")
        phases.append(("node up", time.monotonic()))
        runs = workdir / "runs.txt"
        command = JOB.format(runs=runs, seconds=JOB_SECONDS)
        submitter = _Submitter(node, command, workdir)
        submitter.start()
        if not submitter.reached.wait(60):
            result.problems.append(f"only {len(submitter.acked)} submissions before the kill "
                                   f"(refused: {submitter.refused[:1]})")
            return result
        phases.append(("load before the kill", time.monotonic()))

        # The lag: these are on the master only, and rig must say so to their submitter.
        lagging = Client(node.settings)
        redis_set.cut_replica()
        try:
            handles = lagging.submit_many([{"command": command, "gpu_memory": "10G", "workdir": str(workdir)}]
                                          * LAG_JOBS)
        finally:
            old_port = redis_set.master_port
            kill_wall = time.time()
            redis_set.kill_master()
            redis_set.resume_replica()
        warned = bool(lagging.last_durability_note)
        lag_acks = [Ack(h.id, h._job.instance, kill_wall, warned) for h in handles]
        if not warned:
            result.problems.append(f"jobs {[a.job_id for a in lag_acks]} were acknowledged without the "
                                   "no-replica warning while the replica was stopped")
        submitter.go_on.set()
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

        acks = submitter.acked[:KILL_AFTER] + lag_acks + submitter.acked[KILL_AFTER:]
        result.jobs = len(acks)
        finals = _finals(node, acks, timeout=90)
        phases.append(("submitting and running after the kill", time.monotonic()))
        since = [began] + [at for _, at in phases]
        result.notes.append("phases: " + ", ".join(f"{name} {at - prev:.1f} s"
                                                   for prev, (name, at) in zip(since, phases, strict=False)))
        starts = _starts(runs)
        verdict = _verdict(acks, finals, starts, kill_wall)
        result.lost, result.duplicated = len(verdict.lost), verdict.duplicated
        gone_warned = verdict.gone_as_warned
        if verdict.unfinished_warned:
            result.problems.append("warned jobs kept by the new master that did not succeed: "
                                   f"{verdict.unfinished_warned}")
        if verdict.never_ran:
            result.problems.append(f"acknowledged jobs that never ran: {verdict.never_ran[:10]}")
        result.leaked = node.leaked_bytes()
        mismatch = node.redis.hget(node.keys.node(node.name), "installation_mismatch")
        if mismatch:
            result.problems.append(f"the node froze on the promoted replica: {mismatch}")

        after = [a for a in submitter.acked if a.at > kill_wall]
        result.notes.append(f"{KILL_AFTER} acknowledged before the replica stopped, {LAG_JOBS} while it was "
                            f"stopped (warned: {warned}; {len(gone_warned)} of them lost with the master, as "
                            f"warned), {len(after)} after the kill ({sum(a.warned for a in after)} warned: the "
                            "new master has no replica)")
        # A job submitted after the kill went through the dispatcher and a card worker on the
        # new master (one submitted before may have been claimed before the kill).
        first_start = min((t for a in after for t in starts.get((a.job_id, a.instance), [])), default=None)
        first_ack = min((a.at for a in after), default=None)
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
        _clean_up(result, node, redis_set, began)
    return result


@dataclass(frozen=True)
class Verdict:
    """What the acknowledgements, the final states and the runs file say (job ids)."""

    lost: list[int]  # acknowledged jobs that did not end SUCCEEDED, save those the warning covered
    gone_as_warned: list[int]  # jobs warned before the kill that the new master does not hold
    unfinished_warned: list[int]  # jobs warned before the kill, kept, that did not succeed
    never_ran: list[int]  # jobs that had to run and have no line in the runs file
    duplicated: int  # (id, instance) pairs with more than one line in the runs file


def _verdict(acks: list[Ack], finals: dict[Ack, JobState], starts: dict[tuple[int, str], list[float]],
             kill_wall: float) -> Verdict:
    """Only a job acknowledged *with* the no-replica warning before the kill may be gone: the
    warning says the master's failure could lose it, and the master failed. A job acknowledged
    after the kill is warned too (the new master has no replica yet), but no second failure
    came, so it must end SUCCEEDED and run once like the rest (counting every warned job as
    excused left the 18 jobs submitted after the kill unchecked: one lost would have read
    "4 of them lost with the master, as warned")."""
    covered = [a for a in acks if a.warned and a.at <= kill_wall]
    bound = [a for a in acks if a not in covered]
    return Verdict(
        lost=[a.job_id for a in bound if finals.get(a) != JobState.SUCCEEDED],
        gone_as_warned=[a.job_id for a in covered if a not in finals],
        unfinished_warned=[a.job_id for a in covered if a in finals and finals[a] != JobState.SUCCEEDED],
        never_ran=[a.job_id for a in bound if not starts.get((a.job_id, a.instance))],
        duplicated=sum(1 for times in starts.values() if len(times) > 1))


#: How long the master stays stopped once the sentinels promoted its replica (s): shorter than
#: rig's reply timeout, so calls sent to it meanwhile are answered by it when it continues.
HUNG_EXTRA_S = 2.0


def sentinel_hung_master(workdir: Path) -> ScenarioResult:
    """The master hangs (SIGSTOP) under load until the sentinels promote its replica, then
    answers again (SIGCONT; a partition that heals): a master with no replica, until the
    sentinels demote it (~10 s) and it drops what it took meanwhile. The submitter never
    pauses; every acknowledged job must end SUCCEEDED and run once (no warning excuses one: no
    write was acknowledged before the fault with the warning), every card freed, nothing left."""
    result, began, redis_set = _begin(workdir, "sentinel_hung_master",
                                      "Redis master stopped under load until its replica is promoted, then "
                                      "continued (a deposed master answering as one)")
    node: RigHarness | None = None
    try:
        redis_set.start()
        node = _node(workdir, redis_set, "sh1")
        runs = workdir / "runs.txt"
        submitter = _Submitter(node, JOB.format(runs=runs, seconds=JOB_SECONDS), workdir)
        submitter.go_on.set()  # no pause: submissions are in flight through the whole fault
        submitter.start()
        if not submitter.reached.wait(60):
            result.problems.append(f"only {len(submitter.acked)} submissions before the fault")
            return result
        master = redis_set.procs["master"]
        stop_wall = time.time()
        master.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + FAILOVER_WINDOW_S
            while redis_set.master_port_now() != redis_set.replica_port and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(HUNG_EXTRA_S)
        finally:
            master.send_signal(signal.SIGCONT)
        if redis_set.master_port_now() != redis_set.replica_port:
            result.problems.append("no fail-over: the sentinels never promoted the replica")
        submitter.join(FAILOVER_WINDOW_S + 60)
        if submitter.is_alive():
            result.problems.append("the submitter hung after the fault")
        acks = submitter.acked
        result.jobs = len(acks)
        verdict = _verdict(acks, _finals(node, acks, timeout=90), _starts(runs), stop_wall)
        result.lost, result.duplicated = len(verdict.lost), verdict.duplicated
        if verdict.never_ran:
            result.problems.append(f"acknowledged jobs that never ran: {verdict.never_ran[:10]}")
        result.leaked = node.leaked_bytes()
        result.notes.append(f"{len(acks)} acknowledged ({sum(a.at > stop_wall for a in acks)} after the stop), "
                            f"{len(submitter.refused)} refused (nothing promised): {submitter.refused[:1]}")
    except Exception as exc:  # noqa: BLE001 - reported as the scenario's problem, then cleaned up
        result.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        _clean_up(result, node, redis_set, began)
    return result


def _begin(workdir: Path, name: str, faults: str) -> tuple[ScenarioResult, float, SentinelSet]:
    """A scenario's result, its start (monotonic s) and its Redis set (not started yet)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return ScenarioResult(name, jobs=0, faults=faults), time.monotonic(), SentinelSet(workdir / "redis")


def _node(workdir: Path, redis_set: SentinelSet, name: str) -> RigHarness:
    """The scenarios' node, up. replica_wait_seconds short: while no replica can confirm, each
    WAIT runs out and says so. assigned_timeout short: a start message lost with the master is
    re-sent after it (docs/RELIABILITY.md)."""
    node = RigHarness(workdir / "home", fake_gpus=f"{CARDS}x80G", redis_url=redis_set.url, node_name=name,
                      replica_wait_seconds=0.25, health={"timeout": 15.0, "check_interval": 2.0,
                                                         "assigned_timeout": 5.0})
    node.up()
    return node


def _clean_up(result: ScenarioResult, node: RigHarness | None, redis_set: SentinelSet, began: float) -> None:
    """Count the job processes left, stop the node and the Redis set, note the duration."""
    if node is not None:
        result.orphans = len(node.orphans())
        node.cleanup()
    redis_set.stop()
    result.seconds = round(time.monotonic() - began, 1)


def _finals(node: RigHarness, acks: list[Ack], timeout: float) -> dict[Ack, JobState]:
    """The final state of each acknowledged job the current master still holds (its id naming
    the same instance); a job it does not hold is left out."""
    out: dict[Ack, JobState] = {}
    deadline = time.monotonic() + timeout
    for ack in acks:
        try:
            if node.client.get(ack.job_id).instance != ack.instance:
                continue  # the id was given again: this job was lost with the master
            job = node.client.wait(ack.job_id, timeout=max(1.0, deadline - time.monotonic()))
        except JobNotFound:
            continue
        except (TimeoutError, RigError):
            out[ack] = JobState.RUNNING  # not final in time
            continue
        out[ack] = job.state if job.instance == ack.instance else JobState.RUNNING
    return out


def _starts(runs: Path) -> dict[tuple[int, str], list[float]]:
    """(job id, instance) -> the wall times at which a process of it started (one line per run)."""
    out: dict[tuple[int, str], list[float]] = {}
    if not runs.exists():
        return out
    for line in runs.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.setdefault((int(parts[0]), parts[1]), []).append(float(parts[2]))
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


SCENARIOS = [("sentinel_failover", sentinel_failover), ("sentinel_hung_master", sentinel_hung_master)]
