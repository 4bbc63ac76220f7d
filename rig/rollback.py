"""Redis gone back in time (restarted from an RDB snapshot minutes old, a restored backup): told
from the archive, and repaired so that no job runs twice and no id is handed out twice.

Finished jobs leave Redis for the archive (rig.archiving). When Redis comes back from a copy
older than some of those moves, the jobs come back as they were in the copy (waiting, running)
while their finished records sit in the archive, and the id counter goes back below ids that
archived jobs carry. Two signals, one archive query each, both sound:

- *stale copies*: a job Redis holds as not finished (PENDING, ASSIGNED, RUNNING) whose very id
  and instance the archive holds. An instance is 64 random bits (rig.models.new_job_instance),
  and only finished jobs are archived: that job has finished;
- *the counter went back*: the archive holds a job of this installation (submitted at or after
  the installation was created, both on Redis' clock: rig.clock) with an id above the counter.
  Jobs of an installation whose Redis came back empty are older than the installation that
  replaced it, so ids that restart at 1 there (README: Restarts) are not taken for this.

:func:`check` repairs both: each stale copy is ended in the state the archive holds (the
ledger's transition, fenced on the state read: it releases its cards and its place in the
queues, and is never started again) and then forgotten in Redis (archived.lua): the archive's
record is the job's record. The counter moves to the highest such archived id. What cannot be
recovered is said: ids below it that the archive lacks were jobs submitted after the copy that
had not finished and been archived; Redis has no record of them any more.

It runs before each archiving pass (rig.archiving.archive_pass, under its lock), and in the
control worker's dispatcher as soon as it sees Redis (re)started: its leader check, every pass,
carries INFO server in the same round trip, and a run_id it has not seen stops that pass
(workers.dispatcher.Dispatcher._led); so also at `rig up`. Its line is logged and kept under
``archive:rollback`` for ``NOTE_S`` (`rig status` shows it).

Between a restart and the check, the dispatcher places nothing and health concludes no job
lost (:func:`unchecked`): each check stamps the Redis server's ``run_id`` (new at every start of
redis-server, and at a failover) under ``archive:checked``, and a Redis whose run_id is not the
stamp's was not checked since it started. So that an archive nobody can read never stops the
cluster, this holds only for the first :func:`rig.archive_cluster.overdue_after` seconds of the
server's uptime (the time after which `rig status` says the passes are late).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis

from rig.archive import Archive
from rig.archive_cluster import _number, overdue_after  # _number: one parse of a stored float
from rig.archiving import forget_archived
from rig.clock import shared_now
from rig.keys import Keys
from rig.ledger import Ledger
from rig.lua import source
from rig.models import JobState

log = logging.getLogger(__name__)

#: How long `rig status` shows the line about the last rollback found (s).
NOTE_S = 7 * 24 * 3600.0
#: The states a stale copy can be back in: not finished, so rig would place or supervise it.
LIVE = (JobState.PENDING, JobState.ASSIGNED, JobState.RUNNING)


@dataclass
class Rollback:
    """What :func:`check` found and did.

    ``stale``: job id -> the state Redis had it back in (it was ended as archived and
    forgotten in Redis); ``counter_was`` / ``counter_now``: the id counter before and after
    (equal when it had not gone back); ``gone``: ids up to ``counter_now`` that neither Redis
    nor the archive holds (jobs submitted after the copy and not archived)."""

    stale: dict[int, str] = field(default_factory=dict)
    counter_was: int = 0
    counter_now: int = 0
    gone: int = 0

    def __bool__(self) -> bool:
        return bool(self.stale) or self.counter_now > self.counter_was

    def line(self) -> str:
        """The one line for the operator (rig status, the control worker's log)."""
        parts = ["Redis went back to an older copy of its data (restarted from an old snapshot or backup)"]
        if self.stale:
            ids = sorted(self.stale)
            shown = ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")
            parts.append(f"{len(ids)} job(s) it held again as waiting or running had already finished ({shown}): "
                         "ended as the archive records them, not run again")
        if self.counter_now > self.counter_was:
            parts.append(f"job ids went back to {self.counter_was} while the archive holds this installation's "
                         f"jobs up to {self.counter_now}: new jobs get ids from {self.counter_now + 1}")
            if self.gone:
                parts.append(f"{self.gone} job(s) with ids {self.counter_was + 1}-{self.counter_now} submitted after "
                             "that copy and not archived are gone from Redis (they will not run: submit them again)")
        return "; ".join(parts)


def check(client: redis.Redis, keys: Keys, archive: Archive, *, ledger: Ledger | None = None) -> Rollback:
    """Find the two signals of the module doc and repair what they show; say so (log, and
    ``archive:rollback``) when anything was found. Safe to run at any time, and twice at once:
    each step is fenced (the transition on the state read, the counter by WATCH)."""
    run = server_run(client)  # read first: a restart during the check leaves the stamp stale
    found = Rollback()
    _end_stale(client, keys, archive, ledger or Ledger(client, keys), found)
    _move_counter(client, keys, archive, found)
    if found:
        line = found.line()
        client.set(keys.archive_rollback, f"{shared_now(client)!r} {line}", px=int(NOTE_S * 1000))
        log.warning("%s", line)
    if run is not None:
        client.set(keys.archive_checked, run)
    return found


def server_run(client: redis.Redis) -> str | None:
    """The Redis server's run_id (a new one at each start), or None where INFO has none."""
    try:
        return client.info("server").get("run_id") or None
    except redis.ResponseError:  # INFO refused (a restricted user): nothing to stamp
        return None


def unchecked(client: redis.Redis, keys: Keys, interval: float) -> bool:
    """Has Redis restarted (or failed over) without :func:`check` since, within the first
    ``overdue_after(interval)`` s of its uptime (``interval``: the archiving passes', s)? While
    so, nothing may be placed or concluded lost: it may be a stale copy of a finished job."""
    return unchecked_for(client, keys, interval) is not None


def unchecked_for(client: redis.Redis, keys: Keys, interval: float) -> float | None:
    """While :func:`unchecked`: how long (s) the wait may last at most (the bound's rest);
    else None. One INFO and one GET."""
    try:
        info = client.info("server")
    except redis.ResponseError:
        return None
    run = info.get("run_id")
    left = overdue_after(interval) - float(info.get("uptime_in_seconds", 0))
    if not run or left < 0:
        return None
    stamp = client.get(keys.archive_checked)
    return None if (stamp.decode() if isinstance(stamp, bytes) else stamp) == run else left


def waiting_line(client: redis.Redis, keys: Keys, interval: float) -> str | None:
    """What `rig status` and `rig why` say while :func:`unchecked` holds placement back, or None."""
    left = unchecked_for(client, keys, interval)
    if left is None:
        return None
    return ("Redis restarted and was not yet checked against the archive for jobs that already finished "
            f"(an older copy of its data): nothing is placed until a control worker that reads the archive "
            f"checks it, at most {left:.0f} s more")


def note(client: redis.Redis, keys: Keys) -> str | None:
    """The line about the last rollback found, with when (``rig status``), or None."""
    raw = client.get(keys.archive_rollback)
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else raw
    when, _, line = text.partition(" ")
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(when)))
    except ValueError:
        return line or None
    return f"at {stamp}: {line}"


