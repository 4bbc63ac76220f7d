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
    """:func:`probe_mode` of the server ``conn`` reached (None: the connection is not plain
    TCP: a Unix socket, TLS)."""
    if type(conn) is not redis.Connection and not hasattr(conn, "connection_pool"):
        return None  # (a sentinel-managed connection is plain TCP too)
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    if host is None or port is None:
        return None
    timeout = getattr(conn, "socket_timeout", None) or PROBE_TIMEOUT_S
    return probe_mode(host, int(port), min(timeout, PROBE_TIMEOUT_S))


#: Longest wait for each reply of :func:`probe_mode` (s): a server of either kind answers these
#: two small commands at once.
PROBE_TIMEOUT_S = 1.0


def probe_mode(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The ``redis_mode`` of the server at host:port, asked without credentials (None: it
    cannot be told, or nothing answers). INFO server where the server answers it; where it
    wants a password first (NOAUTH for INFO from both kinds), by its command table, which a
    server consults before the password: a plain Redis knows no SENTINEL ("unknown command"),
    a sentinel does (NOAUTH). The connection skips redis-py's handshake: redis-py 8 opens with
    HELLO, which a server with a password refuses before anything else, whatever its kind."""
    probe = redis.Connection(host=host, port=port, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                             redis_connect_func=_bare)
    setattr(probe, NOT_GATED, True)  # its refusal is no news about rig's password (rig.authgate)
    try:
        probe.connect()
        reply = _ask(probe, "INFO", "server")
        if not isinstance(reply, Exception):
            text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
            modes = [line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("redis_mode:")]
            return modes[0] if modes else None
        if not _wants_password(reply):
            return None
        reply = _ask(probe, "SENTINEL", "MYID")
        if _wants_password(reply):
            return SENTINEL
        if isinstance(reply, redis.ResponseError) and "unknown command" in str(reply).lower():
            return DATA
        return None
    except (redis.RedisError, OSError):
        return None
    finally:
        probe.disconnect()


def _bare(conn: AbstractConnection) -> None:
    """A connection's set-up without any command: only the reply parser (redis-py's private
    ``_parser``; its on_connect sends HELLO, CLIENT SETINFO, AUTH first)."""
    conn._parser.on_connect(conn)  # noqa: SLF001


def _ask(conn: AbstractConnection, *args: str) -> object:
    """The reply to one command, or the error the server answered with (returned, not raised)."""
    conn.send_command(*args)
    try:
        return conn.read_response()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        return exc


def _wants_password(reply: object) -> bool:
    """True for a NOAUTH refusal: redis-py raises it as AuthenticationError (its text without
    the NOAUTH code), older versions as a ResponseError. (No AUTH is sent here, so no WRONGPASS.)"""
    if isinstance(reply, redis.AuthenticationError):
        return True
    return isinstance(reply, redis.ResponseError) and ("NOAUTH" in str(reply) or "Authentication required" in str(reply))


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
    """The master name a sentinel monitors, when it monitors exactly one (for the hint), asked
    on a bare connection (:func:`probe_mode`'s) with the password ``conn`` has, if any: through
    a client of redis-py, a sentinel that wants a password refused its HELLO and rig.authgate
    held the next login back, 5 s before the one line (issue 15)."""
    host, port = getattr(conn, "host", None), getattr(conn, "port", None)
    if host is None or port is None:
        return None
    probe = redis.Connection(host=host, port=int(port), socket_connect_timeout=PROBE_TIMEOUT_S,
                             socket_timeout=PROBE_TIMEOUT_S, redis_connect_func=_bare)
    setattr(probe, NOT_GATED, True)  # its refusal is no news about rig's password (rig.authgate)
    try:
        probe.connect()
        password = getattr(conn, "password", None)
        if password:
            _ask(probe, "AUTH", password)  # refused: the next reply says NOAUTH, and no name is given
        reply = _ask(probe, "SENTINEL", "MASTERS")
    except (redis.RedisError, OSError):
        return None
    finally:
        probe.disconnect()
    if not isinstance(reply, list):
        return None
    names = []
    for master in reply:  # RESP2: each master a flat list of field, value, field, value ...
        fields = dict(zip(master[::2], master[1::2], strict=False)) if isinstance(master, list) else {}
        name = fields.get(b"name", fields.get("name"))
        if name is not None:
            names.append(name.decode(errors="replace") if isinstance(name, bytes) else str(name))
    return names[0] if len(names) == 1 else None


def _address(conn: AbstractConnection) -> str:
    host, port = getattr(conn, "host", "?"), getattr(conn, "port", "?")
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
