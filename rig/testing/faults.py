"""Fault-injection scenarios against a real node: real Redis, real Celery workers, real jobs.

Each scenario injects one kind of fault while jobs wait and run, lets the system recover, and
counts what users care about:

- lost:       jobs that did not reach a final state (terminal, or the error queue);
- duplicated: jobs with two copies alive at once, or with more starts than recorded attempts;
- leaked:     bytes still reserved on any card once everything ended;
- orphans:    processes started for a job that are still alive once everything ended.

Every job appends "<id> <attempt> start|end" lines to a trace file; the SIGTERM trap writes the
"end" line when rig stops a job, so an attempt's life is known from the job's own side.
``scripts/fault_scenarios.py`` prints the table; tests/integration/test_faults.py asserts zeros.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rig.models import TERMINAL_STATES, Job, JobState
from rig.nodes import NodeRegistry
from rig.testing.harness import RigCluster, RigHarness
from workers.health import HealthChecker

#: Body wrapper: records start/end in $TRACE; a SIGTERM from rig still records the end.
TRACED = (
    'trap \'echo "$RIG_JOB_ID $RIG_ATTEMPT end" >> "$TRACE"; exit 143\' TERM; '
    'echo "$RIG_JOB_ID $RIG_ATTEMPT start" >> "$TRACE"; ( {body} ); rc=$?; '
    'echo "$RIG_JOB_ID $RIG_ATTEMPT end" >> "$TRACE"; exit $rc'
)
#: Waits for the scenario's go-file in short steps (so a SIGTERM trap runs within 50 ms).
GATE = 'while [ ! -f "$GO" ]; do sleep 0.05; done'


@dataclass
class ScenarioResult:
    name: str
    jobs: int
    faults: str
    lost: int = 0
    duplicated: int = 0
    leaked: int = 0
    orphans: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # measurements worth printing (not failures)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.leaked or self.orphans or self.problems)


class Scenario:
    """One node (or a cluster's view through one of its nodes: ``node``), a trace file, a
    go-file, and the bookkeeping every scenario shares."""

    def __init__(self, workdir: Path, name: str, faults: str, node: RigHarness | None = None,
                 **node_options) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.trace = workdir / "trace.txt"
        self.go = workdir / "go"
        self.node = node or RigHarness(workdir / "home", **node_options)
        self.result = ScenarioResult(name=name, jobs=0, faults=faults)
        self.job_ids: list[int] = []
        self.began = time.monotonic()

    def submit(self, body: str = GATE, **kwargs) -> int:
        env = {"TRACE": str(self.trace), "GO": str(self.go), **kwargs.pop("env", {})}
        kwargs.setdefault("gpu_memory", "10G")
        kwargs.setdefault("workdir", str(self.workdir))  # never the caller's folder (the repo)
        handle = self.node.client.submit(TRACED.format(body=body), env=env, **kwargs)
        self.job_ids.append(handle.id)
        return handle.id

    def wait_running(self, job_ids: list[int], timeout: float = 60) -> None:
        """Until each job is RUNNING with its process started (a claimed job is RUNNING a
        moment before its pid is recorded)."""
        for jid in job_ids:
            self.node.wait_for_state(jid, {JobState.RUNNING}, timeout=timeout)
        store = self.node.client.store
        _wait(lambda: all(j.pid for j in store.get_many(job_ids)), timeout, f"jobs {job_ids} to start")

    def finish(self, timeout: float = 180) -> dict[int, Job]:
        """Let the jobs go, wait for each to end, run one health pass, then count."""
        self.go.touch()
        finals: dict[int, Job] = {}
        for jid in self.job_ids:
            try:
                finals[jid] = self.node.client.wait(jid, timeout=max(1.0, timeout - self.elapsed()))
            except TimeoutError:
                pass
        HealthChecker(self.node.settings, self.node.redis).run_once()
        self.count(finals)
        return finals

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def count(self, finals: dict[int, Job]) -> None:
        r = self.result
        r.jobs = len(self.job_ids)
        r.lost = sum(1 for jid in self.job_ids
                     if jid not in finals or finals[jid].state not in TERMINAL_STATES)
        r.duplicated = len(duplicated_jobs(self.trace, finals))
        r.leaked = self.node.leaked_bytes()
        r.orphans = len(self.node.orphans())
        r.seconds = round(self.elapsed(), 1)

    def close(self) -> ScenarioResult:
        """Stop the node, and whatever of its jobs still runs: a scenario that failed half-way
        must not leave job processes behind (they would wait for the go-file for ever)."""
        try:
            self.go.touch()
        except OSError:
            pass
        leftovers = self.node.job_processes()
        self.node.cleanup()
        for pid in list(leftovers) + list(self.node.job_processes()):
            try:
                os.killpg(os.getsid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return self.result


def duplicated_jobs(trace: Path, finals: dict[int, Job]) -> list[int]:
    """Jobs with two attempts alive at the same time, or more starts than recorded attempts."""
    events: dict[int, list[tuple[int, str]]] = defaultdict(list)
    if trace.exists():
        for line in trace.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                events[int(parts[0])].append((int(parts[1]), parts[2]))
    bad = []
    for jid, seq in events.items():
        alive: set[int] = set()
        starts = 0
        for attempt, what in seq:
            if what == "start":
                starts += 1
                if alive:
                    bad.append(jid)
                    break
                alive.add(attempt)
            elif what in ("end", "killed"):  # "killed": the scenario saw it die by SIGKILL
                alive.discard(attempt)
        else:
            if jid in finals and starts > max(1, finals[jid].attempt):
                bad.append(jid)
    return bad


# -- scenarios ---------------------------------------------------------------------------------
def sigkill_card_worker(workdir: Path, *, restarted: bool = True) -> ScenarioResult:
    """1. SIGKILL a card worker while it runs jobs. With rig up's supervision the worker comes
    back and adopts them; without it, the health check marks them LOST (after stopping their
    process trees) and they are retried on other cards."""
    name = "card worker SIGKILLed" + (" (restarted, adopts)" if restarted else " (stays dead)")
    sc = Scenario(workdir, name, "SIGKILL of card0's worker", fake_gpus="4x80G",
                  health={"check_interval": 1.0, "timeout": 3.0})
    try:
        sc.node.restart_children = restarted
        sc.node.up(beat=not restarted)
        ids = [sc.submit(gpu_memory="30G") for _ in range(8)]
        sc.wait_running(ids)
        victim = sc.node.worker_pid("card0@testnode")
        on_card0 = [j.id for j in sc.node.client.store.get_many(ids) if j.cards and j.cards[0] == 0]
        os.kill(victim, signal.SIGKILL)
        if restarted:
            _wait(lambda: _heartbeat_pid(sc.node, "card0@testnode") not in (None, victim), 60,
                  "card0's worker to come back")
        else:
            # The health check stops card0's jobs and requeues them elsewhere.
            _wait(lambda: all(sc.node.client.get(j).attempt >= 2 or sc.node.client.get(j).state
                              is not JobState.RUNNING for j in on_card0), 60, "card0's jobs to be recovered")
        finals = sc.finish()
        if not restarted:
            lost_marked = [j for j in on_card0 if j in finals
                           and any(a.get("outcome") == "lost" for a in finals[j].attempts)]
            if len(lost_marked) != len(on_card0):
                sc.result.problems.append(f"jobs on card0 {on_card0}, marked lost: {lost_marked}")
        return sc.result
    finally:
        sc.close()


def redis_killed_and_restarted(workdir: Path) -> ScenarioResult:
    """2. SIGKILL Redis (AOF everysec) while jobs wait and run; start it again on its files."""
    url, server = _private_redis(workdir)
    sc = Scenario(workdir, "Redis SIGKILLed mid-run, restarted (AOF)", "SIGKILL of redis-server, 2 s down",
                  fake_gpus="2x80G", redis_url=url)
    try:
        sc.node.up()
        ids = [sc.submit(body=f"{GATE}; sleep 0.3", gpu_memory="20G") for _ in range(16)]
        sc.wait_running(ids[:4])
        time.sleep(1.2)  # let the AOF's once-a-second fsync cover the submissions
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(2.0)  # the outage itself
        _url, server = _private_redis(workdir, url)  # again, on its files
        sc.finish(timeout=240)
        restarted = [c.name for c in sc.node.stack.children if c.restarts]
        if restarted:
            sc.result.problems.append(f"workers exited instead of reconnecting: {restarted}")
        return sc.result
    finally:
        sc.close()
        server.terminate()
        server.wait(10)


def beats_killed_and_doubled(workdir: Path) -> ScenarioResult:
    """3. SIGKILL beat (rig up restarts it), then start a second beat beside it: exactly one
    beat sends the periodic tasks at any time (celery-redbeat's lock)."""
    sc = Scenario(workdir, "beat SIGKILLed; two beats started", "SIGKILL of beat; a second beat",
                  fake_gpus="2x80G", health={"check_interval": 1.0, "timeout": 10.0})
    extra: subprocess.Popen | None = None
    try:
        sc.node.up(beat=True)
        for _ in range(6):
            sc.submit(body=f"{GATE}; sleep 0.2", gpu_memory="20G")
        beat = sc.node.child("beat")
        old_pid = beat.proc.pid
        os.kill(old_pid, signal.SIGKILL)
        _wait(lambda: beat.proc.pid != old_pid and beat.proc.poll() is None, 30, "beat to restart")
        second_log = sc.node.settings.rig_log_dir / "beat2.log"
        argv = [sys.executable, "-m", "celery", "-A", "workers.app", "beat", "-l", "INFO", "-f", str(second_log)]
        extra = subprocess.Popen(argv, env=beat.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        mark = time.time()
        logs = {"beat": sc.node.settings.rig_log_dir / "beat.log", "beat2": second_log}
        # The killed beat's lock expires (redbeat_lock_timeout), then one beat takes over.
        _wait(lambda: any(_sends_since(p, mark) for p in logs.values()), 40, "a beat to tick again")
        mark = time.time() + 1
        time.sleep(6)  # several periodic intervals with both beats alive
        sends = {name: _sends_since(path, mark) for name, path in logs.items()}
        if sum(1 for n in sends.values() if n) != 1:
            sc.result.problems.append(f"periodic sends per beat while two ran: {sends}")
        sc.finish()
        return sc.result
    finally:
        if extra is not None:
            extra.terminate()
            extra.wait(10)
        sc.close()


def broker_connections_dropped(workdir: Path) -> ScenarioResult:
    """4. Drop every client connection (CLIENT KILL) while jobs run: Celery restores the
    unacked start messages and delivers them again; the claim fence stops second copies. On a
    private Redis: CLIENT KILL on a shared one would cut everybody else's connections too."""
    url, server = _private_redis(workdir)
    sc = Scenario(workdir, "broker connections dropped (CLIENT KILL)", "CLIENT KILL of all clients, twice",
                  fake_gpus="2x80G", redis_url=url)
    try:
        sc.node.up()
        ids = [sc.submit(body=f"{GATE}; sleep 0.2", gpu_memory="20G") for _ in range(12)]
        sc.wait_running(ids[:4])
        admin = redis.Redis.from_url(sc.node.settings.redis_url)
        for _ in range(2):
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes")
            time.sleep(1.0)
        sc.finish()
        return sc.result
    finally:
        sc.close()
        server.terminate()
        server.wait(10)


DAEMON = ("python3 -c \"import os, time\n"
          "if os.fork() == 0:\n"
          "    os.setsid()\n"
          "    if os.fork() == 0:\n"
          "        time.sleep(300)\n"
          "    os._exit(0)\n"
          "time.sleep(0.2)\"")


def double_fork(workdir: Path) -> ScenarioResult:
    """5. Jobs that double-fork a daemon (fork, setsid, fork) and exit: the daemon goes too."""
    sc = Scenario(workdir, "jobs double-fork a daemon and exit", "6 daemons left behind", fake_gpus="2x80G")
    try:
        sc.node.up()
        for _ in range(6):
            sc.submit(body=DAEMON, gpu_memory="5G")
        finals = sc.finish()
        if {j.state for j in finals.values()} != {JobState.SUCCEEDED}:
            sc.result.problems.append(f"states: {sorted({j.state.value for j in finals.values()})}")
        return sc.result
    finally:
        sc.close()


OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.15 GiB of which 1.23 GiB is free.")
CLASS_CASES: list[tuple[str, str, dict, JobState, str]] = [
    # name, body, submit options, expected state, expected failure class
    ("exit 3", "exit 3", {"retries": 0}, JobState.FAILED, "nonzero_exit"),
    ("killed by a signal", "kill -9 $$", {"retries": 0}, JobState.FAILED, "signal"),
    ("CUDA OOM", f"echo '{OOM_LINE}' >&2; exit 1", {"retries": 2}, JobState.FAILED, "cuda_oom"),
    ("CUDA OOM, grow", f"[ $RIG_ATTEMPT -gt 1 ] || {{ echo '{OOM_LINE}' >&2; exit 1; }}",
     {"retries": 2, "oom_retry_grow": True}, JobState.SUCCEEDED, ""),
    ("CUDA error", "echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; exit 1",
     {"retries": 0}, JobState.FAILED, "cuda_error"),
    ("NCCL error", "echo 'torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
     "unhandled cuda error, NCCL version 2.19.3' >&2; exit 1", {"retries": 0}, JobState.FAILED, "nccl_error"),
    ("command not found", "no-such-command-rig-test", {"retries": 0}, JobState.FAILED, "command_not_found"),
    ("time limit", GATE + "; sleep 30", {"time_limit": "1s"}, JobState.TIMEOUT, "timeout"),
    ("fails twice then works", "[ $RIG_ATTEMPT -gt 2 ] || exit 5", {"retries": 2}, JobState.SUCCEEDED, ""),
]


def failure_classes(workdir: Path) -> ScenarioResult:
    """6. One job per failure class; each ends in the right state with the right class."""
    sc = Scenario(workdir, "jobs fail in each class", f"{len(CLASS_CASES) + 1} kinds of ending",
                  fake_gpus="2x80G")
    try:
        sc.node.up()
        ids = {name: sc.submit(body=body, gpu_memory="4G", **opts) for name, body, opts, _, _ in CLASS_CASES}
        cancel = sc.submit(gpu_memory="4G")
        sc.wait_running([cancel])
        sc.node.client.kill(cancel)
        # The time-limit case gates on $GO: it must be stopped before the go-file appears.
        sc.node.wait_for_state(ids["time limit"], {JobState.TIMEOUT}, timeout=60)
        finals = sc.finish()
        errors = set(sc.node.client.store.error_ids())
        for name, _body, _opts, state, failure in CLASS_CASES:
            job = finals.get(ids[name])
            if job is None:
                continue
            got = (job.state, job.failure or "")
            if got[0] is not state or (failure and got[1] != failure):
                sc.result.problems.append(f"{name}: got {got[0].value}/{got[1]}, want {state.value}/{failure}")
            if state in (JobState.FAILED, JobState.TIMEOUT) and job.id not in errors:
                sc.result.problems.append(f"{name}: not in the error queue")
        grown = finals.get(ids["CUDA OOM, grow"])
        if grown and not (grown.attempt == 2 and grown.gpu_memory > 4 * 2**30):
            sc.result.problems.append(f"OOM grow: attempt {grown.attempt}, memory {grown.gpu_memory}")
        oom = finals.get(ids["CUDA OOM"])
        if oom and (oom.attempt != 1 or not oom.suggested_gpu_memory):
            sc.result.problems.append(f"OOM retried with the same declaration or no suggestion: {oom.attempt}")
        if finals.get(cancel) and finals[cancel].state is not JobState.CANCELLED:
            sc.result.problems.append(f"cancel: {finals[cancel].state.value}")
        return sc.result
    finally:
        sc.close()


def random_failures(workdir: Path, *, jobs: int = 500, seed: int = 11) -> ScenarioResult:
    """7. Many jobs on 8 fake cards, each failing its first k attempts (k random, 0..3), with
    max_retries 2: each must end SUCCEEDED after k+1 attempts, or FAILED in the error queue
    after 3."""
    rng = random.Random(seed)
    sc = Scenario(workdir, f"{jobs} jobs with random failures", "random exits 1..3 times",
                  fake_gpus="8x80G", max_retries=2)
    try:
        sc.node.up()
        plan: dict[int, int] = {}
        for _ in range(jobs):
            k = rng.choice([0, 0, 0, 1, 1, 2, 3])
            jid = sc.submit(body=f"[ $RIG_ATTEMPT -gt {k} ] || exit 1",
                            gpu_memory=f"{rng.choice([1, 2, 5, 10, 20, 40])}G",
                            priority=rng.choice(["high", "medium", "low"]))
            plan[jid] = k
        sc.go.touch()
        finals = sc.finish(timeout=600)
        errors = set(sc.node.client.store.error_ids())
        wrong = []
        for jid, k in plan.items():
            job = finals.get(jid)
            if job is None:
                continue
            want = (JobState.SUCCEEDED, k + 1, False) if k <= 2 else (JobState.FAILED, 3, True)
            got = (job.state, job.attempt, jid in errors)
            if got != want:
                wrong.append(f"job {jid} (fails {k}x): {got[0].value} after {got[1]}, error queue {got[2]}")
        if wrong:
            sc.result.problems.extend(wrong[:5] + ([f"... {len(wrong) - 5} more"] if len(wrong) > 5 else []))
        return sc.result
    finally:
        sc.close()


#: Appended by a job whose body ran to its end: a SUCCEEDED job must have exactly one.
DONE = 'echo "$RIG_JOB_ID $RIG_ATTEMPT done" >> "$TRACE"'
#: Bounds for the fail-over of scenario 9 with health.timeout 3 s and check_interval 1 s (s):
#: dispatcher lock 5 s; beat lock 10 s (redbeat_lock_timeout) + one beat loop (2 s); declared
#: down = heartbeat TTL 3 s + the beat fail-over + two health passes.
FAILOVER_BOUNDS = {"dispatcher": 15.0, "beat": 25.0, "down": 35.0}


def node_lost(workdir: Path) -> ScenarioResult:
    """9. Two nodes on one Redis and one key prefix, n1 (2x80G) and n2 (2x40G), each with its
    own beat and control worker. n1 holds the beat and dispatcher locks and runs jobs when it is
    SIGKILLed with every job process (a power cut). n2's dispatcher and beat take over within
    their bounds, n1 is declared down, its cards leave placement, its jobs run again on n2 by
    their retry policy, and new jobs still dispatch. Then n1 comes back, rejoins (its cards take
    jobs again) and runs jobs only it can hold."""
    cluster = RigCluster(workdir / "nodes", {"n1": "2x80G", "n2": "2x40G"},
                         health={"check_interval": 1.0, "timeout": 3.0}, max_retries=2)
    n1, n2 = cluster["n1"], cluster["n2"]
    sc = Scenario(workdir, "node SIGKILLed with its jobs, then rejoins", "SIGKILL of node n1 (workers, beat, jobs)",
                  node=n2)
    problems, notes = sc.result.problems, sc.result.notes
    try:
        n1.up(beat=True)
        _wait(lambda: _leader(cluster) == "n1" and _beat_locked(n1), 60, "n1 to hold the beat and dispatcher locks")
        n2.up(beat=True)
        # 14 x 10G fill both nodes at once: n1 4 jobs per card (max_task_per_gpu), n2 3 per 38G card.
        ids = [sc.submit(body=f"{GATE}; sleep 0.3; {DONE}", gpu_memory="10G") for _ in range(14)]
        sc.wait_running(ids)
        placed = {j.id: j.node for j in cluster.client.store.get_many(ids)}
        on_n1 = sorted(jid for jid, node in placed.items() if node == "n1")
        if not on_n1 or len(on_n1) == len(ids):
            problems.append(f"jobs did not land on both nodes: {placed}")
        if _beat_sends(n2):
            problems.append("n2's beat sent periodic tasks while n1's held the lock")

        killed_at = time.monotonic()
        killed = n1.kill()
        with sc.trace.open("a") as fh:  # SIGKILL runs no trap: record the ends the test saw
            for jid, attempt in killed:
                fh.write(f"{jid} {attempt} killed\n")
        if sorted({jid for jid, _ in killed}) != on_n1:
            problems.append(f"killed job processes {killed}, jobs on n1 {on_n1}")
        later = [sc.submit(body=f"sleep 0.2; {DONE}", gpu_memory="10G") for _ in range(4)]
        sc.go.touch()
        checks = {"dispatcher": lambda: _leader(cluster) == "n2", "beat": lambda: _beat_locked(n2),
                  "down": lambda: _node(cluster, "n1").state == "down"}
        for what, check in checks.items():
            _wait(check, FAILOVER_BOUNDS[what] + 10, f"{what} fail-over")
            took = time.monotonic() - killed_at
            notes.append(f"{what} fail-over after {took:.1f} s")
            if took > FAILOVER_BOUNDS[what]:
                problems.append(f"{what} fail-over took {took:.1f} s, bound {FAILOVER_BOUNDS[what]:.0f} s")
        if any(c.eligible for c in cluster.client.ledger.cards() if c.node == "n1"):
            problems.append("a card of the down node still takes jobs")
        finals = sc.finish(timeout=120)
        for jid in on_n1:
            job = finals.get(jid)
            if job and not (job.attempts and job.attempts[0].get("outcome") == "lost"
                            and job.attempts[0].get("node") == "n1" and job.node == "n2"):
                problems.append(f"job {jid} (on n1): attempts {[(a.get('node'), a.get('outcome')) for a in job.attempts]}"
                                f", now on {job.node}")
        for jid in later:
            if jid in finals and finals[jid].node != "n2":
                problems.append(f"job {jid} submitted after the loss ran on {finals[jid].node}")

        rejoined_at = time.monotonic()
        n1.up(beat=True)
        _wait(lambda: _node(cluster, "n1").state == "up"
              and all(c.eligible for c in cluster.client.ledger.cards() if c.node == "n1"),
              30, "n1 to rejoin with its cards eligible")
        notes.append(f"rejoined (cards eligible) {time.monotonic() - rejoined_at:.1f} s after its rig up")
        # 50G fits only n1's 76G cards: taking them proves it is back in placement.
        big = [sc.submit(body=f"sleep 0.2; {DONE}", gpu_memory="50G") for _ in range(2)]
        for jid in big:
            try:
                finals[jid] = cluster.client.wait(jid, timeout=60)
            except TimeoutError:
                pass
            else:
                if finals[jid].node != "n1":
                    problems.append(f"job {jid} (50G) ran on {finals[jid].node}")
        HealthChecker(n1.settings, n1.redis).run_once()
        sc.count(finals)
        if {j.state for j in finals.values()} != {JobState.SUCCEEDED}:
            problems.append(f"states: {sorted(j.state.value for j in finals.values())}")
        done = _done_lines(sc.trace)
        ran_twice = {jid: n for jid, n in done.items() if n != 1}
        missing = [jid for jid, j in finals.items() if j.state is JobState.SUCCEEDED and jid not in done]
        if ran_twice or missing:
            problems.append(f"ran to the end more or less than once: {ran_twice}, never: {missing}")
        return sc.result
    finally:
        cluster.cleanup()


SCENARIOS: list[tuple[str, Callable[[Path], ScenarioResult]]] = [
    ("sigkill-worker", sigkill_card_worker),
    ("sigkill-worker-stays-dead", lambda w: sigkill_card_worker(w, restarted=False)),
    ("redis-restart", redis_killed_and_restarted),
    ("beats", beats_killed_and_doubled),
    ("client-kill", broker_connections_dropped),
    ("double-fork", double_fork),
    ("failure-classes", failure_classes),
    ("random-failures", random_failures),
    ("node-lost", node_lost),
]


# -- helpers -----------------------------------------------------------------------------------
def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.1)


def _leader(cluster: RigCluster) -> str | None:
    """The node whose dispatcher holds the leader lock (its identity is node:pid:random)."""
    value = cluster.redis.get(cluster.keys.sched_leader)
    return value.split(":", 1)[0] if value else None


def _beat_locked(node: RigHarness) -> bool:
    """Has this node's beat acquired celery-redbeat's lock?"""
    path = node.settings.rig_log_dir / "beat.log"
    return path.exists() and "beat: Acquired lock" in path.read_text(errors="replace")


def _beat_sends(node: RigHarness) -> int:
    path = node.settings.rig_log_dir / "beat.log"
    return path.read_text(errors="replace").count("Sending due task") if path.exists() else 0


def _node(cluster: RigCluster, name: str):  # noqa: ANN202 - rig.nodes.NodeInfo
    return next(n for n in NodeRegistry(cluster.redis, cluster.keys).read() if n.name == name)


def _done_lines(trace: Path) -> dict[int, int]:
    """Job id -> how many of its attempts ran their body to the end ("done" lines)."""
    counts: dict[int, int] = defaultdict(int)
    if trace.exists():
        for line in trace.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2] == "done":
                counts[int(parts[0])] += 1
    return dict(counts)


def _heartbeat_pid(node: RigHarness, name: str) -> int | None:
    try:
        return node.worker_pid(name)
    except (LookupError, redis.RedisError):
        return None


def _private_redis(workdir: Path, url: str | None = None) -> tuple[str, subprocess.Popen]:
    """A redis-server of this scenario's own (AOF in workdir/redis-data), at ``url`` or on a
    free loopback port: (its URL, the process)."""
    from rig.redis_server import start_private_redis

    url = url or f"redis://127.0.0.1:{_free_port()}/0"
    return url, start_private_redis(url, workdir / "redis-data", workdir / "redis.log")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sends_since(log_file: Path, since: float) -> int:
    """Lines in a beat log that sent a periodic task at or after ``since`` (epoch seconds)."""
    if not log_file.exists():
        return 0
    count = 0
    for line in log_file.read_text(errors="replace").splitlines():
        if "Sending due task" not in line or not line.startswith("["):
            continue
        stamp = line[1:24]
        try:
            when = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S"))
        except ValueError:
            continue
        if when >= int(since):
            count += 1
    return count


def run_all(names: list[str] | None = None, root: Path | None = None) -> list[ScenarioResult]:
    root = root or Path(tempfile.mkdtemp(prefix="rig-faults-"))
    results = []
    for name, fn in SCENARIOS:
        if names and name not in names:
            continue
        results.append(fn(root / name))
    return results


def table(results: list[ScenarioResult]) -> str:
    head = ("scenario", "jobs", "faults", "lost", "duplicated", "leaked", "orphans", "seconds", "ok")
    rows = [head] + [(r.name, str(r.jobs), r.faults, str(r.lost), str(r.duplicated), str(r.leaked),
                      str(r.orphans), f"{r.seconds:.1f}", "yes" if r.ok else "NO") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in results:
        for problem in r.problems:
            lines.append(f"  {r.name}: {problem}")
        for note in r.notes:
            lines.append(f"  {r.name}: {note}")
    return "\n".join(lines)


def as_json(results: list[ScenarioResult]) -> str:
    return json.dumps([r.__dict__ for r in results], indent=2)
