"""One clock for everything several machines write to one Redis, and the rule for durations.

Two rules (issue 11.4):

- **A duration a process measures itself** (a time limit, a kill grace, a backoff, how long a
  worker has been silent *as seen by this process*) uses ``time.monotonic()``: a step of the
  wall clock (NTP, an operator's ``date -s``) must not make a 40 s job TIMEOUT after 11 s.
- **A timestamp stored in Redis** (created, placed, started, ended, heartbeats, "up since",
  "waiting since", alert first-seen times) is on *Redis' clock* (``TIME``), so times written by
  nodes whose clocks disagree can be compared: :func:`shared_now` is the one function for it.

How: a :class:`SharedClock` asks Redis for ``TIME`` once (an *anchor*: Redis' time and this
process's monotonic time at the midpoint of the round trip) and from then on adds the monotonic
time elapsed since; it asks again every ``REFRESH_S`` seconds. So it is immune to steps of this
machine's wall clock, costs no round trip per timestamp, and keeps counting through a Redis
outage: an event stamped while Redis is away (a job's end) gets the time it happened, not the
time it could be written. Before the first answer it falls back to the local wall clock.

``offset`` (local wall clock minus Redis', seconds; positive: this machine is ahead) is what a
node reports in its record each heartbeat; ``rig status`` and the alerts name a node whose
offset exceeds its ``max_clock_skew`` (:func:`skew_note`).

Times are Unix epoch seconds (floats).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

#: How often a clock asks Redis for TIME again (s of monotonic time): bounds the drift of the
#: monotonic clock against Redis' and notices a changed offset.
REFRESH_S = 30.0
#: After a failed TIME, how long before the next try (s): an outage must not make every
#: timestamp wait for a connect timeout.
RETRY_S = 5.0
#: A node whose wall clock is off Redis' by more than this is reported (s); Settings.max_clock_skew.
DEFAULT_MAX_SKEW_S = 2.0


@dataclass(frozen=True)
class Anchor:
    """One answer of Redis' TIME, and this process's clocks at the middle of its round trip."""

    shared: float  # Redis' time (epoch s)
    mono: float  # time.monotonic() then
    wall: float  # time.time() then
    rtt: float  # round trip (s): the uncertainty of ``offset`` is half of it

    @property
    def offset(self) -> float:
        """Local wall clock minus Redis' (s): positive when this machine is ahead."""
        return self.wall - self.shared


class SharedClock:
    """Redis' clock, read once per ``refresh_s`` and carried on with the monotonic clock.

    ``source`` returns Redis' time (epoch s) or raises redis.RedisError; ``monotonic`` and
    ``wall`` are this process's clocks (injectable for tests)."""

    def __init__(self, source: Callable[[], float], *, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, refresh_s: float = REFRESH_S) -> None:
        self.source = source
        self.monotonic = monotonic
        self.wall = wall
        self.refresh_s = refresh_s
        self._anchor: Anchor | None = None
        self._next_try = float("-inf")  # monotonic time of the next TIME after a failure
        self._lock = threading.Lock()

    @property
    def anchor(self) -> Anchor | None:
        return self._anchor

    def measure(self) -> Anchor:
        """Ask Redis for its time now (one round trip); raises redis.RedisError."""
        m0, w0 = self.monotonic(), self.wall()
        try:
            shared = self.source()
        except redis.RedisError:
            self._next_try = self.monotonic() + RETRY_S
            raise
        m1, w1 = self.monotonic(), self.wall()
        anchor = Anchor(shared=shared, mono=(m0 + m1) / 2, wall=(w0 + w1) / 2, rtt=max(0.0, m1 - m0))
        with self._lock:
            self._anchor = anchor
        return anchor

    def now(self, *, refresh: bool = True) -> float:
        """Redis' time now (epoch s). With ``refresh``, asks Redis again when the anchor is older
        than ``refresh_s`` (never more often than every RETRY_S while Redis does not answer);
        without it, never touches the network (safe while Redis is away)."""
        anchor = self._anchor
        mono = self.monotonic()
        if refresh and (anchor is None or mono - anchor.mono >= self.refresh_s) and mono >= self._next_try:
            try:
                anchor = self.measure()
            except redis.RedisError:
                pass  # carry on with the old anchor (or the wall clock before the first)
        return self.at_monotonic(self.monotonic())

    def at_monotonic(self, mono: float) -> float:
        """The shared time of a moment given as this process's ``time.monotonic()``."""
        anchor = self._anchor
        if anchor is None:
            return self.wall() - (self.monotonic() - mono)
        return anchor.shared + (mono - anchor.mono)

    def from_wall(self, ts: float) -> float:
        """A timestamp of this machine's wall clock (a file's mtime) on the shared clock."""
        anchor = self._anchor
        return ts if anchor is None else ts - anchor.offset

    def offset(self) -> float | None:
        """Local wall clock minus Redis' at the last answer (s), None before the first."""
        anchor = self._anchor
        return None if anchor is None else anchor.offset