def _end_stale(client: redis.Redis, keys: Keys, archive: Archive, ledger: Ledger, found: Rollback) -> None:
    """Signal 1: end each live job of Redis that the archive holds (same id and instance)."""
    pipe = client.pipeline(transaction=False)
    for state in LIVE:
        pipe.zrange(keys.state_index(state.value), 0, -1)
    ids = sorted({int(i) for part in pipe.execute() for i in part})
    if not ids:
        return
    archived = archive.finished_among(ids)
    if not archived:
        return
    forget = client.register_script(source("archived"))
    for job_id in ids:
        raw = {_s(k): _s(v) for k, v in client.hgetall(keys.job(job_id)).items()}
        state = raw.get("state", "")
        record = archived.get((job_id, raw.get("instance", "")))
        if record is None or state not in {s.value for s in LIVE} or _moved_since(raw, record[1]):
            continue
        ended_as = record[0]
        code, _ = ledger.transition(job_id, JobState(ended_as), expect=JobState(state),
                                    fields={"reason": "finished before Redis went back to an older copy; "
                                                      "the archive holds its record"})
        if code != 1:
            continue  # it moved meanwhile (its worker ended it): the archiving pass moves it
        forget_archived(forget, keys, job_id, {_s(k): _s(v) for k, v in client.hgetall(keys.job(job_id)).items()},
                        client)
        found.stale[job_id] = state


def _moved_since(raw: dict[str, str], ended_at: float | None) -> bool:
    """Did Redis' copy move after the archived job ended (placed, started or requeued since:
    it was run again, as only an unchecked Redis past rig.rollback.unchecked's bound allows)?
    Then it is no stale copy: it runs, and its own end is archived in its turn."""
    if ended_at is None:
        return False
    moves = [_number(raw.get(name)) for name in ("assigned_at", "started_at", "queued_at")]
    return any(when is not None and when > ended_at for when in moves)


def _move_counter(client: redis.Redis, keys: Keys, archive: Archive, found: Rollback) -> None:
    """Signal 2: move the id counter past this installation's archived ids above it."""
    created = client.hget(keys.installation, "created_at")
    if created is None:
        return  # no installation yet: nothing archived can be of it
    while True:
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(keys.next_job_id)
                counter = int(pipe.get(keys.next_job_id) or 0)
                highest, held = archive.ids_above(counter, submitted_since=float(created))
                found.counter_was = found.counter_now = counter
                if highest <= counter:
                    return
                pipe.multi()
                pipe.set(keys.next_job_id, highest)
                pipe.execute()
            except redis.WatchError:
                continue  # a submit took ids meanwhile: look again
        found.counter_now = highest
        found.gone = highest - counter - held
        return


def _s(value: str | bytes) -> str:
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else value
