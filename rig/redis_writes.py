"""Whether rig's Redis takes writes, and whether it keeps them.

A Redis can answer every read and still refuse every write:

- **full**: ``maxmemory`` reached with the ``noeviction`` policy (``OOM command not allowed``);
- **read-only**: rig points at a replica (``READONLY``);
- **cannot persist**: its last RDB save failed and ``stop-writes-on-bgsave-error`` is on
  (``MISCONF``).

Each is an outage for rig, like an unreachable Redis: a refused write changes nothing (a single
command, a MULTI/EXEC transaction and a Lua script that has not written yet are refused whole),
so a caller that retries later loses nothing and does nothing twice. The CLI and the Python API
turn it into one line (rig.errors.RedisRefusesWrites, exit code 5); every worker waits and
retries (:func:`is_outage` is the one test they all use).

A Redis can also take writes and lose them: an evicting ``maxmemory-policy`` (``allkeys-*``,
``volatile-*``) drops rig's records silently when full, and a Redis without RDB saves and
without AOF loses everything on a restart. :func:`warnings` says so, one line each, for
``rig status`` and ``rig up``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from rig.errors import RedisFull, RedisRefusesWrites
from rig.memory import format_memory
from rig.redis_conn import strip_password, suggest_cli

log = logging.getLogger(__name__)

FULL = "full"
READ_ONLY = "read-only"
CANNOT_PERSIST = "cannot-persist"

#: The policy under which a full Redis refuses writes instead of evicting keys.
NOEVICTION = "noeviction"


def refusal(exc: BaseException) -> str | None:
    """FULL, READ_ONLY or CANNOT_PERSIST when ``exc`` is Redis refusing a write; else None.

    redis-py maps the ``OOM`` and ``READONLY`` replies to their own classes; a refusal inside
    a Lua script or a pipeline carries the same text after a prefix, and ``MISCONF`` has no class.
    """
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return FULL
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return READ_ONLY
    if not isinstance(exc, redis.ResponseError):
        return None
    text = str(exc)
    if "command not allowed when used memory" in text:  # "OOM command not allowed ..." in a script
        return FULL
    if text.startswith("READONLY") or "You can't write against a read only replica" in text:
        return READ_ONLY
    if text.startswith("MISCONF") or "MISCONF " in text:
        return CANNOT_PERSIST
    return None


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means "Redis cannot be used right now; wait and try again": it cannot
    be reached (ConnectionError, TimeoutError, the auth and LOADING errors among them) or it
    refuses writes (:func:`refusal`). Every rig worker waits and retries on exactly these."""
    if isinstance(exc, RedisRefusesWrites):
        return True
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError) or refusal(exc) is not None


@dataclass(frozen=True)
class MemoryState:
    """What ``INFO memory`` says: bytes used, the maxmemory limit (0: none), the policy."""

    used: int
    maxmemory: int
    policy: str

    @property
    def full(self) -> bool:
        """At or over its limit with a policy that refuses writes (rather than evicting)."""
        return self.maxmemory > 0 and self.used >= self.maxmemory and self.policy == NOEVICTION

    def describe(self) -> str:
        """``used 1.2 GiB of maxmemory 1.0 GiB, policy noeviction``."""
        limit = format_memory(self.maxmemory) if self.maxmemory else "none"
        return f"used {format_memory(self.used)} of maxmemory {limit}, policy {self.policy}"


def memory_state(client: redis.Redis) -> MemoryState | None:
    """``INFO memory`` (a read: answered by a full Redis too), or None if it cannot be read."""
    try:
        info = client.info("memory")
        return MemoryState(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)),
                           str(info.get("maxmemory_policy", "?")))
    except (redis.RedisError, OSError, ValueError, TypeError) as exc:
        log.debug("INFO memory unreadable: %s", exc)
        return None


def refused_error(url: str, exc: BaseException, client: redis.Redis | None = None) -> RedisRefusesWrites:
    """The rig error (one line, what to do) for a write ``url``'s Redis refused (``exc``;
    :func:`refusal` must say which). With ``client``, a full Redis' figures are read (INFO)."""
    kind = refusal(exc) or FULL
    shown = strip_password(url)
    if kind == FULL:
        state = memory_state(client) if client is not None else None
        figures = state.describe() if state is not None else "maxmemory reached, policy noeviction"
        return RedisFull(
            f"Redis at {shown} is full ({figures}) and refused rig's write; nothing was changed. "
            f"Raise its maxmemory ({suggest_cli(url, 'CONFIG SET maxmemory <size>')}, and in its config "
            "file) or free memory in it, then try again", url)
    if kind == READ_ONLY:
        return RedisRefusesWrites(
            f"Redis at {shown} is a read-only replica and refused rig's write; nothing was changed. "
            "Point RIG_REDIS_URL at the primary", url)
    # Redis' own reason: a failed RDB snapshot, or "Errors writing to the AOF file: No space left
    # on device" (a full disk under the private Redis' AOF), which is no snapshot.
    why = "it could not write to its AOF file" if "AOF" in str(exc) else "it could not save its snapshot"
    return RedisRefusesWrites(
        f"Redis at {shown} refuses writes because {why} (MISCONF); "
        "nothing was changed. Free disk space where it saves (its `dir`) and see its log", url)


