"""A refused password is waited out, never retried at once: one gate per Redis and password.

When the operator changes Redis' ``requirepass`` (and kills the old connections), every rig
process still holds the old password. Without a gate each of its connection paths (heartbeat,
telemetry, the supervise loop, redis-py's own Retry, kombu's consumer) opened a new socket,
sent AUTH, was refused and tried again at once: ~45 refused logins/s from 4 nodes and
thousands of sockets in TIME_WAIT. The gate sits under every redis-py connection of the process
(``install``: AbstractConnection.connect_check_health, which kombu's connections use too): after
a refused login, no new connection of this process opens a socket until the back-off ends
(1 s, doubling, at most 30 s); a try inside it fails at once with AuthenticationError, which
every caller already treats as a refused password. A login that succeeds opens the gate.

A node also says so where ``rig status`` reads it: its already logged-in connections can still
write, so ``rig up`` probes a NEW login now and then (``probe``) and records
``auth_refused_since`` on its node record (``report``); rig.authwatch turns it into the line.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

#: First wait after a refused login (s); it doubles on each further refusal, up to the cap.
BACKOFF_FIRST_S = 1.0
#: Longest wait between two login tries of one process (s).
BACKOFF_CAP_S = 30.0
#: How often ``rig up`` tries a fresh login to find out whether new connections are refused (s).
PROBE_EVERY_S = 10.0
#: The node record field: wall time (Redis-free, this host's clock) of the first refusal.
FIELD = "auth_refused_since"

log = logging.getLogger("rig.authgate")


class AuthGate:
    """Back-off state of one process's logins. Thread-safe; times are monotonic except
    ``since`` (wall clock, for the operator)."""

    def __init__(self, first: float = BACKOFF_FIRST_S, cap: float = BACKOFF_CAP_S) -> None:
        self.first, self.cap = first, cap
        self._lock = threading.Lock()
        self._delay = 0.0  # the last wait imposed (s); 0: no refusal since the last good login
        self._open_at = 0.0  # monotonic time before which no login is tried
        self.since: float | None = None  # wall time of the first refusal of this run of them
        self.refusals = 0  # logins Redis refused (sockets opened for nothing)
        self.held = 0  # logins not tried because the gate was closed
        self.said = "WRONGPASS invalid username-password pair"  # Redis' last refusal (first line)

    def check(self) -> None:
        """Raise AuthenticationError (no socket opened) while the back-off lasts."""
        with self._lock:
            wait = self._open_at - time.monotonic()
            if wait <= 0:
                return
            self.held += 1
        raise self.error()

    def message(self) -> str:
        """The text of every refusal while it lasts, a held login's and a refused one's alike.
        Redis' own words first: every reader of the error (rig.redis_conn.auth_failed) keeps
        saying what Redis said. It never changes while it lasts (no countdown), so the loggers
        that say a repeated line once (rig.lograte) stay quiet: a refused login's own text
        alternating with a held one's made them say it again every second."""
        return f"{self.said} (rig tries a new login after {self.first:.0f} s, doubling up to {self.cap:.0f} s)"

    def error(self) -> redis.AuthenticationError:
        """The AuthenticationError of every refusal while it lasts (``message``), with Redis' own
        words alone as its ``redis_said``: the line a person reads (rig.redis_conn.auth_failed)
        is no back-off's, since a one-shot command (`rig status`, exit 5) tries no new login."""
        exc = redis.AuthenticationError(self.message())
        exc.redis_said = self.said  # type: ignore[attr-defined]
        return exc

    def refused(self, said: str = "") -> float:
        """A login was refused (Redis said ``said``): close the gate for the next wait
        (returned, s)."""
        with self._lock:
            if said:
                self.said = said
            self._delay = self.first if self._delay <= 0 else min(self.cap, self._delay * 2)
            self._open_at = time.monotonic() + self._delay
            if self.since is None:
                self.since = time.time()
            self.refusals += 1
            return self._delay

    def accepted(self) -> None:
        """A login succeeded: open the gate and forget the refusals."""
        with self._lock:
            self._delay, self._open_at, self.since = 0.0, 0.0, None

    def reset(self) -> None:
        """Forget everything (tests)."""
        self.accepted()
        with self._lock:
            self.refusals = self.held = 0


