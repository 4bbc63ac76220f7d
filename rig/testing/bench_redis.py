"""Which Redis the benchmarks under scripts/ use: one rule, so each says the same in --help.

``$RIG_BENCH_REDIS_URL`` when set, else ``$RIG_REDIS_URL`` (the Redis rig itself is told to
use), else ``redis://127.0.0.1:6379/0``. Each benchmark works under a private key prefix it
deletes at the end, so a shared Redis keeps its other keys.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: The variables read, first set wins.
VARIABLES = ("RIG_BENCH_REDIS_URL", "RIG_REDIS_URL")


def bench_redis_url() -> tuple[str, str]:
    """(URL, where it came from: a variable's name or "default")."""
    for name in VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value, name
    return DEFAULT_URL, "default"


def described() -> str:
    """One line for --help: the rule and the URL it gives now (without its password)."""
    from rig.redis_conn import strip_password

    url, source = bench_redis_url()
    now = f"${source}" if source != "default" else "the default"
    return (f"Redis: $RIG_BENCH_REDIS_URL, else $RIG_REDIS_URL, else {DEFAULT_URL}; now {now}: "
            f"{strip_password(url)}")


def with_db(url: str, db: int) -> str:
    """``url`` with database ``db`` (a redis:// or rediss:// URL's path; a ``?db=`` query or
    another scheme is left as it is)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or "db=" in parts.query:
        return url
    return urlunsplit(parts._replace(path=f"/{db}"))


#: Exit status of a benchmark whose Redis cannot be used (rig's own: Redis unreachable or refusing).
REDIS_EXIT = 5


def redis_problem(url: str) -> str | None:
    """Why a benchmark cannot use the Redis at ``url`` (one line), None when it answers PING.
    Checked before a node starts: where nothing answered, each throwaway node's `rig up`
    started a private Redis with a password of its own on that port, which the benchmark's
    client was then refused by (every run "failed: RedisAuthFailed", then a traceback)."""
    import redis

    from rig.redis_conn import is_auth_error, strip_password

    shown = strip_password(url)
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        if is_auth_error(exc):
            return (f"the Redis at {shown} refuses this benchmark's login; give its password in the URL: "
                    f"RIG_BENCH_REDIS_URL=redis://:PASSWORD@HOST:PORT/DB")
        return f"no Redis answers at {shown} ({exc}); start one there, or set RIG_BENCH_REDIS_URL to one"
    finally:
        client.close()
    return None
