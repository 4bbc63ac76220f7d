"""The VRAM ledger: each card's capacity and reservations, and the atomic moves of a job
between states that take or give back those reservations.

All read-check-write steps are Lua scripts (rig/lua) with every key passed in KEYS, so two
dispatchers placing jobs at once can never both take the last 10 GB of a card.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import redis
from redis.commands.core import CoreCommands

from rig import jobtrace
from rig.clock import shared_now
from rig.errors import JobNotFound
from rig.gpus.base import GpuReading
from rig.hashes import read_all
from rig.keys import Keys, card_id, split_card_id
from rig.lua import Scripts, source
from rig.models import REQUEUE_CLEARS, CardState, Job, JobState, pending_score
from rig.store import JobStore

log = logging.getLogger(__name__)

_STATE_ORDER = [s.value for s in JobState]
_REQUEUE_CLEARS = json.dumps(REQUEUE_CLEARS)  # transition.lua ARGV[17]
#: Bounds (s) of the histogram of submission -> first start (rig_job_start_wait_seconds), fed
#: by claim.lua.
START_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
                      4 * 3600.0, 24 * 3600.0)
#: The start-wait histogram's bounds as claim.lua names its fields ('le:<bound>').
START_WAIT_FIELDS = tuple(repr(float(b)) for b in START_WAIT_BUCKETS)
#: A card record's version field: moved (lib_card.lua's card_bump) by every write of the card or
#: of its reservations hash, in the same script or transaction as the write: the reservation,
#: release, reclaim and observe scripts, and bump_cards for registration, readings, health and
#: draining. The dispatcher keeps cards between passes and re-reads those whose version moved
#: (rig/lua/read_cards.lua). A registration starts a new card's version at a random value, so a
#: card registered again after Redis lost its data does not come back at the version a
#: dispatcher holds.
CARD_VERSION = "version"
#: Registration's random first version is below this (versions stay plain integers in Lua's
#: number format, which prints 14 significant digits).
_VERSION_START = 10**11


def bump_cards(pipe: Any, keys: list[str]) -> None:
    """Queue on ``pipe`` (a transaction, after the writes of these card records) the move of
    their versions (CARD_VERSION)."""
    if keys:
        # EVAL, not a registered script: a pipeline holding one first asks Redis whether it
        # knows it (SCRIPT EXISTS), a round trip more for every reading a card worker writes.
        pipe.eval(source("bump_card"), len(keys), *keys)


class Writes(CoreCommands):
    """Writes recorded to be done by a ledger script in the step it moves a job, not sent
    (``Ledger.transition(..., then=writes)``): an ending's run history and the dispatcher's
    wake-up then need no round trip of their own, and are done exactly when the job moved.
    Takes redis-py's command methods like a pipeline (so rig.estimates.record_run can queue on
    it); the commands it can carry: :data:`SINGLE_KEY` and the EVAL of bounded_runs.lua, done as
    lib_runs.lua's rule (transition.lua: ARGV[15], ARGV[16])."""

    #: Redis commands whose one key is their first argument.
    SINGLE_KEY = frozenset({"LPUSH", "RPUSH", "LTRIM", "EXPIRE", "ZADD", "ZREMRANGEBYRANK", "HSET", "HINCRBY",
                            "SET", "DEL"})

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.ops: list[list[Any]] = []

    def execute_command(self, *args: Any, **_options: Any) -> Writes:
        name = str(args[0]).upper()
        if name == "EVAL" and args[1] == source("bounded_runs"):
            name, nkeys, rest = "bounded_runs", int(args[2]), args[3:]
        elif name in self.SINGLE_KEY:
            nkeys, rest = 1, args[1:]
        else:
            raise ValueError(f"{name} cannot be done by a ledger script")
        places = []
        for key in rest[:nkeys]:
            self.keys.append(_text(key))
            places.append(len(self.keys))
        self.ops.append([name, nkeys, *places, *(_text(a) for a in rest[nkeys:])])
        return self


def _text(value: Any) -> str:
    """A command argument as redis-py sends it (floats by repr)."""
    if isinstance(value, bytes):
        return value.decode()
    return repr(value) if isinstance(value, float) else str(value)


