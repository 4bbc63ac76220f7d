"""The health checks. Two kinds, because several nodes may share one Redis:

The cluster pass (``run_cluster``: beat -> control queue -> any one control worker; one at a
time under a lock) covers what only Redis needs:
A. Nodes (rig.nodes): a node with no heartbeat for ``health.timeout`` s, still silent on a later
   pass at least two heartbeat intervals on (a Redis restart expires every heartbeat at once),
   is declared down: its cards take no jobs, its ASSIGNED jobs go back to their place in the
   queue and its RUNNING jobs are marked LOST and retried on the other nodes or sent to the
   error queue by their retry policy. Its processes cannot be reached from here: if they still
   run (a network partition), the node's own local pass stops them when it reconnects, and the
   token fence makes their endings count for nothing. A node stopped on purpose (``rig down``)
   keeps its running jobs: its cards take no jobs, its ASSIGNED jobs are requeued, and it adopts
   the rest when it returns. A node that heartbeats again is up: its cards are eligible again.
B. Zombie reservations: a card reservation whose job is not ASSIGNED/RUNNING on that card is
   given back (atomically re-checked in Lua).
C. The web page's history: this minute's sample (rig.timeline: ended-job counters, card memory).

The local pass (``run_local``: every node's control worker, every ``health.check_interval`` s,
for its own node) covers what needs the node's processes:
1. Dead card workers: a card whose worker has not heartbeated for ``health.timeout`` seconds
   (and whose node registered longer ago than that) has its RUNNING jobs stopped (if their
   process tree still runs on this node, so no second copy can ever run beside a retry),
   marked LOST and retried or sent to the error queue by policy; its ASSIGNED jobs go back to
   their place in the queue (they never started).
2. Orphan processes: a process of this rig and this node (by its RIG_KEY_PREFIX /
   RIG_NODE_NAME / RIG_JOB_ID environment) whose job is not RUNNING here in that attempt is
   stopped with its session: after a rejoin, this is what stops a copy that was re-run elsewhere.
   SIGTERM on the pass that finds it, SIGKILL on a pass ``kill_grace_seconds`` later: a pass
   never waits for one to die.

``run_once`` does both (tests and scripts).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rig import timeline
from rig.clock import shared_now
from rig.config import Settings
from rig.draining import NO_WORKER_REASON, needs_worker
from rig.installation import JOIN, NEW, Installation, Verdict
from rig.keys import Keys, card_worker_name, split_card_id
from rig.ledger import Ledger
from rig.models import CardState, Job, JobState
from rig.nodes import NODE_DOWN_REASON, NODE_STOPPED_REASON, NodeInfo, NodeRegistry
from rig.redis_conn import without_credentials
from rig.redis_writes import is_outage
from rig.rollback import unchecked
from rig.supervision import beat_pid, hung_after
from workers.outcomes import AttemptEnd, conclude
from workers.process_tree import (
    begin_stop,
    environments,
    is_alive,
    is_job_process,
    pids_words,
    session_is_ours,
    session_members,
    signal_tree,
    stop_tree,
)
from workers.unrecorded import UNRECORDED_FIELD, running_line

#: A fake-card usage folder unchanged this long (s) whose job does not run here is removed.
STALE_USAGE_DIR_S = 60.0

log = logging.getLogger(__name__)


@dataclass
class HealthReport:
    lost: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    reclaimed: list[tuple[str, int, int]] = field(default_factory=list)  # card, job, bytes
    orphans_stopped: list[int] = field(default_factory=list)  # pids
    nodes_down: list[str] = field(default_factory=list)  # declared down in this pass
    nodes_back: list[str] = field(default_factory=list)  # heartbeating again after being down

    def __bool__(self) -> bool:
        return bool(self.lost or self.requeued or self.reclaimed or self.orphans_stopped
                    or self.nodes_down or self.nodes_back)


@dataclass
class OrphanStop:
    """An orphan session the local pass is stopping without waiting for it: SIGTERM at
    ``termed_at``, SIGKILL from the first pass ``kill_grace_seconds`` later (``killed_at``),
    and again each pass while any of it is left (monotonic s)."""

    job_id: int
    attempt: int
    termed_at: float
    killed_at: float | None = None
    outlived_said: bool = False  # its "outlived SIGKILL" line is said once


class HealthChecker:
    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.r = client
        self.ledger = Ledger(client, self.keys, usage_half_life_s=settings.fair_share_half_life_hours * 3600)
        self.store = self.ledger.store
        self.nodes = NodeRegistry(client, self.keys)
        self._mismatch_said: str | None = None
        self._unrecorded_said: str | None = None
        self._outage_at = -1e9  # when a pass last found Redis out (monotonic s)
        #: when this checker's last local pass ended (monotonic s; None: none yet)
        self._local_done_at: float | None = None
        self._replaced: dict[int, float] = {}  # card index -> when its hung worker was killed (monotonic)
        self._beat_pids: dict[int, int] = {}  # card index -> the pid last seen in its worker's heartbeat
        #: card index -> the node's started_at when its worker was last seen heartbeating: a
        #: worker of this run of the node that beat once is no longer being started
        self._beat_in_run: dict[int, str] = {}
        #: session id -> the orphan being stopped there (see _stop_orphans)
        self._orphan_stops: dict[int, OrphanStop] = {}

    def run_once(self) -> HealthReport | None:
        """The cluster pass and this node's local pass; None if another holds either lock."""
        cluster = self.run_cluster()
        local = self.run_local()
        if cluster is None or local is None:
            return None
        return HealthReport(
            lost=cluster.lost + local.lost, requeued=cluster.requeued + local.requeued,
            reclaimed=cluster.reclaimed, orphans_stopped=local.orphans_stopped,
            nodes_down=cluster.nodes_down, nodes_back=cluster.nodes_back)

    def run_cluster(self, now: float | None = None) -> HealthReport | None:
        """Nodes and zombie reservations, for the whole cluster (beat: once per interval);
        None if another control worker is running it."""
        when = now or shared_now(self.r)
        return self._locked(self.keys.health_lock,
                            (lambda report: self._node_liveness(report, when), self._zombie_reservations,
                             lambda _report: timeline.record(self.r, self.keys, self.ledger.cards(), when)))

    def run_local(self) -> HealthReport | None:
        """Dead card workers and orphan processes of this node (its control worker), unless
        the Redis is not this node's installation (then nothing here acts: see
        rig.installation)."""
        now = time.monotonic()
        if self._local_done_at is not None and now - self._local_done_at > self.settings.health.timeout:
            # No pass for that long: Redis had no master (a fail-over without quorum), or this
            # process was stopped. Heartbeats expired meanwhile are no silence this pass saw:
            # it killed two card workers as hung a second after a 70 s outage ended.
            self._outage_at = now
        if self.installation_mismatch() is not None:
            report: HealthReport | None = HealthReport()
        else:
            report = self._locked(self.keys.node_health_lock(self.settings.node_name),
                                  (self._dead_workers, self._orphan_processes, self._stale_usage_dirs))
        self._local_done_at = time.monotonic()
        return report

    def installation_mismatch(self) -> str | None:
        """Check that Redis still holds the installation this node joined. When it does not
        and jobs of another installation still run here, mark the node (status, alerts) and
        return the line; nothing is killed or concluded. When every job running here belongs to
        the installation in Redis (none, or the node comes back to the Redis its jobs were
        started from), join it and register this node's cards (nothing can be lost by that)."""
        node = self.settings.node_name
        found = node_identity(self.settings, self.r)
        verdict, inst = found.verdict, found.installation
        if not verdict.mismatch:
            if verdict.kind in (NEW, JOIN):
                inst.join()
            return None
        if found.others:
            line = inst.mark(verdict, found.jobs)
            if line != self._mismatch_said:
                log.critical("%s", line)
                self._mismatch_said = line
            return line
        why = (f"the {len(found.running)} job(s) running on {node} belong to it" if found.running
               else f"no job runs on {node}")
        log.critical("%s; %s: joining it and registering the node's cards again", verdict.explain(node), why)
        from rig.gpus import detect_backend
        from rig.registration import register_node, up_pid

        backend, _notice = detect_backend(self.settings.fake_gpus, self.settings.fake_usage_dir, node=node)
        inst.join()
        register_node(self.settings, self.r, backend, log.warning, pid=up_pid(self.settings))
        self._mismatch_said = None
        return None

    def _locked(self, lock: str, steps: Sequence[Callable[[HealthReport], None]]) -> HealthReport | None:
        """Run ``steps`` into one report under ``lock``; None if someone else holds it."""
        ttl_ms = int(max(self.settings.health.check_interval * 3, 10) * 1000)
        try:
            if not self.r.set(lock, os.getpid(), nx=True, px=ttl_ms):
                return None
        except redis.RedisError as exc:
            if is_outage(exc):  # heartbeats were refused too: _dead_workers gives them time
                self._outage_at = time.monotonic()
            raise
        try:
            report = HealthReport()
            for step in steps:
                step(report)
            if report:
                log.warning("health: %s", report)
            return report
        finally:
            self.r.delete(lock)

    # -- A --------------------------------------------------------------------------------
    def _node_liveness(self, report: HealthReport, now: float) -> None:
        me = self.settings.node_name
        # A heartbeat lost in a Redis restart comes back within one interval: wait two.
        confirm = 2 * self.settings.telemetry_interval
        cards = self.ledger.cards()
        for node in self.nodes.read():
            if node.name == me:
                continue  # this pass runs here, so this node is up; its local pass covers it
            if node.alive:
                if node.down_since is not None or node.missing_since is not None:
                    self.nodes.clear_down(node.name)
                    if node.down_since is not None:
                        log.warning("node %s is back (it was down since %s)", node.name, node.down_since)
                        report.nodes_back.append(node.name)
                self._restore_cards(node.name, cards)
                self._workerless(node, cards, report, now)
                continue
            if node.state == "stopped":
                since = time.strftime("%H:%M:%S", time.localtime(node.stopped_at or now))
                self._disable_cards(node.name, cards, f"{NODE_STOPPED_REASON} at {since}: its running "
                                    "jobs are adopted when it returns")
                self._requeue_assigned(node, report, "stopped")
                continue
            if node.missing_since is None:
                self.nodes.note_missing(node.name, now)
                continue
            if now - node.missing_since < confirm:
                continue
            seen = time.strftime("%H:%M:%S", time.localtime(node.last_seen or now))
            # Its cards close before the node is said down: whoever reads "down" finds them closed.
            self._disable_cards(node.name, cards, f"{NODE_DOWN_REASON}: no heartbeat since {seen}")
            if node.down_since is None:
                self.nodes.set_down(node.name, now)
                report.nodes_down.append(node.name)
                log.warning("node %s is down: no heartbeat since %s; its jobs are handled by their "
                            "retry policy on the other nodes", node.name, node.last_seen)
            # Every pass, not only the first: a dispatcher may have placed a job there just
            # before its cards were disabled.
            self._requeue_assigned(node, report, "down")
            self._conclude_running(node, report)

    def _workerless(self, node: NodeInfo, cards: list[CardState], report: HealthReport, now: float) -> None:
        """A node up (its ``rig up`` heartbeats) with no live worker of its own for
        ``health.timeout`` past its start (NodeInfo.no_worker: a worker's heartbeat outlives it
        by that long, so none beat for that long): nothing there runs what is placed on its
        cards, and its own local pass, which would close them (_dead_workers), runs in the very
        control worker that is missing. Its cards that need a worker take no new jobs (each
        card's worker makes it healthy again at its first reading) and its placed-but-unstarted
        jobs go back to their place in the queue. Running ones are left alone: their processes
        may run on, and a worker that returns adopts them.

        Its ``rig up`` heartbeats only while a worker process of it lives, so none heartbeating
        is a worker still starting (given STARTUP_GRACE_S past the node's start, as the node's
        own pass gives it: hung_after) or one silenced by a Redis that refused every write
        (given health.timeout after it, as _dead_workers does)."""
        timeout = self.settings.health.timeout
        if not node.no_worker or node.started_at is None or now - node.started_at < hung_after(timeout, beat_seen=False):
            return
        if time.monotonic() - self._outage_at < timeout:
            return
        served = [c for c in cards if c.node == node.name and c.healthy and needs_worker(c)]
        if served:
            log.warning("node %s is up but none of its workers has heartbeated for %s s: its cards "
                        "take no new jobs until their workers return", node.name, timeout)
        self._disable_cards(node.name, served, NO_WORKER_REASON)
        self._requeue_assigned(node, report, "up with no worker alive")

    def _node_jobs(self, node: str) -> list[Job]:
        ids = self.store.ids_in_state(JobState.RUNNING) + self.store.ids_in_state(JobState.ASSIGNED)
        return [j for j in self.store.get_many(ids) if j.node == node]

    def _disable_cards(self, node: str, cards: list[CardState], reason: str) -> None:
        for card in cards:
            if card.node == node and (card.healthy or card.health_reason != reason):
                self.ledger.set_healthy(node, card.index, False, reason)

    def _restore_cards(self, node: str, cards: list[CardState]) -> None:
        """Cards the node checks disabled take jobs again once their own worker heartbeats
        (a card whose worker is still missing stays out; its worker restores it on return)."""
        for card in cards:
            if card.node != node or card.healthy:
                continue
            if not card.health_reason.startswith((NODE_DOWN_REASON, NODE_STOPPED_REASON)):
                continue
            # A card with no worker to wait for (outside gpu_whitelist, holding nothing): at once.
            if not needs_worker(card) or self.r.exists(self.keys.worker(card_worker_name(node, card.index))):
                self.ledger.set_healthy(node, card.index, True)

    def _requeue_assigned(self, node: NodeInfo, report: HealthReport, why: str) -> None:
        for job in self._node_jobs(node.name):
            if job.state is not JobState.ASSIGNED:
                continue
            code, _ = self.ledger.transition(
                job.id, JobState.PENDING, token=job.assignments, mode="end", expect=JobState.ASSIGNED,
                fields={"reason": f"requeued: node {node.name} is {why} (it never started)"})
            if code == 1:
                report.requeued.append(job.id)

    def _conclude_running(self, node: NodeInfo, report: HealthReport) -> None:
        """A down node's running jobs end lost, as of its last heartbeat: the last moment rig
        knows them to run (concluded "now", the attempt was charged for the ~40 s it takes to
        declare a node down: a job killed with its host 7 s in read 'lost ... 43s', and `rig
        usage` and fair share counted those seconds as the user's card time)."""
        for job in self._node_jobs(node.name):
            if job.state is not JobState.RUNNING:
                continue
            ended = max(node.last_seen, job.started_at or 0.0) if node.last_seen else None
            self._lost(job, f"node {node.name} stopped heartbeating", report, ended_at=ended)

    # -- 1 --------------------------------------------------------------------------------
    def _dead_workers(self, report: HealthReport) -> None:
        node = self.settings.node_name
        registered = self.r.hget(self.keys.node(node), "started_at")
        up_for = None if registered is None else shared_now(self.r) - float(registered)
        if up_for is None or up_for < self.settings.health.timeout:
            return  # the node has just come up: its workers may not have heartbeated yet
        if time.monotonic() - self._outage_at < self.settings.health.timeout:
            return  # Redis just took writes again after refusing every heartbeat: not silence
        cards = self.ledger.cards(node)
        served = [c for c in cards if needs_worker(c)]
        beats = self.r.mget([self.keys.worker(card_worker_name(node, c.index)) for c in served]) if served else []
        dead = set()
        for card, raw in zip(served, beats, strict=True):
            if raw is None:
                dead.add(card.index)
                continue
            pid = beat_pid(raw)  # which process heartbeats: one seen once is no longer starting (hung_after)
            if pid is not None:
                self._beat_pids[card.index] = pid
            self._beat_in_run[card.index] = registered
        if dead and self.r.hexists(self.keys.node(node), "stopped_at"):
            # rig down: the node is marked stopped before its workers stop, and a stopping worker
            # deletes its heartbeat. Read after the heartbeats, the mark is seen whenever that is
            # why one is gone: its jobs run on and are adopted on return (CI: a pass that ran
            # during rig down stopped a job as 'the worker of card 2 died').
            return
        for card in cards:
            if card.index in dead and card.healthy:
                # No new jobs for a card nobody serves; its worker marks it healthy on return.
                self.ledger.set_healthy(node, card.index, False, NO_WORKER_REASON)
        if not dead:
            return
        living = self._card_worker_processes(dead)
        for index, (pid, age) in sorted(living.items()):
            # Alive but silent: not dead. One that is still starting is left alone; one silent
            # for health.timeout (stopped, deadlocked) is killed so rig up starts another, which
            # adopts its jobs. Concluding them here would stop (and re-run) jobs that run on, or
            # that ended by themselves while nobody watched.
            # Starting, not hung, until its first heartbeat (rig.supervision.hung_after).
            if age < hung_after(self.settings.health.timeout, beat_seen=self._beat_pids.get(index) == pid):
                continue
            log.warning("card %s/%s: its worker (pid %s) lives but has not heartbeated for %s s (hung?); "
                        "killing it so another adopts its jobs", node, index, pid, self.settings.health.timeout)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._replaced[index] = time.monotonic()
        # A card whose hung worker this check killed: rig up is starting another, which will
        # adopt its jobs; give it health.timeout before they count as lost.
        waiting = {i for i, t in self._replaced.items() if time.monotonic() - t < self.settings.health.timeout}
        # No process yet, and none of this run of the node ever beat: rig up is still starting
        # it (a loaded host took more than health.timeout after `rig up` to spawn them: the jobs
        # it was to adopt after `rig down` / `rig up` were stopped and failed as lost), given the
        # grace of a starting worker. rig up restarts one that dies; that one adopts the jobs.
        starting = {i for i in dead if self._beat_in_run.get(i) != registered
                    and up_for < hung_after(self.settings.health.timeout, beat_seen=False)}
        dead -= set(living) | waiting | starting
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
            if job.stuck and job.pid and session_is_ours(job.pid, job.proc_start) and session_members(job.pid):
                # Noted stuck, and stopped, already: a process of its session still outlives
                # SIGKILL (its wrapper, that session's leader, may be gone: a pid stays taken while
                # a session of its name has members, so they are the job's). It keeps its cards
                # (was: the next pass failed it as lost, its cards given back, the process alive),
                # and is not stopped again (each pass waited out kill_grace_seconds).
                continue
            if job.pid and is_alive(job.pid, job.proc_start):
                if is_job_process(job.pid, job.id, self.settings.key_prefix, job.instance):
                    log.warning("job %s: its worker is dead; stopping its process tree first", job.id)
                    stop_tree(job.pid, self.settings.kill_grace_seconds)
                    survivors = session_members(job.pid)
                    if survivors:
                        # Stuck in the kernel (state D), they may hold its cards' memory: it stays
                        # RUNNING, its cards reserved, and the card's next worker adopts it and
                        # waits for them (workers.card_runner: _await_gone).
                        log.warning("job %s: %s of it outlived SIGKILL; it keeps its cards until they are gone",
                                    job.id, pids_words(survivors))
                        self.store.update_while_running(job.id, job.assignments, stuck=pids_words(survivors))
                        continue
                else:  # a damaged or forged pid: never signal it (the orphan check finds the job's own)
                    log.warning("job %s: recorded pid %s is not its process; not signalled", job.id, job.pid)
            self._lost(job, f"the worker of card {job.cards[0]} died", report)

    def _card_worker_processes(self, cards: set[int]) -> dict[int, tuple[int, float]]:
        """Card index -> (pid, age in s) of a live card worker process of this node (found by
        rig.supervision's marks) among ``cards``."""
        from rig.supervision import node_processes

        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        found: dict[int, tuple[int, float]] = {}
        for proc in node_processes(self.settings.node_name, self.settings.home):
            if proc.role == "card" and proc.card.isdigit() and int(proc.card) in cards \
                    and is_alive(proc.pid, proc.start):
                age = uptime - (proc.start or 0) / ticks
                found[int(proc.card)] = (proc.pid, age)
        return found

    def _lost(self, job: Job, why: str, report: HealthReport, ended_at: float | None = None) -> None:
        """End a RUNNING job's attempt as lost (``why``), at ``ended_at`` (shared clock; None:
        now); its retry policy decides what next. Not while Redis restarted unchecked: it may be
        a stale copy of a job that finished and was archived (rig.rollback); a later pass sees it."""
        if unchecked(self.r, self.keys, self.settings.archive_interval):
            return
        code, _ = conclude(self.ledger, job, str(job.assignments),
                           AttemptEnd(exit_code=None, lost=True, note=why, ended_at=ended_at), expect=JobState.RUNNING)
        if code == 1:
            report.lost.append(job.id)

    # -- B --------------------------------------------------------------------------------
    def _zombie_reservations(self, report: HealthReport) -> None:
        """Give back reservations whose job no longer holds them. Every reservation and its
        job's placement are read in two pipelines; reclaim.lua (which decides, atomically) runs
        only for those not plainly held by a live job there: a cluster's 2,048 running jobs
        cost two round trips every pass, not 2,048 scripts."""
        held = self.ledger.holdings_of(self.ledger.cards())
        pairs = [(cid, job_id) for cid, jobs in held.items() for job_id in jobs]
        pipe = self.r.pipeline(transaction=False)
        for _cid, job_id in pairs:
            pipe.hmget(self.keys.job(job_id), "state", "node", "cards")
        for (cid, job_id), (state, node, cards) in zip(pairs, pipe.execute(), strict=True):
            name, index = split_card_id(cid)
            if state in (JobState.ASSIGNED.value, JobState.RUNNING.value) and node == name \
                    and _names_card(cards, index):
                continue
            released = self.ledger.reclaim(name, index, job_id)
            if released:
                report.reclaimed.append((cid, job_id, released))
                self.r.lpush(self.keys.sched_wake, "1")

    # -- 2 --------------------------------------------------------------------------------
    def _orphan_processes(self, report: HealthReport) -> None:
        """Stop job processes of this node that should not run (their job ended, was re-run
        elsewhere, or is in another attempt). Never one whose record is missing: Redis then
        lost it (rolled back to an older copy, or lost its data), and killing a job rig cannot
        account for is not rig's call: the node is marked and `rig recover --stop` offered.
        Never one of another installation (rig.installation). Not limited to this home's
        log_dir: a rig up of another home that took the node name over adopted its jobs (same
        Redis, prefix and name), and another rig's own Redis is told apart by URL and installation."""
        current = Installation(self.r, self.keys, self.settings.run_dir, self.settings.node_name).on_node()
        mine = {sid: p for sid, p in node_job_processes(self.settings.key_prefix, self.settings.node_name,
                                                        self.settings.redis_url).items()
                if p.installation is None or p.installation == current}
        jobs = {j.id: j for j in self.store.get_many(sorted({p.job_id for p in mine.values()}))} if mine else {}
        unrecorded: list[int] = []
        orphans: dict[int, tuple[JobProcess, JobState]] = {}
        for sid, proc in mine.items():
            job_id, attempt = proc.job_id, proc.attempt
            job: Job | None = jobs.get(job_id)
            if job is None:
                unrecorded.append(job_id)
                continue
            # The instance, not the reusable id, says whose process it is (ids restart at 1
            # when Redis loses its data). A process without one predates instances.
            if proc.instance is not None and job.instance is not None and proc.instance != job.instance:
                unrecorded.append(job_id)
                continue
            legit = job.state is JobState.RUNNING and job.node == self.settings.node_name and job.attempt == attempt
            if legit:
                continue
            if job.state is JobState.RUNNING and job.pid is None:
                continue  # just claimed; its pid is being recorded
            if not session_members(sid):
                # It ended by itself between the scan of /proc and the read of its record (its
                # card worker records an ending only once the job's session is empty): not an
                # orphan, nothing to stop or to say (was a false "stopping orphan" line).
                continue
            orphans[sid] = (proc, job.state)
        self._stop_orphans(orphans, report)
        self._mark_unrecorded(sorted(set(unrecorded)))

    def _stop_orphans(self, orphans: dict[int, tuple[JobProcess, JobState]], report: HealthReport) -> None:
        """Stop the orphan sessions of this pass without waiting for them: SIGTERM one first
        seen, SIGKILL one still there ``kill_grace_seconds`` later (on the first pass after
        that), and say each step once. Waiting here (stop_tree: the grace + 2 s) held the
        control worker that long per orphan that did not die, every pass. A session no longer
        an orphan (gone, or its session id now another job's) is forgotten."""
        now = time.monotonic()
        for sid in list(self._orphan_stops):
            stop, found = self._orphan_stops[sid], orphans.get(sid)
            if found is None or (found[0].job_id, found[0].attempt) != (stop.job_id, stop.attempt):
                del self._orphan_stops[sid]
        for sid, (proc, state) in sorted(orphans.items()):
            stop = self._orphan_stops.get(sid)
            if stop is None:
                log.warning("health: stopping orphan process tree %s of job %s attempt %s (job is %s)",
                            sid, proc.job_id, proc.attempt, state.value)
                begin_stop(sid)
                self._orphan_stops[sid] = OrphanStop(proc.job_id, proc.attempt, termed_at=now)
                report.orphans_stopped.append(sid)
                continue
            if stop.killed_at is None and now - stop.termed_at < self.settings.kill_grace_seconds:
                continue
            if stop.killed_at is None:
                log.warning("health: orphan process tree %s of job %s outlived SIGTERM by %g s; SIGKILL",
                            sid, proc.job_id, self.settings.kill_grace_seconds)
                stop.killed_at = now
            elif not stop.outlived_said:
                # Stuck in the kernel (state D) or new members since: SIGKILLed again each pass.
                log.warning("health: %s of orphan process tree %s of job %s outlived SIGKILL; "
                            "signalled again each pass", pids_words(session_members(sid)), sid, proc.job_id)
                stop.outlived_said = True
            signal_tree(sid, signal.SIGKILL)

    def _stale_usage_dirs(self, report: HealthReport) -> None:  # noqa: ARG002 - a health step
        """Remove the fake-card usage folders (rig.gpus.fake.job_usage_dir) of jobs that no
        longer run on this node: the card worker removes a job's folder when its attempt ends,
        but not one whose card worker died and whose ending another process recorded. A folder
        younger than STALE_USAGE_DIR_S is left alone (a new attempt may have just made it); so is
        one of a job Redis has no record of while a live process still writes in it (Redis lost
        the record; the job is reported as unrecorded, not cleaned up after)."""
        if not self.settings.fake_gpus:
            return
        from rig.gpus.fake import drop_job_usage_dir, job_usage_dirs, job_usage_in_use, jobs_dir_for

        jobs_dir = jobs_dir_for(self.settings.fake_usage_dir)
        folders = job_usage_dirs(jobs_dir, older_than=STALE_USAGE_DIR_S)
        if not folders:
            return
        jobs = {j.id: j for j in self.store.get_many(sorted(folders))}
        for job_id, folder in sorted(folders.items()):
            job = jobs.get(job_id)
            if job is None and job_usage_in_use(folder):
                continue
            if job is not None and job.state in (JobState.ASSIGNED, JobState.RUNNING) \
                    and job.node == self.settings.node_name:
                continue
            log.info("health: removing the fake-card usage folder of job %s (it runs here no more)", job_id)
            drop_job_usage_dir(jobs_dir, job_id)

    def _mark_unrecorded(self, jobs: list[int]) -> None:
        """Say on the node record (rig status, alerts) which jobs run here that Redis has no
        record of; clear it when there are none."""
        key = self.keys.node(self.settings.node_name)
        if not jobs:
            if self._unrecorded_said:
                self.r.hdel(key, UNRECORDED_FIELD)
                self._unrecorded_said = None
            return
        line = running_line(self.settings.node_name, jobs)
        self.r.hset(key, UNRECORDED_FIELD, line)
        if line != self._unrecorded_said:
            log.critical("%s", line)
            self._unrecorded_said = line


