"""Job records in Redis: create, read, list by state. State *changes* go through rig.ledger.

Every job is one hash; each state has its own index (a sorted set scored by job id), so
listing or counting by state never scans.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time
from collections.abc import Iterable
from typing import Any

import redis

from rig import packed
from rig import records as R
from rig.clock import shared_now
from rig.errors import JobNotFound, SubmitInterrupted
from rig.keys import Keys
from rig.models import (
    ENV_EXTRA,
    ENV_FIELD,
    ENV_REF,
    PRIORITY_BAND,
    SPEC_FIELDS,
    Job,
    JobState,
    Priority,
    new_job_instance,
    pending_score,
    waiting_since,
)

#: How many waiting jobs of one priority waiting_since_earliest reads at most (it stops at the
#: first never requeued, most often the first).
OLDEST_SCAN = 1024


#: The record's own fields: what no extra field of a submission may replace.
JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job))


#: Lost races for the id counter (WATCH) retried at once before each retry waits up to 10 ms.
CREATE_QUIET_TRIES = 10


class JobStore:
    """Reads and writes job records under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.keys = keys

    # -- writing --------------------------------------------------------------------------
    def create(self, job: Job, extra: dict[str, Any] | None = None) -> Job:
        """Store a new PENDING job (plus ``extra`` plain fields) and put it in the pending
        queues, in one transaction that also wakes the dispatcher.

        ``job.id`` is ignored and replaced by the next integer id.
        """
        return self.create_many([(job, extra)])[0]

    def create_many(self, jobs: list[tuple[Job, dict[str, Any] | None]]) -> list[Job]:
        """create() for several jobs: consecutive ids, one transaction.

        The ids are taken in the same transaction that stores the jobs (WATCH on the id
        counter, then MULTI: INCRBY and the records): a transaction Redis refuses (full,
        read-only, MISCONF: rig.redis_writes) or that fails on the way takes no id, so a batch
        that is retried until Redis has room burns none. Two submitters racing for the counter:
        the loser's transaction is not applied (WatchError) and it tries again with fresh ids.
        """
        if not jobs:
            return []
        now = shared_now(self.r)
        for attempt in itertools.count():
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.keys.next_job_id)
                    first = int(pipe.get(self.keys.next_job_id) or 0) + 1
                    pipe.multi()
                    pipe.incrby(self.keys.next_job_id, len(jobs))
                    out = self._queue_creates(pipe, jobs, first, now)
                    try:
                        pipe.execute()
                    except KeyboardInterrupt:
                        # Ctrl-C after Redis had the transaction (a large @rig.task payload takes
                        # seconds to send): the jobs are queued and will run. Say their ids, as
                        # a Ctrl-C after the store does (SubmitInterrupted), not a bare interrupt.
                        if self._stored(out):
                            raise SubmitInterrupted([job.id for job in out]) from None
                        raise
                    return out
                except redis.WatchError:
                    if attempt >= CREATE_QUIET_TRIES:  # many submitters at once: spread them out
                        time.sleep(random.uniform(0, 0.01))
        raise AssertionError("unreachable")

    def _stored(self, jobs: list[Job]) -> bool:
        """Did an interrupted create_many store ``jobs``? (Their first record, by its instance;
        one transaction stores all or none.) Read on a connection of its own: the interrupted
        one was dropped by redis-py."""
        try:
            return self.r.hget(self.keys.job(jobs[0].id), "instance") == jobs[0].instance
        except redis.RedisError:
            return False

    def _queue_creates(self, pipe: Any, jobs: list[tuple[Job, dict[str, Any] | None]], first: int,
                       now: float) -> list[Job]:
        """Queue the writes of ``jobs`` (ids from ``first`` on) on a MULTI pipeline: per job its
        record, spec and event; the indexes, queues and environment blobs once per batch (one
        ZADD of every id, not one per job: a sweep's submission sends a third of the commands)."""
        out = []
        shared = shared_environments(job for job, _ in jobs)
        blobs: dict[str, tuple[str, int]] = {}  # environment digest -> (packed blob, jobs naming it)
        ids: dict[str, int] = {}
        scores: dict[str, float] = {}
        by_user: dict[str, dict[str, float]] = {}
        for offset, (job, extra) in enumerate(jobs):
            job.id = first + offset
            job.state = JobState.PENDING
            job.created_at = job.created_at or now
            job.instance = job.instance or new_job_instance()
            score = pending_score(job.priority, job.id)
            record = job.to_redis()
            # Extra fields (a @rig.task payload) never replace the record's own (owner, state...).
            record.update({k: _encode(v) for k, v in (extra or {}).items() if v is not None and k not in JOB_FIELDS})
            self._queue_record(pipe, job.id, job.user, record, shared.get(job.user), blobs)
            ids[str(job.id)] = job.id
            scores[str(job.id)] = score
            by_user.setdefault(job.user, {})[str(job.id)] = score
            pipe.publish(self.keys.events_channel, f"{job.id} {JobState.PENDING.value}")
            out.append(job)
        for ref, (blob, count) in blobs.items():
            pipe.set(self.keys.env_blob(ref), blob)
            pipe.hincrby(self.keys.env_refs, ref, count)
        pipe.zadd(self.keys.all_jobs, ids)
        pipe.zadd(self.keys.state_index(JobState.PENDING.value), ids)
        pipe.zadd(self.keys.pending, scores)
        for user, own in by_user.items():
            pipe.zadd(self.keys.pending_user(user), own)
        pipe.sadd(self.keys.pending_users, *by_user)
        pipe.hincrby(self.keys.metrics_counters, "submitted", len(jobs))  # rig_jobs_submitted_total
        pipe.lpush(self.keys.sched_wake, "1")  # the dispatcher BLPOPs this: no Celery hop needed
        return out

    def _queue_record(self, pipe: Any, job_id: int, user: str, record: dict[str, str],
                      shared: dict[str, str] | None = None,
                      blobs: dict[str, tuple[str, int]] | None = None) -> None:
        """Queue the writes of one stored record: the hash, its spec, its environment's blob and
        that blob's count (rig.models.SPEC_FIELDS: why they are apart). ``shared``: the
        variables all of the user's jobs in this submission share (shared_environments):
        the blob holds those, the job's spec the rest (``env_extra``). ``blobs``: where a batch
        gathers its blobs (digest -> packed blob, jobs naming it) to write each once; None:
        written here."""
        spec: dict[str, Any] = {k: record.pop(k) for k in SPEC_FIELDS if k in record}
        env = record.pop(ENV_FIELD, None)
        if env is not None:
            if shared is not None:
                own = json.loads(env)
                extra = {k: v for k, v in own.items() if k not in shared}
                if extra:
                    spec[ENV_EXTRA] = extra
                    env = json.dumps(shared)
            ref = packed.digest(user, env)
            record[ENV_REF] = ref
            if blobs is None:
                pipe.set(self.keys.env_blob(ref), packed.pack(env))
                pipe.hincrby(self.keys.env_refs, ref, 1)
            else:
                blob, count = blobs.get(ref) or (packed.pack(env), 0)
                blobs[ref] = (blob, count + 1)
        pipe.hset(self.keys.job(job_id), mapping=record)
        if spec:
            pipe.set(self.keys.job_spec(job_id), packed.pack(spec))

    def update(self, job_id: int, **fields: Any) -> None:
        """Set plain fields (never ``state``: that moves only through the ledger's scripts)."""
        assert "state" not in fields, "state changes go through the ledger"
        mapping = {k: _encode(v) for k, v in fields.items() if v is not None}
        if mapping:
            self.r.hset(self.keys.job(job_id), mapping=mapping)

    def update_while_running(self, job_id: int, assignments: int | str, **fields: Any) -> bool:
        """Set plain fields only while the job is RUNNING its assignment ``assignments`` (one
        WATCH transaction): a note about a run never lands on a record that has ended or moved
        on meanwhile. False when it had."""
        key = self.keys.job(job_id)
        mapping = {k: _encode(v) for k, v in fields.items() if v is not None}
        with self.r.pipeline() as pipe:
            for _ in range(10):
                try:
                    pipe.watch(key)
                    state, held = pipe.hmget(key, "state", "assignments")
                    if state != JobState.RUNNING.value or held != str(assignments):
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping=mapping)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False

    def clear_fields(self, job_id: int, *names: str) -> None:
        if names:
            self.r.hdel(self.keys.job(job_id), *names)

    def publish(self, job_id: int, state: JobState | str) -> None:
        value = state.value if isinstance(state, JobState) else state
        self.r.publish(self.keys.events_channel, f"{job_id} {value}")

    # -- reading --------------------------------------------------------------------------
    def exists(self, job_id: int) -> bool:
        return bool(self.r.exists(self.keys.job(job_id)))

    def get(self, job_id: int | str, *, without: tuple[str, ...] = ()) -> Job:
        """The job's record, checked (Job.from_redis). ``without``: optional fields left
        unparsed (their defaults), e.g. ``env`` where a caller does not need the job's
        environment: the costliest field to check."""
        jid = R.parse_job_id(job_id)
        raw = self.raws([jid], env=ENV_FIELD not in without)[0]
        if not raw:
            raise JobNotFound(jid)
        for name in without:
            raw.pop(name, None)
        return Job.from_redis(raw)

    def raw(self, job_id: int) -> dict[str, str]:
        """The job's stored record as strings, its spec and environment joined in (join());
        {} when there is none."""
        return self.raws([job_id])[0]

    def raws(self, job_ids: list[int | str], *, env: bool = True) -> list[dict[str, str]]:
        """The stored records of ``job_ids`` (in order; {} for one that does not exist): one
        round trip for the hashes and specs, one more for the environments (none without
        ``env``: the record then has no ``env`` field, i.e. the default)."""
        pipe = self.r.pipeline(transaction=False)
        for jid in job_ids:
            self.queue_raw(pipe, jid)
        read = pipe.execute()
        return self.join(list(zip(read[::2], read[1::2], strict=True)), env=env)

    def queue_raw(self, pipe: Any, job_id: int | str) -> None:
        """Queue the two reads of a record on ``pipe``; join() takes their answers."""
        pipe.hgetall(self.keys.job(job_id))
        pipe.get(self.keys.job_spec(job_id))

    def join(self, read: list[tuple[dict, Any]], *, env: bool = True) -> list[dict[str, str]]:
        """Whole records from (hash, spec) pairs: the spec's fields and the environment's blob
        added (fields of the hash itself win: a record written by hand keeps its own). A spec
        or blob that is missing or cannot be unpacked adds a field that fails its check, so
        the job is shown with the problem and never run without its command or environment."""
        refs = sorted({_s(raw[ENV_REF]) for raw, _ in read if env and raw.get(ENV_REF) and ENV_FIELD not in raw})
        blobs = dict(zip(refs, self.r.mget([self.keys.env_blob(r) for r in refs]), strict=True)) if refs else {}
        out = []
        for raw, spec in read:
            if not raw:
                out.append({})
                continue
            whole = {_s(k): _s(v) for k, v in raw.items()}
            try:
                fields = packed.unpack(spec) if spec is not None else {}
            except ValueError as exc:
                fields = {"command": f"(spec damaged: {exc})"}
            extra = None
            if isinstance(fields, dict):
                for name in SPEC_FIELDS:
                    if name not in whole and isinstance(fields.get(name), str):
                        whole[name] = fields[name]
                extra = fields.get(ENV_EXTRA)
            ref = whole.get(ENV_REF)
            if env and ref and ENV_FIELD not in whole:
                try:
                    whole[ENV_FIELD] = packed.unpack(blobs.get(ref)) if blobs.get(ref) is not None else None
                except ValueError:
                    whole[ENV_FIELD] = None
                if not isinstance(whole[ENV_FIELD], str):
                    whole[ENV_FIELD] = f"(environment {ref} missing or damaged)"
                elif isinstance(extra, dict):
                    whole[ENV_FIELD] = _with_extra(whole[ENV_FIELD], extra)
            if not env:
                whole.pop(ENV_FIELD, None)
            out.append(whole)
        return out

    def fields(self, job_id: int | str, *names: str) -> Job:
        """Only the fields ``names`` of a job's record, read in one HMGET and checked exactly as
        get() checks them (Job.from_redis: the one parser of a job record). The other fields
        keep their neutral values; ``problems`` lists problems of the named fields only.
        Raises JobNotFound when the record does not exist."""
        jid = R.parse_job_id(job_id)
        if any(n in SPEC_FIELDS or n == ENV_FIELD for n in names):  # stored apart: the whole record
            raw = self.raws([jid])[0]
            if not raw:
                raise JobNotFound(jid)
            raw = {k: v for k, v in raw.items() if k in names}
        else:
            pipe = self.r.pipeline(transaction=False)
            pipe.exists(self.keys.job(jid))
            pipe.hmget(self.keys.job(jid), *names)
            exists, values = pipe.execute()
            if not exists:
                raise JobNotFound(jid)
            raw = {k: v for k, v in zip(names, values, strict=True) if v is not None}
        job = Job.from_redis(raw)
        job.problems = [p for p in job.problems if p.split(":", 1)[0].removeprefix("field ") in names]
        return job

    def get_many(self, job_ids: Iterable[int | str]) -> list[Job]:
        return [Job.from_redis(raw) for raw in self.raws(list(job_ids)) if raw]

    def ids_in_state(self, state: JobState, *, limit: int | None = None, newest_first=False) -> list[int]:
        end = -1 if limit is None else limit - 1
        key = self.keys.state_index(state.value)
        ids = self.r.zrevrange(key, 0, end) if newest_first else self.r.zrange(key, 0, end)
        return [int(i) for i in ids]

    def list(self, state: JobState | None = None, *, limit: int = 50, user: str | None = None) -> list[Job]:
        """Newest first; by state through that state's index. With ``user``, only that user's
        jobs: the index is read newest first a page at a time, each page's owners in one round
        trip, until ``limit`` are found (an unknown user reads the whole index: O(jobs))."""
        key = self.keys.state_index(state.value) if state else self.keys.all_jobs
        if user is None:
            return self.get_many(self.r.zrevrange(key, 0, limit - 1))
        found: list[str] = []
        start, page = 0, 1000
        while len(found) < limit:
            ids = self.r.zrevrange(key, start, start + page - 1)
            if not ids:
                break
            pipe = self.r.pipeline(transaction=False)
            for jid in ids:
                pipe.hget(self.keys.job(jid), "user")
            found += [jid for jid, owner in zip(ids, pipe.execute(), strict=True) if owner == user]
            start += page
        return self.get_many(found[:limit])

    def count_by_state(self) -> dict[JobState, int]:
        pipe = self.r.pipeline(transaction=False)
        for state in JobState:
            pipe.zcard(self.keys.state_index(state.value))
        return dict(zip(JobState, (int(n) for n in pipe.execute()), strict=True))

    def pending_head(self, count: int) -> list[int]:
        """The first ``count`` waiting job ids in run order (priority, then FIFO)."""
        return [int(i) for i in self.r.zrange(self.keys.pending, 0, count - 1)]

    def pending_position(self, job_id: int) -> int | None:
        """0-based place of a waiting job in the run order, or None if it is not waiting."""
        rank = self.r.zrank(self.keys.pending, str(job_id))
        return None if rank is None else int(rank)

    def pending_counts(self) -> dict[Priority, int]:
        """Waiting jobs per priority: one ZCOUNT per priority band."""
        pipe = self.r.pipeline(transaction=False)
        for prio in Priority:
            low = prio.rank * PRIORITY_BAND
            pipe.zcount(self.keys.pending, low, low + PRIORITY_BAND - 1)
        return dict(zip(Priority, (int(n) for n in pipe.execute()), strict=True))

    def error_ids(self, limit: int | None = None, *, newest_first: bool = False) -> list[int]:
        """The error queue, oldest first (newest first with ``newest_first``)."""
        end = -1 if limit is None else limit - 1
        return [int(i) for i in self.r.zrange(self.keys.errors, 0, end, desc=newest_first)]

    def error_count(self) -> int:
        """How many jobs the error queue holds."""
        return int(self.r.zcard(self.keys.errors))

    def in_error_queue(self, job_id: int) -> bool:
        return self.r.zscore(self.keys.errors, str(job_id)) is not None

    def clear_error(self, job_id: int) -> bool:
        """Take a job out of the error queue (a person has seen it); its state stays."""
        return bool(self.r.zrem(self.keys.errors, str(job_id)))

    def waiting_since_earliest(self, priority: Priority, limit: int = OLDEST_SCAN) -> float | None:
        """The earliest moment (epoch s) a job waiting at ``priority`` entered the queue
        (rig.models.waiting_since: its last requeue, else its submission), or None when none
        waits. Walks the band in submission order (ids) only up to the first job never requeued:
        every later one was submitted, so entered the queue, after it. At most ``limit`` jobs."""
        low = priority.rank * PRIORITY_BAND
        earliest: float | None = None
        start, chunk = 0, 8
        while start < limit:
            ids = self.r.zrangebyscore(self.keys.pending, low, low + PRIORITY_BAND - 1, start=start,
                                       num=min(chunk, limit - start))
            if not ids:
                break
            pipe = self.r.pipeline(transaction=False)
            for jid in ids:
                pipe.hmget(self.keys.job(int(jid)), "created_at", "queued_at")
            for created, queued in pipe.execute():
                try:
                    since = waiting_since(float(created), float(queued) if queued else None)
                except (TypeError, ValueError):
                    continue  # vanished, or unreadable: its own problem is said where it is shown
                earliest = since if earliest is None else min(earliest, since)
                if not queued:
                    return earliest
            start += len(ids)
            chunk *= 8
        return earliest


def _s(value: Any) -> str:
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)


def shared_environments(jobs: Iterable[Job]) -> dict[str, dict[str, str]]:
    """Per user, the variables (name and value) that every one of the user's ``jobs`` has in
    its environment: one blob for a sweep whose jobs differ in a variable or two (a seed)."""
    out: dict[str, dict[str, str]] = {}
    for job in jobs:
        env = job.env or {}
        if job.user not in out:
            out[job.user] = dict(env)
        else:
            common = out[job.user]
            for name in [n for n, v in common.items() if env.get(n) != v]:
                del common[name]
    return out


def _with_extra(env_text: str, extra: dict[str, Any]) -> str:
    """The shared blob's environment with the job's own variables (env_extra) over it."""
    try:
        base = json.loads(env_text)
    except ValueError:
        return env_text  # damaged: its check says so
    return json.dumps({**base, **extra}) if isinstance(base, dict) else env_text


def _encode(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | dict):
        return json.dumps(value)
    if hasattr(value, "value"):
        return str(value.value)
    return str(value)