def _field(value: Any) -> str:
    """A job field as the Lua script stores it: JSON for lists and dicts, '' for None."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value.value) if hasattr(value, "value") else str(value)


class Ledger:
    """Cards and reservations under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys, *,
                 usage_half_life_s: float = 24 * 3600.0) -> None:
        self.r = client
        self.keys = keys
        #: Fair share: a user's recent usage (GiB-hours) halves every this many seconds.
        self.usage_half_life_s = usage_half_life_s
        self.scripts = Scripts(client)
        self.store = JobStore(client, keys)

    # -- cards ----------------------------------------------------------------------------
    def register_card(
        self,
        node: str,
        reading: GpuReading,
        *,
        max_jobs: int,
        reserve_fraction: float,
        allowed: bool,
        fake: bool,
    ) -> CardState:
        """Record (or refresh) a card's capacity. Reservations already held are kept, so a
        restarted node picks up where it was."""
        key = self.keys.card(node, reading.index)
        usable = int(reading.total * (1.0 - reserve_fraction))
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                "node": node,
                "index": reading.index,
                "uuid": reading.uuid,
                "model": reading.model,
                "total": reading.total,
                "usable": usable,
                "max_jobs": max_jobs,
                "allowed": "1" if allowed else "0",
                "fake": "1" if fake else "0",
            },
        )
        pipe.hsetnx(key, "reserved", 0)
        pipe.hsetnx(key, "jobs", 0)
        pipe.hsetnx(key, "healthy", 1)
        pipe.hsetnx(key, CARD_VERSION, secrets.randbelow(_VERSION_START))
        bump_cards(pipe, [key])
        pipe.sadd(self.keys.cards, card_id(node, reading.index))
        pipe.sadd(self.keys.nodes, node)
        pipe.execute()
        self.record_reading(node, reading)
        return self.card(node, reading.index)

    def record_reading(self, node: str, reading: GpuReading) -> bool:
        """Store what the card reports now (used memory, utilisation, temperature), and put the
        card's reserved/jobs counters back to what its reservations say if they were changed
        by hand (lib_card.lua's card_recount). Returns True when it corrected them."""
        mapping: dict[str, Any] = {"updated_at": shared_now(self.r)}
        for name in ("used", "utilization", "temperature"):
            value = getattr(reading, name)
            mapping[name] = "" if value is None else int(value)
        key = self.keys.card(node, reading.index)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping=mapping)
        bump_cards(pipe, [key])
        pipe.eval(source("recount_card"), 2, key, self.keys.card_jobs(node, reading.index))
        corrected = bool(pipe.execute()[-1])
        if corrected:
            log.warning("card %s/%s: its reserved/jobs counters did not match its reservations (edited by "
                        "hand?); set back to what the reservations hold", node, reading.index)
        return corrected

    def _write_card(self, node: str, index: int, mapping: dict[str, Any]) -> None:
        """Set fields of a card record and move its version, in one transaction."""
        key = self.keys.card(node, index)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping=mapping)
        bump_cards(pipe, [key])
        pipe.execute()

    def set_healthy(self, node: str, index: int, healthy: bool, reason: str = "") -> None:
        self._write_card(node, index, {"healthy": "1" if healthy else "0", "health_reason": reason})

    def card(self, node: str, index: int) -> CardState:
        return CardState.from_redis(self.r.hgetall(self.keys.card(node, index)))

    def cards(self, node: str | None = None,
              parse: Callable[[dict[Any, Any]], CardState] = CardState.from_redis) -> list[CardState]:
        """Every registered card (with ``node``, that node's only), sorted by node then index;
        one round trip for the ids, one pipeline for the records. ``parse``: how a record
        becomes a CardState (the dispatcher's remembers unchanged records' parses)."""
        ids = sorted(self.r.smembers(self.keys.cards))
        keys = [self.keys.card(*split_card_id(cid)) for cid in ids if node is None or split_card_id(cid)[0] == node]
        cards = [parse(raw) for raw in read_all(self.r, keys) if raw]
        return sorted(cards, key=lambda c: (c.node, c.index))

    def holdings(self, node: str, index: int) -> dict[int, int]:
        """job id -> bytes reserved on this card."""
        raw = self.r.hgetall(self.keys.card_jobs(node, index))
        return {int(k): int(v) for k, v in raw.items()}

    def holdings_of(self, cards: list[CardState]) -> dict[str, dict[int, int]]:
        """card id -> (job id -> bytes reserved there), for ``cards``, in one pipeline."""
        raws = read_all(self.r, [self.keys.card_jobs(card.node, card.index) for card in cards])
        return {card.id: {int(k): int(v) for k, v in raw.items()} for card, raw in zip(cards, raws, strict=True)}

    # -- job moves ------------------------------------------------------------------------
    def reserve(self, job_id: int, node: str, cards: list[int], nbytes: int,
                user: str | None = None) -> tuple[bool, str]:
        """PENDING -> ASSIGNED on ``cards`` of ``node``, reserving ``nbytes`` on each.
        ``user`` is the job's user (read from the record when not given).

        The start ("<id> <token>") is pushed onto the first card's start list in the same
        script (Keys.card_starts): that card's worker takes it from there (workers.start_list).

        Returns (True, token) or (False, reason); on False nothing changed.
        """
        if user is None:
            try:
                user = self.store.fields(job_id, "user").user  # '?' when missing or invalid
            except JobNotFound:
                user = "?"  # the script refuses it: state missing
        keys = [
            self.keys.job(job_id),
            self.keys.pending,
            self.keys.state_index(JobState.PENDING.value),
            self.keys.state_index(JobState.ASSIGNED.value),
            self.keys.pending_user(user),
            self.keys.pending_users,
        ]
        for index in cards:
            keys += [self.keys.card(node, index), self.keys.card_jobs(node, index)]
        keys.append(self.keys.card_starts(node, cards[0]))
        # The script publishes the ASSIGNED event itself: no round trip of its own.
        ok, detail = self.scripts.reserve(
            keys=keys, args=[job_id, nbytes, shared_now(self.r), node, json.dumps(cards), user,
                             self.keys.events_channel]
        )
        if ok:
            jobtrace.mark(job_id, "reserved")
        return bool(ok), str(detail)

    def claim(self, job_id: int, token: str | int, worker: str) -> tuple[bool, str]:
        """ASSIGNED -> RUNNING for the holder of ``token``. Returns (True, attempt) or
        (False, current state): a duplicate delivery must then do nothing."""
        keys, args = self._claim_call(job_id, token, worker, None)
        ok, detail = self.scripts.claim(keys=keys, args=args)
        return bool(ok), str(detail)

    def queue_claim(self, pipe: Any, job_id: int, token: str | int, worker: str,
                    installation: str | None) -> None:
        """Queue the claim on ``pipe`` (as EVALSHA: a pipeline would check the script exists
        in a round trip of its own; on NoScriptError, ``load_scripts`` and queue it again).
        ``installation``: the id this node joined (rig.installation); Redis holding another
        or none refuses the claim with (False, 'installation-mismatch'). Its answer:
        :meth:`claim_answer`."""
        keys, args = self._claim_call(job_id, token, worker, installation)
        pipe.evalsha(self.scripts.claim.sha, len(keys), *keys, *args)

    @staticmethod
    def claim_answer(answer: list[Any]) -> tuple[bool, str]:
        ok, detail = answer
        return bool(ok), str(detail)

    def load_scripts(self) -> None:
        """Load the ledger's scripts into Redis (after a NoScriptError: Redis restarted)."""
        for script in vars(self.scripts).values():
            script.sha = self.r.script_load(script.script)

    def _claim_call(self, job_id: int, token: str | int, worker: str,
                    installation: str | None) -> tuple[list[str], list[Any]]:
        keys = [
            self.keys.job(job_id),
            self.keys.state_index(JobState.ASSIGNED.value),
            self.keys.state_index(JobState.RUNNING.value),
            self.keys.metrics_counters,
            self.keys.metrics_start_wait,
        ]
        # The script publishes the RUNNING event and counts the start (rig.metrics).
        args = [job_id, token, shared_now(self.r), worker, self.keys.events_channel, " ".join(START_WAIT_FIELDS)]
        if installation:
            keys.append(self.keys.installation)
            args.append(installation)
        return keys, args

    def transition(
        self,
        job_id: int,
        target: JobState,
        *,
        token: str | int | None = None,
        fields: dict[str, Any] | None = None,
        mode: str = "end",
        error_queue: bool = False,
        expect: JobState | None = None,
        now: float | None = None,
        read: Job | None = None,
        then: Writes | None = None,
    ) -> tuple[int, str]:
        """Move a job to ``target`` and release everything it holds, atomically.

        ``now`` is when it happened on the shared clock (rig.clock; default: now): a job's end
        is stamped with the moment its process ended, not when Redis took the write.

        Modes (see rig/lua/transition.lua): 'end' from a live state, 'cancel' (a running job is
        only flagged), 'retry' from the error queue back to PENDING. With ``error_queue`` the
        job also joins the error queue. Returns (1, previous state) when moved; (2, 'RUNNING')
        when a cancel was flagged; (0, state) when nothing changed. Retries while the job moves
        under us, unless ``expect`` is given: then a job not in that state is left alone and
        (3, its state) comes back.

        ``read``: the job's record as the caller has just read it (saves reading it again; the
        script's fences on state and assignment catch a record that has moved since).

        ``then``: writes done by the same script when, and only when, the job moves (code 1).
        """
        extra = {k: _field(v) for k, v in (fields or {}).items()}
        for _ in range(20):
            job, read = (read, None) if read is not None and read.id == job_id else (self.store.get(job_id), None)
            keys = [self.keys.job(job_id), self.keys.pending, self.keys.errors,
                    self.keys.pending_user(job.user), self.keys.pending_users,
                    self.keys.usage(job.user), self.keys.metrics_counters]
            keys += [self.keys.state_index(s) for s in _STATE_ORDER]
            if job.node:
                for index in job.cards:
                    keys += [self.keys.card(job.node, index), self.keys.card_jobs(job.node, index)]
            if then is not None:
                keys += then.keys
            code, detail = self.scripts.transition(
                keys=keys,
                args=[
                    job_id,
                    target.value,
                    shared_now(self.r) if now is None else now,
                    "" if token is None else str(token),
                    json.dumps(extra),
                    mode,
                    json.dumps(_STATE_ORDER),
                    pending_score(job.priority, job_id),
                    (expect or job.state).value,
                    "1" if error_queue else "0",
                    self.usage_half_life_s,
                    job.user,
                    str(job.assignments) if job.field_valid("assignments") else "",
                    self.keys.events_channel,  # the script publishes the event when it moves
                    json.dumps(then.ops) if then is not None else "",
                    len(then.keys) if then is not None else 0,
                    _REQUEUE_CLEARS,
                ],
            )
            if int(code) == 3:
                if expect is not None:
                    return 3, str(detail)
                continue  # the job moved between our read and the script: read again
            return int(code), str(detail)
        raise RuntimeError(f"job {job_id}: state kept changing during {target.value}")

    def unqueue(self, job_id: int, user: str) -> bool:
        """Take a job that is not PENDING out of the global queue and ``user``'s queue (where a
        stale id was found). Returns whether it was taken out."""
        keys = [self.keys.job(job_id), self.keys.pending, self.keys.pending_user(user), self.keys.pending_users]
        return bool(int(self.scripts.unqueue(keys=keys, args=[job_id, user])))

    def reclaim(self, node: str, index: int, job_id: int) -> int:
        """Release ``job_id``'s reservation on this card unless a live job holds it there.
        Returns the bytes released (0 if the reservation is legitimate or gone)."""
        ok, detail = self.scripts.reclaim(
            keys=[self.keys.card(node, index), self.keys.card_jobs(node, index), self.keys.job(job_id)],
            args=[job_id, node, index],
        )
        return int(detail) if int(ok) == 1 else 0

    def observe(self, node: str, index: int, job_id: int, used: int, utilization: int | None,
                declared: int, tolerance: float = 1.05) -> tuple[int, bool]:
        """Record a measured sample; the card then counts max(declared, used) for the job.
        Returns (bytes held now, over its declaration?); held is -1 if the job left the card."""
        held, over = self.scripts.observe(
            keys=[self.keys.card(node, index), self.keys.card_jobs(node, index), self.keys.job(job_id)],
            args=[job_id, int(used), "" if utilization is None else int(utilization), int(declared), tolerance],
        )
        return int(held), bool(int(over))

    def set_foreign(self, node: str, index: int, nbytes: int) -> None:
        """Memory on the card used by processes rig did not start: counted as taken."""
        self._write_card(node, index, {"foreign": int(nbytes)})

    def job_cards(self, job: Job) -> list[CardState]:
        return [self.card(job.node, i) for i in job.cards] if job.node else []
