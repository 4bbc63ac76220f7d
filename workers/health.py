"""The periodic health check (beat -> control queue -> here). One runs at a time (a lock).

Each pass:
1. Dead card workers: a card whose worker has not heartbeated for ``health.timeout`` seconds
   (and whose node registered longer ago than that) has its RUNNING jobs stopped (if their
   process tree still runs on this node, so no second copy can ever run beside a retry),
   marked LOST and retried or sent to the error queue by policy; its ASSIGNED jobs go back to
   their place in the queue (they never started).
2. Zombie reservations: a card reservation whose job is not ASSIGNED/RUNNING on that card is
   given back (atomically re-checked in Lua).
3. Orphan processes: a process of this rig (by its RIG_KEY_PREFIX / RIG_JOB_ID environment) on
   this node whose job is not RUNNING here in that attempt is stopped with its session.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import redis

from rig.config import Settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import Job, JobState
from workers.outcomes import AttemptEnd, conclude
from workers.process_tree import environments, is_alive, session_members, stop_tree

log = logging.getLogger(__name__)


@dataclass
class HealthReport:
    lost: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    reclaimed: list[tuple[str, int, int]] = field(default_factory=list)  # card, job, bytes
    orphans_stopped: list[int] = field(default_factory=list)  # pids

    def __bool__(self) -> bool:
        return bool(self.lost or self.requeued or self.reclaimed or self.orphans_stopped)


class HealthChecker:
    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.r = client
        self.ledger = Ledger(client, self.keys)
        self.store = self.ledger.store

    def run_once(self) -> HealthReport | None:
        """One check under the health lock; None if another control worker holds it."""
        ttl_ms = int(max(self.settings.health.check_interval * 3, 10) * 1000)
        if not self.r.set(self.keys.health_lock, os.getpid(), nx=True, px=ttl_ms):
            return None
        try:
            report = HealthReport()
            self._dead_workers(report)
            self._zombie_reservations(report)
            self._orphan_processes(report)
            if report:
                log.warning("health: %s", report)
            return report
        finally:
            self.r.delete(self.keys.health_lock)

    # -- 1 --------------------------------------------------------------------------------
    def _dead_workers(self, report: HealthReport) -> None:
        node = self.settings.node_name
        registered = self.r.hget(self.keys.node(node), "started_at")
        if registered is None or time.time() - float(registered) < self.settings.health.timeout:
            return  # the node has just come up: its workers may not have heartbeated yet
        cards = [c for c in self.ledger.cards() if c.node == node]
        dead = {c.index for c in cards if c.allowed and not self.r.exists(self.keys.worker(f"card{c.index}@{node}"))}
        for card in cards:
            if card.index in dead and card.healthy:
                # No new jobs for a card nobody serves; its worker marks it healthy on return.
                self.ledger.set_healthy(node, card.index, False, "its worker is not running")
        if not dead:
            return
        ids = self.store.ids_in_state(JobState.RUNNING) + self.store.ids_in_state(JobState.ASSIGNED)
        for job in self.store.get_many(ids):
            if job.node != node or not job.cards or job.cards[0] not in dead:
                continue
            if job.state is JobState.ASSIGNED:
                code, _ = self.ledger.transition(
                    job.id, JobState.PENDING, token=job.assignments, mode="end", expect=JobState.ASSIGNED,
                    fields={"reason": f"requeued: the worker of card {job.cards[0]} is gone"})
                if code == 1:
                    report.requeued.append(job.id)
                continue
            if job.pid and is_alive(job.pid, job.proc_start):
                log.warning("job %s: its worker is dead; stopping its process tree first", job.id)
                stop_tree(job.pid, self.settings.kill_grace_seconds)
            code, _ = conclude(self.ledger, job, str(job.assignments), AttemptEnd(
                exit_code=None, lost=True, note=f"the worker of card {job.cards[0]} died"),
                expect=JobState.RUNNING)
            if code == 1:
                report.lost.append(job.id)

    # -- 2 --------------------------------------------------------------------------------
    def _zombie_reservations(self, report: HealthReport) -> None:
        for card in self.ledger.cards():
            for job_id in self.ledger.holdings(card.node, card.index):
                released = self.ledger.reclaim(card.node, card.index, job_id)
                if released:
                    report.reclaimed.append((card.id, job_id, released))
                    self.r.lpush(self.keys.sched_wake, "1")

    # -- 3 --------------------------------------------------------------------------------
    def _orphan_processes(self, report: HealthReport) -> None:
        mine = _rig_processes(self.settings.key_prefix, self.settings.redis_url)
        if not mine:
            return
        jobs = {j.id: j for j in self.store.get_many(sorted({jid for jid, _ in mine.values()}))}
        for sid, (job_id, attempt) in mine.items():
            job: Job | None = jobs.get(job_id)
            legit = (job is not None and job.state is JobState.RUNNING and job.node == self.settings.node_name
                     and job.attempt == attempt)
            if legit:
                continue
            if job is not None and job.state is JobState.RUNNING and job.pid is None:
                continue  # just claimed; its pid is being recorded
            log.warning("health: stopping orphan process tree %s of job %s attempt %s (job is %s)",
                        sid, job_id, attempt, job.state.value if job else "gone")
            stop_tree(sid, self.settings.kill_grace_seconds)
            report.orphans_stopped.append(sid)


def _rig_processes(prefix: str, redis_url: str) -> dict[int, tuple[int, int]]:
    """Session id -> (job id, attempt) of the job processes of this rig on this machine."""
    want_prefix = f"RIG_KEY_PREFIX={prefix}".encode()
    want_url = f"RIG_REDIS_URL={redis_url}".encode()
    found: dict[int, tuple[int, int]] = {}
    for pid, env in environments():
        if want_prefix not in env or want_url not in env:
            continue
        values = dict(item.split(b"=", 1) for item in env if b"=" in item)
        try:
            job_id, attempt = int(values[b"RIG_JOB_ID"]), int(values[b"RIG_ATTEMPT"])
            sid = os.getsid(pid)
        except (KeyError, ValueError, ProcessLookupError, PermissionError):
            continue
        if sid > 1 and session_members(sid):
            found.setdefault(sid, (job_id, attempt))
    return found