@dataclass(frozen=True)
class JobProcess:
    """What a job process's environment says it is."""

    job_id: int
    attempt: int
    instance: str | None  # RIG_JOB_INSTANCE; None for processes started before instances
    installation: str | None = None  # RIG_INSTALLATION: the installation it was started under


def node_job_processes(prefix: str, node: str, redis_url: str | None = None,
                       log_dir: Path | None = None) -> dict[int, JobProcess]:
    """Session id -> what the job processes of this key prefix and node on this machine are
    (several nodes of one cluster may share a machine, e.g. in tests: each sees only its own).
    With ``redis_url``, only those started against that Redis (its password aside: a job run as
    another user gets the URL without it). With ``log_dir``, only those started by this home's
    workers (their exit file is under it): another rig on this machine with its own Redis and
    home may use the same node name, and its jobs are not this node's to judge or stop."""
    want = [f"RIG_KEY_PREFIX={prefix}".encode(), f"RIG_NODE_NAME={node}".encode()]
    url = without_credentials(redis_url) if redis_url is not None else None
    logs = os.fsencode(str(log_dir)).rstrip(b"/") + b"/" if log_dir is not None else None
    found: dict[int, JobProcess] = {}
    for pid, env in environments():
        if not all(item in env for item in want):
            continue
        values = dict(item.split(b"=", 1) for item in env if b"=" in item)
        if url is not None and without_credentials(values.get(b"RIG_REDIS_URL", b"").decode("utf-8", "replace")) != url:
            continue
        exit_file = values.get(b"RIG_EXIT_FILE")
        if logs is not None and exit_file is not None and not exit_file.startswith(logs):
            continue
        try:
            job_id, attempt = int(values[b"RIG_JOB_ID"]), int(values[b"RIG_ATTEMPT"])
            instance = values.get(b"RIG_JOB_INSTANCE", b"").decode("ascii", "replace") or None
            installation = values.get(b"RIG_INSTALLATION", b"").decode("ascii", "replace") or None
            sid = os.getsid(pid)
        except (KeyError, ValueError, ProcessLookupError, PermissionError):
            continue
        if sid > 1 and session_members(sid):
            found.setdefault(sid, JobProcess(job_id, attempt, instance, installation))
    return found


