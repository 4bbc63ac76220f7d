"""Connecting to the Redis that holds rig's state, with its password; Redis errors become
RedisUnavailable (or RedisAuthFailed) here.

Where the password comes from (``resolve_auth``; docs/SECURITY.md), first match wins:

1. the URL's own password: ``redis://:PASSWORD@host:port/0`` (or ``redis://USER:PASSWORD@...``);
2. the ``redis_password`` setting (``RIG_REDIS_PASSWORD``);
3. the file named by the ``redis_password_file`` setting (``RIG_REDIS_PASSWORD_FILE``);
4. ``$RIG_HOME/redis.password``, only for a ``redis://`` URL on loopback: the password that
   ``rig up`` generated for the private Redis it starts on this machine;
5. none.

The settings object puts the password found into ``Settings.redis_url`` once, so every client,
Celery (broker and redbeat), every child process (through ``RIG_REDIS_URL`` in its environment,
never its argv) and every job uses the same credentials. Printed URLs always go through
``strip_password`` or ``rig.errors.redact_url``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

from rig import sentinel_url, server_kind
from rig.authgate import install as _install_auth_gate
from rig.errors import ConfigError, RedisAuthFailed, RedisUnavailable
from rig.sentinel_url import is_sentinel

# Every redis-py connection of a process that uses rig waits out a refused password (rig.authgate).
_install_auth_gate()

#: The generated password of the private Redis, in the rig home.
PASSWORD_FILE_NAME = "redis.password"
#: Hosts that mean "this machine".
LOOPBACK = {"127.0.0.1", "localhost", "::1", ""}
#: 32 random bytes, URL-safe base64 (43 characters): safe in a URL and in redis.conf unquoted.
GENERATED_PASSWORD_BYTES = 32


@dataclass(frozen=True)
class RedisAuth:
    """The URL to connect with and where its password came from."""

    url: str
    #: Human description of the password's origin ("" when there is none).
    source: str = ""
    #: The home password file that applies to this URL (loopback redis:// only), for hints.
    home_file: Path | None = None
    #: A configured password file this user may not read ("" when none): such a user holds no
    #: credentials and goes through the node's gateway (rig.gateway.choice), as one without a
    #: password file does; named when Redis then asks for the password.
    unreadable: str = ""


# Resolved URL -> how it was resolved, so an error about that URL can say where the refused
# password came from. Filled by resolve_auth; a URL never resolved here has no entry.
_RESOLVED: dict[str, RedisAuth] = {}


# -- how every client talks to Redis ---------------------------------------------------------
#: Seconds to set up a connection (TCP and AUTH) before giving up.
CONNECT_TIMEOUT_S = 5.0
#: Seconds to wait for any one reply before the connection is dropped and the call raises
#: redis.TimeoutError: a half-open connection (Redis or the network gone without a FIN) then
#: costs a caller at most this long instead of hanging it for ever. Every blocking command rig
#: sends waits for less (the dispatcher's BLPOP: 1 s; Celery's BRPOP: 1 s); pub/sub reads pass
#: their own timeout. A large pipeline on a loaded Redis answers well within it.
REPLY_TIMEOUT_S = 10.0
#: A connection unused for this long is PINGed before it is used again (s).
HEALTH_CHECK_INTERVAL_S = 25
#: TCP keepalive on every connection: probes after 10 s idle, every 5 s, 3 unanswered probes
#: drop it; and TCP_USER_TIMEOUT: data unacknowledged for 30 s drops it. Together they end a
#: connection to a host that vanished (power loss, partition) even while nothing is sent
#: (a pub/sub subscriber, an idle pooled connection) or while a send is stuck retransmitting.
KEEPALIVE_OPTIONS: dict[int, int] = {
    opt: value for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3),
                                   ("TCP_USER_TIMEOUT", 30_000))
    if (opt := getattr(socket, name, None)) is not None  # Linux names; others keep the defaults
}


def client_options(*, connect_timeout: float = CONNECT_TIMEOUT_S,
                   reply_timeout: float = REPLY_TIMEOUT_S) -> dict[str, object]:
    """The socket options of every Redis client rig opens: its own (connect) and Celery's broker
    and beat (rig.celery_config). One place, so no client can wait for ever."""
    return {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": reply_timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": dict(KEEPALIVE_OPTIONS),
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
    }


#: How long a client of a ``sentinel://`` URL keeps retrying a command whose connection
#: failed (s): longer than a fail-over takes (the sentinels' down-after-milliseconds plus the
#: election and promotion, a few seconds; docs/RELIABILITY.md), so a command sent to the old
#: master just before it died lands on the new one instead of failing.
FAILOVER_WINDOW_S = 30.0


def _retry(url: str = "") -> Retry:
    """Retry a command only when the connection failed (refused, reset, closed by the server:
    typically a pooled connection that a Redis restart closed), 0.1, 0.2, 0.4 ... s apart;
    never after a refused password (_RetryButNotAuth).
    A plain URL: twice (a restarted Redis is back, or it is an outage the caller reports).
    A ``sentinel://`` URL: for FAILOVER_WINDOW_S, each try asking the sentinels for the master
    again (a demoted master's ReadOnlyError counts as a failed connection in redis-py).
    Never after a reply timeout: the command may have run (a ledger script is not idempotent),
    so the caller gets redis.TimeoutError and decides."""
    if is_sentinel(url):
        cap = 1.0
        return _FollowFailover(sentinel_url.parse(url), ExponentialBackoff(cap=cap, base=0.1),
                               int(FAILOVER_WINDOW_S / cap) + 3, supported_errors=(redis.ConnectionError,))
    return _RetryButNotAuth(ExponentialBackoff(cap=1.0, base=0.1), 2, supported_errors=(redis.ConnectionError,))


class _RetryButNotAuth(Retry):
    """redis-py's Retry, except that a refused password (an AuthenticationError is a
    ConnectionError to redis-py) is raised at once: a retry 0.1 s later opens a socket only to
    be refused again. The caller waits it out (rig.authgate holds new logins back)."""

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # type: ignore[no-untyped-def, override]
        def retryable(error: Exception) -> bool:
            return not is_auth_error(error) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


class _FollowFailover(_RetryButNotAuth):
    """The retry of a ``sentinel://`` client: "no master found" is retried only while a
    sentinel that answers monitors the master (a fail-over in progress); with no sentinel
    answering, a refused sentinel password or an unknown master name it is raised at once (a
    configuration mistake, or no sentinel left: waiting out a fail-over window helps nothing)."""

    def __init__(self, target: sentinel_url.SentinelUrl, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.target = target

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # type: ignore[no-untyped-def, override]
        # The window is a time, not a count of tries: each try asks the sentinels (up to
        # SENTINEL_TIMEOUT_S when one is hung), and 33 tries took a tester's command 100 s.
        deadline = time.monotonic() + FAILOVER_WINDOW_S

        def retryable(error: Exception) -> bool:
            if time.monotonic() >= deadline:
                return False
            if isinstance(error, MasterNotFoundError) and not sentinel_diagnosis(error, self.target)[1]:
                return False
            return is_retryable is None or is_retryable(error)

        return super().call_with_retry(do, fail, retryable, with_failure_count)


#: The attribute of a MasterNotFoundError that holds its diagnosis (rig.sentinel_url.diagnose).
_DIAGNOSIS = "rig_sentinel_diagnosis"


def sentinel_diagnosis(error: BaseException, target: sentinel_url.SentinelUrl) -> tuple[str, bool]:
    """``target.diagnose()`` for ``error``, asked once per error: the retry policy asks (to
    decide) and the error message asks again (to say why); each asking waits up to
    SENTINEL_TIMEOUT_S when the sentinels are hung."""
    known = getattr(error, _DIAGNOSIS, None)
    if known is None:
        known = target.diagnose(client_options())
        setattr(error, _DIAGNOSIS, known)
    return known


# -- how many connections a process of a node opens -------------------------------------------
#: The environment variable through which ``rig up`` bounds each process it starts
#: (rig.stack.pool_limit): at most this many connections to Redis for all the process's rig
#: clients together (one shared pool); a command waits up to POOL_WAIT_S for a free one. Unset
#: (a user's own program, the CLI): one pool per client, unbounded, as redis-py's default.
POOL_LIMIT_ENV = "RIG_REDIS_POOL_LIMIT"
#: Seconds a command waits for a free connection of its process's bounded pool before
#: PoolExhausted: longer than any holder keeps one for a command (REPLY_TIMEOUT_S, and the
#: 1 s blocking reads), so only connections held for good (pub/sub listeners) beyond the
#: bound can make it fail.
POOL_WAIT_S = 30.0


class PoolExhausted(redis.ConnectionError):
    """Every connection of this process's bounded pool stayed busy for POOL_WAIT_S: more
    threads held one at once (pub/sub listeners keep theirs) than the bound allows."""


class _BoundedPool(redis.BlockingConnectionPool):
    """redis-py's blocking pool whose "No connection available." names the bound and the fix."""

    def get_connection(self, *args: object, **options: object) -> redis.Connection:
        try:
            return super().get_connection(*args, **options)  # type: ignore[arg-type]
        except redis.ConnectionError as exc:
            if isinstance(exc, PoolExhausted) or "No connection available" not in str(exc):
                raise
            raise PoolExhausted(
                f"all {self.max_connections} Redis connections of this process (pid {os.getpid()}, "
                f"{POOL_LIMIT_ENV}={self.max_connections}) stayed busy for {self.timeout:g} s; more of its "
                "threads held one at once than rig up allows (docs/PERFORMANCE.md, Cluster scale: connections "
                "per node)") from None


