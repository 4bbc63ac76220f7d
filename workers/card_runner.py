"""The per-card runner: starts a job's process tree on this card, watches it, ends it, and
gives its reservation back whatever way it ends.

One Celery worker process serves one card. The dispatcher's reservation pushes each start onto
the card's start list in Redis (workers.start_list); this runner's consumer takes it and runs
``run_job`` on a thread of its own, which blocks until the job ends: no Celery message per
start. Flower shows the job itself, from the job's moves (workers/flower_bridge.py). When the
worker shuts down, the jobs keep running (they live in their own sessions); the next worker of
this card adopts them on start (``adopt``) and learns their exit status from the file the
wrapper writes.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis
from redis.client import Pipeline

from rig import job_env as jobenv
from rig import jobtrace, logkeeper, logspace
from rig import records as R
from rig.clock import event_time, monotonic_of, shared_now
from rig.config import Settings
from rig.draining import card_is_gone, card_open, send_back_unstarted
from rig.errors import JobNotFound
from rig.failures import FailureClass
from rig.gpus import GpuBackend, GpuReadError, GpuReading
from rig.gpus.fake import drop_job_usage_dir, job_usage_dir
from rig.installation import Installation, verdict
from rig.installation import matches as installation_matches
from rig.keys import Keys
from rig.ledger import Ledger
from rig.logs import AttemptFiles, enforce_size_cap, job_folder
from rig.models import Job, JobState, new_job_instance
from rig.redis_conn import connect, without_credentials
from rig.redis_writes import is_outage, refusal
from rig.replication import replica_wait
from rig.store import JobStore
from rig.supervision import beat_supervisor
from workers.attempt_locate import carries_attempt, job_folders, locate
from workers.card_keeper import CardKeeper, ForeignKeeper, KeptLog, job_fds
from workers.log_space import (
    LogSpaceGuard,
    NotStarted,
    prepare_attempt,
    remove_attempt_files,
    write_pid_file,
)
from workers.outcomes import AttemptEnd, conclude, never_started
from workers.process_tree import (
    ExitWatcher,
    describe_survivor,
    holds_file,
    is_alive,
    is_job_process,
    job_leftovers,
    leads_session,
    pids_with_environ,
    pids_words,
    proc_start_time,
    session_is_ours,
    session_members,
    stop_tree,
    stopped_sessions,
    wrapper_argv,
)
from workers.run_as import RunAs, RunAsRefused
from workers.run_as import decide as decide_run_as
from workers.start_list import StartConsumer, StartList, entry
from workers.unrecorded import mark_lost_ending

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How often a running job's record is checked for a kill request, as a fallback to pub/sub (s).
CANCEL_POLL_S = 2.0
#: How often a running job's log size is checked against log_max_bytes (s), when it has no
#: log keeper (rig.logkeeper could not start): the fallback only.
LOG_CAP_POLL_S = 5.0
#: Exit codes of a wrapper ended by SIGTERM or SIGKILL (128 + n), as rig kill's signals leave it.
KILLED_CODES = frozenset({128 + 15, 128 + 9})
#: How long a job's end waits for its log keeper to write the last output (s).
KEEPER_WAIT_S = 10.0
#: How often an adopted job's end looks whether its keeper still holds the log open (s).
KEEPER_POLL_S = 0.02
#: The most of an exit file that is read (bytes): it holds one number.
EXIT_FILE_MAX_BYTES = 64
#: A job whose every process is found stopped (state T: ``kill -STOP``, Ctrl-Z, a debugger) at
#: this many ticks in a row (telemetry_interval s apart) is marked paused (Job.paused_since).
PAUSED_AFTER_TICKS = 3


@dataclass
class ActiveJob:
    job_id: int
    token: str
    attempt: int
    pid: int
    proc_start: int | None
    exit_file: Path
    popen: subprocess.Popen | None = None
    kill_event: threading.Event = field(default_factory=threading.Event)
    started_at: float = field(default_factory=time.time)
    #: time.monotonic() at its start (adopted: derived from the record's started_at) and at its
    #: end: the time limit and the runtime are measured on it, never on the wall clock.
    started_mono: float = field(default_factory=time.monotonic)
    ended_mono: float | None = None
    time_limit: float | None = None
    timed_out: bool = False
    overused: int = 0  # bytes, when rig stopped it for using more than it declared
    log_path: Path | None = None
    #: The job's output pipe as this worker holds it (workers.card_keeper: its keeper, restarted
    #: when it dies); None when adopted, or when the job writes its log directly.
    kept: KeptLog | None = None
    #: An adopted job's keeper, from the attempt's pid file (None: no keeper).
    keeper_pid: int | None = None
    keeper_start: int | None = None
    #: An adopted job's keeper died while the job still ran (this worker holds no end of its
    #: output to hand to another): its writes fail from then on, through no fault of its own.
    keeper_lost: bool = False
    #: ... or was found dead as the job's end was seen (which came first is not known then).
    keeper_dead_at_end: bool = False
    #: The worker's log said its log was deleted while it ran (said once).
    log_deleted_said: bool = False
    #: The job's instance (Job.instance): its ending is written only to the record of that
    #: job, never to a later job that reuses the id (after Redis lost its data).
    instance: str | None = None
    #: Ticks in a row its every process was found stopped, and when the first of them was
    #: (shared clock, epoch s; None while it runs): see CardRunner._note_paused.
    stopped_ticks: int = 0
    stopped_since: float | None = None
    #: Whether Job.paused_since is written: None at first (an adopted job's may be, by the
    #: worker before), so the first tick that finds it running clears it.
    paused_written: bool | None = None

    @property
    def pid_file(self) -> Path:
        return self.exit_file.with_suffix(".pid")

    @property
    def has_keeper(self) -> bool:
        """Does a log keeper write its log (else the worker caps it by polling)?"""
        return self.kept is not None or self.keeper_pid is not None


@dataclass
class Gathered:
    """How an attempt ended, as this node saw it (exit status, its own kill, time limit, log
    note), before the record's kill request is weighed: the ending reads the record once
    (``CardRunner._finish``, with the installation), and the request with it, so an ending
    has no round trip of its own for the request."""

    exit_code: int | None
    killed_here: bool  # this worker acted on a kill request (it stopped the tree)
    timed_out: bool = False
    overused: int = 0
    note: str = ""  # the log's note (rig.logspace), if any
    ended_at: float | None = None
    runtime: float | None = None
    where: str = ""  # words about where it ran (adoption: files another host holds)
    #: INFRASTRUCTURE when its log keeper died under it and the job then failed (rig's fault).
    failure: FailureClass | None = None
    #: Its processes that outlived SIGKILL (stuck in the kernel, state D), pid -> start time
    #: (clock ticks since boot: a pid taken by another process meanwhile is told apart): its
    #: cards stay reserved until they are gone (CardRunner._await_gone).
    survivors: dict[int, int] = field(default_factory=dict)

    def end(self, kill_requested: bool, cancelled_by: str | None) -> AttemptEnd:
        """The attempt's ending, given the record's ``cancel_requested`` and ``cancelled_by``.
        A kill asked for but never acted on here counts only if the job did not end by itself:
        one that exited with its own code before the kill reached it keeps that ending (it ran
        to completion: "CANCELLED, exit 0" would be false). No exit status, not killed and
        not timed out: it ended while no worker watched it (lost)."""
        rc = self.exit_code
        cancelled = self.killed_here or (kill_requested and (rc is None or rc in KILLED_CODES))
        if rc is None and not (cancelled or self.timed_out):
            lost = "it ended while no worker watched it; exit status unknown"
            return AttemptEnd(exit_code=None, lost=True, ended_at=self.ended_at,
                              note="; ".join(x for x in (self.where, lost, self.note) if x))
        return AttemptEnd(exit_code=rc, cancelled=cancelled, timed_out=self.timed_out, cancelled_by=cancelled_by,
                          overused=self.overused, note="; ".join(x for x in (self.where, self.note) if x),
                          ended_at=self.ended_at, runtime=self.runtime,
                          failure=self.failure if rc not in (0, None) else None)


#: Under Sentinel: how many times a claim or an ending that fail-overs lost is written again.
LOST_WRITE_TRIES = 5
#: A claim's answer, (won, attempt or the job's state), and with a won claim what was read in
#: its round trip: (the record's hash, its spec, the card's [allowed, gone]).
Claimed = tuple[tuple[bool, str], tuple[dict, str | None, list] | None]


class CardRunner:
    """Runs the jobs of one card (``node``/``index``) for one worker process."""

    def __init__(
        self,
        settings: Settings,
        node: str,
        index: int,
        worker_name: str,
        backend: GpuBackend | None = None,
        may_take: Callable[[], bool] | None = None,
    ) -> None:
        """``may_take``: False while this worker must leave the card's starts to another (the
        node name is another rig up's now); asked before each take."""
        self.settings = settings
        self.node = node
        self.index = index
        self.worker_name = worker_name
        self.backend = backend
        self.keys = Keys(settings.key_prefix)
        self.r = connect(settings.redis_url)
        self.store = JobStore(self.r, self.keys)
        self.ledger = Ledger(self.r, self.keys,
                             usage_half_life_s=settings.fair_share_half_life_hours * 3600)
        #: Under Sentinel: a claim and an ending count once a replica has them (rig.replication).
        self.replicas = replica_wait(self.r, self.keys, settings.redis_url, settings.replica_wait_seconds)
        self.shutdown = threading.Event()
        #: This card's starts (workers.start_list), taken by ``consumer`` once services start.
        self.starts = StartList(self.r, self.keys, node, index, self.ledger.scripts)
        self.consumer = StartConsumer(self.starts, self.run_job, slots=settings.max_task_per_gpu,
                                      shutdown=self.shutdown, may_take=may_take)
        self._active: dict[int, ActiveJob] = {}
        #: Jobs this process is claiming or starting (job id -> threads doing so): adoption must
        #: leave them alone. A count, not a set: a job's next attempt can be claimed on this card
        #: by another thread while the thread of its last one is still ending, and that ending
        #: must not take the new one out (CI, under load: adoption then sent the new attempt
        #: back as "never started" while it ran, and the attempt ran twice).
        self._starting: dict[int, int] = {}
        #: Adopted jobs that ended, whose endings wait in a thread of their own for processes of
        #: theirs that outlived SIGKILL (_finish_when_gone): adoption leaves them alone too.
        self._ending: set[int] = set()
        #: Held by the adoption pass that runs (adopt): one at a time. The tick loop's first audit
        #: came health.check_interval after start, while the startup pass still stopped a job's
        #: leftovers (4 s and more): both ended the job, and each waited for its stuck processes.
        self._adopting = threading.Lock()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: The card's log keeper (every job's log), restarted at once when it dies.
        self._keepers = CardKeeper(sys.executable, self._keeper_env, what=f"card {node}/{index}")
        #: Takes this card out of placement while the node cannot write logs (issue 11.3).
        self.log_space = LogSpaceGuard(self.ledger, node, index, [settings.job_log_dir, settings.run_dir],
                                       settings.log_min_free_bytes)

    # -- lifecycle ------------------------------------------------------------------------
    def start_services(self) -> None:
        """Heartbeat + card readings, the kill listener, adoption of orphaned jobs, then the
        taking of starts from the card's start list."""
        for target, name in ((self._tick_loop, "tick"), (self._kill_listener, "kill-listener")):
            thread = threading.Thread(target=target, name=f"rig-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        try:
            self._keepers.server()  # started now, not on the first job's path
        except OSError as exc:
            log.warning("the card's log keeper did not start (%s); each job gets a keeper of its own", exc)
        self._retry_redis(self.adopt, "adopt running jobs")
        self.consumer.start()

    def stop(self) -> None:
        """Leave running jobs running; their supervisors return at once. The card's log keeper
        takes no new logs; it copies those of the running jobs to their end, then exits."""
        self.shutdown.set()
        with self._lock:
            busy = bool(self._active or self._starting)
        self._keepers.close(wait=0.0 if busy else 5.0)

    def active_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._active)

    # -- one job --------------------------------------------------------------------------
    def run_job(self, job_id: int, token: str,
                release: Callable[[Pipeline | None], None] | None = None) -> str:
        """Claim, start, supervise and end one job. Returns what happened, for the log.

        ``release`` removes the start from the card's taking list (workers.start_list) once its
        claim is answered (won or refused): given a pipeline, it queues its command there (the
        round trip that reads the record after the claim). Not called when no claim was
        answered (shutting down, Redis away): the start stays taken and goes back to the list.
        """
        with self._lock:
            self._starting[job_id] = self._starting.get(job_id, 0) + 1
        try:
            return self._run_job(job_id, token, release or (lambda _pipe=None: None))
        finally:
            with self._lock:
                left = self._starting.pop(job_id) - 1
                if left:
                    self._starting[job_id] = left

    def _run_job(self, job_id: int, token: str, release: Callable[[Pipeline | None], None]) -> str:
        try:
            # A claim Redis refused (full, read-only) changed nothing: wait for it, then claim.
            claimed = self._claim(job_id, token, release)
        except redis.ResponseError as exc:
            # The claim script could not use the record (e.g. its attempt count is not a
            # number): end the job with the reason instead of failing this start for ever.
            job = self.store.get(job_id)
            reason = job.invalid_reason or f"invalid record: the claim failed: {exc}"
            self._release_quietly(job_id, release)
            return self._refuse(job_id, str(token), reason, "invalid_record", expect=JobState.ASSIGNED)
        if claimed is None:
            return "ignored:shutting-down"  # never claimed: its start stays taken (workers.start_list)
        (ok, detail), read = claimed
        jobtrace.mark(job_id, "claimed")
        if detail == "installation-mismatch":
            # Another installation answers at rig's Redis (rig.installation): never claim or
            # run its jobs on cards this node's own jobs may still use. Its start is pushed
            # again (adopt) once this node has joined it (`rig recover`).
            log.error("job %s: start ignored: this node's Redis is not its installation", job_id)
            return "ignored:installation-mismatch"
        if not ok or read is None:
            log.info("job %s: start ignored, job is %s (duplicate or stale start)", job_id, detail)
            return f"ignored:{detail}"
        attempt = int(detail)
        raw, spec, (allowed, gone) = read
        raw = self.store.join([(raw, spec)])[0]
        if not raw:
            raise JobNotFound(job_id)
        job = self._with_instance(Job.from_redis(raw))
        jobtrace.mark(job_id, "read")
        if job.problems or job.id != job_id:
            # Nothing of a damaged or hostile record is used: not its command, env or folder.
            reason = job.invalid_reason or f"invalid record: field id: {job.id}, not {job_id}"
            return self._refuse(job_id, str(token), reason, "invalid_record")
        running = self._running_copy(job, attempt)
        if running is None and job.cancel_requested:
            # Killed between its placement and this claim: it never starts.
            log.info("job %s: kill requested before it started; not starting it", job_id)
            end = AttemptEnd(exit_code=None, cancelled=True, cancelled_by=self.r.hget(self.keys.job(job_id), "cancelled_by"),
                             note="killed before it started")
            state = self._finish(job_id, str(token), end, instance=job.instance)
            return state.value if state else "unknown"
        if running is not None:
            # Redis lost the record of an earlier start (a crash within its fsync window):
            # the job already runs here, so watch that copy instead of starting a second one.
            log.warning("job %s: a copy already runs as pid %s; adopting it, not starting another",
                        job_id, running.pid)
            self.store.update(job_id, pid=running.pid, proc_start=running.proc_start,
                              attempt=running.attempt)
            running.token = str(token)
            return self._supervise(running)
        files = self._files(job, attempt)
        if files.log.exists():
            # This very attempt of this very job (its folder carries the job's instance, so
            # never another job that reused the id) already started here: Redis lost its
            # ending (a crash within the AOF fsync window). Conclude it from what it left
            # instead of running it again.
            exit_file = files.exit
            log.warning("job %s: attempt %s already ran on this node; concluding it, not re-running",
                        job_id, attempt)
            log_file = str(files.log)
            fields: dict[str, object] = {}
            if log_file not in job.log_paths:
                fields["log_paths"] = [*job.log_paths, log_file]
            # The claim just stamped started_at "now"; the attempt really started when its pid
            # file was written (just after its process), and its end comes from the exit file.
            started = _file_time(self.r, files.pid) or _file_time(self.r, files.started)
            ended = _file_time(self.r, files.exit)
            if started is not None and ended is not None:
                # The worker writes the pid file after Popen returns: a short job may have
                # ended by then (seen under load: 4 ms after the exit file).
                started = min(started, ended)
            if started is not None:
                fields["started_at"] = started
            if fields:
                self.store.update(job_id, **fields)
            end = self._outcome(ActiveJob(job_id, str(token), attempt, 0, None, exit_file))
            if end.survivors and not self._await_gone(job_id, str(token), end.survivors):
                return "detached"
            state = self._finish(job_id, str(token), end, instance=job.instance)
            return state.value if state else "unknown"
        if not card_open(allowed, gone):  # read with the record, just after the claim
            # Placed before the card left the whitelist or the node: it has not started, so it
            # goes back to its place in the queue (rig.draining); running ones are unaffected.
            log.warning("job %s: this card takes no new jobs any more; sending it back to the queue", job_id)
            self._retry_redis(lambda: send_back_unstarted(self.ledger, job, self.node, self.index),
                              f"requeue job {job_id}")
            return "requeued:card-closed"
        try:
            jobtrace.mark(job_id, "checked")
            active = self._launch(job, token, attempt)
        except NotStarted as exc:
            return self._not_started(job, str(token), attempt, exc)
        except Exception as exc:  # noqa: BLE001 - one job's start must never take the worker down
            if is_outage(exc):
                raise  # Redis away or refusing writes: adoption sorts this start out once it is back
            log.exception("job %s: could not be started", job_id)
            return self._refuse(job_id, str(token), f"rig could not start it: {type(exc).__name__}: {exc}",
                                "start_error")
        if active is None:
            return "failed-to-start"
        return self._supervise(active)

    def _release_quietly(self, job_id: int, release: Callable[[Pipeline | None], None]) -> None:
        """Remove a start whose claim was answered; a Redis error leaves it taken, to come back
        (workers.start_list: recovered, then refused by the claim's fence)."""
        try:
            release(None)
        except redis.RedisError as exc:
            log.warning("job %s: its start stays taken for now (%s)", job_id, exc)

    def _claim(self, job_id: int, token: str, release: Callable[[Pipeline | None], None]) -> Claimed | None:
        """The claim and what a start reads after it, made to survive a Redis fail-over before
        the job's process starts: under Sentinel the claim counts once a replica has it
        (rig.replication); a claim the fail-over lost (the new master's record is not RUNNING
        with this token and attempt) is tried again there, where it wins only if the job is
        still ASSIGNED to this token."""
        installation = Installation(self.r, self.keys, self.settings.run_dir, self.node).on_node()
        for _ in range(LOST_WRITE_TRIES):
            claimed = self._retry_redis(lambda: self._claim_and_read(job_id, token, installation, release),
                                        f"claim job {job_id}", only=refusal)
            if claimed is None or not claimed[0][0] or self.replicas is None:
                return claimed
            if not self._retry_redis(self.replicas.confirm, f"confirm job {job_id}'s start"):
                log.warning("job %s: %s", job_id, self.replicas.unconfirmed_note("its start"))
            if self._holds(job_id, token, attempt=claimed[0][1]):
                return claimed
            log.warning("job %s: its claim is not on the Redis master any more (a fail-over lost it); "
                        "claiming again", job_id)
        # Fail-overs in a row: not started now; a start still ASSIGNED is pushed again (adopt, assigned_timeout).
        return (False, "claim-lost"), None

    def _claim_and_read(self, job_id: int, token: str, installation: str | None,
                        release: Callable[[Pipeline | None], None]) -> Claimed:
        """One round trip: the claim (claim.lua, which also checks the installation), the
        record and the card's ``allowed``/``gone`` as they are after it, and the start's removal
        from the taking list (its claim is answered either way). The reads are None when the
        claim was refused."""
        for _ in range(2):
            pipe = self.r.pipeline(transaction=False)
            self.ledger.queue_claim(pipe, job_id, token, self.worker_name, installation)
            self.store.queue_raw(pipe, job_id)
            pipe.hmget(self.keys.card(self.node, self.index), "allowed", "gone")
            release(pipe)
            try:
                answer, raw, spec, card = pipe.execute()[:4]
            except redis.exceptions.NoScriptError:
                self.ledger.load_scripts()  # Redis restarted since they were loaded
                continue
            claimed = self.ledger.claim_answer(answer)
            return claimed, ((raw, spec, card) if claimed[0] else None)
        raise redis.exceptions.NoScriptError(f"the claim script could not be loaded for job {job_id}")

    def _holds(self, job_id: int, token: str, *, attempt: str | None = None) -> bool:
        """True while the master's record says this worker runs this attempt (token) of the job."""
        state, assignments, now_attempt, worker = self._retry_redis(
            lambda: self.r.hmget(self.keys.job(job_id), "state", "assignments", "attempt", "worker"),
            f"read job {job_id}") or (None, None, None, None)
        return (state == JobState.RUNNING.value and assignments == str(token) and worker == self.worker_name
                and (attempt is None or now_attempt == attempt))

    def _refuse(self, job_id: int, token: str, reason: str, failure: str,
                expect: JobState = JobState.RUNNING) -> str:
        """End a job this worker will not run: FAILED into the error queue, not retried (the
        same record would fail the same way), with ``reason``; this card's reservation is
        given back even if the record's card list is unreadable."""
        log.error("job %s: not started: %s", job_id, reason)

        def _do() -> None:
            fields: dict = {"reason": reason, "failure": failure}
            job = self.store.get(job_id)
            if not job.problems and job.attempt:
                fields["attempts"] = [*job.attempts, never_started(job, failure, reason)]
            self.ledger.transition(job_id, JobState.FAILED, token=token, expect=expect, error_queue=True,
                                   fields=fields)
            self.ledger.reclaim(self.node, self.index, job_id)
            self.r.lpush(self.keys.sched_wake, "1")

        self._retry_redis(_do, f"end job {job_id}")
        return "failed-to-start"

    def _not_started(self, job: Job, token: str, attempt: int, exc: NotStarted) -> str:
        """An attempt whose files could not be made never ran. Disk trouble: the card is taken
        out of placement (the guard) and the job goes back to its place in the queue with its
        attempt not counted. Anything else: refused as a start error (the job never ran)."""
        remove_attempt_files(self._files(job, attempt))
        if not logspace.is_disk_error(exc.error):
            return self._refuse(job.id, token, f"rig could not start it: {exc}", "start_error")
        problem = self.log_space.trip(self.settings.job_log_dir, exc.error)

        def _do() -> None:
            self.ledger.transition(
                job.id, JobState.PENDING, token=token, expect=JobState.RUNNING,
                fields={"attempt": max(0, attempt - 1),
                        "reason": f"requeued, it never started: node {self.node} {problem}"})
            self.r.lpush(self.keys.sched_wake, "1")

        self._retry_redis(_do, f"requeue job {job.id}")
        return "requeued:not-started"

    def _files(self, job: Job, attempt: int) -> AttemptFiles:
        """The files of ``attempt`` of ``job`` on this node (rig.logs.job_folder)."""
        return AttemptFiles(job_folder(self.settings.job_log_dir, job.id, job.instance), attempt)

    def _with_instance(self, job: Job) -> Job:
        """``job``, with an instance recorded if its record predates them (set once, HSETNX,
        so every worker agrees on it)."""
        if job.instance or job.problems:
            return job
        self.r.hsetnx(self.keys.job(job.id), "instance", new_job_instance())
        return self.store.get(job.id)

    def _launch(self, job: Job, token: str, attempt: int) -> ActiveJob | None:
        """Start one attempt. Raises NotStarted (nothing runs) when its files cannot be made;
        once its process exists, no error of rig's own ends the attempt: it is supervised."""
        files = self._files(job, attempt)
        log_path = files.log
        exit_file = files.exit
        log_paths = [*job.log_paths, str(log_path)]
        try:
            run_as = decide_run_as(job.user, job.uid, worker_uid=os.geteuid(),
                                   allow_root_jobs=self.settings.allow_root_jobs)
        except RunAsRefused as exc:
            try:
                files.folder.mkdir(parents=True, exist_ok=True)
                with open(log_path, "ab") as logf:
                    logf.write(f"rig: not started: {exc}\n".encode())
                self.store.update(job.id, log_path=str(log_path), log_paths=log_paths)
            except OSError:
                pass  # the reason is in the record all the same
            self._refuse(job.id, token, f"not started: {exc}", "run_as_refused")
            return None
        env = self._job_env(job, attempt, exit_file, run_as)
        # The argv goes to the wrapper as its positional parameters, never into its script.
        argv = wrapper_argv(job.command)
        # Every file of the attempt is made (and allocated) before its process exists: a full
        # disk is met while nothing runs (issue 11.3). The exit file is opened here, by the
        # worker, and handed to the wrapper as its stdin (RIG_EXIT_FD=0): a job running as its
        # submitter may not be able to open that path.
        exit_fd = prepare_attempt(files)
        try:
            with open(log_path, "ab", buffering=0) as logf:
                if run_as is not None:
                    os.fchown(logf.fileno(), run_as.uid, run_as.gid)  # theirs to read
                    os.fchmod(logf.fileno(), 0o600)  # and nobody else's (rig log goes through the gateway)
                # The job writes into a pipe read by its log keeper (rig.logkeeper), which
                # keeps the log within log_max_bytes at any rate; without one, straight to the
                # file, capped by polling.
                kept, job_out = self._keepers.open(log_path, self.settings.log_max_bytes)
                jobtrace.mark(job.id, "keeper")
                forked = time.monotonic()  # its start, for the time limit (and job_leftovers)
                try:
                    popen = subprocess.Popen(
                        argv, cwd=job.workdir, env=env, stdin=exit_fd, stdout=job_out if kept else logf,
                        stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                        pass_fds=job_fds(kept),  # its pipe's reader of last resort (card_keeper)
                        umask=-1 if job.umask is None else job.umask,  # its submitter's (-1: the worker's)
                        **(run_as.popen_args() if run_as is not None else {}),  # type: ignore[arg-type]
                    )
                except (OSError, ValueError, subprocess.SubprocessError) as exc:
                    detail = getattr(exc, "strerror", None) or exc
                    as_whom = f" as {run_as.user}" if run_as is not None else ""
                    message = f"rig: could not start the job in {job.workdir}{as_whom}: {exc}\n"
                    try:
                        logf.write(message.encode())
                    except OSError:
                        pass  # the note below says it
                    self.store.update(job.id, log_path=str(log_path), log_paths=log_paths)
                    if kept is not None:
                        self._keepers.release(kept)
                    self._finish(job.id, token, instance=job.instance, end=AttemptEnd(
                        exit_code=126, note=f"could not start in {job.workdir}{as_whom}: {detail}",
                        failure=FailureClass.START_FAILED))
                    return None
                finally:
                    if kept is not None:
                        os.close(job_out)  # the job holds it now; the keeper ends at its EOF
        finally:
            os.close(exit_fd)
        # From here on the job runs: whatever fails below, it is supervised and concluded as
        # started (never refused as "could not start" while it runs).
        jobtrace.mark(job.id, "popen")
        start = proc_start_time(popen.pid)
        # Written before anything else: the node's own record that this attempt runs (over the
        # allocated file: needs no new space); again whenever its log keeper is replaced.
        if kept is not None:
            self._keepers.follow(kept, lambda k: write_pid_file(
                files, f"{popen.pid} {start} {attempt} {k.keeper_pid or 0} {k.keeper_start or 0}\n"))
        else:
            write_pid_file(files, f"{popen.pid} {start} {attempt} 0 0\n")
        try:
            self.store.update(
                job.id, pid=popen.pid, proc_start=start, log_path=str(log_path), log_paths=log_paths,
                cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"],
            )
        except (redis.ConnectionError, redis.TimeoutError):
            raise  # Redis away: adoption finds the job by its environment once it is back
        except redis.RedisError as exc:
            log.error("job %s: started, but its pid could not be recorded (%s); supervising it", job.id, exc)
        jobtrace.mark(job.id, "recorded")
        log.info("job %s attempt %s: started pid %s on %s/%s (CUDA_VISIBLE_DEVICES=%s)",
                 job.id, attempt, popen.pid, self.node, job.cards, env["CUDA_VISIBLE_DEVICES"])
        return ActiveJob(job.id, str(token), attempt, popen.pid, start, exit_file, popen, instance=job.instance,
                         time_limit=job.time_limit, started_mono=forked, log_path=log_path, kept=kept)

    def _keeper_env(self, what: str) -> dict[str, str]:
        return {logkeeper.MARK: what, "PATH": jobenv.DEFAULT_PATH, **jobtrace.environ()}

    def _keeper_server(self) -> logkeeper.KeeperServer:
        """The card's log keeper, started if need be (workers.card_keeper)."""
        return self._keepers.server()

    def _job_env(self, job: Job, attempt: int, exit_file: Path, run_as: RunAs | None = None) -> dict[str, str]:
        """The job's environment (rig.job_env): a minimal base for the user it runs as, the
        variables its record carries (the submitter's passed-on ones and --env), then rig's
        own. Nothing of this worker's environment (the operator's shell at `rig up`)."""
        if run_as is not None:
            identity = jobenv.base(run_as.user, run_as.home, _login_shell(run_as.uid))
        else:
            identity = jobenv.current_base()
        rig_vars = {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in job.cards),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "RIG_JOB_ID": str(job.id),
            # The job's identity: its id alone is reused when Redis loses its data.
            "RIG_JOB_INSTANCE": job.instance or "",
            # The installation it runs under (rig.installation): which Redis may account for it.
            "RIG_INSTALLATION": Installation(self.r, self.keys, self.settings.run_dir, self.node).on_node() or "",
            "RIG_JOB_NAME": job.name,
            "RIG_ATTEMPT": str(attempt),
            "RIG_EXIT_FILE": str(exit_file),
            "RIG_EXIT_FD": "0",
            # So a job can call rig (rig log, @rig.task .delay) against this installation: a job
            # of another user than this worker's through the gateway, as itself, without Redis'
            # password (rig.gateway); one of the worker's own user (who can read the password
            # file anyway) straight to Redis.
            "RIG_REDIS_URL": self.settings.redis_url if _holds_password(run_as) else without_credentials(self.settings.redis_url),
            "RIG_KEY_PREFIX": self.settings.key_prefix,
            # Which node's job this is: a node's orphan check stops only its own (health.py).
            "RIG_NODE_NAME": self.node,
        }
        if self.settings.gateway_socket is not None:
            rig_vars["RIG_GATEWAY_SOCKET"] = str(self.settings.gateway_socket)
        usage_dir = getattr(self.backend, "usage_dir", None)
        if usage_dir is not None:  # fake cards: jobs may "use" memory
            if run_as is not None:  # another user cannot write the shared folder: one of its own
                try:
                    usage_dir = job_usage_dir(self.backend.jobs_dir, job.id, run_as.uid, run_as.gid)
                except OSError as exc:
                    log.warning("job %s: no fake-card usage folder of its own (%s); it cannot use fake "
                                "memory", job.id, exc)
            rig_vars["RIG_FAKE_GPU_DIR"] = str(usage_dir)
        return jobenv.compose(job.env, identity=identity, rig_vars=rig_vars)

    def _supervise(self, active: ActiveJob) -> str:
        with self._lock:
            self._active[active.job_id] = active
        watcher = ExitWatcher(active.pid)
        self._take_log(active)
        # Without one, that keeper's death is only watched, to say whose fault what follows is.
        keeper = (ExitWatcher(active.keeper_pid) if active.kept is None and active.keeper_pid
                  and is_alive(active.keeper_pid, active.keeper_start) else None)
        if keeper is None and active.kept is None and active.keeper_pid:
            # That keeper died before it could be watched (between the first try and here):
            # its death would never be seen, so the log is taken now.
            self._take_log(active)
        next_poll = 0.0
        next_cap = time.monotonic() + LOG_CAP_POLL_S
        log_file = _inode(active.log_path)  # a log deleted under the job is said when seen
        try:
            while True:
                if watcher.wait(0.1):
                    break
                if keeper is not None and keeper.wait(0) and not watcher.wait(0):
                    # Dead while the job runs (it ends only after the job's output ends).
                    keeper.close()
                    keeper = None
                    if self._take_log(active):  # the log goes to a keeper of this worker's
                        continue
                    active.keeper_lost = True
                    log.error("job %s: its log keeper (pid %s) died while it ran; this worker (which adopted it) "
                              "could take no end of its output: its writes wait on its wrapper's read end, or fail "
                              "(started by an older rig; rig's fault, not the job's)", active.job_id, active.keeper_pid)
                if self.shutdown.is_set():
                    log.info("job %s: worker stopping; the job keeps running and will be adopted",
                             active.job_id)
                    return "detached"
                now = time.monotonic()
                if not active.kill_event.is_set() and now >= next_poll:
                    next_poll = now + CANCEL_POLL_S
                    try:
                        flags = self.r.hmget(self.keys.job(active.job_id), "cancel_requested", "overuse_stop")
                        if flags[0] == "1":
                            active.kill_event.set()
                        elif flags[1] and not active.overused:
                            active.overused = int(flags[1])
                            log.warning("job %s: over its declaration (%s bytes); stopping it "
                                        "(overuse_policy = stop)", active.job_id, flags[1])
                            stop_tree(active.pid, self.settings.kill_grace_seconds,
                                      reap=lambda: _reap(active))
                    except redis.RedisError:
                        pass  # Redis away: keep watching the process
                if now >= next_cap and active.log_path is not None:
                    next_cap = now + LOG_CAP_POLL_S
                    if not active.has_keeper:
                        _cap_quietly(active, self.settings.log_max_bytes)
                    current = _inode(active.log_path)
                    # The attempt's folder is made before the job starts: gone, it was deleted,
                    # even before this loop first saw the log file (CI, under load: the file
                    # lived a few ms before a test deleted the folder).
                    folder_gone = current is None and not active.log_path.parent.exists()
                    if log_file is None and not active.log_deleted_said and not folder_gone:
                        # The keeper makes the file at the job's first output, which may come
                        # after supervision began (seen under load): watch it from then on.
                        log_file = current
                    elif not active.log_deleted_said and (folder_gone or current != log_file):
                        log_file = None
                        active.log_deleted_said = True
                        log.warning("job %s: its log %s was deleted while it runs (its folder, or the file); its "
                                    "keeper makes it again at its next output: the output before is gone",
                                    active.job_id, active.log_path)
                if (active.time_limit and not active.timed_out
                        and time.monotonic() - active.started_mono > active.time_limit):
                    active.timed_out = True
                    log.info("job %s: time limit of %.0f s exceeded; stopping it", active.job_id,
                             active.time_limit)
                    stop_tree(active.pid, self.settings.kill_grace_seconds, reap=lambda: _reap(active))
                if active.kill_event.is_set():
                    log.info("job %s: stopping its process tree (kill requested)", active.job_id)
                    stop_tree(active.pid, self.settings.kill_grace_seconds, reap=lambda: _reap(active))
            if keeper is not None and keeper.wait(0):
                active.keeper_dead_at_end = True
            active.ended_mono = time.monotonic()  # when it ended, not when Redis hears of it
            jobtrace.mark(active.job_id, "exit_seen")
            end = self._outcome(active)
            if end.survivors and not self._await_gone(active.job_id, active.token, end.survivors):
                return "detached"  # the worker stops: the next one adopts it and waits again
            jobtrace.mark(active.job_id, "outcome")
            if active.log_path is not None and not active.has_keeper:
                _cap_quietly(active, self.settings.log_max_bytes)
            state = self._finish(active.job_id, active.token, end, instance=active.instance)
            jobtrace.mark(active.job_id, "concluded")
            return state.value if state else "unknown"
        finally:
            watcher.close()
            if keeper is not None:
                keeper.close()
            if active.kept is not None:
                # Ended, or detached (the next worker waits through /proc): the keeper copies on.
                self._keepers.release(active.kept)
            with self._lock:
                if self._active.get(active.job_id) is active:  # not a later attempt's, started meanwhile
                    del self._active[active.job_id]

    def _take_log(self, active: ActiveJob) -> bool:
        """Adopted: a read end of the job's pipe of this worker's own, so the keeper of the
        worker before may die as this worker's own may; one found dead is replaced at once
        (workers.card_keeper.adopt). True when this worker holds the log now."""
        if active.kept is None and active.keeper_pid and active.pid and active.log_path is not None:
            active.kept = self._keepers.adopt(active.log_path, self.settings.log_max_bytes, active.pid,
                                              active.proc_start, active.keeper_pid, active.keeper_start)
            if active.kept is not None:
                files = AttemptFiles(active.exit_file.parent, active.attempt)
                self._keepers.follow(active.kept, lambda k: write_pid_file(
                    files, f"{active.pid} {active.proc_start or 0} {active.attempt} {k.keeper_pid or 0} "
                           f"{k.keeper_start or 0}\n"))
        return active.kept is not None

    def _outcome(self, active: ActiveJob) -> Gathered:
        """Stop what the job left running, let its keeper finish the log, and gather how it
        ended here; the record's kill request is weighed where the ending reads the record
        (``_finish``: ``Gathered.end``)."""
        wrapper_rc = active.popen.wait() if active.popen else None
        # Anything the job left behind in its session goes with it: no orphans on the card.
        # Daemonised children (double fork + setsid) left the session but kept the environment.
        # Both are found in one pass over /proc (process_tree.job_leftovers).
        ours = active.pid > 0 and session_is_ours(active.pid, active.proc_start)
        members, daemons = job_leftovers(
            active.pid if ours else 0, "RIG_EXIT_FILE", str(active.exit_file), active.proc_start if ours else None,
            first_pid=active.pid if ours else None, age=time.monotonic() - active.started_mono)
        stopped = list(members)  # what the job left running and rig stopped: said in its log and reason
        if members:
            log.info("job %s: stopping processes it left running", active.job_id)
            stop_tree(active.pid, min(2.0, self.settings.kill_grace_seconds))
            # Stopping the session takes time: look again for what left it meanwhile.
            daemons = pids_with_environ("RIG_EXIT_FILE", str(active.exit_file))
        for pid in daemons:
            try:
                sid = os.getsid(pid)
            except ProcessLookupError:
                continue
            if members and sid == active.pid:
                continue  # in its session, stopped above: one that outlived that is a survivor below
            log.info("job %s: stopping daemonised leftover pid %s (session %s)", active.job_id, pid, sid)
            stop_tree(sid, min(2.0, self.settings.kill_grace_seconds))
            stopped.append(pid)
        survivors: dict[int, int] = {}
        if stopped:
            # SIGKILL takes effect only when a process leaves the kernel: one stuck there (state
            # D: a GPU driver, a hung file system) lives on, and may still hold its cards' memory.
            still, escaped = job_leftovers(active.pid if ours else 0, "RIG_EXIT_FILE", str(active.exit_file),
                                           active.proc_start if ours else None)
            # Each with its start time, read now: the wait for them starts after the wait for the
            # job's log below (up to KEEPER_WAIT_S), by when the pid may be another process's.
            survivors = {pid: start for pid in sorted(set(still) | set(escaped))
                         if (start := proc_start_time(pid)) is not None}
            if survivors:  # said now: the wait for its log below lasts while they hold its output
                self._note_stuck(active.job_id, active.token, pids_words(list(survivors)))
        self._wait_for_keeper(active)
        leftovers = leftovers_note(stopped)
        if leftovers:
            _say_in_log(active, leftovers)  # after its keeper finished: the log's last line
        rc = _read_exit_file(active.exit_file)
        if rc is None and wrapper_rc is not None:
            rc = wrapper_rc if wrapper_rc >= 0 else 128 - wrapper_rc
        # A log the keeper could not write whole, or cut to its cap, says so in the record;
        # the job's own exit status stays its result.
        note = logspace.read_note(active.exit_file.with_suffix(".note"))
        log_note = logspace.describe_note(note)
        if note.get("log_made_again") and not active.log_deleted_said:
            log.warning("job %s: its log %s was deleted while it ran (its folder, or the file); its keeper made "
                        "it again: the output before that is gone", active.job_id, active.log_path)
        ended_at, runtime = self._end_time(active)
        # Its output pipe lost its reader (the keeper died, none could take over, or this
        # worker held no end of it): a failure then is rig's, not the job's. A keeper found
        # dead only as the job's end was seen may have exited after it, at its end of file: it
        # counts when the job died of SIGPIPE (a job's own broken pipe then is taken for rig's).
        keeper_lost = ((active.kept is not None and active.kept.lost_reader) or active.keeper_lost
                       or (active.keeper_dead_at_end and rc == 128 + signal.SIGPIPE))
        return Gathered(exit_code=rc, killed_here=active.kill_event.is_set(), timed_out=active.timed_out,
                        overused=active.overused, note="; ".join(x for x in (leftovers, log_note) if x),
                        ended_at=ended_at, runtime=runtime,
                        failure=FailureClass.INFRASTRUCTURE if keeper_lost else None, survivors=survivors)

    def _await_gone(self, job_id: int, token: str, survivors: dict[int, int]) -> bool:
        """Wait until the job's processes that outlived SIGKILL are gone (SIGKILL again each
        second: it is pending on them anyway), so its ending, which gives its cards back, is
        written only once nothing of it can hold their memory. True once they are gone; False
        when this worker stops first (the next one adopts the job and waits again). ``survivors``:
        pid -> start time; one whose pid another process has taken since counts as gone, and is
        never signalled (pidfd: nor one that takes it during the wait)."""
        watchers = [ExitWatcher(pid, start) for pid, start in survivors.items()]
        try:
            log.warning("job %s: %s outlived SIGKILL (stuck in the kernel: a GPU driver, a hung file system?); "
                        "the job's cards stay reserved until %s gone", job_id,
                        ", ".join(describe_survivor(pid) for pid in survivors),
                        "it is" if len(survivors) == 1 else "they are")
            self._note_stuck(job_id, token, pids_words(list(survivors)))
            while True:
                watchers = [w for w in watchers if not w.wait(0)]
                if not watchers:
                    log.info("job %s: its processes that outlived SIGKILL are gone", job_id)
                    return True  # its ending clears the note (workers.outcomes.conclude)
                if self.shutdown.is_set():
                    return False
                for watcher in watchers:
                    watcher.kill()
                watchers[0].wait(1.0)  # an exit ends the wait early; the others are looked at again
        finally:
            for watcher in watchers:
                watcher.close()

    def _end_time(self, active: ActiveJob) -> tuple[float, float | None]:
        """(when the attempt ended on the shared clock, its runtime in s or None): from this
        worker's monotonic clock when it watched the end, else from the exit file's mtime (it
        ended unwatched), written whenever Redis takes it (rig.clock)."""
        if active.ended_mono is not None:
            return event_time(self.r, mono=active.ended_mono), max(0.0, active.ended_mono - active.started_mono)
        ended = _file_time(self.r, active.exit_file)
        return (event_time(self.r) if ended is None else ended), None

    def _wait_for_keeper(self, active: ActiveJob) -> None:
        """Let the log keeper write the last output before the log is read (the failure
        class comes from its end). It ends at end of file, once no process of the job holds
        the pipe; a leftover that escaped the job's session could hold it longer."""
        kept = active.kept
        if kept is not None and isinstance(kept.keeper, ForeignKeeper):
            # Adopted, copied by the worker before's keeper: done once it lets go of the log; if
            # it died instead, the log went to a keeper of this worker's (waited for below).
            self._wait_for_adopted_keeper(active)
            self._keepers.keeper_exited(kept)
        if kept is not None and not isinstance(kept.keeper, ForeignKeeper):
            # Through keeper restarts (workers.card_keeper): the keeper that copies it now says
            # when this log is written to its end.
            if not self._keepers.wait_done(kept, KEEPER_WAIT_S):
                log.warning("job %s: its log is not written to its end yet (keeper pid %s); something still "
                            "holds the job's output", active.job_id, kept.keeper_pid)
            return
        if kept is None:
            self._wait_for_adopted_keeper(active)

    def _wait_for_adopted_keeper(self, active: ActiveJob) -> None:
        """The keeper named in the attempt's pid file: done once it no longer holds the log
        open, or has exited."""
        if not active.keeper_pid:
            return
        # Adopted (the keeper named in the attempt's pid file: the card's keeper of the worker
        # before, or a keeper of this log alone): done once it no longer holds the log open, or
        # has exited (watched through a pidfd). The start time is checked after the pidfd is
        # open: a pid reused since is never waited for.
        watcher = ExitWatcher(active.keeper_pid)
        try:
            if not is_alive(active.keeper_pid, active.keeper_start):
                return
            deadline = time.monotonic() + KEEPER_WAIT_S
            while active.log_path is None or holds_file(active.keeper_pid, active.log_path):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("job %s: its log keeper (pid %s) still holds its log; something still holds the "
                                "job's output", active.job_id, active.keeper_pid)
                    return
                if watcher.wait(min(left, KEEPER_POLL_S)):
                    return  # it exited: everything it read is written
        finally:
            watcher.close()

    def _finish(self, job_id: int, token: str, end: AttemptEnd | Gathered,
                expect: JobState | None = None, instance: str | None = None) -> JobState | None:
        """Record how the attempt ended and release its cards (retrying through a Redis
        outage: a restart of Redis must not lose a job's ending). A ``Gathered`` ending is
        settled with the kill request of the record read here (``Gathered.end``)."""
        result: list[JobState] = []

        folders: list[Path] = []

        def _do() -> None:
            # The installation and the record in one round trip.
            pipe = self.r.pipeline(transaction=False)
            pipe.hget(self.keys.installation, "id")
            self.store.queue_raw(pipe, job_id)
            found, raw, spec = pipe.execute()
            place = Installation(self.r, self.keys, self.settings.run_dir, self.node)
            if verdict(place.on_node(), found).mismatch:
                # Redis is not the installation this job ran under (it lost its data, or
                # another answers): write nothing there. The ending stays on disk (exit and
                # pid files) for `rig recover`.
                log.critical("job %s ended (%s) while this node's Redis is not its installation; "
                             "its ending is kept on disk only", job_id, end)
                return
            # Ending it needs no environment; no record: Redis lost it (rolled back, or
            # emptied by a double fault).
            record = self.store.join([(raw, spec)], env=False)[0]
            record.pop("env", None)
            job = Job.from_redis(record) if record else None
            if job is None or (instance is not None and job.instance != instance):
                log.warning("job %s instance %s ended (%s), but Redis %s: nothing written", job_id, instance, end,
                            "has no record of it" if job is None else f"holds another job under that id "
                            f"(instance {job.instance})")
                mark_lost_ending(self.r, self.keys, self.node, job_id)
                return
            folders[:] = (job_folders(job, job_folder(self.settings.job_log_dir, job_id, job.instance)))
            settled = end if isinstance(end, AttemptEnd) else end.end(job.cancel_requested,
                                                                       record.get("cancelled_by") or None)
            code, state = conclude(self.ledger, job, token, settled, expect=expect)
            if code == 1:
                result.append(state)

        self._retry_redis(_do, f"end job {job_id}")
        for _ in range(LOST_WRITE_TRIES if self.replicas is not None else 0):
            if self.shutdown.is_set():
                break
            # Under Sentinel the ending counts once a replica has it (rig.replication); one a
            # fail-over lost (the new master still says RUNNING with this token) is written again.
            if not self._retry_redis(self.replicas.confirm, f"confirm job {job_id}'s ending"):
                log.warning("job %s: %s", job_id, self.replicas.unconfirmed_note("its ending"))
            if not result or not self._holds(job_id, token):
                break
            log.warning("job %s: its ending is not on the Redis master any more (a fail-over lost it); "
                        "recording it again", job_id)
            result.clear()
            self._retry_redis(_do, f"end job {job_id}")
        for folder in folders if result else []:
            for path in folder.glob("attempt-*.pid") if folder.is_dir() else []:
                try:
                    # Out of adoption's sight, but its mtime still says when the attempt began
                    # (AttemptFiles.started), should Redis forget this ending.
                    path.rename(path.with_suffix(".started"))
                except OSError:
                    pass  # another home's folder this user may not write: a stale pid file only
        jobs_dir = getattr(self.backend, "jobs_dir", None)
        if jobs_dir is not None:  # its fake-card usage folder, if it had one (job_usage_dir)
            drop_job_usage_dir(jobs_dir, job_id)
        return result[0] if result else None

    def _running_copy(self, job: Job, claimed: int) -> ActiveJob | None:
        """A live process of this job started by this node (name), known from its pid file, of
        attempt ``claimed`` (the one just claimed) or later, or None. A copy another node on
        this host started (the attempt this one re-runs after that node went silent) is not ours
        to adopt: that node stops it when it returns.

        A copy of an earlier attempt is no lost record of this start: rig concluded that attempt
        (lost when this node was declared down while its jobs ran on, then placed again here
        before the orphan check stopped it). It is stopped now, before this attempt starts, so
        the job never runs twice at once; adopting it gave the new attempt the old one's number
        and cards (it ran on the card it started on while the reservation named another)."""
        # Also the folders of another home that ran this node name before (attempt_locate).
        pid_files = [f for d in job_folders(job, job_folder(self.settings.job_log_dir, job.id, job.instance))
                     if d.is_dir() for f in sorted(d.glob("attempt-*.pid"))]
        for pid_file in pid_files:
            found = read_pid_file(pid_file)
            if found is None:
                continue
            pid, start, attempt, keeper_pid, keeper_start = found
            if is_alive(pid, start) and is_job_process(pid, job.id, self.settings.key_prefix, job.instance,
                                                       node=self.node):
                if attempt < claimed:
                    log.warning("job %s: its attempt %s, concluded by rig, still runs as pid %s; stopping it "
                                "before attempt %s starts", job.id, attempt, pid, claimed)
                    if session_is_ours(pid, start):
                        stop_tree(pid, self.settings.kill_grace_seconds)
                    continue
                exit_file = pid_file.with_suffix(".exit")
                return ActiveJob(job.id, str(job.assignments), attempt, pid, start, exit_file, instance=job.instance,
                                 time_limit=job.time_limit, log_path=pid_file.with_suffix(".log"),
                                 started_at=job.started_at or shared_now(self.r), keeper_pid=keeper_pid,
                                 started_mono=monotonic_of(self.r, job.started_at or shared_now(self.r)),
                                 keeper_start=keeper_start)
        return None

    def installation_ok(self) -> bool:
        """False when Redis does not hold the installation this node joined (rig.installation):
        then this worker concludes, adopts and re-registers nothing."""
        return installation_matches(self.r, self.keys, self.settings.run_dir, self.node)

    def _retry_redis(self, fn: Callable[[], T], what: str,
                     only: Callable[[BaseException], object] = is_outage) -> T | None:
        """Run ``fn`` until Redis answers and takes the write (rig.redis_writes.is_outage, or
        ``only``); a restart of Redis, or a full one, must not lose a job's ending. Returns
        ``fn``'s result (None when given up at shutdown)."""
        delay = 0.2
        while True:
            try:
                return fn()
            except redis.RedisError as exc:
                if not only(exc):
                    raise
                if self.shutdown.is_set():
                    log.warning("gave up trying to %s while shutting down: %s", what, exc)
                    return None
                log.warning("Redis unavailable, will retry to %s in %.1f s: %s", what, delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- adoption after a restart ---------------------------------------------------------
    def adopt(self, resend_after: float = 0.0, *, wait: bool = True) -> None:
        """Take over this card's jobs left RUNNING by an earlier worker (or whose end Redis
        lost), and push again the start of jobs ASSIGNED here for longer than ``resend_after``
        seconds whose start is in neither of the card's lists (workers.start_list; a copy
        too many is fenced by the claim). Idempotent: run at start and then periodically; one
        pass at a time: a pass started meanwhile waits for it (then finds its work done), or,
        without ``wait`` (the tick loop's, which also heartbeats), leaves the work to it."""
        if not self._adopting.acquire(blocking=wait):
            return
        try:
            self._adopt(resend_after)
        finally:
            self._adopting.release()

    def _adopt(self, resend_after: float) -> None:
        """One adoption pass (adopt), its lock held."""
        # The lists are read before the records: a start missing from them while its job is
        # still ASSIGNED with that token afterwards was lost, not claimed meanwhile.
        listed = set().union(*self.starts.listed())
        for job in self._placed_here():
            if job.state is JobState.ASSIGNED:
                if shared_now(self.r) - (job.assigned_at or 0) < resend_after:
                    continue
                if entry(job.id, job.assignments) not in listed:
                    log.info("job %s: its start is in no list of card %s/%s; pushing it again",
                             job.id, self.node, self.index)
                    self.starts.push(job.id, str(job.assignments))
                continue
            with self._lock:
                if job.id in self._active or job.id in self._starting or job.id in self._ending:
                    continue
            # Our list may be stale (a start or an end may have happened since): act only on
            # a job that is still RUNNING with the same assignment, and say so to the ledger.
            fresh = self.store.get(job.id)
            if fresh.state is not JobState.RUNNING or fresh.assignments != job.assignments:
                continue
            job = fresh
            pid, start = job.pid, job.proc_start
            env = _environ(pid) if pid and is_alive(pid, start) else None
            if env is not None and not carries_attempt(env, job, job.attempt, self.settings.key_prefix):
                # The record names a live process that is not this job's (a damaged or forged
                # pid): never adopt, and so never signal, it. Look for the job's own wrapper.
                log.warning("job %s: recorded pid %s is not its process; looking for it by its "
                            "environment", job.id, pid)
                pid = None
            # Its files are those it started with (another home's log_dir after a takeover of
            # the node name), its process found by the job's identity (workers.attempt_locate).
            where = locate(job, job.attempt, self._files(job, job.attempt), self.settings.key_prefix,
                           pid if env is not None else None)
            exit_file = where.files.exit
            if where.pid and where.pid != pid:
                pid, start = where.pid, proc_start_time(where.pid)
                self.store.update(job.id, pid=pid, proc_start=start)
            noted = read_pid_file(exit_file.with_suffix(".pid"))
            active = ActiveJob(job.id, str(job.assignments), job.attempt, pid or 0, start, exit_file, instance=job.instance,
                               time_limit=job.time_limit, started_at=job.started_at or shared_now(self.r),
                               started_mono=monotonic_of(self.r, job.started_at or shared_now(self.r)),
                               log_path=exit_file.with_suffix(".log"),
                               keeper_pid=noted[3] if noted else None, keeper_start=noted[4] if noted else None)
            # Only its wrapper, the leader of the session it was started in, is the job: a process
            # of it found by its identity once the wrapper has gone (a leftover; one stuck in the
            # kernel) is stopped with the ending below, never watched as the job (was: a frozen
            # child adopted, and `rig kill` of it looping on a session it does not lead).
            if pid and is_alive(pid, start) and leads_session(pid):
                log.info("job %s: adopting running pid %s", job.id, pid)
                thread = threading.Thread(target=self._supervise, args=(active,),
                                          name=f"rig-adopted-{job.id}", daemon=True)
                thread.start()
                self._threads.append(thread)
            elif (pid or _read_exit_file(exit_file) is not None or where.recorded
                  or read_pid_file(where.files.pid) is not None):
                # It started (a pid, an exit status, its record or its pid file says so) and no
                # process of it runs here: it ended unwatched, or ran from files this host
                # cannot reach. Never "never started": that would run it a second time.
                if pid and session_is_ours(pid, start) and session_members(pid):
                    stop_tree(pid, min(2.0, self.settings.kill_grace_seconds))
                end = self._outcome(active)
                if not where.reachable:
                    end.where = (f"started with files in {where.files.folder} (another home or host); "
                                 "its files are not reachable here")
                log.info("job %s: ended while no worker watched it (exit %s) %s", job.id, end.exit_code, end.note)
                if end.survivors:  # waited for in a thread of its own: the other jobs are adopted meanwhile
                    with self._lock:
                        self._ending.add(job.id)
                    thread = threading.Thread(target=self._finish_when_gone, args=(job.id, active.token, end),
                                              name=f"rig-survivors-{job.id}", daemon=True)
                    thread.start()
                    self._threads.append(thread)
                    continue
                self._finish(job.id, active.token, end, expect=JobState.RUNNING)
            else:
                # Claimed but never started: it has not run, so it goes back to its place.
                log.info("job %s: its worker stopped before starting it; back to the queue", job.id)
                self._retry_redis(lambda job=job: self._requeue_unstarted(job), f"requeue job {job.id}")

    def _note_stuck(self, job_id: int, token: str, stuck: str) -> None:
        """Say on the job's record which of its processes outlived SIGKILL (Job.stuck: `rig show`,
        `rig jobs`, `rig kill` say why it still runs; its ending clears it). A note only: a Redis
        away leaves it unsaid, never the wait. Only on the record of this run (``token``), still
        RUNNING: an adoption pass that read it before another thread ended it left the note on
        the ended record."""
        try:
            self.store.update_while_running(job_id, token, stuck=stuck)
        except redis.RedisError as exc:
            log.warning("job %s: could not note its stuck processes on its record (%s)", job_id, exc)

    def _finish_when_gone(self, job_id: int, token: str, end: Gathered) -> None:
        """An adopted job's ending, written once its processes that outlived SIGKILL are gone."""
        try:
            if self._await_gone(job_id, token, end.survivors):
                self._finish(job_id, token, end, expect=JobState.RUNNING)
        finally:
            with self._lock:
                self._ending.discard(job_id)

    def _placed_here(self) -> list[Job]:
        """The RUNNING, then the ASSIGNED, jobs whose first card is this one, each by id. Found
        through this card's reservations (reserve.lua adds a job there and it stays until
        transition.lua moves it out of ASSIGNED/RUNNING; reclaim.lua never takes a live job's),
        so a card worker reads its own few jobs, not every placed job of the cluster."""
        held = self.store.get_many(sorted(self.ledger.holdings(self.node, self.index)))
        placed = [j for j in held if j.state in (JobState.RUNNING, JobState.ASSIGNED)
                  and j.node == self.node and j.cards and j.cards[0] == self.index]
        return sorted(placed, key=lambda j: (j.state is JobState.ASSIGNED, j.id))

    def _requeue_unstarted(self, job: Job) -> None:
        files = self._files(job, job.attempt)
        if _read_exit_file(files.exit) is None:
            # Its files were made before its worker stopped: gone, so the number it gets again
            # never looks like an attempt that ran here (the "already ran" check).
            remove_attempt_files(files)
        self.ledger.transition(
            job.id, JobState.PENDING, token=str(job.assignments), expect=JobState.RUNNING,
            fields={"attempt": max(0, job.attempt - 1), "reason": "requeued: its worker stopped before starting it"},
        )
        self.r.lpush(self.keys.sched_wake, "1")

    # -- background loops -----------------------------------------------------------------
    def _tick_loop(self) -> None:
        """Heartbeat (expires after health.timeout), this card's readings and health, and a
        periodic audit of this card's jobs."""
        ttl = max(1, int(self.settings.health.timeout))
        next_audit = time.monotonic() + self.settings.health.check_interval
        while not self.shutdown.is_set():
            try:
                beat = {
                    "role": "card", "node": self.node, "card": self.index, "pid": os.getpid(),
                    "jobs": len(self.active_ids()), "seen_at": shared_now(self.r), **beat_supervisor(),
                }
                pipe = self.r.pipeline(transaction=False)
                pipe.set(self.keys.worker(self.worker_name), json.dumps(beat), ex=ttl)
                pipe.sadd(self.keys.workers, self.worker_name)
                pipe.execute()
                if not self.installation_ok():
                    # Not our installation: touch nothing (rig.installation; the control
                    # worker marks the node and says what to do).
                    self.shutdown.wait(self.settings.telemetry_interval)
                    continue
                reading = self._read_card()
                if reading is not None:
                    self._observe_jobs(reading)
                self._note_paused()
                self.log_space.check()
                if time.monotonic() >= next_audit:
                    next_audit = time.monotonic() + self.settings.health.check_interval
                    self.adopt(resend_after=self.settings.health.assigned_timeout, wait=False)
            except redis.RedisError as exc:
                log.debug("tick skipped, Redis unavailable: %s", exc)
            except Exception:  # noqa: BLE001 - the heartbeat must outlive one bad tick
                log.exception("tick failed")
            self.shutdown.wait(self.settings.telemetry_interval)
        try:
            self.r.delete(self.keys.worker(self.worker_name))
        except redis.RedisError:
            pass

    def _note_paused(self) -> None:
        """Mark a running job whose every process is stopped (state T) PAUSED_AFTER_TICKS ticks
        in a row as paused since the first of them (Job.paused_since: `rig show` / `rig jobs`
        say so: it holds its cards and does nothing), and clear the mark once any of it runs
        again. Said, never acted on: whoever stopped it may continue it (``kill -CONT``). The
        one place the mark is written or cleared while it runs (its ending clears it too:
        workers.outcomes)."""
        with self._lock:
            active = list(self._active.values())
        stopped = stopped_sessions({job.pid for job in active}) if active else set()
        for job in active:
            if job.pid in stopped:
                if job.stopped_since is None:
                    job.stopped_since = shared_now(self.r)
                job.stopped_ticks += 1
                if job.stopped_ticks >= PAUSED_AFTER_TICKS and job.paused_written is not True:
                    log.warning("job %s: all its processes are stopped (state T) since %s; it holds its cards",
                                job.job_id, time.strftime("%H:%M:%S", time.localtime(job.stopped_since)))
                    job.paused_written = self.store.update_while_running(job.job_id, job.token,
                                                                         paused_since=job.stopped_since)
                continue
            if job.paused_written is not False:
                if job.paused_written:
                    log.info("job %s: runs again", job.job_id)
                self.store.clear_fields(job.job_id, "paused_since")
            job.stopped_ticks, job.stopped_since, job.paused_written = 0, None, False

    def _read_card(self) -> GpuReading | None:
        """Record the card's readings; a card that cannot be read, or runs hotter than
        health.max_temperature, is marked unhealthy and takes no new jobs until it recovers
        (5 C below the limit)."""
        if self.backend is None or card_is_gone(self.r, self.keys, self.node, self.index):
            return None  # a card gone from the node cannot be read: its worker only supervises
        try:
            reading = self.backend.read(self.index)
        except GpuReadError as exc:
            log.warning("card %s/%s cannot be read: %s", self.node, self.index, exc)
            self.ledger.set_healthy(self.node, self.index, False, f"cannot be read: {exc}")
            return None
        self.ledger.record_reading(self.node, reading)
        limit = self.settings.health.max_temperature
        card = self.ledger.card(self.node, self.index)
        temp = reading.temperature
        if temp is not None and temp > limit:
            if card.healthy:
                log.warning("card %s/%s at %s C, over %s C: no new jobs", self.node, self.index, temp, limit)
            self.ledger.set_healthy(self.node, self.index, False, f"temperature {temp} C > {limit} C")
        elif not card.healthy and (temp is None or temp <= limit - 5) and not logspace.is_log_space_reason(card.health_reason):
            log.info("card %s/%s healthy again", self.node, self.index)
            self.ledger.set_healthy(self.node, self.index, True)
        return reading

    def _observe_jobs(self, reading: GpuReading) -> None:
        """Closed-loop accounting: attribute the card's per-process memory to the running jobs
        holding this card (by process session, or by the job id in a process's environment),
        record each job's sample, let the ledger count max(declared, used), and count memory
        of processes rig did not start as taken (``foreign``)."""
        holdings = self.ledger.holdings(self.node, self.index)
        jobs = [j for j in self.store.get_many(sorted(holdings)) if j.state is JobState.RUNNING]
        by_session = {j.pid: j for j in jobs if j.pid}
        by_id = {j.id: j for j in jobs}
        usage = {j.id: 0 for j in jobs}
        foreign = 0
        for pid, nbytes in reading.processes.items():
            job = None
            try:
                job = by_session.get(os.getsid(pid))
            except (ProcessLookupError, PermissionError):
                continue
            if job is None:
                job = by_id.get(_job_id_of(pid, self.settings.key_prefix) or -1)
            if job is None:
                foreign += nbytes
            else:
                usage[job.id] += nbytes
        for job in jobs:
            if not job.pid:
                continue  # still starting: its first sample comes next time
            _held, over = self.ledger.observe(self.node, self.index, job.id, usage[job.id],
                                              reading.utilization, job.gpu_memory,
                                              self.settings.overuse_tolerance)
            if over and not job.overuse:
                log.warning("job %s uses %d bytes on %s/%s, more than the %d it declared", job.id,
                            usage[job.id], self.node, self.index, job.gpu_memory)
            if over and self.settings.overuse_policy == "stop":
                self.store.update(job.id, overuse_stop=usage[job.id])
        card = self.ledger.card(self.node, self.index)
        if card.foreign != foreign:
            self.ledger.set_foreign(self.node, self.index, foreign)

    def _kill_listener(self) -> None:
        """Pass kill requests published on the kill channel to the job's supervisor."""
        while not self.shutdown.is_set():
            pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.keys.kill_channel)
                while not self.shutdown.is_set():
                    msg = pubsub.get_message(timeout=0.5)
                    if not msg:
                        continue
                    try:
                        job_id = int(msg["data"])
                    except (TypeError, ValueError):
                        continue
                    with self._lock:
                        active = self._active.get(job_id)
                    if active is not None:
                        active.kill_event.set()
            except redis.RedisError as exc:
                log.debug("kill listener reconnecting: %s", exc)
                self.shutdown.wait(1.0)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:
                    pass


