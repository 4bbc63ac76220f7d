"""Moving finished jobs from Redis into the archive (rig.archive): the periodic pass.

A finished job (SUCCEEDED, FAILED, CANCELLED, TIMEOUT) moves when it ended more than
``archive_after_days`` ago, or, beyond ``archive_keep_finished`` finished jobs in Redis, the
oldest (lowest ids) move at once whatever their age: Redis holds a bounded number of finished
jobs however many are submitted. Jobs in the error queue never move: they wait for a person
(``rig retry`` / ``rig clear``), and move once cleared.

Each batch is three steps, in this order, so a crash anywhere loses and duplicates nothing:

1. read the batch's records from Redis;
2. write them to the archive in one transaction and commit (an upsert: writing a job twice
   is harmless);
3. forget each in Redis (its hash and its index entries) with ``archived.lua``, which leaves
   alone a job whose record changed since step 1 (retried, say).

A crash before step 2 commits leaves the batch in Redis only (the transaction rolls back); one
between 2 and 3 leaves it in both: every reader prefers Redis and dedupes (rig.history), and
the next pass forgets it. Two passes at once (a lock expired) do the same work twice, safely.

The lock is short (LOCK_S) and renewed before each batch, so a pass killed mid-way (SIGKILL)
holds archiving up for LOCK_S at most; a pass that lost its lock stops before its next batch.
Only a control worker whose archive is the cluster's (rig.archive_cluster) runs the pass, and
before step 3 the archive is checked to be the file it opened (rig.archive: a SQLite file
deleted or moved under rig): jobs leave Redis only once they are in the archive on disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from rig.archive import Archive, is_database_error, one_line
from rig.archive_cluster import (
    NotClusterArchive,
    add_held,
    archive_of,
    emptied,
    held_jobs,
    mark_held,
    mark_pass_ok,
    note_pass,
    require_cluster,
    settle_host,
)
from rig.config import Settings
from rig.errors import ConfigError
from rig.keys import Keys
from rig.lograte import Throttle
from rig.lua import source
from rig.models import ENV_REF, TERMINAL_STATES, Job
from rig.store import JobStore

log = logging.getLogger(__name__)

#: Jobs read, written and forgotten per transaction.
BATCH = 1000
#: How long the pass's lock lasts (s) unless renewed: a killed pass holds archiving up this long.
LOCK_S = 30.0


@dataclass
class MoveReport:
    """What one pass did: jobs archived (and forgotten in Redis), jobs archived but left in
    Redis because their record changed meanwhile (they move again later), and jobs it wrote
    that another pass (its lock lapsed) had already forgotten in Redis (archived by that one)."""

    archived: int = 0
    changed: list[int] = field(default_factory=list)
    gone: int = 0

    def __str__(self) -> str:
        left = f", {len(self.changed)} changed meanwhile and left in Redis" if self.changed else ""
        other = f", {self.gone} already moved by another pass" if self.gone else ""
        return f"archived {self.archived} finished job(s){left}{other}"


class Archiver:
    """Moves one installation's finished jobs from Redis to ``archive``.

    ``after_seconds``: a finished job moves once it ended this long ago; ``keep``: at most this
    many finished jobs (out of the error queue) stay in Redis, the oldest move first (0: no
    limit); ``batch``: jobs per archive transaction."""

    def __init__(self, client: redis.Redis, keys: Keys, archive: Archive, *, after_seconds: float,
                 keep: int, batch: int = BATCH) -> None:
        self.r = client
        self.keys = keys
        self.archive = archive
        self.after_seconds = after_seconds
        self.keep = keep
        self.batch = batch
        self._forget = client.register_script(source("archived"))

    def due(self, now: float) -> list[int]:
        """The ids of the finished jobs to move now, oldest first (see the module doc)."""
        pipe = self.r.pipeline(transaction=False)
        for state in sorted(TERMINAL_STATES, key=lambda s: s.value):
            pipe.zrange(self.keys.state_index(state.value), 0, -1)
        pipe.zrange(self.keys.errors, 0, -1)
        *finished, errors = pipe.execute()
        held = {int(i) for i in errors}
        ids = sorted(int(i) for part in finished for i in part if int(i) not in held)
        beyond = max(0, len(ids) - self.keep) if self.keep else 0
        due = ids[:beyond]
        rest = ids[beyond:]
        cutoff = now - self.after_seconds
        for start in range(0, len(rest), self.batch):
            chunk = rest[start:start + self.batch]
            pipe = self.r.pipeline(transaction=False)
            for jid in chunk:
                pipe.hmget(self.keys.job(jid), "ended_at", "created_at")
            for jid, (ended, created) in zip(chunk, pipe.execute(), strict=True):
                when = _float(ended) if ended else _float(created)
                if when is not None and when <= cutoff:
                    due.append(jid)
        return due

    def run(self, now: float, renew: Callable[[], None] = lambda: None) -> MoveReport:
        """One pass: move every due job (see the module doc), a batch at a time; ``renew`` is
        called before each batch (it renews the pass's lock, and raises if it was lost)."""
        report = MoveReport()
        due = self.due(now)
        for start in range(0, len(due), self.batch):
            renew()
            entries = self._read(due[start:start + self.batch])
            if entries:
                mark_held(self.r, self.keys)
            self.archive.add(entries, now=now)
            self.archive.check_file()  # on disk still, the file written to: else Redis keeps them
            before = report.archived
            self._forget_archived(entries, report)
            add_held(self.r, self.keys, report.archived - before)
        return report

    def _read(self, ids: list[int]) -> list[tuple[Job, dict[str, str]]]:
        """The records of ``ids`` still finished (a job retried since due() read it is left)."""
        out = []
        for raw in JobStore(self.r, self.keys).raws(ids):
            if not raw:
                continue
            job = Job.from_redis(raw)
            if job.state in TERMINAL_STATES and job.id:
                out.append((job, {_s(k): _s(v) for k, v in raw.items()}))
        return out

    def _forget_archived(self, entries: list[tuple[Job, dict[str, str]]], report: MoveReport) -> None:
        """Step 3: forget the archived jobs in Redis, each only if unchanged (archived.lua)."""
        pipe = self.r.pipeline(transaction=False)
        for job, raw in entries:
            forget_archived(self._forget, self.keys, job.id, raw, pipe)
        for (job, _), done in zip(entries, pipe.execute(), strict=True):
            if done == 1:
                report.archived += 1
            elif done == 2:
                report.gone += 1
            else:
                report.changed.append(job.id)


def forget_archived(script: Callable[..., object], keys: Keys, job_id: int, raw: dict[str, str],
                    client: redis.Redis | redis.client.Pipeline) -> object:
    """Call archived.lua (``script``, registered) for job ``job_id`` whose record, as the
    archive holds it, is ``raw``: it forgets the job in Redis only while that is still its record."""
    ref = raw.get(ENV_REF, "")
    return script(keys=[keys.job(job_id), keys.all_jobs, keys.state_index(raw["state"]), keys.errors,
                        keys.job_spec(job_id), keys.env_refs, keys.env_blob(ref or "-")],
                  args=[job_id, raw["state"], raw.get("ended_at", ""), raw.get("attempt", ""),
                        raw.get("instance", ""), ref], client=client)


def archive_pass(client: redis.Redis, keys: Keys, archive: Archive, *, after_seconds: float, keep: int,
                 now: float, lock_s: float = LOCK_S, batch: int = BATCH) -> MoveReport | None:
    """One pass under the cluster-wide lock (one control worker at a time); None if another
    holds it. Raises NotClusterArchive when ``archive`` is not the cluster's archive."""
    require_cluster(client, keys, archive.url)
    if (gone := emptied(client, keys, archive)) is not None:
        raise gone  # not silently the history from now on: jobs stay in Redis, said each pass
    settle_host(client, keys, archive.url)  # a record of an older rig: this file, this host's
    lock = client.lock(keys.archive_lock, timeout=lock_s, blocking=False)
    if not lock.acquire():
        return None
    try:
        from rig.rollback import check as check_rollback  # rig.rollback uses forget_archived

        check_rollback(client, keys, archive)  # first: a stale copy must not be archived over its record
        report = Archiver(client, keys, archive, after_seconds=after_seconds, keep=keep,
                          batch=batch).run(now, lock.reacquire)
        mark_pass_ok(client, keys, now)
        if report.archived or report.changed or report.gone:
            log.info("archive: %s", report)
        return report
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            pass  # it lapsed (the pass outlived it): nothing of ours to release


class PeriodicArchiver:
    """Beat's archiving task's state in one control worker: the archive's connection, kept
    between passes, and the one line it logs when the archive cannot be used. One per process,
    shared by the pass and the dispatcher's rollback check (``lock``: one at a time): a second
    SQLite connection in the process would open the file beside the first, and closing that
    file drops the process's POSIX locks on it, which the first one's WAL relies on."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.r = client
        self.keys = Keys(settings.key_prefix)
        self.archive: Archive | None = None
        self.quiet = Throttle(300.0)
        self.lock = threading.Lock()

    def run(self, now: float) -> str:
        """One pass (archive_pass); what it did, as the task's result."""
        with self.lock:
            return self._run(now)

    def _run(self, now: float) -> str:
        s = self.settings
        url = ""
        try:
            url = archive_of(self.r, self.keys, s)  # none set here: the cluster's
            archive = self._open(url)
            report = archive_pass(self.r, self.keys, archive, after_seconds=s.archive_after_days * 86400,
                                  keep=s.archive_keep_finished, now=now)
        except Exception as exc:
            if not (isinstance(exc, ConfigError) or is_database_error(exc)):
                raise  # Redis' errors: the task's usual handling
            # No psycopg, a wrong URL, an unwritable folder, a database gone: one line now and
            # then, a fresh connection next pass; Redis is left as it was (module doc).
            self._drop()
            line = one_line(exc)[:300]
            if self.quiet.due(line):
                log.error("archiving pass skipped: %s (said again in %.0f s while it lasts)", line, self.quiet.every)
            if not isinstance(exc, NotClusterArchive):
                # The cluster's archive failing, not this node's being another: rig status says it.
                note_pass(self.r, self.keys, now, interval=s.archive_interval, node=s.node_name, skipped=line, url=url)
            return f"skipped: {line}"
        if report is not None:
            note_pass(self.r, self.keys, now, interval=s.archive_interval, node=s.node_name)
        return "skipped (another pass runs)" if report is None else str(report)


    def _open(self, url: str) -> Archive:
        """The cluster's archive at ``url``, opened once and kept; raises NotClusterArchive when
        this node's is another, ConfigError or a database error when it cannot be opened."""
        # First: another node's missing file is no loss; recorded only once it opens (below).
        require_cluster(self.r, self.keys, url, record=False)
        if self.archive is None:
            # A missing SQLite file is created only while the archive never held jobs: one
            # deleted under rig is said, not silently replaced by an empty one.
            self.archive = Archive(url, self.settings.key_prefix,
                                   create=not held_jobs(self.r, self.keys), home=self.settings.home)
        return self.archive

    def _drop(self) -> None:
        """Close the archive after an error: a fresh connection next time."""
        if self.archive is not None:
            self.archive.close_quietly()
        self.archive = None

    def check_rollback(self) -> bool:
        """rig.rollback.check now (the dispatcher found Redis restarted): True once done, False
        when this node cannot read the cluster's archive (another node's pass will check)."""
        from rig.rollback import check  # rig.rollback uses forget_archived

        try:
            with self.lock:
                check(self.r, self.keys, self._open(archive_of(self.r, self.keys, self.settings)))
        except Exception as exc:
            if not (isinstance(exc, ConfigError) or is_database_error(exc)):
                raise
            self._drop()
            return False  # the archiving pass says why, once
        return True


def _float(text: str | bytes) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _s(value: str | bytes) -> str:
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else value
