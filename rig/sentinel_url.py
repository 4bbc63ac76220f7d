"""A ``sentinel://`` Redis URL: rig's Redis behind Redis Sentinel (automatic fail-over).

One form, read by one function (:func:`parse`), from which every client is derived: rig's own
(redis-py ``Sentinel(...).master_for``), Celery's broker (kombu), beat (celery-redbeat) and
Flower (through the broker's options)::

    sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[/DB][?sentinel_password=PW]

- HOST:PORT, comma-separated: the sentinels (port 26379 when omitted); any one that answers
  is enough to find the master.
- MASTER_NAME: the name the sentinels monitor (``sentinel monitor MASTER_NAME ...``).
- DB: the database number on the master (0 when omitted: ``.../rigm`` is ``.../rigm/0``). A
  lone number after the hosts (``.../0``) is refused: it would be read as the master's name.
- USER / PASSWORD: the credentials of the master and its replicas (``requirepass`` /
  ``masterauth``); also filled from ``redis_password`` / ``redis_password_file`` like a
  ``redis://`` URL's (rig.redis_conn.resolve_auth).
- ``sentinel_password``: the sentinels' own password (their ``requirepass``), when they have
  one; it may differ from the master's; also filled from ``redis_sentinel_password_file``.
  Without it the sentinels get no password; an empty one is refused (it would silently
  override the file).
- Passwords holding ``@ : / ? #`` are percent-encoded (``p@ss:w/rd`` is ``p%40ss%3Aw%2Frd``).

Example: ``sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/rig/0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

SCHEME = "sentinel"
DEFAULT_SENTINEL_PORT = 26379
#: The query parameter that carries the sentinels' own password.
SENTINEL_PASSWORD_PARAM = "sentinel_password"
#: What a password with URL delimiters in it needs (finding 11 of issue 15).
ENCODE_HINT = "percent-encode @ : / ? # in passwords (p@ss:w/rd is p%40ss%3Aw%2Frd)"
#: Longest wait for a sentinel to accept a connection, and for each of its replies (s). A
#: sentinel answers its few small commands at once; a longer wait only delays the next sentinel
#: when one is hung (SIGSTOP, swapping: it accepts, never answers): with rig's 10 s reply
#: timeout one hung sentinel cost every command 10 s, all three 90 s (issue 15).
SENTINEL_TIMEOUT_S = 1.0
FORM = ("sentinel://[:PASSWORD@]HOST:PORT,HOST:PORT,HOST:PORT/MASTER_NAME/DB "
        "(?sentinel_password=PW for sentinels with their own password)")


@dataclass(frozen=True)
class SentinelUrl:
    """What a ``sentinel://`` URL says; the clients' forms are derived from it here only."""

    #: (host, port) of every sentinel, in the URL's order.
    sentinels: tuple[tuple[str, int], ...]
    #: The name the sentinels monitor the master under.
    master_name: str
    db: int = 0
    username: str | None = None
    #: The master's (and replicas') password.
    password: str | None = None
    #: The sentinels' own password (None: they have none).
    sentinel_password: str | None = None

    def sentinel_kwargs(self, options: dict[str, Any]) -> dict[str, Any]:
        """Options of the connections to the sentinels themselves: the socket timeouts of
        ``options`` (rig.redis_conn.client_options) capped at SENTINEL_TIMEOUT_S, their own
        password, never the master's, and no retry of their own: a master lookup asks each
        sentinel once, and the lookup is retried by the master client's policy (redis-py's
        default retried each dead sentinel 3 times with backoff: 9 s before "no sentinel
        answers")."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs: dict[str, Any] = {key: min(options.get(key) or SENTINEL_TIMEOUT_S, SENTINEL_TIMEOUT_S)
                                  for key in ("socket_connect_timeout", "socket_timeout")}
        kwargs["retry"] = Retry(NoBackoff(), 0)
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs

    def client(self, options: dict[str, Any]):  # noqa: ANN201 - redis.Redis (redis imported lazily)
        """A redis-py client of the current master: on a fail-over its connections fail
        (ConnectionError, or ReadOnlyError from a demoted master, which redis-py turns into a
        ConnectionError) and the next connection asks the sentinels again."""
        from redis.sentinel import Sentinel

        from rig import server_kind

        # The sentinels' connections refuse a listed address that is no sentinel (rig.server_kind).
        kwargs = {**self.sentinel_kwargs(options), "redis_connect_func": server_kind.on_connect(server_kind.SENTINEL)}
        sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=kwargs, **options)
        return sentinel.master_for(self.master_name, db=self.db, username=self.username,
                                   password=self.password, connection_class=_master_connection_class())

    def diagnose(self, options: dict[str, Any] | None = None) -> tuple[str, bool]:
        """Why no master can be found, asking every sentinel once, all at the same time (so all
        of them hung cost SENTINEL_TIMEOUT_S twice, not that per sentinel): (one sentence for the
        operator, whether it is a fail-over in progress that retrying rides out). Only a
        sentinel that answers and monitors MASTER_NAME means a fail-over; none answering, a
        refused sentinel password, a listed address that is no sentinel or an unknown name is
        the configuration's fault."""
        answers = self._ask_all(options)
        by_kind: dict[str, list[str]] = {}
        named: set[str] = set()
        for (kind, detail), hp in zip(answers, self.sentinels, strict=True):
            if kind == "masters":
                if self.master_name in detail:
                    down = f"the sentinels know master {self.master_name!r} but it is down"
                    no_quorum = _no_quorum(hp, self.master_name, {**self.sentinel_kwargs(options or {}),
                                                                  "decode_responses": True})
                    if no_quorum is not None:
                        # Not "in progress": none can start until more sentinels are back.
                        return (f"{down}, and the sentinels cannot fail over: {no_quorum} (SENTINEL CKQUORUM), too "
                                "few for the quorum or a majority; start the sentinels that are down (if the master stays down "
                                "long, they may then find its replica too stale to promote: `SENTINEL FAILOVER "
                                f"{self.master_name}` on one of them promotes it)", True)
                    return (f"{down} and no replica is promoted yet (a fail-over in progress, or no replica to "
                            "promote)", True)
                named.update(detail)
            else:
                by_kind.setdefault(kind, []).append(detail if kind == "not_sentinel" else hostport(hp))
        if "not_sentinel" in by_kind:
            return "; ".join(by_kind["not_sentinel"]), False
        if "refused" in by_kind:
            # None sent: saying it was refused sent the operator looking for a wrong password.
            said = "refused the sentinel password" if self.sentinel_password else "require a password and rig sent none"
            return (f"the sentinel(s) at {', '.join(by_kind['refused'])} {said}; give theirs "
                    f"as ?{SENTINEL_PASSWORD_PARAM}=PW at the end of redis_url", False)
        if named:
            return (f"the sentinels monitor no master named {self.master_name!r} (they monitor "
                    f"{', '.join(sorted(named))}); write that name after the hosts in redis_url", False)
        hung, down = by_kind.get("hung", []), by_kind.get("down", [])
        if hung and len(hung) + len(down) == len(self.sentinels):
            line = (f"the sentinel(s) at {', '.join(hung)} accept connections but do not answer within "
                    f"{SENTINEL_TIMEOUT_S:g} s (hung, or stopped with SIGSTOP? `kill -CONT` them, or restart them)")
            return line + (f"; none answers at {', '.join(down)} either" if down else ""), False
        if down and len(down) == len(self.sentinels):
            return (f"no sentinel answers at {', '.join(down)}; start them, or fix the hosts and ports "
                    "in redis_url", False)
        return f"the sentinels monitor no master named {self.master_name!r}", False

    def _ask_all(self, options: dict[str, Any] | None) -> list[tuple[str, Any]]:
        """Every listed sentinel asked once, all at the same time: _ask_sentinel's answers, in
        the URL's order."""
        from concurrent.futures import ThreadPoolExecutor

        kwargs = {**self.sentinel_kwargs(options or {}), "decode_responses": True}
        with ThreadPoolExecutor(max_workers=len(self.sentinels), thread_name_prefix="rig-sentinel-ask") as pool:
            return list(pool.map(lambda hp: _ask_sentinel(hp, kwargs), self.sentinels))

    def answering(self, options: dict[str, Any] | None = None) -> tuple[str, int] | None:
        """The first listed sentinel (in the URL's order) that answers now, one that monitors
        MASTER_NAME before one that does not, or None when none answers: all asked at once
        (_ask_all), so this costs at most SENTINEL_TIMEOUT_S twice."""
        answered = [(self.master_name in detail, hp) for (kind, detail), hp
                    in zip(self._ask_all(options), self.sentinels, strict=True) if kind == "masters"]
        return next((hp for monitors, hp in answered if monitors), answered[0][1] if answered else None)

    def silent(self, options: dict[str, Any] | None = None) -> list[str]:
        """A warning for each listed sentinel that does not answer while another does: rig works,
        so nothing else said that one of them (a typo in its port, one never started) leaves
        fewer sentinels than the operator counts on."""
        answers = self._ask_all(options)
        if not any(kind == "masters" for kind, _ in answers):
            return []  # none answers: rig up's own error says so
        return [f"the sentinel at {hostport(hp)} listed in redis_url does not answer"
                f"{' (it accepts connections, then is silent: hung?)' if kind == 'hung' else ''}: rig finds the "
                "master through the others, and one fewer can fail before it cannot; start it, or fix its host "
                "and port in redis_url"
                for (kind, _), hp in zip(answers, self.sentinels, strict=True) if kind in ("down", "hung")]

    def notices(self, window_s: float, options: dict[str, Any] | None = None) -> list[str]:
        """Warnings for `rig up` about a Sentinel setup that would not fail over in time, from
        the first sentinel that answers (``SENTINEL MASTER``): fewer than two sentinels listed,
        a listed sentinel that does not answer, a listed address that is no sentinel (a plain Redis among them: found only when it is
        asked first, so said here for each), no replica to promote, a master called down later
        than rig's clients wait (``window_s``)."""

        import redis


        out = []
        if len(self.sentinels) < 2:
            out.append(f"redis_url lists one sentinel: while it is down rig cannot find the master; list "
                       f"every sentinel (sentinel://h1:26379,h2:26379,h3:26379/{self.master_name}/{self.db})")
        out += self.not_sentinels()
        out += self.silent(options)
        kwargs = {**self.sentinel_kwargs(options or {}), "decode_responses": True}
        for host, port in self.sentinels:
            client = redis.Redis(host=host, port=port, **kwargs)
            try:
                state = client.sentinel_master(self.master_name)
                replicas = client.sentinel_slaves(self.master_name)
            except redis.RedisError:
                continue
            finally:
                client.close()
            if not live_replicas(replicas):
                out.append(f"the sentinels know no live replica of {self.master_name!r} ({len(replicas)} known, "
                           "none up): a fail-over has nothing to promote, and every submission warns that no "
                           "replica confirmed it; start a replica (replicaof) or set replica_wait_seconds = 0")
            down_after_s = int(state.get("down-after-milliseconds", 0)) / 1000
            if down_after_s + 5 > window_s:
                out.append(f"the sentinels call {self.master_name!r} down only after {down_after_s:g} s "
                           f"(down-after-milliseconds), and rig's commands wait {window_s:g} s for a new master: "
                           f"set `sentinel down-after-milliseconds {self.master_name} 5000` (docs/RELIABILITY.md)")
            break
        return out

    def not_sentinels(self) -> list[str]:
        """One line for each listed address that answers as another kind of server than a
        sentinel (a plain Redis, a cluster node), all asked at once (SENTINEL_TIMEOUT_S each);
        an address that does not answer is not judged here."""
        from concurrent.futures import ThreadPoolExecutor

        from rig import server_kind

        with ThreadPoolExecutor(max_workers=len(self.sentinels), thread_name_prefix="rig-sentinel-kind") as pool:
            modes = list(pool.map(lambda hp: server_kind.probe_mode(*hp, SENTINEL_TIMEOUT_S), self.sentinels))
        return [server_kind.wrong_kind(mode, server_kind.SENTINEL, hostport(hp))
                for mode, hp in zip(modes, self.sentinels, strict=True)
                if mode is not None and mode != server_kind.SENTINEL]

    def kombu_url(self) -> str:
        """kombu's form (Celery's broker; Flower reads the first): one ``sentinel://`` URL per
        sentinel joined by ``;``; the first carries the master's credentials and the database."""
        creds = ""
        if self.username or self.password:
            creds = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        first, *rest = self.sentinels
        urls = [f"sentinel://{creds}{hostport(first)}/{self.db}"]
        urls += [f"sentinel://{hostport(hp)}" for hp in rest]
        return ";".join(urls)

    def kombu_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The broker_transport_options kombu's Sentinel channel (and Flower) needs."""
        return {"master_name": self.master_name, "sentinel_kwargs": self.sentinel_kwargs(options)}

    def redbeat_url(self) -> str:
        """celery-redbeat only looks at the scheme; the sentinels are in redbeat_options."""
        return f"redis-sentinel://{hostport(self.sentinels[0])}/{self.db}"

    def redbeat_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """celery-redbeat's redbeat_redis_options for this master (redbeat passes only
        socket_timeout, password, username, db and sentinel_kwargs on to its Sentinel)."""
        out: dict[str, Any] = {
            "sentinels": list(self.sentinels), "service_name": self.master_name, "db": self.db,
            "sentinel_kwargs": self.sentinel_kwargs(options),
            "socket_timeout": options.get("socket_timeout"),
        }
        if self.password:
            out["password"] = self.password
        if self.username:
            out["username"] = self.username
        return out