def read_pid_file(path: Path) -> tuple[int, int, int, int | None, int | None] | None:
    """(pid, start time, attempt, keeper pid, keeper start time) from an attempt's pid file
    (``<pid> <start> <attempt> [<keeper pid> <keeper start>]``; keeper fields 0 or absent: no
    keeper); None when it is missing or unreadable."""
    try:
        fields = [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return None
    if len(fields) not in (3, 5):
        return None
    pid, start, attempt = fields[:3]
    keeper_pid, keeper_start = (fields[3] or None, fields[4] or None) if len(fields) == 5 else (None, None)
    return pid, start, attempt, keeper_pid, keeper_start


def _file_time(client: redis.Redis, path: Path) -> float | None:
    """When ``path`` was last written, on the shared clock (rig.clock), or None (no file)."""
    try:
        return event_time(client, wall=path.stat().st_mtime)
    except OSError:
        return None


def _read_exit_file(path: Path) -> int | None:
    """The exit status the wrapper wrote, or None (no file, empty, not a number). Reads at most
    EXIT_FILE_MAX_BYTES from a regular file and never follows a symlink or blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, EXIT_FILE_MAX_BYTES).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return R.as_int(text, -(2**31), 2**31 - 1) if text else None
    except R.BadField:
        return None


def _holds_password(run_as: RunAs | None) -> bool:
    """Does a job run as ``run_as`` get Redis' password in its RIG_REDIS_URL? Only a job of the
    worker's own user (no switch, or a switch to this very uid: root's job on a root node), who
    can read the password file anyway; its own HOME may not lead to rig's (RIG_HOME elsewhere)."""
    return run_as is None or run_as.uid == os.geteuid()


