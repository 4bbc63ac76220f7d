"""Connecting to the Redis that holds rig's state; Redis errors become RedisUnavailable here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from rig.errors import RedisUnavailable


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    """A client with decoded responses. Does not connect until first used."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=timeout,
        socket_timeout=None,  # BLPOP and pub/sub block on purpose
        health_check_interval=30,
        retry_on_timeout=True,
    )


def check(client: redis.Redis, url: str) -> None:
    """Raise RedisUnavailable (naming the URL) unless the server answers PING."""
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise RedisUnavailable(url, _short(exc)) from None
    except redis.AuthenticationError as exc:
        raise RedisUnavailable(url, f"authentication failed: {exc}") from None


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn redis-py connection errors raised inside the block into RedisUnavailable."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(url, _short(exc)) from None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]
