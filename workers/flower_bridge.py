"""The bridge that shows each rig job in Flower as one Celery task, for its whole life.

Every move of a job is published on rig's events channel (``<id> <STATE>``: rig.store at
submit, claim.lua, transition.lua), by whichever process made it: a card worker, the control
worker, ``rig kill`` on someone's laptop. One bridge in the cluster listens there and sends the
Celery task event that move means (rig.task_events.event_for), under the job's own task id
``rig-job-<id>`` and, from the start on, under the hostname of the card worker that runs it, so
Flower's task list, its Failed filter, its search and its Workers counters are about jobs.

Runs in the control worker; it acts only

* while task events are on in that worker (``-E``, or a Flower's ``enable_events``, which
  every Flower broadcasts every 5 s): no Flower, no cost beyond the subscription;
* while that worker's dispatcher leads (``sched:leader``): one bridge per cluster, so a move is
  told once however many nodes run a control worker.

A state is told once (its attempt included, ``flower:told``); each event carries the time of
its move (rig.task_events), so one told late shows the true times. Every RESYNC_S it tells what
a dropped move left untold: the present state of every job not ended yet, and the end of every
job it last told as not ended (it ended while no bridge listened).

What was told is not what a Flower heard: a Flower that (re)starts (after a crash, a ``rig
down``, its history file deleted, a second one) missed what was told while it was away. Each
Flower says when it starts listening: its event receiver broadcasts ``heartbeat`` to the workers
once it consumes (celery.events.EventReceiver, ``wakeup``), which rig's control worker passes on
(:meth:`FlowerBridge.listener_joined`, workers.remote_control). Then, and whenever it starts
to tell (a Flower turned task events on, this worker started or took the lead, the subscription
came back: what a Flower heard meanwhile is unknown), the bridge tells *again* the present state
of every job not ended yet, and the end of every job that ended in the last ENDED_KEEP_S (at
most ENDED_MAX; the very event told then, kept in ``flower:ended_events``, so a job since
archived is told the same). A Flower that already had them counts nothing twice (rig's Flower
skips an event it has applied already: workers.flower_patches).

Best effort and bounded: events never wait on, slow down or fail a job. The channel is read on
one thread into a queue of at most QUEUE_MAX moves (when full, moves are dropped and counted);
another thread reads each job's record and publishes. A move dropped, or made while the bridge
is away, shows in Flower at the job's next move or at the next resync (at once when the bridge
starts telling, then every RESYNC_S); rig's own records stay the truth (``rig show``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from rig.errors import JobNotFound
from rig.keys import Keys
from rig.lograte import Throttle
from rig.models import JobState
from rig.store import JobStore
from rig.task_events import event_for, task_id, worker_of
from workers.broker_quiet import outage_words

log = logging.getLogger(__name__)

#: The most job moves waiting to be sent; more are dropped (counted, said now and then).
QUEUE_MAX = 10_000
#: How long the answer "does this worker's dispatcher lead?" is trusted (s).
LEADER_CHECK_S = 1.0
#: How often the bridge checks, while it tells, that Flower was told every job's present state
#: (s): a move dropped (full queue) or a message Redis did not deliver is told by then.
RESYNC_S = 60.0
#: How long (s) and how many of the ends told are kept, to tell them again to a Flower that
#: (re)starts: one down longer, or more jobs ended meanwhile, shows the older ends as they were.
ENDED_KEEP_S = 3600.0
ENDED_MAX = 2000

#: What Flower says of a job whose record Redis lost while it waited or ran (tell_lost).
LOST = ("its record is gone from rig's Redis (Redis lost its data, or an older copy was put back): "
        "rig no longer knows this job; `rig status` says what the node did with it")

#: One move to tell: (job id, the state it moved to, None: the state its record says when told;
#: again: told even if told already, a Flower (re)started).
Move = tuple[int, "JobState | None", bool]


class FlowerBridge:
    """Listens to rig's job moves and sends them as Celery task events (module doc).

    ``events_on``: are task events on in this worker now? ``leads``: does this worker's
    dispatcher lead the cluster now? ``hostname``: this worker's Celery hostname, the sender of
    the events of jobs that have no card worker yet. ``connect``: a new kombu connection for
    publishing (the Celery app's ``connection_for_write``)."""

    def __init__(self, r: redis.Redis, keys: Keys, *, hostname: str, events_on: Callable[[], bool],
                 leads: Callable[[], bool], connect: Callable[[], Any], dispatcher_cls: Callable[..., Any]) -> None:
        self.r = r
        self.keys = keys
        self.store = JobStore(r, keys)
        self.hostname = hostname
        self.events_on = events_on
        self._leads = leads
        self._connect = connect
        self._dispatcher_cls = dispatcher_cls
        self.moves: queue.Queue[Move] = queue.Queue(maxsize=QUEUE_MAX)
        self.stop_event = threading.Event()
        #: Set when a Flower started listening: everything is told again (listener_joined).
        self.retell = threading.Event()
        self.sent = 0
        self.dropped = 0
        self._leader_seen: tuple[float, bool] = (0.0, False)
        self._connection: Any = None
        self._dispatchers: dict[str, Any] = {}
        self._quiet = Throttle()
        #: The jobs told as not ended, by id: (task id, task name, worker, installation id when
        #: told). Kept here, not in Redis: a Redis that lost its data lost ``flower:told`` too,
        #: and these are what Flower would show waiting or running for ever (tell_lost).
        self.live: dict[int, tuple[str, str, str, str | None]] = {}
        #: The losses told (tell_lost), by job id and task id: (worker, event fields, when).
        self.lost: dict[int, dict[str, tuple[str, dict[str, Any], float]]] = {}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._listen, "rig-flower-listen"), (self._send_loop, "rig-flower-send")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()

    def listener_joined(self) -> None:
        """A Flower (or any event receiver) has just started listening: it missed what was told
        before, so tell the present state and the recent ends again (module doc). Returns at
        once (called from Celery's control handler)."""
        self.retell.set()

    # -- listening ------------------------------------------------------------------------
    def wanted(self) -> bool:
        """Tell moves now? Task events on here, and this worker's dispatcher leads."""
        if not self.events_on():
            return False
        now = time.monotonic()
        at, leads = self._leader_seen
        if now - at > LEADER_CHECK_S:
            try:
                leads = bool(self._leads())
            except redis.RedisError:
                leads = False
            self._leader_seen = (now, leads)
        return leads

    def offer(self, message: str) -> bool:
        """Queue one published move (``<id> <STATE>``) if it is to be told; False when it is
        not (malformed, not wanted now, or the queue is full: then counted as dropped)."""
        try:
            raw_id, raw_state = message.split()
            move: Move = (int(raw_id), JobState(raw_state), False)
        except ValueError:
            return False
        if move[1] is JobState.ASSIGNED or not self.wanted():
            return False  # ASSIGNED tells Flower nothing (rig.task_events): not even read
        try:
            self.moves.put_nowait(move)
        except queue.Full:
            self.dropped += 1
            self._say(f"Flower events: job moves dropped, the queue of {QUEUE_MAX} is full (Flower lags)")
            return False
        return True

    def resync(self, again: bool = False) -> int:
        """Queue, to be told if Flower has not been told it yet, the present state of every job
        not ended yet and of every job whose last told state was not its end (it ended while
        no bridge listened): this bridge has just started to tell (task events turned on by a
        Flower, the lead taken over, the subscription lost). ``again``: a Flower (re)started,
        so all of that is told even if told already, and the recent ends too
        (``flower:ended``). Returns how many were queued."""
        self.forget_old_ends()
        ids = set(self.r.hkeys(self.keys.flower_told)) | {str(i) for i in list(self.live)}
        if again:
            ids.update(str(i) for i in list(self.lost))
        for state in (JobState.PENDING, JobState.ASSIGNED, JobState.RUNNING):
            ids.update(str(i) for i in self.store.ids_in_state(state))
        if again:
            ids.update(self.r.zrange(self.keys.flower_ended, 0, -1))
        queued = 0
        for job_id in sorted(int(i) for i in ids if str(i).isdigit()):
            try:
                self.moves.put_nowait((job_id, None, again))
            except queue.Full:
                break
            queued += 1
        return queued

    def forget_old_ends(self) -> None:
        """Keep the ends told in the last ENDED_KEEP_S, at most ENDED_MAX (the newest)."""
        old = self.r.zrangebyscore(self.keys.flower_ended, "-inf", time.time() - ENDED_KEEP_S)
        old += self.r.zrange(self.keys.flower_ended, 0, -(ENDED_MAX + 1))
        if old:
            pipe = self.r.pipeline(transaction=False)
            pipe.zrem(self.keys.flower_ended, *old)
            pipe.hdel(self.keys.flower_ended_events, *old)
            pipe.execute()

    def _listen(self) -> None:
        telling = False
        next_resync = 0.0
        while not self.stop_event.is_set():
            pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.keys.events_channel)
                while not self.stop_event.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and isinstance(message.get("data"), str):
                        self.offer(message["data"])
                    # Subscribed first, then the snapshot: no move falls between the two.
                    was, telling = telling, self.wanted()
                    if telling and (not was or self.retell.is_set()):
                        # Starting to tell (this worker just started, took the lead or got its
                        # subscription back), or a Flower started listening: what any Flower
                        # heard before is unknown, so everything is told again (a Flower's wake-
                        # up may even have come before this bridge existed). Kept set until then.
                        self.retell.clear()
                        log.info("Flower events: telling job moves; telling again what waits, runs and "
                                 "ended lately (%s jobs)", self.resync(again=True))
                        next_resync = time.monotonic() + RESYNC_S
                    elif telling and time.monotonic() >= next_resync:
                        self.resync()  # what a dropped move or message left untold
                        next_resync = time.monotonic() + RESYNC_S
            except redis.RedisError as exc:
                telling = False  # moves published meanwhile were missed: tell the present again
                self._say(f"Flower events: not listening, Redis: {outage_words(exc)}")
                self.stop_event.wait(1.0)
            except Exception:  # noqa: BLE001 - the listener must outlive one surprise
                telling = False
                log.exception("Flower events: listener failed; listening again in 1 s")
                self.stop_event.wait(1.0)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:
                    pass

    # -- sending --------------------------------------------------------------------------
    def _send_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                job_id, state, again = self.moves.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.tell(job_id, state, again)
            except Exception as exc:  # noqa: BLE001 - an event must never stop the bridge
                self._drop_connection()
                self._say(f"Flower events: not sent ({type(exc).__name__}: {str(exc)[:200]})")

    def tell(self, job_id: int, state: JobState | None, again: bool = False) -> bool:
        """Send the task event of ``job_id``'s move to ``state`` (None: the state its record
        says now), read from its record now, unless that very state of that very attempt was
        told already (``flower:told``): a move is told once, however often it is queued.
        ``again`` (a Flower (re)started): told even so; a job whose end was told lately is
        told that same end event again (``flower:ended_events``). Returns whether an event
        was sent."""
        retold = again and self._retell_lost(job_id)
        if again and (saved := self.r.hget(self.keys.flower_ended_events, job_id)):
            hostname, kind, fields = json.loads(saved)
            self._dispatcher(hostname).send(kind, **fields)
            self.sent += 1
            return True
        try:
            job = self.store.get(job_id, without=("env",))
        except JobNotFound:
            self.r.hdel(self.keys.flower_told, job_id)
            return self.tell_lost(job_id) or retold
        if job.problems:
            return False  # nothing of a damaged record is shown
        if job_id in self.live and self.live[job_id][0] != task_id(job):
            self.tell_lost(job_id)  # the id is another job's now: the one Flower shows is gone
        state = state or (JobState.PENDING if job.state is JobState.ASSIGNED else job.state)
        told = f"{state.value}:{job.attempt}"
        if not again and not state.terminal and self.r.hget(self.keys.flower_told, job_id) == told:
            return False
        event = event_for(job, state)
        if event is None:
            return False
        kind, fields = event
        hostname = worker_of(job, state) or self.hostname
        self._dispatcher(hostname).send(kind, **fields)
        self.sent += 1
        pipe = self.r.pipeline(transaction=False)
        if state.terminal:
            self.live.pop(job_id, None)
            pipe.hdel(self.keys.flower_told, job_id)  # nothing more to tell: the hash holds live jobs
            # ... but a Flower that (re)starts is told it again (listener_joined).
            pipe.hset(self.keys.flower_ended_events, job_id, json.dumps([hostname, kind, fields]))
            pipe.zadd(self.keys.flower_ended, {str(job_id): time.time()})
        else:
            self.live[job_id] = (fields["uuid"], fields["name"], hostname, self._installation())
            pipe.hset(self.keys.flower_told, job_id, told)
        pipe.execute()
        return True

    def tell_lost(self, job_id: int) -> bool:
        """A job told as waiting or running whose record Redis no longer has, or that its id now
        names another job of: Redis lost its data (restarted empty, an older copy put back), so
        no move of that job will come and Flower would show it waiting or running for ever. Tell
        Flower it is revoked, saying why. A record gone from the same installation (archived,
        forgotten) is no loss: nothing is told. Returns whether an event was sent."""
        known = self.live.pop(job_id, None)
        if known is None:
            return False
        uuid, name, hostname, installation = known
        now = self._installation()
        try:
            still = self.store.get(job_id, without=("env",))
        except JobNotFound:
            still = None
        if still is None and now is not None and now == installation:
            return False
        fields = {"uuid": uuid, "name": name, "terminated": False, "signum": None, "expired": False,
                  "exception": LOST}
        # Kept before sending, to be told again to a Flower that (re)starts or reconnects: one
        # that lost Redis too may not have been listening yet (listener_joined).
        self.lost.setdefault(job_id, {})[uuid] = (hostname, fields, time.time())
        self._dispatcher(hostname).send("task-revoked", **fields)
        self.sent += 1
        return True

    def _retell_lost(self, job_id: int) -> bool:
        """Tell again the losses of ``job_id`` told in the last ENDED_KEEP_S (tell_lost)."""
        kept = {uuid: told for uuid, told in self.lost.get(job_id, {}).items()
                if told[2] > time.time() - ENDED_KEEP_S}
        if not kept:
            self.lost.pop(job_id, None)
            return False
        self.lost[job_id] = kept
        for hostname, fields, _ in kept.values():
            self._dispatcher(hostname).send("task-revoked", **fields)
            self.sent += 1
        return True

    def _installation(self) -> str | None:
        """This Redis' installation id (rig.installation), None when it holds none."""
        return self.r.hget(self.keys.installation, "id")

    def _dispatcher(self, hostname: str) -> Any:  # noqa: ANN401 - celery.events.EventDispatcher
        """An event dispatcher sending as ``hostname`` (one per worker name, on one
        connection); a publish that fails raises (never buffered: the move is dropped)."""
        if self._connection is None:
            self._connection = self._connect()
        found = self._dispatchers.get(hostname)
        if found is None:
            found = self._dispatcher_cls(self._connection, hostname=hostname, enabled=True,
                                         buffer_while_offline=False)
            self._dispatchers[hostname] = found
        return found

    def _drop_connection(self) -> None:
        for dispatcher in self._dispatchers.values():
            try:
                dispatcher.close()
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass
        self._dispatchers.clear()
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001
                pass
            self._connection = None

    def _say(self, line: str) -> None:
        if self._quiet.due(line):
            log.warning("%s (said again in %.0f s while it lasts)", line, self._quiet.every)