@dataclass
class NodeIdentity:
    """This node against the Redis it talks to now (rig.installation), with its running jobs."""

    installation: Installation
    verdict: Verdict
    running: dict[int, JobProcess]  # session id -> every job process of this node (any Redis URL)
    others: dict[int, JobProcess]  # those not of the installation in Redis

    @property
    def jobs(self) -> list[int]:
        """Ids of the jobs of another installation running here."""
        return sorted({p.job_id for p in self.others.values()})


def node_identity(settings: Settings, client: redis.Redis) -> NodeIdentity:
    """The verdict, and which job processes running here belong to another installation than
    the one in Redis (a process says which it was started under; one from before that was
    recorded belongs to the installation the node joined)."""
    inst = Installation(client, Keys(settings.key_prefix), settings.run_dir, settings.node_name)
    verdict = inst.check()
    running = node_job_processes(settings.key_prefix, settings.node_name, log_dir=settings.job_log_dir)

    def belongs(proc: JobProcess) -> bool:
        started_under = proc.installation or verdict.expected
        return verdict.found is not None and started_under in (verdict.found, None)

    others = {sid: p for sid, p in running.items() if not belongs(p)}
    return NodeIdentity(inst, verdict, running, others)


def _names_card(cards: str | None, index: int) -> bool:
    """Does a job's stored card list (JSON) plainly name card ``index``? Anything unreadable is
    left to reclaim.lua to judge."""
    try:
        return index in json.loads(cards or "[]")
    except (ValueError, TypeError):
        return False