_SHARED_POOLS: dict[str, _BoundedPool] = {}
_SHARED_LOCK = threading.Lock()


def pool_limit() -> int | None:
    """The bound rig up gave this process (POOL_LIMIT_ENV), or None: unbounded."""
    text = os.environ.get(POOL_LIMIT_ENV, "").strip()
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def _shared_pool(url: str, limit: int, options: dict[str, object]) -> _BoundedPool:
    """The process's one bounded pool for ``url`` (made at the first call)."""
    key = url
    with _SHARED_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None:
            from rig.connections import process_label  # (rig.connections imports rig.config)

            label = process_label()
            named = {"client_name": f"rig:{label}"} if label else {}
            pool = _BoundedPool.from_url(url, max_connections=limit, timeout=POOL_WAIT_S, **options, **named)
            _SHARED_POOLS[key] = pool
        return pool


def connect(url: str, *, timeout: float = CONNECT_TIMEOUT_S,
            reply_timeout: float = REPLY_TIMEOUT_S, retry: Retry | None = None) -> redis.Redis:
    """A client with decoded responses and bounded waits (client_options). Does not connect
    until first used. ``url`` carries the password already (``Settings.redis_url`` is
    resolved). A blocking command sent through it must block for less than ``reply_timeout``.
    A ``sentinel://`` URL gives a client of the sentinels' current master (rig.sentinel_url).
    A server of the wrong kind (a sentinel, a cluster node) raises ConfigError at the first
    command (rig.server_kind).
    ``retry``: instead of rig's policy (_retry), e.g. none for a probe.

    In a process rig up started (POOL_LIMIT_ENV set), every client made with the default
    timeouts and rig's retry policy shares one pool of at most that many connections; a probe
    (``retry`` or shorter timeouts given, closed after use) keeps its own."""
    options = client_options(connect_timeout=timeout, reply_timeout=reply_timeout)
    if urlsplit(url).scheme == "unix":  # no TCP: no keepalive options (redis-py refuses them)
        options.pop("socket_keepalive")
        options.pop("socket_keepalive_options")
    options.update(
        decode_responses=True,
        # Bytes that are not UTF-8 (a damaged or hostile record) decode to lone surrogates that
        # rig.records rejects, instead of a UnicodeDecodeError out of every reader.
        encoding_errors="surrogateescape",
        retry=retry if retry is not None else _retry(url),
        # Every connection checks it reached a plain Redis (not a sentinel, not a cluster node).
        redis_connect_func=server_kind.on_connect(server_kind.DATA),
    )
    if is_sentinel(url):
        return sentinel_url.parse(url).client(options)
    limit = pool_limit()
    if limit is not None and retry is None and (timeout, reply_timeout) == (CONNECT_TIMEOUT_S, REPLY_TIMEOUT_S):
        return redis.Redis(connection_pool=_shared_pool(url, limit, options))
    return redis.Redis.from_url(url, **options)  # type: ignore[arg-type]