def full_notice(client: redis.Redis) -> str | None:
    """"Redis is full (used X of maxmemory Y, policy noeviction): ..." when it is, else None.
    For `rig status` and the alert (read-only: works on a full Redis)."""
    state = memory_state(client)
    if state is None or not state.full:
        return None
    return (f"Redis is full ({state.describe()}): it refuses rig's writes, so nothing can be "
            "submitted, placed or concluded until its maxmemory is raised or memory is freed")


def _config(client: redis.Redis, name: str) -> str | None:
    """One CONFIG GET value, or None when CONFIG is refused (renamed or disabled, an ACL user
    without the right) or the value is absent."""
    try:
        return client.config_get(name).get(name)
    except (redis.RedisError, OSError, AttributeError) as exc:
        log.debug("CONFIG GET %s refused: %s", name, exc)
        return None


def warnings(client: redis.Redis, *, url: str, private: bool = False) -> list[str]:
    """One line per way this Redis may lose rig's data: an evicting maxmemory-policy, and
    (unless ``private``: the Redis `rig up` starts keeps an AOF) no persistence at all, each
    with the `redis-cli` command that mends it on ``url`` (``client``'s URL). Read
    with CONFIG GET when allowed, INFO otherwise; a fact that cannot be read is not guessed:
    nothing is said about it. Never raises."""
    out: list[str] = []
    try:
        policy = _config(client, "maxmemory-policy")
        if policy is None:
            state = memory_state(client)
            policy = state.policy if state is not None else None
        if policy and policy != NOEVICTION:
            out.append(f"Redis' maxmemory-policy is {policy}: when it fills it silently deletes keys, "
                       "rig's job records and reservations among them; set it to noeviction "
                       f"({suggest_cli(url, 'CONFIG SET maxmemory-policy noeviction')}, and in its config file)")
        if not private:
            save, aof = _config(client, "save"), _config(client, "appendonly")
            if aof is None:
                try:
                    aof = "yes" if int(client.info("persistence").get("aof_enabled", 0)) else "no"
                except (redis.RedisError, OSError, ValueError, TypeError):
                    aof = None
            # Without CONFIG, whether RDB saves are configured cannot be read: say nothing.
            if save is not None and not save.strip() and aof == "no":
                out.append("Redis keeps no copy on disk (no RDB save, no AOF): a restart of it loses "
                           "every job and reservation; turn on AOF "
                           f"({suggest_cli(url, 'CONFIG SET appendonly yes')}, and in its config file)")
    except Exception as exc:  # noqa: BLE001 - a warning must never fail the command that asks
        log.debug("Redis durability check failed: %s", exc)
    return out


def refused_at(url: str, exc: BaseException) -> RedisRefusesWrites:
    """:func:`refused_error` for a caller without a client (the CLI's error handler): one
    short-lived connection reads a full Redis' figures; without them the line still says it."""
    from rig.redis_conn import connect

    try:
        client = connect(url, timeout=2.0, reply_timeout=2.0)
    except (redis.RedisError, OSError, ValueError):
        return refused_error(url, exc)
    try:
        return refused_error(url, exc, client)
    finally:
        client.close()


#: The short form of a notice, for a narrow screen (`rig top` at 80 columns): what is wrong and
#: the setting that mends it; the consequence is dropped, and so is the redis-cli command line
#: (with rig's Redis URL it does not fit): `rig status` prints it whole. Keyed by how the long
#: form starts.
_SHORT_NOTICES = (
    ("Redis keeps no copy on disk", lambda _: "Redis keeps no copy on disk: CONFIG SET appendonly yes (rig status)"),
    ("Redis' maxmemory-policy is ", lambda _: "Redis may evict rig's keys: CONFIG SET maxmemory-policy noeviction "
                                               "(rig status)"),
    ("Redis is full", lambda _: "Redis is full and refuses rig's writes: raise its maxmemory"),
)