def _login_shell(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_shell or None
    except KeyError:
        return None


def _environ(pid: int) -> list[bytes] | None:
    """A process's environment as b"NAME=value" items; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return None


def _job_id_of(pid: int, prefix: str) -> int | None:
    """The rig job id in a process's environment, if it belongs to this rig (same key prefix)."""
    env = _environ(pid)
    if env is None or f"RIG_KEY_PREFIX={prefix}".encode() not in env:
        return None
    for item in env:
        if item.startswith(b"RIG_JOB_ID="):
            try:
                return int(item.split(b"=", 1)[1])
            except ValueError:
                return None
    return None


def _inode(path: Path | None) -> tuple[int, int] | None:
    """(device, inode) of ``path``, None when it is not there."""
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st is not None else None


def _cap_quietly(active: ActiveJob, cap: int) -> None:
    """Keep a keeperless log under its cap; a disk that refuses the cut never ends the watch."""
    if active.log_path is None:
        return
    try:
        enforce_size_cap(active.log_path, cap)
    except OSError as exc:
        log.warning("job %s: could not cut its log %s: %s", active.job_id, active.log_path, exc)


def leftovers_note(pids: list[int]) -> str:
    """The words for the job's log and reason when rig stopped ``pids``, processes the job left
    running once its own process ended ("" for none): a job's processes end with it, so none
    holds its card's memory for the next job (docs/RELIABILITY.md, "a job leaves children behind")."""
    if not pids:
        return ""
    shown = ", ".join(map(str, sorted(set(pids))[:10])) + (", ..." if len(set(pids)) > 10 else "")
    return (f"rig stopped {len(set(pids))} process(es) the job left running when it ended, pid {shown}: a job's "
            "processes end with it (its session, and daemons that left it)")


def _say_in_log(active: ActiveJob, words: str) -> None:
    """Append ``[rig: words]`` to the job's log (its keeper has finished it), as rig's other
    notes in a log; a log that cannot be written is only logged here (the reason has it too)."""
    if active.log_path is None:
        return
    try:
        with open(active.log_path, "ab") as out:
            out.write(f"[rig: {words}]\n".encode())
    except OSError as exc:
        log.warning("job %s: could not add a note to its log %s: %s", active.job_id, active.log_path, exc)


def _reap(active: ActiveJob) -> None:
    if active.popen is not None:
        active.popen.poll()
