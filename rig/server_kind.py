"""Which kind of Redis server a connection reached, and the one refusal rule for the wrong kind.

rig keeps its state in one plain Redis (``redis_mode:standalone``), found either directly
(``redis://``) or through Redis Sentinel (``sentinel://``, whose listed addresses must be
sentinels: ``redis_mode:sentinel``). Three mistakes reach a server of the wrong kind and used to
end in tracebacks far from their cause (``unknown command 'SMEMBERS'``, ``unknown command
'SENTINEL'``, ``CROSSSLOT``) or in a wrong one (a refused password):

- a ``redis://`` URL naming a sentinel's port;
- a ``sentinel://`` URL naming a plain Redis's port;
- a URL naming a Redis Cluster node (rig's scripts touch keys of many hash slots).

:func:`on_connect` is installed on every connection rig opens (rig.redis_conn.connect and the
sentinel connections of rig.sentinel_url), so rig, rig-submit, the Python API and ``rig up``
refuse these the same way (ConfigError, exit 6), once per connection, for one ``INFO server``
round trip.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from redis.connection import AbstractConnection

from rig.authgate import NOT_GATED
from rig.errors import ConfigError

#: redis_mode of the server that holds rig's data.
DATA = "standalone"
#: redis_mode of a sentinel.
SENTINEL = "sentinel"
#: redis_mode of a Redis Cluster node.
CLUSTER = "cluster"


def on_connect(expected: str) -> Callable[[AbstractConnection], None]:
    """A redis-py ``redis_connect_func``: the connection's own set-up (AUTH, SELECT), then
    :func:`refuse_wrong_kind`. A refused password from a server of the wrong kind (a sentinel
    without a password, a plain Redis sent a sentinel password) is reported as the wrong kind."""

    def connect_func(conn: AbstractConnection) -> None:
        try:
            conn.on_connect()
        except (redis.AuthenticationError, redis.ResponseError) as exc:
            conn.disconnect()
            mode = _mode_without_auth(conn)
            if mode is not None and mode != expected:
                raise ConfigError(wrong_kind(mode, expected, _address(conn), conn)) from None
            raise exc from None
        mode = server_mode(conn)
        if mode is not None and mode != expected:
            line = wrong_kind(mode, expected, _address(conn), conn)
            conn.disconnect()  # redis-py cleans up after its own errors only
            raise ConfigError(line)

    return connect_func


def server_mode(conn: AbstractConnection) -> str | None:
    """The server's ``redis_mode`` (standalone, sentinel, cluster) from ``INFO server``; None
    when the server does not say (INFO not allowed to rig's ACL user, a very old Redis)."""
    try:
        conn.send_command("INFO", "server")
        reply = conn.read_response()
    except redis.ResponseError:
        return None
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    for line in text.splitlines():
        if line.startswith("redis_mode:"):
            return line.partition(":")[2].strip()
    return None


def _mode_without_auth(conn: AbstractConnection) -> str | None:
    """redis_mode asked on a fresh TCP connection without credentials (None: it wants them too,
    or the connection is not plain TCP: a Unix socket, TLS)."""
    if type(conn) is not redis.Connection and not hasattr(conn, "connection_pool"):
        return None  # (a sentinel-managed connection is plain TCP too)
    kwargs = {k: getattr(conn, k) for k in ("host", "port", "socket_connect_timeout", "socket_timeout")
              if hasattr(conn, k)}
    probe = redis.Connection(**kwargs)
    setattr(probe, NOT_GATED, True)  # its refusal is no news about rig's password (rig.authgate)
    try:
        probe.connect()
        return server_mode(probe)
    except (redis.RedisError, OSError):
        return None
    finally:
        probe.disconnect()


def wrong_kind(mode: str, expected: str, where: str, conn: AbstractConnection | None = None) -> str:
    """The one line for a server of ``mode`` where rig expected ``expected``."""
    if mode == CLUSTER:
        return (f"the Redis at {where} is a Redis Cluster node, which rig does not support (its scripts touch "
                "keys of many slots); point redis_url at one Redis, or at Redis Sentinel (sentinel://...) for "
                "fail-over (docs/RELIABILITY.md)")
    if mode == SENTINEL:
        name = _monitored_name(conn) if conn is not None else None
        return (f"that port is a Redis Sentinel ({where}), not the Redis that holds rig's data; write "
                f"sentinel://{where}/{name or 'MASTER_NAME'}/0, listing every sentinel comma-separated "
                "(docs/RELIABILITY.md)")
    return (f"the server at {where}, listed as a sentinel in redis_url, is a plain Redis (redis_mode {mode}), "
            f"not a Redis Sentinel; list the sentinels' ports in sentinel://..., or write redis://{where}/0 "
            "for a Redis without Sentinel")


def _monitored_name(conn: AbstractConnection) -> str | None:
    """The master name a sentinel monitors, when it monitors exactly one (for the hint)."""
    kwargs = {k: getattr(conn, k) for k in ("host", "port", "socket_connect_timeout", "socket_timeout")
              if hasattr(conn, k)}
    client = redis.Redis(**kwargs, password=getattr(conn, "password", None), decode_responses=True)
    try:
        names = list(client.sentinel_masters())
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return names[0] if len(names) == 1 else None


def _address(conn: AbstractConnection) -> str:
    host, port = getattr(conn, "host", "?"), getattr(conn, "port", "?")
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
