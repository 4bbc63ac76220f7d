"""Nodes: the servers whose card workers share one Redis, and whether each one is alive.

A node is *alive* while its heartbeat key (``P node:<node>:alive``, written every
``telemetry_interval`` seconds by its ``rig up`` and by its control worker, expiring after
``health.timeout`` seconds) or the heartbeat of any of its workers (``P worker:<name>@<node>``)
exists. The cluster health check (beat, once cluster-wide: workers/health.py) turns a node that
stays silent into a *down* node.

What a person sees (``NodeInfo.state``):

- ``up``: alive. A node that ``rig up`` runs (its record has a pid) with no live worker is up
  but runs nothing (``NodeInfo.no_worker``): it reads ``started ..., no worker alive``, and
  its cards are no place a job "fits now" (rig.waiting).
- A node whose ``rig up`` died (SIGKILLed) is normally *stopped*: its workers, following it,
  mark it so as they go (workers.app, NodeRegistry.mark_stopped with ``why``), since its jobs
  run on. Until that mark is written (or where it could not be), a node whose ``rig up`` is
  gone while its heartbeats, its own and its workers', have yet to expire (all SIGKILLed at
  once) is not up: a reader on the node's own host and boot (the record's ``host_id``,
  hostname and boot id) sees that the recorded pid (with its start time, ``pid_start``) no
  longer runs, and the node reads silent and presumed down at once (``NodeInfo.gone``: "its
  rig up (pid N) no longer runs on HOST; its heartbeat expires in N s") instead of "up, N
  workers" for the rest of the heartbeats' life. A reader on another host cannot see that
  pid: for it the heartbeats' life decides.
- ``silent``: no heartbeat for ``health.timeout`` s; the next health passes confirm it (a
  Redis restart makes every heartbeat expire at once, so one missed look is not enough). A
  silent node whose last heartbeat is older than the life it declared (``beat_ttl``, the
  beater's ``health.timeout``) is *presumed down* (``NodeInfo.presumed_down``): computed by
  each reader from the heartbeat's age, so it is said even where no health check runs to
  declare it down (a one-node cluster whose ``rig up`` was SIGKILLed).
- ``down``: declared down at ``down_since``: its cards take no jobs; its running jobs were
  marked lost and retried elsewhere by their retry policy; placed-but-unstarted ones went back
  to the queue.
- ``stopped``: stopped on purpose (``rig down``, Ctrl-C) at ``stopped_at``: its cards take no
  jobs, its running jobs keep running on it and are adopted when it comes back. The mark names
  the ``rig up`` that wrote it (``stopped_by``, its rig.node_claim identity); from then on a
  heartbeat of that ``rig up`` or of its workers (winding down) is refused in the same Lua step
  that would write it, so a stopped node never reads "up" again until a ``rig up`` registers it.

A node gone for good stays in that list until an admin forgets it (``rig forget-node``,
``NodeRegistry.forget``); a forgotten node that comes back simply registers again.

Times are Unix epoch seconds.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import redis
from redis.commands.core import Script

from rig.clock import DEFAULT_MAX_SKEW_S, record_clock_offset, shared_now
from rig.data_format import DATA_FORMAT, FIELD, STAMPED_AT, node_format
from rig.errors import InvalidInput, NodeInUse
from rig.keys import Keys, split_card_id
from rig.models import JobState
from rig.redis_writes import refusal
from rig.supervision import beat_of_up
from workers.process_tree import boot_host, may_run, proc_start_time

T = TypeVar("T")

#: A heartbeat: KEYS[1] the node's record, KEYS[2] its heartbeat key. ARGV[1] the heartbeat's
#: value (JSON), ARGV[2] its life (ms), ARGV[3] seen_at (shared clock, epoch s), ARGV[4] its life
#: (s, kept as beat_ttl for readers), ARGV[5] the beater's owner identity (rig.node_claim; ""
#: for none). Refused (nothing written, returns 0) when the record's stop mark was written by
#: that same owner: the check and the write are one step, so a beat that started before
#: `rig down` marked the node and arrives after it cannot make the stopped node read up.
#: Returns 1 when written.
_BEAT_LUA = """
if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'stopped_by') == ARGV[5] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[1], 'last_seen', ARGV[3], 'beat_ttl', ARGV[4])
return 1
"""

#: The life assumed for a heartbeat whose record does not say it (written by an older rig):
#: health.timeout's default (s).
DEFAULT_BEAT_TTL_S = 30.0

#: Prefixes of the card health reasons the node checks write, so a rejoin clears only those.
NODE_DOWN_REASON = "node down"
NODE_STOPPED_REASON = "node stopped"


@dataclass
class NodeInfo:
    """One node as the shared Redis knows it."""

    name: str
    alive: bool
    state: str  # up | silent | down | stopped
    since: float | None  # up: started_at; silent: last_seen; down: down_since; stopped: stopped_at
    last_seen: float | None = None
    started_at: float | None = None
    down_since: float | None = None
    stopped_at: float | None = None
    missing_since: float | None = None  # when the health check first found it silent
    #: The life its last heartbeat declared (s; the beater's health.timeout).
    beat_ttl: float | None = None
    #: Silent beyond that life, as the reader computed it when it read the record (never
    #: declared down: that is the health check's act, with its consequences for the jobs).
    presumed_down: bool = False
    backend: str = ""
    cards: int = 0
    host: str = ""
    pid: int | None = None  # its rig up's
    pid_start: int | None = None  # its rig up's start time (clock ticks since its host's boot)
    #: workers of this node with a live heartbeat that names no other rig up (beat_of_up)
    workers: int = 0
    #: Set by the node when this Redis is not the installation it joined (rig.installation):
    #: the line saying so and what to do; the node then acts on nothing.
    mismatch: str | None = None
    #: Set by the node when jobs run there that Redis has no record of (rolled back or lost):
    #: the line saying so and what to do.
    unrecorded: str | None = None
    #: Set by a reader (rig.authwatch) when Redis refuses this silent node's logins: the line.
    auth_refused: str | None = None
    #: Set by the node when its clock is off Redis' by more than its max_clock_skew (rig.clock).
    clock_skew: str | None = None
    #: Set by a reader (rig.refused_beats) while Redis refuses writes and this node has no
    #: heartbeat: the line saying its heartbeats are refused (it is not known to be silent).
    writes_refused: str | None = None
    #: Set by the node (rig.authgate) while Redis refuses its NEW logins: wall time of the first.
    auth_refused_since: float | None = None
    #: The data format its rig writes (rig.data_format; 0: a rig from before the number).
    data_format: int = 0
    #: Its config's [pools] as its rig up recorded them (rig.pools.encode; None: not recorded).
    pools: str | None = None
    #: Its config's templates as its rig up recorded them (rig.cluster_templates.encode; None:
    #: not recorded).
    templates: str | None = None
    #: The rules its config applies to every user's jobs, as its rig up recorded them
    #: (rig.policy.encode; None: not recorded).
    policy: str | None = None
    #: Why a stopped node stopped when it was not ``rig down`` (its rig up died: NodeRegistry.mark_stopped).
    stopped_why: str | None = None
    #: Set by a reader on the node's host (and boot) when the node's ``rig up`` (``pid``) no
    #: longer runs there: the words saying so. The node is then silent and presumed down though
    #: its last heartbeats (its own, its workers') have not expired yet.
    gone: str | None = None

    @property
    def no_worker(self) -> bool:
        """Up, run by a ``rig up`` (its record has a pid: a record without one was written by a
        tool or a test, never by a node that starts workers), and no worker of it alive: its
        cards run nothing now (starting, or its workers died)."""
        return self.state == "up" and self.workers == 0 and self.pid is not None

    @property
    def describe(self) -> str:
        """``up since 12:01:05``, ``DOWN since 12:03:40``, ... (local time)."""
        if self.mismatch:
            return f"FROZEN: {self.mismatch}"
        if self.writes_refused:
            return self.writes_refused
        if self.no_worker:
            # Not plainly "up": nothing runs its jobs (rig up starting them, or they died).
            text = f"started {clock(self.since)}, no worker alive" if self.since else "no worker alive"
            return f"{text}: {self.auth_refused}" if self.auth_refused else text
        label = {"up": "up", "silent": "silent", "down": "DOWN", "stopped": "stopped"}[self.state]
        text = f"{label} since {clock(self.since)}" if self.since else label
        if self.presumed_down:
            text += ", presumed down"
        if self.gone:
            text += f" ({self.gone})"
        if self.stopped_why:
            text += f" ({self.stopped_why})"
        return f"{text}: {self.auth_refused}" if self.auth_refused else text

    @property
    def silent_note(self) -> str:
        """What a silent node's state means (``rig status``, the web page): either that the
        health check has yet to confirm it, or, past its heartbeat's life, that it is presumed
        down and why nothing declared it."""
        if not self.presumed_down:
            return "not yet declared down"
        if self.gone:
            return f"{self.gone}; no health check declared it down, so its jobs stay as they are"
        life = f"{self.beat_ttl:g} s " if self.beat_ttl else ""
        return f"past its heartbeat's {life}life; no health check declared it down, so its jobs stay as they are"


def latest_recorded(nodes: Iterable[NodeInfo], read: Callable[[NodeInfo], T | None]) -> tuple[str, T] | None:
    """The node ``rig up`` registered last (greatest started_at, then name) among those whose
    record ``read`` finds readable (not None), and what it read; None when none has. The one rule
    for whose recorded config the cluster's is: pools (rig.pools) and templates
    (rig.cluster_templates). A record without it (an older rig) or damaged tells nothing."""
    latest: tuple[float, str, T] | None = None
    for node in nodes:
        found = read(node)
        if found is not None and (latest is None or (node.started_at or 0.0, node.name) > latest[:2]):
            latest = (node.started_at or 0.0, node.name, found)
    return None if latest is None else (latest[1], latest[2])


def clock(ts: float | None) -> str:
    """``12:01:05`` today, ``2026-11-29 12:01:05`` on another day, ``-`` for None (local time)."""
    if not ts:
        return "-"
    same_day = time.localtime(ts)[:3] == time.localtime()[:3]
    return time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", time.localtime(ts))


class NodeRegistry:
    """Node registration, heartbeats and liveness under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.r = client
        self.keys = keys
        self._beat_script: Script | None = None

    # -- written by the node itself -----------------------------------------------------------
    def register(self, node: str, *, ttl: float, **fields: object) -> None:
        """A node (re)joins: record it, forget that it was stopped, and heartbeat."""
        now = shared_now(self.r)
        pid = fields.get("pid")
        # Where its rig up runs, to be checked by a reader on this host in this boot (_info).
        origin = {"host_id": boot_host(), "pid_start": proc_start_time(int(str(pid))) or ""} if pid else {}
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(self.keys.nodes, node)
        pipe.hset(self.keys.node(node), mapping={**{k: str(v) for k, v in fields.items()}, **origin,
                                                 "started_at": now, "host": socket.gethostname(),
                                                 FIELD: DATA_FORMAT, STAMPED_AT: now})
        # down_since stays until the cluster health check sees the node back (it reports it).
        pipe.hdel(self.keys.node(node), "stopped_at", "stopped_by", "stopped_why",
                  *(() if pid else ("host_id", "pid_start")))
        pipe.execute()
        try:
            self.beat(node, ttl=ttl, source="rig up")
        except redis.ResponseError as exc:
            # Redis filled (or turned read-only) between the record and its first beat: the
            # node is registered; rig up's heartbeat loop says Redis refuses writes and beats
            # once it takes them again (fault scenario redis-full-down).
            if refusal(exc) is None:
                raise

    def beat(self, node: str, *, ttl: float, source: str, pid: int | None = None,
             max_skew: float = DEFAULT_MAX_SKEW_S, owner: str | None = None) -> bool:
        """Refresh the node's heartbeat; it expires after ``ttl`` seconds. Also records how
        far this machine's clock is off Redis' (rig.clock; reported beyond ``max_skew`` s).

        ``owner`` is the rig.node_claim identity of the ``rig up`` the beater belongs to (itself,
        or the one that started this worker): once that ``rig up`` marked the node stopped, the
        beat is refused atomically (_BEAT_LUA) and False is returned. True when written."""
        now = shared_now(self.r)
        record_clock_offset(self.r, self.keys.node(node), max_skew)
        value = json.dumps({"host": socket.gethostname(), "pid": pid or os.getpid(), "by": source,
                            "seen_at": now})
        life_ms = max(1000, int(ttl * 1000))
        if self._beat_script is None:
            self._beat_script = self.r.register_script(_BEAT_LUA)
        written = self._beat_script(
            keys=[self.keys.node(node), self.keys.node_alive(node)],
            args=[value, life_ms, repr(now), repr(life_ms / 1000), owner or ""])
        return bool(int(written))

    def mark_stopped(self, node: str, *, owner: str | None = None, why: str | None = None,
                     attempts: int = 5) -> bool:
        """The node was stopped on purpose: its jobs keep running and are adopted on return.
        ``why``: said beside the state (``stopped_why``) when it was not ``rig down`` (its ``rig
        up`` died and its workers, winding down, marked it: rig.supervision.supervisor_gone).

        With ``owner`` (the rig.node_claim identity of the stopping rig up), only while no other
        process holds the node name, and the claim is given up in the same transaction: a
        second claimant, or a rig up that lost the name, never marks the live owner stopped.
        The mark names ``owner`` (``stopped_by``): heartbeats of that rig up and its workers are
        refused from then on (:meth:`beat`). Returns False (nothing written) when another
        process holds the name."""
        owner_key = self.keys.node_owner(node)
        for _ in range(attempts):
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    if owner is not None:
                        pipe.watch(owner_key)
                        held = pipe.get(owner_key)
                        if held is not None and held.rpartition("|")[0] != owner:
                            return False
                    pipe.multi()
                    pipe.hset(self.keys.node(node), "stopped_at", shared_now(self.r))
                    if why:
                        pipe.hset(self.keys.node(node), "stopped_why", why)
                    else:
                        pipe.hdel(self.keys.node(node), "stopped_why")
                    if owner is not None:
                        pipe.hset(self.keys.node(node), "stopped_by", owner)
                    else:
                        pipe.hdel(self.keys.node(node), "stopped_by")
                    pipe.delete(self.keys.node_alive(node))
                    if owner is not None:
                        pipe.delete(owner_key)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False

    # -- written by the cluster health check --------------------------------------------------
    def note_missing(self, node: str, when: float) -> None:
        self.r.hsetnx(self.keys.node(node), "missing_since", when)

    def set_down(self, node: str, when: float) -> None:
        self.r.hsetnx(self.keys.node(node), "down_since", when)

    def clear_down(self, node: str) -> None:
        self.r.hdel(self.keys.node(node), "down_since", "missing_since")

    # -- forgetting a node that is gone for good -------------------------------------------
    def forget(self, node: str, *, attempts: int = 5, check_only: bool = False) -> list[str]:
        """Remove ``node``: its record, its heartbeats (the node's and its workers'), its card
        records, their start lists and their ids in the cards set. Returns the card ids removed.
        ``check_only``: the same checks, nothing removed (the card ids it would remove).

        Refused with NodeInUse while the node is up (its heartbeat or a worker's) or while any
        of its cards holds a reservation or a job is ASSIGNED or RUNNING there; InvalidInput
        for a node Redis does not know. The check and the removal are one transaction (WATCH):
        a node or card that changes meanwhile (a reservation, a registration) is looked at again.
        """
        k = self.keys
        for _ in range(attempts):
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(k.nodes, k.cards, k.workers, k.node(node), k.node_alive(node), k.node_owner(node))
                    cards = sorted((c for c in pipe.smembers(k.cards) if split_card_id(c)[0] == node),
                                   key=lambda c: split_card_id(c)[1])
                    card_keys = [key for c in cards for key in (k.card(node, split_card_id(c)[1]),
                                                                 k.card_jobs(node, split_card_id(c)[1]))]
                    if card_keys:
                        pipe.watch(*card_keys)
                    # Starts left on its cards' lists are stale (no job is placed there): they go too.
                    start_keys = [key for c in cards for key in (k.card_starts(node, split_card_id(c)[1]),
                                                                  k.card_taking(node, split_card_id(c)[1]))]
                    workers = sorted(w for w in pipe.smembers(k.workers) if w.rpartition("@")[2] == node)
                    if not (cards or pipe.sismember(k.nodes, node) or pipe.exists(k.node(node))):
                        raise InvalidInput(f"no node named {node!r}; `rig status` lists the nodes")
                    self._refuse_if_in_use(pipe, node, cards, workers)
                    if check_only:
                        return cards
                    pipe.multi()
                    pipe.srem(k.nodes, node)
                    pipe.delete(k.node(node), k.node_alive(node), k.node_health_lock(node), *card_keys,
                                *start_keys, *(k.worker(w) for w in workers))
                    if cards:
                        pipe.srem(k.cards, *cards)
                    if workers:
                        pipe.srem(k.workers, *workers)
                    pipe.execute()
                    return cards
                except redis.WatchError:
                    continue
        raise NodeInUse(f"node {node} kept changing while rig tried to forget it ({attempts} tries); "
                        "is it coming back? Try again")

    def _refuse_if_in_use(self, pipe: redis.client.Pipeline, node: str, cards: list[str],
                          workers: list[str]) -> None:
        k = self.keys
        live = [w for w in workers if pipe.exists(k.worker(w))]
        owner = pipe.get(k.node_owner(node))
        if pipe.exists(k.node_alive(node)) or live or owner:
            from rig.node_claim import parse

            holder = parse(owner)
            who = f" (live workers: {', '.join(live)})" if live else ""
            who += f" (owned by {holder.describe()})" if holder else ""
            raise NodeInUse(f"node {node} is up{who}; rig forgets only a node that is gone: stop it "
                            f"first (`rig down --node {node}` there)")
        held: set[int] = set()
        holding: list[str] = []
        for cid in cards:
            index = split_card_id(cid)[1]
            jobs = pipe.hkeys(k.card_jobs(node, index))
            reserved, count = pipe.hmget(k.card(node, index), "reserved", "jobs")
            held.update(int(j) for j in jobs if j.isdigit())
            if jobs or _positive(reserved) or _positive(count):
                holding.append(cid)
        read = self.r.pipeline(transaction=False)
        for state in (JobState.ASSIGNED, JobState.RUNNING):
            read.zrange(k.state_index(state.value), 0, -1)
        placed = [int(i) for ids in read.execute() for i in ids]
        for job_id in placed:
            read.hget(k.job(job_id), "node")
        held.update(j for j, where in zip(placed, read.execute(), strict=True) if where == node)
        if not (held or holding):
            return
        ids = " ".join(map(str, sorted(held)))
        what = "; ".join(filter(None, (f"job(s) {ids} placed or running there" if held else "",
                                       f"card(s) {', '.join(holding)} hold reservations" if holding else "")))
        if pipe.hexists(k.node(node), "stopped_at"):
            hint = (f"it was stopped on purpose (`rig down`), so its jobs stay its own until it returns: "
                    f"`rig up --node {node}` there and let them end or kill them")
        else:
            hint = (f"wait until they end{f' or `rig kill {ids}`' if held else ''} (a silent node's "
                    "are given back once it is declared down)")
        raise NodeInUse(f"node {node} still has work: {what}; {hint}, then forget it")

    # -- read -----------------------------------------------------------------------------
    def read(self) -> list[NodeInfo]:
        """Every node that ever registered, sorted by name, with its liveness now."""
        names = sorted(self.r.smembers(self.keys.nodes))
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.node(name))
            pipe.exists(self.keys.node_alive(name))
        replies = pipe.execute()
        live_workers = self._live_workers_by_node({name: replies[2 * i] or {} for i, name in enumerate(names)})
        now = shared_now(self.r)
        here = boot_host()
        return [_info(name, replies[2 * i] or {}, bool(replies[2 * i + 1]), live_workers.get(name, 0), now,
                      here=here)
                for i, name in enumerate(names)]

    def _live_workers_by_node(self, records: dict[str, dict]) -> dict[str, int]:
        """Node name -> workers of it whose heartbeat has not expired and names no rig up other
        than the one its record (``records``: node name -> its hash) names (names are role@node)."""
        names = sorted(self.r.smembers(self.keys.workers))
        if not names:
            return {}
        values = self.r.mget([self.keys.worker(n) for n in names])
        counts: dict[str, int] = {}
        for name, value in zip(names, values, strict=True):
            node = worker_node(name)
            record = records.get(node or "", {})
            if node is not None and beat_of_up(value, _int(record.get("pid")), _int(record.get("pid_start"))):
                counts[node] = counts.get(node, 0) + 1
        return counts