def _ask_sentinel(hp: tuple[str, int], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """One sentinel's SENTINEL MASTERS, classified: ("masters", {name: state}), ("refused", ""),
    ("hung", "") (it accepted the connection, then no reply in time), ("down", "") (nothing
    accepts: refused, unreachable, connect timeout) or ("not_sentinel", the one line saying so)."""
    import redis

    from rig import server_kind

    host, port = hp
    client = redis.Redis(host=host, port=port, **kwargs)
    try:
        return "masters", client.sentinel_masters()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        mode = server_kind.probe_mode(host, port, SENTINEL_TIMEOUT_S)
        if mode is not None and mode != server_kind.SENTINEL:
            return "not_sentinel", server_kind.wrong_kind(mode, server_kind.SENTINEL, hostport(hp))
        if isinstance(exc, redis.AuthenticationError) or str(exc).split(" ", 1)[0] in ("NOAUTH", "WRONGPASS"):
            return "refused", ""
        return "not_sentinel", f"the server at {hostport(hp)} is not a sentinel ({exc})"
    except redis.TimeoutError as exc:
        return ("down" if "connect" in str(exc).lower() else "hung"), ""
    except (redis.ConnectionError, OSError):
        return "down", ""
    finally:
        client.close()


def _no_quorum(hp: tuple[str, int], master_name: str, kwargs: dict[str, Any]) -> str | None:
    """How many sentinels the one at ``hp`` can use (``1 usable Sentinels``, from its ``SENTINEL
    CKQUORUM`` refusal ``NOQUORUM 1 usable Sentinels. Not enough ...``) when they are too few for
    the quorum or the majority a fail-over needs; None when they are enough, or when it cannot
    be asked."""
    import redis

    client = redis.Redis(host=hp[0], port=hp[1], **kwargs)
    try:
        client.execute_command("SENTINEL CKQUORUM", master_name)
    except redis.ResponseError as exc:
        text = str(exc)
        return text.removeprefix("NOQUORUM").split(".", 1)[0].strip() if text.startswith("NOQUORUM") else None
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return None


#: Sentinel's flags of a replica it cannot use: subjectively / objectively down, disconnected.
DEAD_REPLICA_FLAGS = frozenset({"s_down", "o_down", "disconnected"})


def live_replicas(replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replicas of ``SENTINEL REPLICAS`` a fail-over could promote: none of DEAD_REPLICA_FLAGS
    (``flags`` is a comma-separated string from redis-py over RESP2, a set over RESP3)."""
    def flags(replica: dict[str, Any]) -> set[str]:
        raw = replica.get("flags", "")
        return set(raw) if isinstance(raw, set | frozenset | list) else set(str(raw).split(","))

    return [r for r in replicas if not flags(r) & DEAD_REPLICA_FLAGS]


_MASTER_CONNECTION: type | None = None


def _master_connection_class() -> type:
    """redis-py's SentinelManagedConnection, except that every (re)connect asks the sentinels
    for the master. redis-py 8.1 asks only when the pool hands a connection out: a command
    retried on the same connection after the master died (Retry, inside one call) reconnects
    to the *old* address until its retries run out (measured: a dispatcher stuck 30 s after a
    2.5 s fail-over)."""
    global _MASTER_CONNECTION
    if _MASTER_CONNECTION is None:
        from redis.sentinel import SentinelManagedConnection

        class FollowsMaster(SentinelManagedConnection):
            def _connect(self):  # type: ignore[no-untyped-def]  # noqa: ANN202 - redis-py's
                if self.connection_pool.is_master:
                    self.host, self.port = self.connection_pool.get_master_address()
                return super()._connect()

        _MASTER_CONNECTION = FollowsMaster
    return _MASTER_CONNECTION


def is_sentinel(url: str) -> bool:
    """True for a ``sentinel://`` URL."""
    return url.strip().lower().startswith(f"{SCHEME}://")


def parse(url: str) -> SentinelUrl:
    """The one reading of a ``sentinel://`` URL; ValueError saying what is wrong and the form."""
    if ";" in url:
        raise ValueError(f"it lists the sentinels kombu's way (';'); rig reads them comma-separated in one URL: "
                         f"write it like {FORM}")
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != SCHEME:
        raise ValueError(f"it is not a sentinel:// URL; write it like {FORM}")
    if "@" in parts.path or "@" in parts.query:  # a password's "/" (or "?") ended the hosts early
        raise ValueError(f"its password seems to hold a '/', '?' or '#': {ENCODE_HINT}; write it like {FORM}")
    creds, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ValueError(f"it names no sentinel; write it like {FORM}")
    try:
        sentinels = tuple(_sentinel(item) for item in hosts.split(","))
    except ValueError as exc:
        raise ValueError(f"{exc} ({ENCODE_HINT})" if creds else str(exc)) from None
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(f"it names no master (the name the sentinels monitor, after the hosts); write it like {FORM}")
    if len(path) == 1 and path[0].isdigit():
        raise ValueError(f"it names no master: {path[0]!r} after the hosts would be the master's name; write the "
                         f"name the sentinels monitor before the database, like {FORM}")
    if len(path) > 2:
        raise ValueError(f"after the hosts it has {'/'.join(path)!r}: only MASTER_NAME/DB; write it like {FORM}")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"its database {path[1]!r} is not a number (0, 1, ...); write it like {FORM}")
        db = int(path[1])
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - {SENTINEL_PASSWORD_PARAM})
    if unknown:
        raise ValueError(f"it has the unknown option(s) {', '.join(unknown)}; only {SENTINEL_PASSWORD_PARAM} "
                         f"is read; write it like {FORM}")
    if SENTINEL_PASSWORD_PARAM in query and not query[SENTINEL_PASSWORD_PARAM]:
        raise ValueError(f"its {SENTINEL_PASSWORD_PARAM} is empty (it would override redis_sentinel_password_file); "
                         f"give the password or remove ?{SENTINEL_PASSWORD_PARAM}=; write it like {FORM}")
    user, has_password, password = creds.partition(":")
    return SentinelUrl(
        sentinels=sentinels, master_name=unquote(path[0]), db=db,
        username=unquote(user) or None,
        password=unquote(password) if has_password and password else None,
        sentinel_password=query.get(SENTINEL_PASSWORD_PARAM) or None,
    )


