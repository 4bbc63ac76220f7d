"""The Celery app and rig's thin tasks. Run by ``rig up`` as:

  control worker: RIG_ROLE=control celery -A workers.app worker -Q rig.high,rig.medium,rig.low,rig.control
  card worker:    RIG_ROLE=card RIG_CARD_INDEX=3 celery -A workers.app worker -Q rig.card.<node>.3
  beat:           celery -A workers.app beat   (celery-redbeat: one ticking beat at a time)
  flower:         celery -A workers.app flower

The tasks only call into rig: the dispatcher and the card runner hold the logic. A start
reaches its card worker without a Celery message: the dispatcher's reservation pushes it onto
the card's start list in Redis, which the card worker takes from (workers.start_list). Card
workers stay Celery workers (heartbeats, remote control, Flower's worker view) and consume
their card queue only to drain a ``rig.start_job`` an older rig queued.

Several nodes may share one Redis, each with its own control worker and beat. Cluster-wide
duties run once: beat's lock lets one beat send the periodic tasks, each of which one control
worker takes (rig.health: nodes and reservations), and the dispatcher leads under its own
lock. Node duties run on every node: its control worker heartbeats for the node and, every
health.check_interval s, checks its own card workers and processes (HealthChecker.run_local);
hourly it sweeps its own old job logs.

Started by ``rig up``, every one of these processes dies with it and a node never runs two
workers of one card or two control workers, across processes (``_bind_to_node`` below).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time

import redis
from celery.signals import worker_ready, worker_shutting_down

from rig.authgate import quiet_on_auth
from rig.celery_config import (
    LOG_SWEEP_INTERVAL_S,
    TASK_ALERTS,
    TASK_ARCHIVE,
    TASK_HEALTH,
    TASK_START_JOB,
    TASK_SUBMITTED,
    TASK_TICK,
    make_celery,
)
from rig.clock import shared_now
from rig.config import load_settings
from rig.gpus import detect_backend
from rig.keys import Keys
from rig.lograte import Throttle
from rig.node_claim import OWNER_ENV
from rig.nodes import NodeRegistry
from rig.redis_conn import connect
from rig.redis_writes import is_outage
from rig.supervision import beat_supervisor, supervisor_gone, watch_supervisor
from rig.worker_lock import EXIT_LOCK_HELD, LockHeld, acquire, lock_path, worker_lock_name
from workers import broker_quiet, celery_clock, kombu_patches, remote_control
from workers.alert_check import AlertChecker
from workers.card_runner import CardRunner
from workers.dispatcher import Dispatcher
from workers.flower_bridge import FlowerBridge
from workers.forecaster import Forecaster
from workers.health import HealthChecker
from workers.log_sweep import rotate_own_logs, sweep_logs

log = logging.getLogger("rig.worker")
kombu_patches.install()
broker_quiet.install()  # a broker outage: one line a minute, no deprecation essay
if os.environ.get("RIG_ROLE") == "flower" or "flower" in sys.argv[1:]:  # a Flower (rig's, or by hand)
    from workers import flower_patches

    flower_patches.install()

settings = load_settings()

#: Allocations of container objects between two young collections in a worker (Python: 700).
GC_YOUNG_THRESHOLD = 50_000


def _bind_to_node() -> int | None:
    """Die with the ``rig up`` that started this process (rig.supervision), and hold this
    worker's lock for life (rig.worker_lock): a second worker of the same card, or a second
    control worker, exits here with one line naming the first one's pid. Returns the lock's
    descriptor (kept open until exit) or None (beat, or a process not started by rig up)."""
    watch_supervisor()
    name = worker_lock_name(os.environ.get("RIG_ROLE", ""), os.environ.get("RIG_CARD_INDEX"))
    if name is None:
        return None
    try:
        return acquire(lock_path(settings.run_dir, settings.node_name, name))
    except LockHeld as held:
        print(f"rig: {name} of node {settings.node_name} already runs here as pid {held.holder} "
              f"(lock {held.path}); this copy exits", file=sys.stderr, flush=True)
        os._exit(EXIT_LOCK_HELD)


_role_lock = _bind_to_node()
app = make_celery(settings)
keys = Keys(settings.key_prefix)
_redis = connect(settings.redis_url)
celery_clock.install(app, lambda: _redis)  # beat's schedule and task expiry on Redis' clock

# Flower shows jobs, not these tasks: each rig task says send_events=False (they are transport,
# rig.task_events), and the job's own task events come from the bridge (workers.flower_bridge).


def _stop_job_for_flower(job_id: int, instance: str | None) -> str:
    """Flower's Terminate (or Revoke) of job ``job_id`` (its instance starting ``instance``):
    rig kill's path, as an admin (workers.remote_control). A row of an earlier job whose id is
    reused stops nothing."""
    from rig.client import Client
    from rig.task_events import same_job

    client = Client(settings, redis_client=_redis)
    job = client.get(job_id)
    if not same_job(job, instance):
        return f"job {job_id} of that row is gone (its id names another job now): nothing stopped"
    if job.state.terminal:
        return f"job {job_id} has ended already ({job.state.value})"
    client.kill(job_id, wait=False, admin=remote_control.FLOWER_ADMIN)
    log.warning("job %s: stopped from Flower (%s)", job_id, remote_control.FLOWER_ADMIN)
    return f"job {job_id}: stopping it (as {remote_control.FLOWER_ADMIN})"


def _flower_listens() -> None:
    """A Flower started listening (workers.remote_control): the bridge tells it again."""
    if _bridge is not None:
        _bridge.listener_joined()


if os.environ.get("RIG_ROLE") == "control":
    remote_control.install(_stop_job_for_flower, listener_joined=_flower_listens)
else:
    remote_control.install(None)

_runner: CardRunner | None = None
_dispatcher: Dispatcher | None = None
_forecaster: Forecaster | None = None
_alert_checker: AlertChecker | None = None
_bridge: FlowerBridge | None = None
_control_stop = threading.Event()


@app.task(name=TASK_SUBMITTED, ignore_result=True, send_events=False)
def submitted(job_id: int) -> None:
    """A job arrived on a priority queue: nothing to do (rig.notify; Flower shows the job
    itself, workers.flower_bridge). The transaction that stored the job woke the dispatcher
    already (JobStore.create, and retry's wake_dispatcher)."""


@app.task(name=TASK_START_JOB, ignore_result=True, send_events=False)
def start_job(job_id: int, token: str) -> str:
    """A start message an older rig queued on this card's Celery queue: onto the card's start
    list, where this worker (or the node name's owner's) takes it (workers.start_list). No
    start is sent through Celery any more; a copy too many is refused by the claim."""
    if _runner is None:
        raise RuntimeError("start_job reached a worker that serves no card (RIG_ROLE != card)")
    _runner.starts.push(int(job_id), str(token))
    return "moved to the card's start list"


#: How long the answer of _name_is_ours is kept (s): asked before each take of a start.
NAME_CHECK_S = 1.0
_name_checked: tuple[float, bool] = (-NAME_CHECK_S, True)


def _name_is_ours() -> bool:
    """Read only: does no other process than the rig up that started this worker own the node
    name? (True for a worker not started by rig up, and while nobody holds it.) Read from Redis
    at most every NAME_CHECK_S s: a takeover waits health.timeout s for the claim to lapse."""
    global _name_checked
    from rig.node_claim import OWNER_ENV, held_by_other

    ident = os.environ.get(OWNER_ENV)
    if not ident:
        return True
    at, ours = _name_checked
    if time.monotonic() - at < NAME_CHECK_S:
        return ours
    try:
        ours = held_by_other(_redis, keys, settings.node_name, ident) is None
    except redis.RedisError:
        ours = True  # proves nothing: run_job meets the same Redis and handles it as before
    if not ours and _name_checked[1]:
        log.warning("node name %s is another rig up's now: this card worker leaves the card's starts "
                    "to that one's", settings.node_name)
    _name_checked = (time.monotonic(), ours)
    return ours


@app.task(name=TASK_TICK, ignore_result=True, send_events=False)
@quiet_on_auth("dispatch tick", log)
def tick() -> None:
    """Periodic (beat): a safety-net dispatcher pass."""
    _redis.lpush(keys.sched_wake, "1")


@app.task(name=TASK_HEALTH, ignore_result=True, send_events=False)
@quiet_on_auth("cluster health check", log)
def health() -> str:
    """Periodic (beat, once cluster-wide): dead nodes, zombie reservations (workers/health.py)."""
    report = HealthChecker(settings, _redis).run_cluster()
    return "skipped (another check runs)" if report is None else repr(report)


@app.task(name=TASK_ALERTS, ignore_result=True, send_events=False)
@quiet_on_auth("alert check", log)
def check_alerts() -> str:
    """Periodic (beat), kept for an older rig's control workers beside this one: this rig checks
    the alerts in the leading dispatcher's control worker only, by its own clock and settings
    (workers.alert_check), never here by whichever node took the message."""
    return "checked by the leading dispatcher's control worker (workers.alert_check)"


_archiver = None
_archiver_made = threading.Lock()


@app.task(name=TASK_ARCHIVE, ignore_result=True, send_events=False)
@quiet_on_auth("archiving pass", log)
def archive() -> str:
    """Periodic (beat, once cluster-wide under a lock): finished jobs older than the retention
    move from Redis to the archive (rig.archiving)."""
    return _the_archiver().run(shared_now(_redis))


def _the_archiver():  # noqa: ANN202 - rig.archiving.PeriodicArchiver, imported when first used
    """This control worker's one PeriodicArchiver: it keeps its database connection, shared by
    the archiving task and the dispatcher's rollback check."""
    global _archiver
    from rig.archiving import PeriodicArchiver

    with _archiver_made:
        if _archiver is None:
            _archiver = PeriodicArchiver(settings, _redis)
        return _archiver


def _control_heartbeat(name: str) -> None:
    """The control worker's heartbeat, and the node's (rig.nodes), every telemetry_interval s."""
    ttl = max(1, int(settings.health.timeout))
    nodes = NodeRegistry(_redis, keys)
    while not _control_stop.is_set():
        try:
            if not _still_owner():
                _control_stop.wait(settings.telemetry_interval)
                continue
            beat = {"role": "control", "node": settings.node_name, "card": None,
                    "pid": os.getpid(), "jobs": 0, "seen_at": shared_now(nodes.r), **beat_supervisor()}
            _redis.set(keys.worker(name), json.dumps(beat), ex=ttl)
            _redis.sadd(keys.workers, name)
            # As its rig up (RIG_NODE_OWNER): refused once that rig up marked the node stopped.
            nodes.beat(settings.node_name, ttl=settings.health.timeout, source=name,
                       max_skew=settings.max_clock_skew, owner=os.environ.get(OWNER_ENV))
        except Exception as exc:  # noqa: BLE001
            log.debug("control heartbeat skipped: %s", exc)
        _control_stop.wait(settings.telemetry_interval)
    try:
        _redis.delete(keys.worker(name))  # stopped, not dead: say so at once
    except Exception:  # noqa: BLE001 - Redis may be gone at shutdown
        pass


_owner_said = False


def _still_owner() -> bool:
    """Does the rig up that started this worker still own the node name (rig.node_claim)? If
    not, the node's heartbeat and its own checks are another process's to do (said once)."""
    global _owner_said
    from rig.node_claim import renew_as

    mine = renew_as(_redis, keys, settings.node_name, settings.health.timeout)
    if not mine and not _owner_said:
        log.critical("node name %s is owned by another process now; this worker no longer acts for the node",
                     settings.node_name)
    _owner_said = not mine
    return mine


def _local_health() -> None:
    """This node's own duties: its checks (dead card workers, orphan processes) every
    check_interval s, and the sweep of its own job logs every LOG_SWEEP_INTERVAL_S s. They need
    this node's processes and files, so every node's control worker runs them for itself (beat's
    periodic tasks reach only one control worker of the cluster, so beat sends none of them)."""
    checker = HealthChecker(settings, _redis)
    next_sweep = time.monotonic() + LOG_SWEEP_INTERVAL_S
    quiet = Throttle()
    rotate_own_logs(settings)  # also at each start: a node restarted within the hour rotates too
    while not _control_stop.wait(settings.health.check_interval):
        try:
            if not _still_owner():
                continue
            checker.run_local()
            if time.monotonic() >= next_sweep:
                rotate_own_logs(settings)
                swept = sweep_logs(settings, _redis)
                # Skipped while another node sweeps (one lock): try again in a minute.
                next_sweep = time.monotonic() + (LOG_SWEEP_INTERVAL_S if swept is not None else 60.0)
        except Exception as exc:  # noqa: BLE001 - the next pass tries again
            if is_outage(exc) or isinstance(exc, redis.RedisError):
                # Unreachable, full, or a refused password: one line now and then, not a
                # traceback a pass.
                line = f"local health check skipped: Redis: {broker_quiet.outage_words(exc)}"
                if quiet.due(line):
                    log.error("%s (said again in %.0f s while it lasts)", line, quiet.every)
            else:
                log.exception("local health check failed")


@worker_ready.connect
def _on_worker_ready(sender=None, **_: object) -> None:
    global _runner, _dispatcher, _forecaster, _alert_checker
    # What start-up made (modules, classes, Celery's own objects: ~65,000, kept for the
    # process's life) leaves the cyclic collector's walk: a full collection, which falls in a
    # dispatcher pass or a job's start now and then, walks only what was made since
    # (measured alone: 38 ms for those objects, ~0 once frozen; PERFORMANCE: idlepass2).
    gc.collect()
    gc.freeze()
    # A young collection every GC_YOUNG_THRESHOLD allocations of container objects instead of
    # Python's 700: a dispatcher pass makes hundreds of thousands, and at 700 the collector kept
    # walking the pass's live working set (11-79 ms of a starting pass at 512 cards; starting
    # passes' CPU 0.85x with this: PERFORMANCE, "Garbage collection in the pass"). Garbage in
    # cycles waits at most that many allocations longer (a few MB).
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 10)
    role = os.environ.get("RIG_ROLE", "")
    name = getattr(sender, "hostname", None) or f"{role}@{settings.node_name}"
    if role == "card":
        index = int(os.environ["RIG_CARD_INDEX"])
        backend, _notice = detect_backend(settings.fake_gpus, settings.fake_usage_dir,
                                          node=settings.node_name)

        _runner = CardRunner(settings, settings.node_name, index, name, backend=backend, may_take=_name_is_ours)
        _runner.start_services()
        log.info("card worker %s serving %s/%s", name, settings.node_name, index)
    elif role == "control":
        # After a Redis restart it checks for a rollback before placing anything (rig.rollback),
        # through the pass's archiver: one archive connection per process (PeriodicArchiver).
        _dispatcher = Dispatcher(settings, check_rollback=lambda: _the_archiver().check_rollback())
        _dispatcher.start()
        _forecaster = Forecaster(_dispatcher)  # its estimated starts, while it leads
        _forecaster.start()
        _alert_checker = AlertChecker(_dispatcher)  # the alert check, while it leads
        _alert_checker.start()
        _start_bridge(sender, name, _dispatcher)
        threading.Thread(target=_control_heartbeat, args=(name,), name="rig-heartbeat", daemon=True).start()
        threading.Thread(target=_local_health, name="rig-local-health", daemon=True).start()
        log.info("control worker %s: dispatcher started", name)


