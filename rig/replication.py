"""Waiting for a replica before a write is acknowledged (Redis Sentinel deployments).

Redis replicates asynchronously: a write the master acknowledged is lost if the master dies
before a replica has it and the replica is promoted. Under Sentinel (a ``sentinel://`` URL),
rig therefore sends ``WAIT 1 <timeout>`` after the writes that must survive a fail-over:

- a submission (rig.client: the job records), before its ids are given to the submitter;
- a card worker's claim (RUNNING, with its attempt token), before the job's process starts:
  a promoted replica without the claim would let the dispatcher place the job again while its
  first copy runs;
- a card worker's record of how an attempt ended, before the worker moves on: a promoted
  replica without it would see a RUNNING job whose heartbeat stops, and run it again;
- a ``@rig.task`` call's result (rig.call, directly or through the gateway), before its process
  exits 0: a promoted replica without it has a SUCCEEDED job with no result (:func:`write_confirmed`).

WAIT waits for every write the same connection sent before it; a pooled client does not keep
one connection, so :meth:`ReplicaWait.confirm` writes a mark (INCR) and WAITs in one pipeline,
on one connection, after the writes it covers: the master's replication offset only grows, so
a replica that has the mark has everything written before it.

No replica in time (it is down, or the new master has none yet after a fail-over): the write
stands and the caller goes on (refusing would be untrue: the job is stored and will run), and
says so: a warning line (log, and the submitter's terminal) that a fail-over *now* would lose it.
With no replica connected at all (INFO replication: ``connected_slaves:0``) the WAIT is not sent:
it could only cost its whole timeout on every write; the warning is the same. `rig status`, the
page and ``/metrics`` (``rig_redis_replicas``) say so too (:func:`no_replica_note`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from rig.errors import ConfigError
from rig.keys import Keys
from rig.redis_conn import FAILOVER_WINDOW_S
from rig.sentinel_url import is_sentinel

log = logging.getLogger(__name__)

#: Replicas that must have a write before it counts as safe.
REPLICAS = 1


@dataclass(frozen=True)
class ReplicaWait:
    """WAIT for a replica through ``client``, for at most ``timeout_s`` seconds."""

    client: redis.Redis
    keys: Keys
    timeout_s: float

    def confirm(self) -> bool:
        """True once a replica has every write this process sent before the call; False after
        ``timeout_s`` without one. Raises redis errors (the master died in between: the caller
        retries its write, which its fencing makes safe, then confirms again)."""
        if connected_replicas(self.client) == 0:
            follow_master(self.client)
            return False  # nothing could confirm it: do not wait out the timeout on every write
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(self.keys.replication_mark)
        # WAIT 0 would block for ever: at least 1 ms.
        pipe.wait(REPLICAS, max(1, round(self.timeout_s * 1000)))
        _, acked = pipe.execute()
        if int(acked) >= REPLICAS:
            return True
        follow_master(self.client)
        return False

    def unconfirmed_note(self, what: str) -> str:
        """The warning line when confirm() returned False: why (no replica connected, so it did
        not wait; or none confirmed in time) and what it means."""
        try:
            alone = connected_replicas(self.client) == 0
        except (redis.RedisError, OSError):
            alone = False
        why = ("no replica is connected to it (replica down, or a fail-over just happened)" if alone else
               f"no replica confirmed it within {self.timeout_s:g} s (replica down, or a fail-over just happened)")
        return (f"warning: {what} stored on the Redis master, but {why}: if the master failed now it would be "
                "lost (docs/RELIABILITY.md)")


class MasterDeposed(redis.ConnectionError):
    """The master a write went to was deposed: the sentinel with the newest configuration names
    another one. It takes writes until the sentinels turn it into a replica, then drops them:
    the write is as good as lost. A ConnectionError, so that a card worker's retry waits until
    redis-py follows the new master and confirms again (rig.client says "lost" at once)."""


def follow_master(client: redis.Redis) -> None:
    """After a write no replica confirmed: ask the sentinels for the master now, so that the
    caller's read-back (is the write still there?) goes to the master they name. A master that
    was hung or cut off (SIGSTOP, a partition) while the sentinels promoted its replica answers
    again as a master, with no replica, until the sentinels turn it into a replica (~10 s) and
    it drops everything written meanwhile; rig's connections to it are healthy, so nothing made
    them ask the sentinels: submissions were acknowledged there (with the no-replica warning)
    and lost, and a card worker started a job whose claim was lost, which then ran twice.
    redis-py's pool, told of a new master address, closes its idle connections to the old one
    and drops the busy ones as they come back. Not under Sentinel (no such pool): nothing.

    redis-py asks ``SENTINEL MASTERS``, which names the old master until the fail-over ends:
    just after the promotion only the leading sentinel knows, by ``GET-MASTER-ADDR-BY-NAME``
    with a newer config epoch. Then the pool stays on the old master, so MasterDeposed is
    raised when the sentinel with the newest epoch names another master than the one the pool
    wrote to (12 of 15 submissions right after a promotion were acknowledged there, and lost)."""
    pool = client.connection_pool
    ask = getattr(pool, "get_master_address", None)
    if ask is None or not getattr(pool, "is_master", False):
        return
    wrote_to = _address(pool.master_address)
    try:
        ask()
    except (redis.RedisError, OSError):
        pass  # no sentinel answers now: the read-back's own connection asks again
    named = newest_master(pool.sentinel_manager.sentinels, pool.service_name)
    if named is not None and wrote_to is not None and named != wrote_to:
        raise MasterDeposed(f"the Redis master {wrote_to[0]}:{wrote_to[1]} was replaced in a fail-over: the "
                            f"sentinels name {named[0]}:{named[1]}")


def write_confirmed(replicas: ReplicaWait | None, write: Callable[[], object], kept: Callable[[], bool],
                    what: str, window_s: float = FAILOVER_WINDOW_S) -> str | None:
    """``write()`` so that a fail-over does not lose it, for a write that can simply be made
    again (idempotent) and whose writer has nothing else to fence it with. Returns None once a
    replica has it (or not under Sentinel: ``replicas`` None), else the warning line
    (:meth:`ReplicaWait.unconfirmed_note` of ``what``) once the master the sentinels name holds
    it (``kept()``, read there). Written to a master the sentinels replaced (MasterDeposed), or
    not found on the master named after an unconfirmed wait: written again, 0.1 s doubling to
    1 s apart, until redis-py follows the new master; after ``window_s`` seconds of that the
    last error is raised (redis errors as they come)."""
    deadline = time.monotonic() + window_s
    delay = 0.1
    while True:
        write()
        if replicas is None:
            return None
        try:
            if replicas.confirm():
                return None
            if kept():  # read on the master the sentinels name now (confirm followed it)
                return replicas.unconfirmed_note(what)
            lost: redis.ConnectionError = MasterDeposed(f"{what} was not on the Redis master after a fail-over")
        except MasterDeposed as exc:
            lost = exc
        if time.monotonic() + delay > deadline:
            raise lost
        log.warning("%s: lost in a Redis fail-over (%s); writing it again in %.1f s", what, lost, delay)
        time.sleep(delay)  # no event says when redis-py's pool follows the new master: retry with backoff
        delay = min(delay * 2, 1.0)


#: Seconds a sentinel that did not answer is left out of :func:`newest_master` (one hung
#: sentinel would otherwise cost every unconfirmed write its whole timeout).
QUIET_S = 30.0
_quiet: dict[tuple[str, int], float] = {}


def newest_master(sentinels: list[redis.Redis], name: str) -> tuple[str, int] | None:
    """The master address (``GET-MASTER-ADDR-BY-NAME``) of the sentinel whose configuration of
    ``name`` is the newest (``config-epoch``); None when none answers or two of the newest
    epoch disagree."""
    best: tuple[int, tuple[str, int] | None] | None = None
    for sentinel in sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        where = (str(kwargs.get("host")), int(kwargs.get("port") or 0))
        if time.monotonic() < _quiet.get(where, 0.0):
            continue
        try:
            pipe = sentinel.pipeline(transaction=False)
            pipe.sentinel_master(name)
            pipe.sentinel_get_master_addr_by_name(name)
            state, addr = pipe.execute()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            _quiet[where] = time.monotonic() + QUIET_S
            continue
        except (redis.RedisError, ConfigError):  # unknown name, refused, wrong kind: this one says nothing
            continue
        epoch, named = int(state.get("config-epoch") or 0), _address(addr)
        if best is None or epoch > best[0]:
            best = (epoch, named)
        elif epoch == best[0] and named != best[1]:
            best = (epoch, None)
    return None if best is None else best[1]


def _address(addr: object) -> tuple[str, int] | None:
    """(host, port) as text and number, from redis-py's pool or a sentinel's reply."""
    if not addr:
        return None
    host, port = addr  # type: ignore[misc]
    return (host.decode() if isinstance(host, bytes) else str(host), int(port))


def replica_wait(client: redis.Redis, keys: Keys, url: str, timeout_s: float) -> ReplicaWait | None:
    """The wait rig's writes use with this Redis: only under Sentinel and ``timeout_s`` > 0 (a
    single Redis has no replica to wait for; WAIT there would only cost the timeout)."""
    if timeout_s <= 0 or not is_sentinel(url):
        return None
    return ReplicaWait(client, keys, timeout_s)


def connected_replicas(client: redis.Redis) -> int | None:
    """Replicas connected to the master now (INFO replication ``connected_slaves``); None when
    Redis does not say (INFO not allowed)."""
    try:
        info = client.info("replication")
    except redis.ResponseError:
        return None
    value = info.get("connected_slaves")
    return int(value) if value is not None else None


def no_replica_note(client: redis.Redis, url: str) -> str | None:
    """The status line under Sentinel when no replica is connected: every write is at risk and a
    fail-over has nothing to promote. None otherwise (also when it cannot be read)."""
    if not is_sentinel(url):
        return None
    try:
        count = connected_replicas(client)
    except (redis.RedisError, OSError):
        return None
    if count != 0:
        return None
    return ("no replica confirms writes: the Redis master has no replica connected, so a fail-over would lose "
            "what it holds and has nothing to promote; start the replica (replicaof) and check `SENTINEL "
            "REPLICAS` (docs/RELIABILITY.md)")