def check(client: redis.Redis, url: str) -> None:
    """Raise RedisUnavailable (naming the URL) unless the server answers PING; RedisAuthFailed
    if it answers but refuses rig's credentials. A Redis that refuses writes because it cannot
    save (MISCONF: its disk full) refuses PING too, on purpose, but still reads: it answered.
    Every view (`rig status`, `jobs`, `show`, `log`) failed then with the refusal, exactly when
    the operator needed them; a write still says it (rig.redis_writes)."""
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, redis.exceptions.InvalidResponse,
            OSError) as exc:
        from rig.redis_writes import refusal  # it imports this module

        if refusal(exc) is not None:
            return
        if not is_unusable(exc):
            raise
        raise unavailable(url, exc) from None


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn redis-py connection and authentication errors raised inside the block into
    RedisUnavailable / RedisAuthFailed."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, redis.exceptions.InvalidResponse) as exc:
        if not is_unusable(exc):
            raise
        raise unavailable(url, exc) from None


# -- errors -----------------------------------------------------------------------------------
def is_auth_error(exc: BaseException) -> bool:
    """True for every way Redis says "not with these credentials": a wrong or missing password
    (WRONGPASS, NOAUTH, ``invalid password``), a password sent to a Redis without one, AUTH
    with a user name on Redis < 6, and an ACL user lacking a permission (NOPERM)."""
    if isinstance(exc, redis.AuthenticationError | redis.AuthenticationWrongNumberOfArgsError):
        return True
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return True
    if isinstance(exc, redis.ResponseError):
        # Older redis-py versions map NOAUTH / WRONGPASS to a plain ResponseError.
        return str(exc).split(" ", 1)[0] in ("NOAUTH", "WRONGPASS", "NOPERM")
    return False


