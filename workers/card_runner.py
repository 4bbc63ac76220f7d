"""The per-card runner: starts a job's process tree on this card, watches it, ends it, and
gives its reservation back whatever way it ends.

One Celery worker process serves one card. Each start message runs ``run_job`` on a worker
thread, which blocks until the job ends, so Flower shows the job as an active task for its
whole life. When the worker shuts down, the jobs keep running (they live in their own
sessions); the next worker of this card adopts them on start (``adopt``) and learns their exit
status from the file the wrapper writes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rig.config import Settings
from rig.gpus import GpuBackend, GpuReadError
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import Job, JobState
from rig.redis_conn import connect
from rig.store import JobStore
from workers.process_tree import (
    ExitWatcher,
    find_by_environ,
    is_alive,
    proc_start_time,
    session_members,
    stop_tree,
    wrapper_argv,
)

log = logging.getLogger(__name__)

#: How often a running job's record is checked for a kill request, as a fallback to pub/sub (s).
CANCEL_POLL_S = 2.0


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


@dataclass
class Outcome:
    state: JobState
    exit_code: int | None
    reason: str


class CardRunner:
    """Runs the jobs of one card (``node``/``index``) for one worker process."""

    def __init__(
        self,
        settings: Settings,
        node: str,
        index: int,
        worker_name: str,
        backend: GpuBackend | None = None,
        resend: Callable[[int, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.node = node
        self.index = index
        self.worker_name = worker_name
        self.backend = backend
        self.resend = resend
        self.keys = Keys(settings.key_prefix)
        self.r = connect(settings.redis_url)
        self.store = JobStore(self.r, self.keys)
        self.ledger = Ledger(self.r, self.keys)
        self.shutdown = threading.Event()
        self._active: dict[int, ActiveJob] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start_services(self) -> None:
        """Heartbeat + card readings, the kill listener, and adoption of orphaned jobs."""
        for target, name in ((self._tick_loop, "tick"), (self._kill_listener, "kill-listener")):
            thread = threading.Thread(target=target, name=f"rig-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._retry_redis(self.adopt, "adopt running jobs")

    def stop(self) -> None:
        """Leave running jobs running; their supervisors return at once."""
        self.shutdown.set()

    def active_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._active)

    # -- one job --------------------------------------------------------------------------
    def run_job(self, job_id: int, token: str) -> str:
        """Claim, start, supervise and end one job. Returns what happened, for the task log."""
        ok, detail = self.ledger.claim(job_id, token, self.worker_name)
        if not ok:
            log.info("job %s: start message ignored, job is %s (duplicate or stale delivery)", job_id, detail)
            return f"ignored:{detail}"
        attempt = int(detail)
        job = self.store.get(job_id)
        active = self._launch(job, token, attempt)
        if active is None:
            return "failed-to-start"
        return self._supervise(active)

    def _launch(self, job: Job, token: str, attempt: int) -> ActiveJob | None:
        job_dir = self.settings.job_log_dir / str(job.id)
        job_dir.mkdir(parents=True, exist_ok=True)
        log_path = job_dir / f"attempt-{attempt}.log"
        exit_file = job_dir / f"attempt-{attempt}.exit"
        exit_file.unlink(missing_ok=True)
        env = self._job_env(job, attempt, exit_file)
        argv = wrapper_argv(job.command)
        log_paths = [*job.log_paths, str(log_path)]
        with open(log_path, "ab", buffering=0) as logf:
            try:
                popen = subprocess.Popen(
                    argv, cwd=job.workdir, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                message = f"rig: could not start the job in {job.workdir}: {exc}\n"
                logf.write(message.encode())
                self.store.update(job.id, log_path=str(log_path), log_paths=log_paths)
                self._finish(job.id, token, Outcome(JobState.FAILED, None, message.strip()[5:]))
                return None
        start = proc_start_time(popen.pid)
        self.store.update(
            job.id, pid=popen.pid, proc_start=start, log_path=str(log_path), log_paths=log_paths,
            cuda_visible_devices=env["CUDA_VISIBLE_DEVICES"],
        )
        log.info("job %s attempt %s: started pid %s on %s/%s (CUDA_VISIBLE_DEVICES=%s)",
                 job.id, attempt, popen.pid, self.node, job.cards, env["CUDA_VISIBLE_DEVICES"])
        return ActiveJob(job.id, str(token), attempt, popen.pid, start, exit_file, popen)

    def _job_env(self, job: Job, attempt: int, exit_file: Path) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("RIG_ROLE", "RIG_CARD_INDEX"):
            env.pop(key, None)
        env.update(job.env)
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in job.cards),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "RIG_JOB_ID": str(job.id),
            "RIG_JOB_NAME": job.name,
            "RIG_ATTEMPT": str(attempt),
            "RIG_EXIT_FILE": str(exit_file),
            "RIG_REDIS_URL": self.settings.redis_url,
            "RIG_KEY_PREFIX": self.settings.key_prefix,
        })
        return env

    def _supervise(self, active: ActiveJob) -> str:
        with self._lock:
            self._active[active.job_id] = active
        watcher = ExitWatcher(active.pid)
        next_poll = 0.0
        try:
            while True:
                if watcher.wait(0.1):
                    break
                if self.shutdown.is_set():
                    log.info("job %s: worker stopping; the job keeps running and will be adopted",
                             active.job_id)
                    return "detached"
                now = time.monotonic()
                if not active.kill_event.is_set() and now >= next_poll:
                    next_poll = now + CANCEL_POLL_S
                    try:
                        if self.r.hget(self.keys.job(active.job_id), "cancel_requested") == "1":
                            active.kill_event.set()
                    except redis.RedisError:
                        pass  # Redis away: keep watching the process
                if active.kill_event.is_set():
                    log.info("job %s: stopping its process tree (kill requested)", active.job_id)
                    stop_tree(active.pid, self.settings.kill_grace_seconds, reap=lambda: _reap(active))
            outcome = self._outcome(active)
            self._finish(active.job_id, active.token, outcome)
            return outcome.state.value
        finally:
            watcher.close()
            with self._lock:
                self._active.pop(active.job_id, None)

    def _outcome(self, active: ActiveJob) -> Outcome:
        wrapper_rc = active.popen.wait() if active.popen else None
        # Anything the job left behind in its session goes with it: no orphans on the card.
        if active.pid > 0 and session_members(active.pid):
            log.info("job %s: stopping processes it left running", active.job_id)
            stop_tree(active.pid, min(2.0, self.settings.kill_grace_seconds))
        rc = _read_exit_file(active.exit_file)
        cancelled = active.kill_event.is_set()
        if not cancelled:
            try:
                cancelled = self.r.hget(self.keys.job(active.job_id), "cancel_requested") == "1"
            except redis.RedisError:
                pass
        if cancelled:
            by = None
            try:
                by = self.r.hget(self.keys.job(active.job_id), "cancelled_by")
            except redis.RedisError:
                pass
            return Outcome(JobState.CANCELLED, rc, f"cancelled by {by or 'a person'}")
        if rc is None and wrapper_rc is not None:
            rc = wrapper_rc if wrapper_rc >= 0 else 128 - wrapper_rc
        if rc is None:
            return Outcome(JobState.FAILED, None,
                           "ended while no worker watched it; exit status unknown")
        if rc == 0:
            return Outcome(JobState.SUCCEEDED, 0, "exit code 0")
        return Outcome(JobState.FAILED, rc, describe_exit(rc))

    def _finish(self, job_id: int, token: str, outcome: Outcome) -> None:
        fields = {"reason": outcome.reason}
        if outcome.exit_code is not None:
            fields["exit_code"] = outcome.exit_code

        def _do() -> None:
            code, detail = self.ledger.transition(job_id, outcome.state, token=token, fields=fields)
            if code == 1:
                log.info("job %s: %s (%s); reservation released", job_id, outcome.state.value, outcome.reason)
            else:
                log.warning("job %s: not moved to %s, it is %s", job_id, outcome.state.value, detail)
            self.r.lpush(self.keys.sched_wake, "1")

        self._retry_redis(_do, f"end job {job_id}")

    def _retry_redis(self, fn: Callable[[], None], what: str) -> None:
        """Run ``fn`` until Redis answers; a restart of Redis must not lose a job's ending."""
        delay = 0.2
        while True:
            try:
                fn()
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self.shutdown.is_set():
                    log.warning("gave up trying to %s while shutting down: %s", what, exc)
                    return
                log.warning("Redis unavailable, will retry to %s in %.1f s: %s", what, delay, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- adoption after a restart ---------------------------------------------------------
    def adopt(self) -> None:
        """Take over this card's jobs left RUNNING by an earlier worker, and re-send the start
        of jobs ASSIGNED here (duplicates are fenced by the claim)."""
        mine = [
            j for j in self.store.get_many(
                self.store.ids_in_state(JobState.RUNNING) + self.store.ids_in_state(JobState.ASSIGNED)
            )
            if j.node == self.node and j.cards and j.cards[0] == self.index
        ]
        for job in mine:
            if job.state is JobState.ASSIGNED:
                if self.resend is not None:
                    log.info("job %s: re-sending its start after a restart", job.id)
                    self.resend(job.id, str(job.assignments))
                continue
            with self._lock:
                if job.id in self._active:
                    continue
            exit_file = self.settings.job_log_dir / str(job.id) / f"attempt-{job.attempt}.exit"
            pid, start = job.pid, job.proc_start
            if not pid:
                # The worker died between the claim and recording the pid: find the wrapper
                # by the exit-file path in its environment.
                pid = find_by_environ("RIG_EXIT_FILE", str(exit_file))
                start = proc_start_time(pid) if pid else None
                if pid:
                    self.store.update(job.id, pid=pid, proc_start=start)
            active = ActiveJob(job.id, str(job.assignments), job.attempt, pid or 0, start, exit_file)
            if pid and is_alive(pid, start):
                log.info("job %s: adopting running pid %s", job.id, pid)
                thread = threading.Thread(target=self._supervise, args=(active,),
                                          name=f"rig-adopted-{job.id}", daemon=True)
                thread.start()
                self._threads.append(thread)
            elif pid or exit_file.exists():
                if pid and session_members(pid):
                    stop_tree(pid, min(2.0, self.settings.kill_grace_seconds))
                outcome = self._outcome(active)
                log.info("job %s: ended while no worker watched it: %s", job.id, outcome.reason)
                self._finish(job.id, active.token, outcome)
            else:
                # Claimed but never started: it has not run, so it goes back to its place.
                log.info("job %s: its worker stopped before starting it; back to the queue", job.id)
                self._retry_redis(lambda job=job: self._requeue_unstarted(job), f"requeue job {job.id}")

    def _requeue_unstarted(self, job: Job) -> None:
        self.ledger.transition(
            job.id, JobState.PENDING, token=str(job.assignments),
            fields={"attempt": max(0, job.attempt - 1), "reason": "requeued: its worker stopped before starting it"},
        )
        self.r.lpush(self.keys.sched_wake, "1")

    # -- background loops -----------------------------------------------------------------
    def _tick_loop(self) -> None:
        """Heartbeat (expires after health.timeout) and this card's readings."""
        ttl = max(1, int(self.settings.health.timeout))
        while not self.shutdown.is_set():
            try:
                beat = {
                    "role": "card", "node": self.node, "card": self.index, "pid": os.getpid(),
                    "jobs": len(self.active_ids()), "seen_at": time.time(),
                }
                pipe = self.r.pipeline(transaction=False)
                pipe.set(self.keys.worker(self.worker_name), json.dumps(beat), ex=ttl)
                pipe.sadd(self.keys.workers, self.worker_name)
                pipe.execute()
                if self.backend is not None:
                    try:
                        reading = self.backend.read(self.index)
                        self.ledger.record_reading(self.node, reading)
                        self.ledger.set_healthy(self.node, self.index, True)
                    except GpuReadError as exc:
                        log.warning("card %s/%s cannot be read: %s", self.node, self.index, exc)
                        self.ledger.set_healthy(self.node, self.index, False, str(exc))
            except redis.RedisError as exc:
                log.debug("tick skipped, Redis unavailable: %s", exc)
            self.shutdown.wait(self.settings.telemetry_interval)
        try:
            self.r.delete(self.keys.worker(self.worker_name))
        except redis.RedisError:
            pass

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


def describe_exit(rc: int) -> str:
    """``137`` -> ``killed by signal SIGKILL (exit 137)``; ``127`` -> command not found."""
    if rc == 127:
        return "command not found (exit 127)"
    if rc == 126:
        return "command not executable (exit 126)"
    if rc > 128:
        try:
            name = signal.Signals(rc - 128).name
            return f"killed by signal {name} (exit {rc})"
        except ValueError:
            pass
    return f"exit code {rc}"


def _read_exit_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _reap(active: ActiveJob) -> None:
    if active.popen is not None:
        active.popen.poll()
