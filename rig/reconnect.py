"""Riding out a short loss of Redis while a command watches a job.

``rig-submit --wait`` and ``rig log -f`` watch a job for minutes or hours; a Redis restarted
under them (a one-second blip) used to end both at once with exit 5 although the job ran on.
:class:`RideOut` calls a read again while the connection is lost, for at most
:data:`WATCH_RECONNECT_S` seconds, with one line when it is lost and one when it is back; only
then does the error go on (exit 5, its usual one line). The waits between tries are redis-py's
:class:`~redis.backoff.ExponentialBackoff` (each call already has redis-py's own short retry,
rig.redis_conn._retry: this is the longer, watcher-only one on top).

Only a lost connection is ridden out (refused, reset, timed out: rig.errors.RedisUnavailable
from a ConnectionError, a TimeoutError or an OSError): a refused password, a Redis that refuses
writes, or no such database is no blip and goes on at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import ExponentialBackoff

from rig.errors import RedisUnavailable
from rig.redis_conn import is_auth_error, is_setup_error

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a watching command (``rig-submit --wait``, ``rig log -f``, ``Client.wait``) keeps
#: trying while Redis cannot be reached before it gives up with exit 5 (seconds).
WATCH_RECONNECT_S = 30.0
#: The first wait between two tries, doubled at each (seconds), and the longest (seconds).
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.25, 2.0


def lost_connection(exc: BaseException) -> bool:
    """Is ``exc`` a lost or refused connection to Redis (worth trying again), rather than a
    Redis that answers and refuses (credentials, writes, database)?"""
    if isinstance(exc, RedisUnavailable):
        if type(exc) is not RedisUnavailable:  # RedisAuthFailed, RedisRefusesWrites: it answered
            return False
        if exc.__context__ is None:
            return True  # as the gateway reports it (its Redis, or the gateway itself, not answering)
        exc = exc.__context__  # the redis-py error rig.client.Client._guard translated
    if not isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError):
        return False
    return not (is_auth_error(exc) or is_setup_error(exc))


class RideOut:
    """Calls a read again while Redis is lost, for at most ``limit_s`` seconds of one outage.

    ``say`` gets one line when the connection is lost and one when it is back (stderr for the
    CLI; the log for Python callers). An outage that outlasts ``limit_s`` raises its last error.
    ``clock`` and ``sleep`` are time.monotonic and time.sleep but for tests."""

    def __init__(self, say: Callable[[str], None] | None = None, limit_s: float = WATCH_RECONNECT_S, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.say = say or log.warning
        self.limit_s = limit_s
        self.clock, self.sleep = clock, sleep

    def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``fn(*args, **kwargs)``, tried again while the connection is lost (see the class)."""
        lost_at: float | None = None
        backoff = ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S)
        failures = 0
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if self.limit_s <= 0 or not lost_connection(exc):
                    raise  # not a lost connection, or riding out is off (0 s): as a plain call
                now = self.clock()
                if lost_at is None:
                    lost_at = now
                    self.say(f"rig: lost the connection to Redis ({_first_line(exc)}); trying again "
                             f"for up to {self.limit_s:.0f} s")
                if now - lost_at >= self.limit_s:
                    raise
                failures += 1
                self.sleep(min(backoff.compute(failures), max(0.0, lost_at + self.limit_s - now)))
                continue
            if lost_at is not None:
                self.say(f"rig: Redis is back (lost for {self.clock() - lost_at:.0f} s); going on")
            return result


def _first_line(exc: BaseException) -> str:
    cause = exc.__context__ if isinstance(exc, RedisUnavailable) and exc.__context__ else exc
    text = str(cause).strip().splitlines()
    return text[0] if text else type(cause).__name__
