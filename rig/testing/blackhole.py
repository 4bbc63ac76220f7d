"""A TCP proxy that can black-hole its connections: the fault of a half-open connection.

Redis that vanishes behind a firewall, a NAT that forgets a flow, a host that loses power: the
client's socket stays open and no FIN or RST ever comes; every byte sent is swallowed and no
reply arrives. Closing a connection (what killing Redis does) is the easy case; this is the
other one.

    proxy = BlackHoleProxy("127.0.0.1", redis_port).start()
    client = connect(proxy.url())          # goes through the proxy
    proxy.cut()                            # every connection stalls, both ways, nothing closed
    proxy.heal()                           # new connections are forwarded again; the stalled
                                           # ones stay stalled until the client drops them
    proxy.close()

Threads, standard library only. Stalled connections are not read from, so what a client sends
queues in the kernel's buffers, as on a real black hole.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field

#: How often a pump looks at its stop and forwarding flags (s).
_POLL_S = 0.05


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket
    forwarding: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.close()


class BlackHoleProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port`` until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._new_forwarded = True  # do connections accepted from now on get forwarded?
        self._stop = threading.Event()

    def url(self, db: int = 0, password: str | None = None) -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self) -> BlackHoleProxy:
        threading.Thread(target=self._accept, name="blackhole-accept", daemon=True).start()
        return self

    # -- the fault --------------------------------------------------------------------------
    def cut(self) -> None:
        """Stop forwarding on every connection, existing and new, both ways; close nothing."""
        with self._lock:
            self._new_forwarded = False
            for pair in self._pairs:
                pair.forwarding.clear()

    def heal(self) -> None:
        """Forward connections opened from now on. Connections stalled by cut() stay stalled
        (half-open for ever, as after a real partition): only a client that drops them and
        reconnects recovers."""
        with self._lock:
            self._new_forwarded = True

    def stalled(self) -> int:
        """Connections open but not forwarded now."""
        with self._lock:
            return sum(1 for p in self._pairs if not p.forwarding.is_set() and not p.closed.is_set())

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    # -- plumbing ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], _POLL_S)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                if self._new_forwarded:
                    pair.forwarding.set()
                self._pairs.append(pair)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True,
                                 name="blackhole-pump").start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        while not (self._stop.is_set() or pair.closed.is_set()):
            if not pair.forwarding.wait(_POLL_S):
                continue  # stalled: read nothing, send nothing, close nothing
            try:
                ready, _, _ = select.select([src], [], [], _POLL_S)
                if not ready:
                    continue
                data = src.recv(65536)
            except (OSError, ValueError):
                break
            if not data:
                break
            while not pair.forwarding.wait(_POLL_S):  # cut after the read: hold these bytes
                if self._stop.is_set() or pair.closed.is_set():
                    return
            try:
                dst.sendall(data)
            except OSError:
                break
        pair.close()