def is_setup_error(exc: BaseException) -> bool:
    """True when the server at the URL cannot be rig's Redis at all, whatever rig sends: it
    does not speak Redis (an HTTP server: "Protocol Error"), or it has no such database
    (``redis://host:6379/99``: "DB index is out of range" when the connection SELECTs it)."""
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return True
    return isinstance(exc, redis.ResponseError) and "DB index" in str(exc)


def is_unusable(exc: BaseException) -> bool:
    """An error that means "rig cannot use that Redis" (exit 5), not a bug of the command:
    unreachable, credentials refused, no Redis there or no such database."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError):
        return True
    return is_auth_error(exc) or is_setup_error(exc)


def unavailable(url: str, exc: BaseException) -> RedisUnavailable:
    """The rig error for a redis-py error about ``url``: RedisAuthFailed for credentials,
    RedisUnavailable (cannot reach it, no Redis there, no such database) otherwise."""
    if is_auth_error(exc):
        return auth_failed(url, exc)
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return RedisUnavailable.said(
            url, f"the server at {strip_password(url)} does not answer as Redis does ({_short(exc)}); "
            "check the host and port of the Redis URL (RIG_REDIS_URL or redis_url)")
    if isinstance(exc, MasterNotFoundError) and is_sentinel(url):
        why, _ = sentinel_diagnosis(exc, sentinel_url.parse(url))
        return RedisUnavailable.said(url, f"no Redis master behind {strip_password(url)}: {why}")
    if is_setup_error(exc):
        return RedisUnavailable.said(
            url, f"Redis at {strip_password(url)} has no such database ({_short(exc)}); use a database "
            "number below its `databases` setting (0-15 by default) at the end of the Redis URL")
    if isinstance(exc, redis.TimeoutError) and "connecting" not in str(exc):
        # Connected, then no answer: a Redis runs there (stopped with SIGSTOP, or stuck), and `rig up` is no cure.
        return RedisUnavailable.said(
            url, f"Redis at {strip_password(url)} does not answer ({_short(exc)}): it is up but hung or "
            f"overloaded (stopped, swapping, a slow command); check it with {suggest_cli(url, 'ping')}")
    return RedisUnavailable(url, _short(exc))


def auth_failed(url: str, exc: BaseException) -> RedisAuthFailed:
    """One line that says what Redis refused and how to give rig the right password."""
    auth = _RESOLVED.get(url) or RedisAuth(url, "the URL" if url_password(url) else "")
    shown = strip_password(url)
    # Redis' words, not the login gate's back-off (rig.authgate): this line may end the command
    detail = getattr(exc, "redis_said", None) or _short(exc)
    example = with_password(shown, "PASSWORD")
    ways = f"set RIG_REDIS_URL={example}, RIG_REDIS_PASSWORD, or redis_password_file"
    if auth.home_file is not None:
        ways += f", or put it in {auth.home_file}"
    if isinstance(exc, redis.exceptions.NoPermissionError) or detail.startswith("NOPERM"):
        message = (f"Redis at {shown} refused a command to rig's Redis user ({detail}); grant it "
                   "the rights docs/SECURITY.md lists (ACL SETUSER ...)")
    elif "without any password configured" in detail or "no password is set" in detail:
        message = (f"Redis at {shown} has no password, but rig sent the one from {auth.source}; "
                   f"remove that password from rig's settings (or set requirepass on that Redis)")
    elif auth.source:
        message = (f"Redis at {shown} refused the password from {auth.source} ({detail}); {ways}"
                   f"{_gateway_instead(auth)}")
    elif auth.unreadable:
        message = (f"Redis at {shown} requires a password and this user cannot read "
                   f"{auth.unreadable}; use rig through the node's gateway (start it with `rig up`, or set "
                   "RIG_GATEWAY_SOCKET to its socket), or ask the file's owner for access")
    else:
        # (redis-py's text here is about HELLO/NOAUTH internals; the fact is enough.)
        message = f"Redis at {shown} requires a password and rig has none; {ways}"
    return RedisAuthFailed(message, url)


def _gateway_instead(auth: RedisAuth) -> str:
    """'; ...' naming the node's gateway, which a user whose password Redis refused can use with
    none at all (rig.gateway.choice), or "" for root and where no gateway is there. The password
    is one they were given (left in the shell from before the admin changed it, or a wrong one),
    or their home's redis.password, which a `rig up` of their own wrote for its private Redis:
    while that file is there, every command sends it to whatever Redis answers on the port (the
    node's) instead of going to the gateway. Only a hint: settings that cannot be read give none."""
    if os.geteuid() == 0:
        return ""
    try:
        from rig.config import load_settings
        from rig.gateway.paths import client_socket

        path = client_socket(load_settings())
    except Exception:  # noqa: BLE001 - only a hint: no settings, no hint
        return ""
    if path is None:
        return ""
    if auth.home_file is not None and auth.source == str(auth.home_file):
        return (f"; if that file is left from a `rig up` of your own and this Redis is the node's, move "
                f"{auth.home_file} away: users of the node need no password, rig goes through the node's gateway "
                f"at {path}")
    return (f"; users of the node need no password: with {auth.source} unset, rig goes through the node's "
            f"gateway at {path}")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


# -- URLs -------------------------------------------------------------------------------------
def is_local(url: str) -> bool:
    """A plain ``redis://`` URL on this machine: one ``rig up`` may start a private Redis for."""
    parsed = urlsplit(url)
    return parsed.scheme in ("redis", "") and (parsed.hostname or "") in LOOPBACK


def url_password(url: str) -> str | None:
    """The URL's own password (percent-decoded), or None."""
    password = urlsplit(url).password
    return unquote(password) if password else None


def _split_netloc(url: str) -> tuple[str, str]:
    """(user part as written, host:port) of the URL's authority."""
    netloc = urlsplit(url).netloc
    creds, _, hostport = netloc.rpartition("@")
    return creds.partition(":")[0], hostport


def with_password(url: str, password: str) -> str:
    """The URL with ``password`` (percent-encoded) in it, keeping its user name if any."""
    parts = urlsplit(url)
    user, hostport = _split_netloc(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hostport}"))


def strip_password(url: str) -> str:
    """The URL without its password (the user name stays) nor a sentinel's: safe to print."""
    url = sentinel_url.redact(url)
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    user, hostport = _split_netloc(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{hostport}" if user else hostport))


def redis_cli(url: str, command: str) -> str:
    """The `redis-cli` command line that runs ``command`` on rig's Redis at ``url``: the one
    rule for every command rig suggests, so a copied line never acts on another Redis (a bare
    `redis-cli` means 127.0.0.1:6379). The password is never printed: ``PASSWORD`` stands in
    for it when the URL has one. Only the command, to be quoted as it is: behind Sentinel
    (which redis-cli cannot follow) the master is named by its role, ``-h MASTER -p PORT``,
    and :func:`redis_cli_note` says how to find it (:func:`suggest_cli` puts the two together)."""
    shown = strip_password(url)
    if is_sentinel(url):
        try:
            parsed = sentinel_url.parse(url)
        except ValueError:
            return f"redis-cli -h MASTER -p PORT {command}"
        auth = " -a PASSWORD" if parsed.password is not None else ""
        db = f" -n {parsed.db}" if parsed.db else ""
        return f"redis-cli -h MASTER -p PORT{db}{auth} {command}"
    parts = urlsplit(url)
    if parts.scheme == "unix":  # redis-cli -u takes redis:// and rediss:// only
        db = dict(parse_qsl(parts.query)).get("db", "0")
        auth = " -a PASSWORD" if url_password(url) is not None else ""
        return f"redis-cli -s {parts.path} -n {db}{auth} {command}"
    if url_password(url) is not None:
        shown = with_password(shown, "PASSWORD")
    return f"redis-cli -u {shown} {command}"


def redis_cli_note(url: str) -> str:
    """What the MASTER and PORT of :func:`redis_cli`'s line are, for a ``sentinel://`` URL:
    ``(MASTER PORT: the master's address, from `redis-cli ... SENTINEL get-master-addr-by-name
    NAME`)`` asked of the first listed sentinel that answers now (the first listed, when dead,
    answered the copied line with "Connection refused"), or, when none answers, that none
    does; no password printed. "" for any other URL (its line names the server itself)."""
    if not is_sentinel(url):
        return ""
    try:
        parsed = sentinel_url.parse(url)
    except ValueError:
        return f"(MASTER PORT: the master behind {strip_password(url)})"
    found = parsed.answering()
    host, port = found if found is not None else ("HOST", "PORT")
    ask = f"redis-cli -h {host} -p {port}{' -a SENTINEL_PASSWORD' if parsed.sentinel_password else ''}"
    line = f"(MASTER PORT: the master's address, from `{ask} SENTINEL get-master-addr-by-name {parsed.master_name}`"
    if found is None:
        listed = ", ".join(sentinel_url.hostport(hp) for hp in parsed.sentinels)
        return f"{line} on a sentinel; none of those listed answers now: {listed})"
    return f"{line})"


def suggest_cli(url: str, command: str) -> str:
    """:func:`redis_cli`'s line in backticks, followed by :func:`redis_cli_note` when there is
    one: how every message words a command to run (the note outside the backticks, so the
    quoted part can be copied and run)."""
    note = redis_cli_note(url)
    return f"`{redis_cli(url, command)}`" + (f" {note}" if note else "")


def client_url(client: redis.Redis) -> str | None:
    """The URL ``client`` connects to, read back from its pool (``PASSWORD`` in place of a
    password), for a message made where only the client is at hand; None when it cannot be
    said (a Sentinel client: its master moves)."""
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    if "host" not in kwargs:
        return None
    user = kwargs.get("username") or ""
    creds = f"{quote(user, safe='')}:PASSWORD@" if kwargs.get("password") else (f"{quote(user, safe='')}@" if user else "")
    scheme = "rediss" if issubclass(client.connection_pool.connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{creds}{kwargs['host']}:{kwargs.get('port', 6379)}/{db}"


def without_credentials(url: str) -> str:
    """The URL with no password at all (the master's removed, the sentinels' left out, not
    masked): a URL that still works where the password comes from elsewhere, for a config file
    (`rig init`) or a job run as another user (which reaches rig through the gateway)."""
    return strip_password(sentinel_url.redact(url, mask=None))


def _tls_defaults(url: str) -> str:
    """A ``rediss://`` URL without ``ssl_cert_reqs`` gets ``ssl_cert_reqs=required``: kombu
    (Celery's broker) would otherwise connect WITHOUT checking the server's certificate."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return url
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "ssl_cert_reqs" for key, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, ("ssl_cert_reqs", "required")], safe="/")))


# -- the password -----------------------------------------------------------------------------
def home_password_file(home: Path) -> Path:
    """Where ``rig up`` keeps the generated password of the private Redis."""
    return home.expanduser() / PASSWORD_FILE_NAME


def visible(path: Path) -> bool:
    """Does ``path`` exist for this user? False too where a folder on the way shuts them out:
    a user whose RIG_HOME is the admin's 0700 home (Python 3.11's Path.exists raises
    PermissionError there, out of every command) has no password or log folder of theirs in
    it, as a config file there is none for them (rig.config.find_config_file); they go through
    the gateway."""
    try:
        path.stat()
    except OSError:
        return False
    return True


def listener_uid(port: int) -> int | None:
    """The uid of the process listening on TCP ``port`` of this host (loopback or any address),
    from /proc/net/tcp and tcp6; None when nothing listens or it cannot be read."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return int(fields[7])
    return None


def foreign_listener(url: str, password_file: Path) -> str | None:
    """One line when the process listening on the loopback port of ``url`` belongs to another
    user than this one, root and the password file's owner (it cannot be rig's Redis), else None."""
    try:
        port = urlsplit(url).port or 6379
        owner = password_file.stat().st_uid
    except (ValueError, OSError):
        return None
    uid = listener_uid(port)
    if uid is None or uid in (0, os.geteuid(), owner):
        return None
    return (f"the process listening on port {port} belongs to uid {uid}, not to rig's Redis: rig does not send it "
            f"the password in {password_file}; stop that process (or point redis_url at rig's Redis)")


def resolve_auth(url: str, *, home: Path, password: str | None = None,
                 password_file: Path | None = None, sentinel_password_file: Path | None = None) -> RedisAuth:
    """The URL to connect with, password included, by the order in this module's docstring;
    for a ``sentinel://`` URL without ``sentinel_password``, the sentinels' own password from
    ``sentinel_password_file`` goes into it too (rig.sentinel_url).

    Raises ConfigError for a password file that is missing (when configured), empty,
    unreadable, or open to every user.
    """
    url = _tls_defaults(url)
    if sentinel_password_file is not None and is_sentinel(url):
        path = sentinel_password_file.expanduser()
        if not path.exists():
            raise ConfigError(f"redis_sentinel_password_file names {path}, which does not exist; create it "
                              "(one line, mode 0600) or unset RIG_REDIS_SENTINEL_PASSWORD_FILE")
        url = sentinel_url.with_sentinel_password(url, read_password_file(path, sentinels=True))
    home_file = home_password_file(home) if is_local(url) else None
    if url_password(url):
        auth = RedisAuth(url, _handed_source(url) or URL_SOURCE, home_file)
    elif password:
        auth = RedisAuth(with_password(url, password), "redis_password (RIG_REDIS_PASSWORD)", home_file)
    elif password_file is not None:
        path = password_file.expanduser()
        if not path.exists():
            raise ConfigError(f"redis_password_file names {path}, which does not exist; "
                              "create it (one line, mode 0600) or unset RIG_REDIS_PASSWORD_FILE")
        if path.exists() and not os.access(path, os.R_OK):
            # A team's password file kept from users (0640 root:rigadmins): they are not meant to
            # hold the password, and the gateway serves them; refusing here stopped every command.
            auth = RedisAuth(url, "", home_file, unreadable=f"redis_password_file {path} (no permission to read it)")
        else:
            auth = RedisAuth(with_password(url, read_password_file(path)), str(path), home_file)
    elif home_file is not None and visible(home_file) and not os.access(home_file, os.R_OK):
        # Another user's home (RIG_HOME set to the node's, to share its config.toml): its
        # password is not this user's, whose commands go to the gateway, as for a
        # redis_password_file kept from them; reading it stopped every command (exit 6).
        auth = RedisAuth(url, "", home_file, unreadable=f"{home_file}, the password file of RIG_HOME "
                                                        "(no permission to read it)")
    elif home_file is not None and visible(home_file):
        # The home's password goes only to a Redis of this user's (or root's) own: a process of
        # another user listening on that port (squatting it while rig's Redis is down) would
        # receive it with the first AUTH.
        squatter = foreign_listener(url, home_file)
        if squatter:
            raise ConfigError(squatter)
        auth = RedisAuth(with_password(url, read_password_file(home_file)), str(home_file), home_file)
    else:
        auth = RedisAuth(url, "", home_file)
    _RESOLVED[auth.url] = auth
    return auth


def password_source(url: str) -> str:
    """Where the password in this (resolved) URL came from; "" if it has none."""
    auth = _RESOLVED.get(url)
    if auth is not None:
        return auth.source
    return URL_SOURCE if url_password(url) else ""


#: Where a password inside the URL itself comes from, as errors name it.
URL_SOURCE = "the URL (RIG_REDIS_URL / redis_url)"
#: Set by rig up for its children beside the resolved RIG_REDIS_URL it hands them: where the
#: password inside that URL came from ("DIGEST SOURCE"; DIGEST binds it to that very URL, so a
#: copy of the variable beside another URL is ignored). A refused password was named as coming
#: from "the URL (RIG_REDIS_URL / redis_url)" when rig up had read it from redis_password_file.
PASSWORD_SOURCE_ENV = "RIG_REDIS_PASSWORD_SOURCE"


def _url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def handed_source(url: str) -> dict[str, str]:
    """The variable (PASSWORD_SOURCE_ENV) rig up gives a child beside RIG_REDIS_URL=``url``
    (resolved): where its password came from, when not from the URL as configured."""
    source = password_source(url)
    if not source or source == URL_SOURCE:
        return {}
    return {PASSWORD_SOURCE_ENV: f"{_url_digest(url)} {source} (as read by rig up when it started)"}


def _handed_source(url: str) -> str:
    """Where rig up found the password inside ``url`` (handed_source), "" if it did not say."""
    digest, _, source = os.environ.get(PASSWORD_SOURCE_ENV, "").partition(" ")
    return source if source and digest == _url_digest(url) else ""


def read_password_file(path: Path, *, sentinels: bool = False) -> str:
    """The password in ``path`` (its first line, surrounding blanks removed); ``sentinels``:
    the sentinels' own password file (redis_sentinel_password_file), which the errors name as
    such (they said "the Redis password file", "set RIG_REDIS_PASSWORD" and "delete it to have
    `rig up` generate one", none of which is true of it).

    The file must not be open to every user (no permission bits for "other"); group-readable
    is allowed so that a team can share a file through a Unix group.
    """
    what = "sentinel password file (redis_sentinel_password_file)" if sentinels else "Redis password file"
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        instead = (f"or give it as ?{sentinel_url.SENTINEL_PASSWORD_PARAM}=PW at the end of redis_url" if sentinels
                   else "or set RIG_REDIS_PASSWORD")
        raise ConfigError(f"cannot read the {what} {path} ({exc.strerror}); ask its owner for the password, "
                          f"{instead}") from None
    if mode & stat.S_IRWXO:
        raise ConfigError(f"the {what} {path} is open to every user (mode "
                          f"{stat.S_IMODE(mode):04o}); run `chmod 600 {path}` and change the password")
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise ConfigError(f"the {what} {path} is empty; write the sentinels' password (their requirepass) on its "
                          "first line" if sentinels else
                          f"the {what} {path} is empty; write the password on its first "
                          f"line, or delete it to have `rig up` generate one")
    return lines[0].strip()


def ensure_password_file(path: Path) -> str:
    """The password in ``path``, generated there first if the file does not exist.

    A new file is written in full under a temporary name created with mode 0600 (never readable
    by anyone else, whatever the umask), then linked into place only if ``path`` still does not
    exist: two ``rig up`` racing end up with the same password.
    """
    if path.exists():
        return read_password_file(path)
    password = secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)
    write_private(path, password + "\n", replace=False)
    return read_password_file(path)  # the winner's, if another process was first


def write_private(path: Path, text: str, *, replace: bool = True) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte on.

    ``replace=False`` leaves an existing ``path`` untouched (the caller reads it instead).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask can only take bits away; make it exactly 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