def redis_time(client: redis.Redis) -> float:
    """Redis' TIME as epoch seconds."""
    secs, usecs = client.time()
    return float(secs) + float(usecs) / 1e6


# -- one clock per Redis server per process ----------------------------------------------------
_clocks: dict[tuple, SharedClock] = {}
_last: SharedClock | None = None
_registry_lock = threading.Lock()


def _server_of(client: redis.Redis) -> tuple:
    """Which Redis server a client talks to (its clock is the server's, whatever the db)."""
    kwargs = client.connection_pool.connection_kwargs
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), getattr(client.connection_pool, 'connection_class', type(None)).__name__,
            id(client.connection_pool) if kwargs.get("host") is None and kwargs.get("path") is None else 0)


def clock_for(client: redis.Redis) -> SharedClock:
    """The process's SharedClock of ``client``'s Redis server (created on first use)."""
    global _last
    key = _server_of(client)
    with _registry_lock:
        found = _clocks.get(key)
        if found is None:
            found = _clocks[key] = SharedClock(lambda: redis_time(client))
        _last = found
    return found


def use_clock(client: redis.Redis, clock: SharedClock) -> None:
    """Make ``clock`` the one of ``client``'s server in this process (tests inject fake clocks)."""
    global _last
    with _registry_lock:
        _clocks[_server_of(client)] = clock
        _last = clock


def reset() -> None:
    """Forget every clock (tests)."""
    global _last
    with _registry_lock:
        _clocks.clear()
        _last = None


def shared_now(client: redis.Redis | None = None, *, refresh: bool = True) -> float:
    """Now on the shared clock (Redis' TIME, epoch s): THE function for any timestamp written to
    Redis, or compared with one read from it. Without ``client``: the clock this process used
    last (a CLI that rendered what it read), else the local wall clock."""
    if client is not None:
        return clock_for(client).now(refresh=refresh)
    last = _last
    return last.now(refresh=refresh) if last is not None else time.time()


def event_time(client: redis.Redis, *, mono: float | None = None, wall: float | None = None) -> float:
    """When something happened, on the shared clock, without asking Redis (it may be away): from
    this process's ``time.monotonic()`` at that moment (best: immune to clock steps), else from a
    timestamp of this machine's wall clock (a file's mtime), else now."""
    clock = clock_for(client)
    if mono is not None:
        return clock.at_monotonic(mono)
    if wall is not None:
        return clock.from_wall(wall)
    return clock.now(refresh=False)


def monotonic_of(client: redis.Redis, shared_ts: float) -> float:
    """The ``time.monotonic()`` value of a moment stamped on the shared clock (e.g. a job's
    started_at read back by a worker that adopts it), so durations since it are monotonic."""
    return time.monotonic() - max(0.0, shared_now(client) - shared_ts)


def skew_note(offset: float | None, max_skew: float) -> str | None:
    """The line ``rig status`` and the alerts show for a node whose clock is off, or None."""
    if offset is None or abs(offset) <= max_skew:
        return None
    way = "ahead of" if offset > 0 else "behind"
    return (f"clock {abs(offset):.1f} s {way} Redis' (limit {max_skew:g} s): fix its time sync "
            "(NTP/chrony); rig uses Redis' clock meanwhile")


def record_clock_offset(client: redis.Redis, node_key: str, max_skew: float) -> float | None:
    """Measure this machine's clock against Redis' now (one TIME) and write it to the node's
    record (``node_key``): ``clock_offset`` (s, + ahead) and ``clock_skew``, the line for
    ``rig status`` while it exceeds ``max_skew`` (deleted once it does not). Returns the
    offset, or None when Redis did not answer."""
    try:
        offset = clock_for(client).measure().offset
        note = skew_note(offset, max_skew)
        pipe = client.pipeline(transaction=False)
        pipe.hset(node_key, "clock_offset", round(offset, 3))
        if note:
            pipe.hset(node_key, "clock_skew", note)
        else:
            pipe.hdel(node_key, "clock_skew")
        pipe.execute()
    except redis.RedisError:
        return None
    return offset