#: One gate per Redis address and credentials: another Redis, or the same one with another
#: password, is not held back by this one's refusals.
_GATES: dict[tuple[object, ...], AuthGate] = {}
_gates_lock = threading.Lock()


def gate_of(connection: Any) -> AuthGate:
    """The gate of a redis-py connection's address and credentials."""
    key = (getattr(connection, "host", None), getattr(connection, "port", None),
           getattr(connection, "path", None), getattr(connection, "username", None),
           getattr(connection, "password", None))
    with _gates_lock:
        return _GATES.setdefault(key, AuthGate())


def refused_since() -> float | None:
    """Wall time of the first refusal still in force in this process (None: none)."""
    with _gates_lock:
        times = [g.since for g in _GATES.values() if g.since is not None]
    return min(times) if times else None


def reset_all() -> None:
    """Forget every gate (tests)."""
    with _gates_lock:
        _GATES.clear()

#: A connection with this attribute set is not gated: rig's own probes that log in without
#: credentials on purpose (rig.server_kind asks a server's kind), whose refusal says nothing
#: about the password in use.
NOT_GATED = "_rig_not_gated"

_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Put the gates under every redis-py connection of this process (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from redis.connection import AbstractConnection

        original = AbstractConnection.connect_check_health

        @functools.wraps(original)
        def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self, "_sock", None) is not None or getattr(self, NOT_GATED, False):
                return original(self, *args, **kwargs)
            gate = gate_of(self)
            gate.check()
            try:
                result = original(self, *args, **kwargs)
            except Exception as exc:
                from rig.redis_conn import is_auth_error

                if is_auth_error(exc) and not isinstance(exc, redis.exceptions.NoPermissionError):
                    gate.refused(str(exc).strip().split("\n")[0][:160])
                    raise gate.error() from exc
                raise
            gate.accepted()
            return result

        AbstractConnection.connect_check_health = gated  # type: ignore[method-assign]
        _installed = True


def probe(url: str) -> bool | None:
    """Try one NEW login to ``url`` (a fresh client, closed after): True accepted, False refused
    (the gate then holds further tries), None when Redis cannot be reached (proves nothing)."""
    from rig.redis_conn import connect, is_auth_error

    client = connect(url)
    try:
        client.ping()
        return True
    except redis.RedisError as exc:
        return False if is_auth_error(exc) else None
    finally:
        client.close()


def report(client: redis.Redis, node_key: str, since: float | None) -> None:
    """Record (or clear) ``auth_refused_since`` on the node record through ``client``, whose
    pooled connection may still be logged in. A refused write proves nothing: ignored."""
    try:
        if since is None:
            client.hdel(node_key, FIELD)
        else:
            client.hsetnx(node_key, FIELD, f"{since:.3f}")
    except redis.RedisError as exc:
        log.debug("auth_refused_since not recorded: %s", exc)


F = TypeVar("F", bound=Callable[..., Any])


def quiet_on_auth(what: str, logger: logging.Logger, every: float = 300.0) -> Callable[[F], F]:
    """Decorator for a periodic task: a refused password makes it log ONE line (again only
    every ``every`` s while it lasts) and return a short string, instead of a traceback a run."""
    from rig.lograte import Throttle

    quiet = Throttle(every)

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            from rig.errors import RedisAuthFailed
            from rig.redis_conn import is_auth_error

            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not (isinstance(exc, RedisAuthFailed) or is_auth_error(exc)):
                    raise
                line = f"{what} skipped: Redis refused rig's password ({str(exc).splitlines()[0][:160]})"
                if quiet.due(f"{what}:auth"):
                    logger.error("%s (said again in %.0f s while it lasts)", line, quiet.every)
                return "skipped: Redis refused the password"

        return run  # type: ignore[return-value]

    return wrap