def live_first(url: str, timeout_s: float = 1.0) -> str:
    """The URL with the first sentinel that answers PING moved to the front of the list (the
    others keep their order); the URL as it is when none answers. For Flower, whose Broker page
    asks only the first sentinel (kombu's first URL): with the first-listed one dead it said
    "No master found" for ever. Decided once, when `rig up` starts Flower."""
    import redis

    parts = urlsplit(url)
    creds, at, hosts = parts.netloc.rpartition("@")
    items = hosts.split(",")
    target = parse(url)
    kwargs = {**target.sentinel_kwargs({"socket_connect_timeout": timeout_s, "socket_timeout": timeout_s})}
    for number, (host, port) in enumerate(target.sentinels):
        client = redis.Redis(host=host, port=port, **kwargs)
        try:
            client.ping()
        except (redis.RedisError, OSError):
            continue
        finally:
            client.close()
        if number == 0:
            return url
        ordered = [items[number], *items[:number], *items[number + 1:]]
        return urlunsplit(parts._replace(netloc=f"{creds}{at}{','.join(ordered)}"))
    return url


def with_sentinel_password(url: str, password: str) -> str:
    """The URL with the sentinels' password in it, unless it names one already."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == SENTINEL_PASSWORD_PARAM for k, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, (SENTINEL_PASSWORD_PARAM, password)])))


def redact(url: str, mask: str | None = "***") -> str:
    """The URL with the sentinels' password (the query's) replaced by ``mask``, or left out
    when ``mask`` is None (a config file `rig init` writes); the netloc's password is left to
    the caller's own masking (rig.redis_conn.strip_password, rig.errors.redact_url)."""
    parts = urlsplit(url)
    if SENTINEL_PASSWORD_PARAM not in parts.query:
        return url
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != SENTINEL_PASSWORD_PARAM]
    if mask is not None:
        query.append((SENTINEL_PASSWORD_PARAM, mask))
    return urlunsplit(parts._replace(query=urlencode(query, safe="*")))


def _sentinel(item: str) -> tuple[str, int]:
    """(host, port) of one ``HOST[:PORT]`` of the URL (``[v6]:port`` too)."""
    text = item.strip()
    if not text:
        raise ValueError(f"it has an empty sentinel address (two commas, or one at an end); write it like {FORM}")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"the sentinel address {text!r} has no host; write it like {FORM}")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"the sentinel address {text!r} has a port that is not a number from 1 to 65535; "
                         f"write it like {FORM}")
    return host, int(port_text)


def hostport(hp: tuple[str, int]) -> str:
    host, port = hp
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