def worker_node(name: str) -> str | None:
    """The node a worker's name (``role@node``) says it runs on; None for a name without one."""
    return name.split("@", 1)[1] if "@" in name else None


def _positive(value: str | None) -> bool:
    """A counter field of a card record above zero (a damaged one counts as in use)."""
    try:
        return float(value or 0) > 0
    except ValueError:
        return True


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _checkable_here(raw: dict, here: str, workers: int) -> bool:
    """Can this reader (``here``: its boot_host) tell whether the node's ``rig up`` pid runs?
    Yes on the host and boot the node recorded. A record from before ``host_id`` names only a
    host name: there only while no worker is alive (that rig's rule)."""
    if raw.get("host_id"):
        return raw["host_id"] == here
    return workers == 0 and raw.get("host") == here.split("/")[0]


def _info(name: str, raw: dict, heartbeat: bool, workers: int, now: float, *, here: str | None = None) -> NodeInfo:
    """One node's record read at ``now`` (shared clock, epoch s): its state and liveness.
    ``here``: the reader's host in this boot (workers.process_tree.boot_host); on the node's
    own host no heartbeat counts, its own or its workers', once its ``rig up`` no longer runs
    (see the module doc)."""
    def num(key: str) -> float | None:
        value = raw.get(key)
        try:
            return float(value) if value not in (None, "") else None
        except ValueError:
            return None

    pid = num("pid")
    started, seen, ttl = num("started_at"), num("last_seen"), num("beat_ttl")
    gone = None
    if (heartbeat or workers) and pid is not None and here and _checkable_here(raw, here, workers) \
            and not may_run(int(pid), _int(raw.get("pid_start"))):
        # Not os.kill(pid, 0) alone: a zombie answers it. A rig up of another user that /proc
        # hides (hidepid) may run: then its heartbeats decide.
        # Its last beats outlive it (SIGKILLed): its workers' too, dying with it or winding down.
        heartbeat, workers = False, 0
        left = (seen or started or now) + (ttl or DEFAULT_BEAT_TTL_S) - now
        gone = (f"its rig up (pid {int(pid)}) no longer runs on {raw.get('host') or 'this host'}"
                + (f"; its heartbeat expires in {max(1, round(left))} s" if left > 0 else ""))
    alive = heartbeat or workers > 0
    down, stopped, missing = num("down_since"), num("stopped_at"), num("missing_since")
    if stopped is not None and not (seen and seen > stopped and heartbeat):
        # Stopped on purpose; workers still winding down may heartbeat for a moment.
        state, since = "stopped", stopped
    elif alive:
        state, since = "up", started
    elif down is not None:
        state, since = "down", down
    else:
        state, since = "silent", seen or started
    # The reader's own judgement, from the record alone: no live beat or health check needed.
    presumed = state == "silent" and (gone is not None or now - (seen or started or now) > (ttl or DEFAULT_BEAT_TTL_S))
    return NodeInfo(
        name=name, alive=alive and state != "stopped", state=state, since=since, last_seen=seen,
        started_at=started, down_since=down, stopped_at=stopped, missing_since=missing,
        beat_ttl=ttl, presumed_down=presumed, backend=raw.get("backend", ""), cards=int(num("cards") or 0), host=raw.get("host", ""),
        pid=int(pid) if pid is not None else None, pid_start=_int(raw.get("pid_start")), workers=workers,
        mismatch=raw.get("installation_mismatch") or None,
        unrecorded=raw.get("unrecorded_jobs") or None,
        clock_skew=raw.get("clock_skew") or None,
        auth_refused_since=num("auth_refused_since"),
        data_format=node_format(raw), gone=gone if state == "silent" else None,
        pools=raw.get("pools"), templates=raw.get("templates"), policy=raw.get("policy"), stopped_why=(raw.get("stopped_why") or None) if state == "stopped" else None,
    )