def _start_bridge(consumer: object, name: str, dispatcher: Dispatcher) -> None:
    """Start the bridge that shows jobs in Flower (workers.flower_bridge), from this control
    worker while its task events are on and its dispatcher leads."""
    global _bridge

    def events_on() -> bool:
        events = getattr(consumer, "event_dispatcher", None)  # replaced when the consumer reconnects
        return bool(events is not None and events.enabled and (not events.groups or "task" in events.groups))

    _bridge = FlowerBridge(_redis, keys, hostname=name, events_on=events_on,
                           leads=lambda: _redis.get(keys.sched_leader) == dispatcher.identity,
                           connect=app.connection_for_write, dispatcher_cls=app.events.Dispatcher)
    _bridge.start()


def _stopped_with_supervisor() -> None:
    """This worker stops because its ``rig up`` died (SIGKILLed, OOM-killed): mark the node
    stopped, as ``rig down`` would have, naming why. Its running jobs run on in their own
    sessions; unmarked, the other nodes would declare it down after health.timeout and run
    those jobs again beside them (a breaker's job ran twice). Stopped, its cards take no jobs,
    its placed-but-unstarted jobs go back to the queue, and the next ``rig up`` adopts the rest.
    Only as that rig up (RIG_NODE_OWNER), while it still holds the node's name: a ``rig up``
    that took the name meanwhile is never marked (NodeRegistry.mark_stopped)."""
    supervisor, owner = supervisor_gone(), os.environ.get(OWNER_ENV)
    if supervisor is None or not owner:
        return
    try:
        nodes = NodeRegistry(_redis, keys)
        if _redis.hget(keys.node(settings.node_name), "stopped_by") == owner:
            return  # another worker of that rig up marked it first
        if nodes.mark_stopped(settings.node_name, owner=owner,
                              why=f"its rig up (pid {supervisor}) died; `rig up` adopts its running jobs"):
            log.warning("rig up (pid %s) died: node %s marked stopped, its running jobs left running "
                        "for the next rig up to adopt", supervisor, settings.node_name)
    except Exception as exc:  # noqa: BLE001 - Redis may be gone too: the node then goes silent
        log.warning("could not mark node %s stopped after its rig up died: %s", settings.node_name, exc)


@worker_shutting_down.connect
def _on_worker_shutting_down(**_: object) -> None:
    _stopped_with_supervisor()
    if _bridge is not None:
        _bridge.stop()
    if _runner is not None:
        _runner.stop()
    if _dispatcher is not None:
        _dispatcher.stop()
    if _forecaster is not None:
        _forecaster.stop()
    if _alert_checker is not None:
        _alert_checker.stop()
    _control_stop.set()
