"""Jobs in Redis and in the archive, read as one (``rig show``, ``rig jobs``, ``rig log``,
``rig metrics``, ``rig usage``).

Redis is read first and wins: a job that is in both (the archiving pass stopped between its
commit and its forget, rig.archiving) is shown once, as Redis has it. A job is the same job in
both when its id and instance match (ids restart when Redis loses its data).

Which archive: this process's ``archive_url`` when it set one, else the cluster's recorded one
(rig.archive_cluster), else the default SQLite file under ``$RIG_HOME``. A reader that set
another archive than the cluster's is told so in one line instead of silently showing fewer
jobs, and a SQLite archive that held jobs but is gone, or an archive recreated empty, is said,
never read as empty. An archive that cannot be read now (server down, database dropped, file
moved or not readable to this user) leaves listings with Redis' jobs and ``unread`` set, which
the command says in one warning line; a job asked for by id that is not in Redis then raises
ArchiveUnread (never "no job").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import redis

from rig.accounting import (
    Accounting,
    UsageLine,
    accounting_of,
    lines_of,
    merge_into,
    tally,
    total_of,
)
from rig.archive import (
    Archive,
    ArchiveRefused,
    ArchiveUnreachable,
    may_exist,
    missing,
    one_line,
    safe_url,
    same_archive,
    sqlite_path,
    unreadable,
)
from rig.archive_cluster import (
    archive_of,
    cluster_url,
    elsewhere,
    emptied,
    held_jobs,
    not_here,
    reader_not_here,
)
from rig.config import Settings
from rig.errors import ConfigError, JobGone, JobNotFound, RigError
from rig.keys import Keys
from rig.models import (
    DEFAULT,
    REQUIRED_FIELDS,
    TERMINAL_STATES,
    Job,
    JobState,
    field_value,
    text_of,
)
from rig.store import JobStore

#: What accounting reads of a job still in Redis (never its environment or command).
ACCOUNTING_FIELDS = ("id", "instance", "user", "name", "template", "pool", "node", "state", "failure",
                     "created_at", "started_at", "ended_at", "gpus", "gpu_memory", "attempts")


class History:
    """Reads of jobs wherever they are (see the module doc). The archive is opened on first use."""

    def __init__(self, store: JobStore, settings: Settings) -> None:
        self.store = store
        self.r: redis.Redis = store.r
        self.keys: Keys = store.keys
        self.settings = settings
        self._archive: Archive | None = None
        self._local = threading.local()  # ``unread`` is each thread's own (a gateway's threads share one)

    @property
    def unread(self) -> str | None:
        """Why the archive could not be read by this thread's latest listing (one line), else
        None: the listing then holds Redis' jobs only, and the command says so (unread_line();
        through the gateway too: rig.gateway.server carries it)."""
        return getattr(self._local, "unread", None)

    @unread.setter
    def unread(self, why: str | None) -> None:
        self._local.unread = why

    def location(self) -> str:
        """The archive this reader reads: its own ``archive_url`` when it set one (ConfigError
        when that is not the cluster's), else the cluster's recorded one (else the default)."""
        cluster = cluster_url(self.r, self.keys)
        if self.settings.archive_url and self.settings.archive_url.strip():
            own = self.settings.archive_location
            if cluster and not same_archive(cluster, own):
                raise ConfigError(elsewhere(cluster, own))
            return own
        # No archive_url of its own (any user's rig jobs): the cluster's, whatever this
        # reader's RIG_HOME; its recorded URL has no password (libpq's ~/.pgpass gives one).
        return archive_of(self.r, self.keys, self.settings)

    def archive(self) -> Archive | None:
        """This installation's archive, or None when nothing was ever archived here (a SQLite
        file that does not exist is not created by a reader). Raises ConfigError when the
        reader set an archive_url that is not the cluster's, ArchiveMissing when the SQLite file
        is missing though the cluster's archive held jobs (or cannot be read by this user), and
        ArchiveUnreachable / a database error when the server cannot be read."""
        if self._archive is not None:
            return self._archive
        own = self.location()
        if (host := not_here(self.r, self.keys, own)) is not None:
            raise reader_not_here(host, own)  # the same path here is another file: never read as the archive
        path = sqlite_path(own)
        if path is not None and not may_exist(path):
            if held_jobs(self.r, self.keys):
                raise missing(path)
            return None
        # Read-only: a reader never writes the archive (a read-only file or mount reads), and
        # one it cannot open is ArchiveUnreadable in the OS's words (rig.archive.cannot_read).
        archive = Archive(own, self.keys.prefix, create=False, readonly=True)
        if (gone := emptied(self.r, self.keys, archive)) is not None:
            archive.close()
            raise gone  # an archive recreated empty is not the history: Redis' jobs, one warning
        self._archive = archive
        return self._archive

    def readable_archive(self) -> Archive | None:
        """archive(), or None (and ``unread`` set to why) when it cannot be read now: a missing
        or unreadable SQLite file, a server down, a database dropped. A reader's own
        misconfiguration (another archive than the cluster's) still raises."""
        try:
            return self.archive()
        except Exception as exc:
            self._note_unreadable(exc)
            return None

    def _note_unreadable(self, exc: Exception) -> None:
        """Set ``unread`` to why the archive cannot be read and let it go; re-raise ``exc`` when
        it is not that (a reader's own misconfiguration, a bug)."""
        if not unreadable(exc):
            raise exc
        self._drop()
        self.unread = first_line(exc)

    def _drop(self) -> None:
        if self._archive is not None:
            self._archive.close_quietly()
            self._archive = None

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive = None

    def get(self, job_id: int, instance: str | None = None) -> Job:
        """The job from Redis, else from the archive; JobNotFound if in neither. ``instance``
        (its first hex digits will do): that very job, should the id have been given again
        after Redis lost its data."""
        try:
            job: Job | None = self.store.get(job_id)
        except JobNotFound:
            job = None
        if job is not None and (instance is None or (job.instance or "").startswith(instance)):
            return job
        job = None  # Redis' job is another instance: only the archive may have the one asked for
        try:
            archive = self.archive()
            if archive is not None:
                job = archive.get(job_id) if instance is None else archive.get_instance(job_id, instance)
        except Exception as exc:
            if not unreadable(exc):
                raise
            self._drop()
            raise ArchiveUnread(f"job {job_id} is not in Redis and the archive could not be read, so whether it "
                                f"was archived is unknown: {first_line(exc)}") from None
        if job is None:
            if instance is not None:
                raise JobGone(job_id, f"no job {job_id} of instance {instance}; `rig jobs --since 30d` shows each "
                                      "job's instance where ids repeat")
            raise self._not_found(job_id)
        return job

    def other_instance(self, job: Job) -> Job | None:
        """The archived job with ``job``'s id but another instance (Redis lost its data and the
        id was given again), or None; None too when the archive cannot be read (a hint, not a
        failure). ``job`` may be archived itself: the other one is asked for, not the newest."""
        if not job.instance:
            return None
        try:
            archive = self.archive()
            return archive.get_other(job.id, job.instance) if archive is not None else None
        except Exception as exc:  # noqa: BLE001 - the archive's own errors are said elsewhere
            if not unreadable(exc):
                raise
            return None

    def _not_found(self, job_id: int) -> JobNotFound:
        """JobNotFound for an id in neither Redis nor the archive, saying the job may be in the
        archive the cluster used before when it moved archives (archive:previous, named), or
        when the id is below every id Redis still knows yet was handed out (an earlier archive,
        unnamed: the cluster's record of it is gone)."""
        previous = self.r.get(self.keys.archive_previous)
        if previous is not None:
            url = previous.decode() if isinstance(previous, bytes) else previous
            return JobElsewhere(job_id, f"no job {job_id} in Redis or in the cluster's archive "
                                        f"{safe_url(self.location())}: it may be in the archive the cluster used "
                                        f"before, {url} (set archive_url (RIG_ARCHIVE_URL) to it to read it)")
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(self.keys.all_jobs, 0, 0)
        pipe.get(self.keys.next_job_id)
        lowest, given = pipe.execute()
        try:
            below = bool(lowest) and job_id < int(lowest[0]) and job_id <= int(given or 0)
        except ValueError:
            below = False
        if below:
            return JobElsewhere(job_id, f"no job {job_id} in Redis or in the cluster's archive "
                                        f"{safe_url(self.location())}, though the id was handed out: it may be in "
                                        "an archive the cluster used before (set archive_url to it to read it)")
        return JobNotFound(job_id)

    def archived_count(self) -> int:
        """Jobs in the archive only: a job also still in Redis (the pass stopped between its
        commit and its forget, rig.archiving) is counted once, as Redis'."""
        archive = self.archive()
        if archive is None:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for state in TERMINAL_STATES:
            pipe.zrange(self.keys.state_index(state.value), 0, -1)
        ids = sorted({int(i) for part in pipe.execute() for i in part})
        both = archive.keys_among(ids)
        if not both:
            return archive.count()
        pipe = self.r.pipeline(transaction=False)
        for jid, _ in both:
            pipe.hget(self.keys.job(jid), "instance")
        live = [(v.decode() if isinstance(v, bytes) else v) or "" for v in pipe.execute()]
        return archive.count() - sum(1 for (_, inst), now in zip(both, live, strict=True) if inst == now)

    def stored_field(self, job: Job, name: str) -> str | None:
        """A field of ``job``'s stored record that is no Job field (a @rig.task's ``result``):
        from Redis while the job is there, else from its archived record; None, with ``unread``
        set, when the archive cannot be read (a caller for whom None is an answer checks it)."""
        self.unread = None
        pipe = self.r.pipeline(transaction=False)
        pipe.exists(self.keys.job(job.id))
        pipe.hget(self.keys.job(job.id), name)
        there, value = pipe.execute()
        if there:
            return value
        record = self._read_or_note(lambda a: a.record(job.id, job.instance or ""), None)
        return record.get(name) if record else None

    def list(self, state: JobState | None = None, *, limit: int = 50, user: str | None = None,
             since: float | None = None) -> list[Job]:
        """Newest submitted first, at most ``limit``: Redis' jobs and the archive's, each once;
        ``since`` (epoch s): only jobs submitted then or later."""
        self.unread = None  # a listing without the archive's part reads it not: nothing unread
        live = self.store.list(state, limit=limit, user=user)
        if since is not None:
            live = [j for j in live if j.created_at >= since]
        old: list[Job] = []
        if state is None or state in TERMINAL_STATES:
            old = self._read_or_note(lambda a: a.list(state=state, user=user, since=since, limit=limit), [])
        return merge(live, old)[:limit]

    def _read_or_note(self, read, empty):  # noqa: ANN001, ANN202 - read: Archive -> T; empty: T
        """``read(archive)``, or ``empty`` with ``unread`` set when the archive cannot be read
        (readable_archive(), or a query failing: a table dropped, the connection lost)."""
        self.unread = None  # of this listing only: a long-lived client's archive may be back
        archive = self.readable_archive()
        if archive is None:
            return empty
        try:
            return read(archive)
        except Exception as exc:
            self._note_unreadable(exc)
            return empty

    def unread_line(self, what: str = "older finished jobs are not shown") -> str | None:
        """The one warning line for a command whose listing lacked the archive, else None."""
        return unread_line(self.unread, what)

    def accounting(self, since: float | None = None) -> list[Accounting]:
        """The accounting inputs of every finished job that ended at or after ``since``: the
        archive's and Redis', each job once (Redis' copy wins); Redis' alone, with ``unread``
        set, when the archive cannot be read."""
        live = self._live_accounting(since)
        seen = {(a.id, a.instance) for a in live}
        old = self._read_or_note(lambda a: a.accounting(since=since), [])
        return live + [a for a in old if (a.id, a.instance) not in seen]

    def usage(self, since: float | None = None, by: str = "user") -> tuple[list[UsageLine], UsageLine]:
        """rig usage's lines per ``by`` and the total: the same figures as rig.accounting's
        usage() and total() over accounting(), each job once (Redis' copy wins), but the
        archive's jobs added up by the archive (its daily rollup and SQL sums), not row by row
        here: O(days x groups), not O(jobs archived)."""
        self.unread = None
        live = self._live_accounting(since)
        groups = (by,) if by == "user" else (by, "user")  # the total counts each job once: by user
        found = {group: tally(live, group) for group in groups}
        besides = {(a.id, a.instance) for a in live}
        old = self._read_or_note(lambda a: a.usage(since=since, groups=groups, besides=besides), None)
        if old is not None:
            for group in groups:
                merge_into(found[group], old[group])
        return lines_of(found[by]), total_of(found["user"])

    def archive_rollup_built(self) -> tuple[int, float] | None:
        """(jobs, seconds) when opening the archive here built its usage rollup from an older
        rig's rows (rig.archive: once), else None."""
        built = self._archive.rollup_built if self._archive is not None else None
        return built if built and built[0] else None

    def _live_accounting(self, since: float | None) -> list[Accounting]:
        """The accounting inputs of the finished jobs in Redis that ended at or after ``since``
        (a job without an end time counts as ended at 0): accounting_of each, its record read
        by :class:`AccountingReader` (only the fields accounting reads, parsed as
        Job.from_redis parses them)."""
        reader = AccountingReader()
        out: list[Accounting] = []
        for values in self._finished_records():
            job = reader.job(values, since)
            if job is not None:
                out.append(accounting_of(job))
        return out

    def _finished_records(self) -> Iterator[list]:
        """HMGET ACCOUNTING_FIELDS of every job in a terminal state's index, in id order, in
        pipelines of 2,000 (a job gone meanwhile: all None)."""
        pipe = self.r.pipeline(transaction=False)
        for state in TERMINAL_STATES:
            pipe.zrange(self.keys.state_index(state.value), 0, -1)
        ids = sorted({int(i) for part in pipe.execute() for i in part})
        for start in range(0, len(ids), 2000):
            pipe = self.r.pipeline(transaction=False)
            for jid in ids[start:start + 2000]:
                pipe.hmget(self.keys.job(jid), *ACCOUNTING_FIELDS)
            yield from pipe.execute()


class AccountingReader:
    """Job.from_redis restricted to ACCOUNTING_FIELDS, for many records at once: each field
    given rig.models.field_value (the value Job.from_redis gives it: a missing or bad required
    field its fallback, a missing or bad optional one the Job's default) (tests/store/test_accounting_reader.py checks accounting_of of both
    over random and damaged records). What it skips: the fields accounting never reads, the
    problems list (accounting ignores it) and, since values repeat from job to job (user,
    name, node, state...), checking a value it checked before (the checks are pure)."""

    #: Fields whose values repeat across jobs: their checks' results are kept per reader.
    _REPEATED = frozenset({"instance", "user", "name", "template", "pool", "node", "state", "failure", "gpus",
                           "gpu_memory"})
    #: Required fields that HMGET of ACCOUNTING_FIELDS never returns: always their fallback.
    _ABSENT_REQUIRED = tuple(sorted(REQUIRED_FIELDS - set(ACCOUNTING_FIELDS)))

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], object] = {}

    def job(self, values: list, since: float | None = None) -> Job | None:
        """The Job of one HMGET of ACCOUNTING_FIELDS (bytes or str), or None when the record is
        gone (every value None), not in a terminal state, or (``since`` given) ended before
        ``since`` (a job without an end time counts as ended at 0)."""
        if all(v is None for v in values):
            return None
        data = {name: text_of(v) for name, v in zip(ACCOUNTING_FIELDS, values, strict=True) if v is not None}
        kwargs: dict = {}
        state = self._field("state", data.get("state"))
        if state not in TERMINAL_STATES:
            return None
        ended = self._field("ended_at", data.get("ended_at"))
        if since is not None and (0 if ended is DEFAULT else ended) < since:
            return None
        for name in ACCOUNTING_FIELDS:
            value = state if name == "state" else ended if name == "ended_at" else self._field(name, data.get(name))
            if value is not DEFAULT:
                kwargs[name] = value
        for name in self._ABSENT_REQUIRED:
            kwargs[name] = field_value(name, None)
        return Job(**kwargs)

    def _field(self, name: str, text: str | None) -> object:
        """field_value(name, text), kept per reader for the fields whose values repeat."""
        if text is not None and name in self._REPEATED:
            key = (name, text)
            found = self._seen.get(key)
            if found is None:
                found = self._seen[key] = field_value(name, text)
            return found
        return field_value(name, text)