def short_notice(notice: str) -> str:
    """``notice`` (from :func:`notices`) in under 80 columns with what to do kept; a notice
    without a short form is returned as it is."""
    for start, short in _SHORT_NOTICES:
        if notice.startswith(start):
            return short(notice)
    return notice


def notices(client: redis.Redis, *, url: str, private: bool = False) -> list[str]:
    """What `rig status` and `rig up` say about rig's Redis (``client``, at ``url``):
    :func:`refusal_notice` first, then :func:`warnings`. Never raises."""
    try:
        refused = refusal_notice(client)
    except Exception:  # noqa: BLE001 - a notice must never fail the command that asks
        refused = None
    return ([refused] if refused else []) + warnings(client, url=url, private=private)


def notices_at(url: str) -> list[str]:
    """:func:`notices` for the Redis at ``url`` over one short-lived connection (`rig up`)."""
    from rig.redis_conn import connect

    try:
        client = connect(url, timeout=2.0, reply_timeout=2.0)
    except (redis.RedisError, OSError, ValueError):
        return []
    try:
        return notices(client, url=url)
    finally:
        client.close()


class FullWatch:
    """The "Redis is full" (or otherwise refuses writes: :func:`refusal_notice`) alert of one
    process (a node's control worker: workers.alert_check), kept in memory: a full Redis refuses
    the alert's own bookkeeping (rig.alerts keeps it in Redis). :meth:`check` returns the alerts
    to deliver: one firing when Redis begins to refuse writes (where ``speaks``: one process of
    the cluster says it), one resolved when it takes writes again (by the process that fired,
    whether it still speaks or not: it alone knows it fired)."""

    KEY = "redis_refuses_writes"

    def __init__(self, node: str) -> None:
        self.node = node
        self.firing: str | None = None

    def check(self, client: redis.Redis, *, speaks: bool) -> list:  # noqa: ANN401 - list[rig.alerts.Alert]
        from rig.alerts import SEVERITY_CRITICAL, Alert

        if memory_state(client) is None:
            return []  # unreadable: neither full nor cleared, as far as is known
        line = refusal_notice(client)
        if line and self.firing is None and not speaks:
            return []  # another node's control worker says it: one alert for the cluster
        if line and self.firing is None:
            self.firing = line
            return [Alert(self.KEY, SEVERITY_CRITICAL, f"{line} (seen by node {self.node})")]
        if line is None and self.firing is not None:
            said, self.firing = self.firing, None
            return [Alert(self.KEY, SEVERITY_CRITICAL, f"resolved: {said}", status="resolved")]
        return []


def refusal_notice(client: redis.Redis) -> str | None:
    """One line when Redis answers but would refuse a write now, else None (also when that
    cannot be read): full (:func:`full_notice`), a read-only replica, or a failed RDB save with
    stop-writes-on-bgsave-error (MISCONF). For `rig status`, `rig up` and the alert."""
    try:
        full = full_notice(client)
        if full:
            return full
        replication = client.info("replication")
        if replication.get("role") == "slave" and str(replication.get("slave_read_only", 1)) == "1":
            return ("Redis is a read-only replica: it refuses rig's writes, so nothing can be "
                    "submitted, placed or concluded; point RIG_REDIS_URL at the primary")
        persistence = client.info("persistence")
        if str(persistence.get("aof_enabled", 0)) == "1" and persistence.get("aof_last_write_status") == "err":
            # Always refused (no setting turns it off) until a write to the AOF succeeds; the
            # private Redis keeps its AOF under RIG_HOME, so a full RIG_HOME does this.
            return ("Redis refuses writes: it cannot write its AOF file (MISCONF; its disk full?), so nothing "
                    "can be submitted, placed or concluded; free disk space where it saves (its `dir`) and "
                    "see its log")
        if persistence.get("rdb_last_bgsave_status") == "err":
            # MISCONF needs save points and stop-writes-on-bgsave-error (both unknown without
            # CONFIG: Redis' defaults, which refuse).
            stops = _config(client, "stop-writes-on-bgsave-error") != "no"
            saves = (_config(client, "save") or "x").strip() != ""
            if stops and saves:
                return ("Redis refuses writes: its last RDB save failed (MISCONF), so nothing can be "
                        "submitted, placed or concluded; free disk space where it saves and see its log")
    except (redis.RedisError, OSError, ValueError, TypeError) as exc:
        log.debug("Redis write state unreadable: %s", exc)
    return None


def refuses_writes(client: redis.Redis) -> bool:
    """True when Redis answers but would refuse a write now (:func:`refusal_notice`). Then every
    heartbeat is refused at once, so silence proves nothing about a worker (rig.stack's hung
    check judges none). False when unknown."""
    return refusal_notice(client) is not None
