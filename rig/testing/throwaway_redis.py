"""A throwaway redis-server for a benchmark or a fault scenario: on loopback, no persistence (or
the options given), answering before this returns. Never the shared Redis: callers own it and
stop it (``proc.terminate()``/``kill()``) when done."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

#: Longest wait for a started redis-server to answer PING, s.
ANSWER_WITHIN_S = 10.0


def start_redis(port: int, folder: Path, *, password: str | None = None,
                extra: tuple[str, ...] = ("--save", "", "--appendonly", "no")) -> subprocess.Popen:
    """Start the redis-server rig would start (rig.redis_server.redis_binary) on ``port`` with
    its files in ``folder`` (made if missing), ``extra`` options (default: no persistence at
    all) and ``password`` if given; return once it answers PING. Raises RuntimeError (the
    process killed) if it does not answer within ANSWER_WITHIN_S or exits first."""
    from rig.redis_server import redis_binary

    folder.mkdir(parents=True, exist_ok=True)
    argv = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), *extra]
    if password is not None:
        argv += ["--requirepass", password]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=password, socket_connect_timeout=0.2)
    deadline = time.monotonic() + ANSWER_WITHIN_S
    try:
        while True:
            try:
                client.ping()
                return proc
            except redis.RedisError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError(f"redis-server on port {port} did not answer within {ANSWER_WITHIN_S:.0f} s "
                                       f"(exit {proc.returncode}); is the port taken?") from None
                time.sleep(0.05)  # polling a server that is starting
    finally:
        client.close()