def unread_line(unread: str | None, what: str = "older finished jobs are not shown") -> str | None:
    """The one warning line for a command whose listing lacked the archive because of
    ``unread`` (History.unread), else None."""
    return None if unread is None else f"warning: the archive could not be read ({unread}): {what}"


def archive_warning(client, what: str = "older finished jobs are not shown") -> str | None:  # noqa: ANN001
    """The one stderr line for a listing by ``client`` that lacked the archive (History.unread),
    else None. A gateway client's node read it and sent why with its answer
    (rig.gateway.client.GatewayClient.archive_unread)."""
    from rig.client import Client

    if isinstance(client, Client):
        return client.history.unread_line(what)
    return unread_line(getattr(client, "archive_unread", None), what)


class JobElsewhere(JobNotFound):
    """A job in neither Redis nor the cluster's archive that may be in an earlier archive (exit 4)."""

    def __init__(self, job_id: int, message: str) -> None:
        RigError.__init__(self, message)
        self.job_id = job_id


class ArchiveUnread(ConfigError):
    """A job asked for by id is not in Redis and the archive cannot be read (exit 6)."""


def first_line(exc: BaseException) -> str:
    """Why the archive could not be read, in one line for a warning (a server's own reason
    without the advice for rig up's archive_url)."""
    if isinstance(exc, ArchiveRefused):
        return f"{safe_url(exc.url)} refused the login: {exc.reason}"
    if isinstance(exc, ArchiveUnreachable):
        return f"{safe_url(exc.url)} unreachable now: {exc.reason}"
    return one_line(exc)


def merge(live: list[Job], archived: list[Job]) -> list[Job]:
    """Both lists as one, newest submitted first, a job in both once (Redis' copy)."""
    seen = {(j.id, j.instance) for j in live}
    both = live + [j for j in archived if (j.id, j.instance) not in seen]
    return sorted(both, key=lambda j: (j.created_at, j.id), reverse=True)

