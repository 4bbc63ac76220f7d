"""Sending the "submitted" Celery message off the caller's thread.

A submission is durable once its record and its place in the pending queue are written (one
Redis transaction that also wakes the dispatcher). The Celery message that follows only makes
the job visible as a task in Flower and wakes the dispatcher a second time, yet publishing it
costs more than the whole Redis write. So a daemon thread publishes it: ``submit()`` returns as
soon as the job is safe, and a burst of submissions is not held up by kombu.

Messages not yet sent when the process exits are flushed by an ``atexit`` hook (bounded by
FLUSH_TIMEOUT_S); one that still fails is only logged, since the job is already queued.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long the exit hook waits for unsent messages (s).
FLUSH_TIMEOUT_S = 5.0
#: Messages waiting beyond this are sent by the caller itself (back-pressure, bounded memory).
MAX_BACKLOG = 10_000


class BackgroundSender:
    """Runs ``send(item)`` for each queued item on one daemon thread, in order."""

    def __init__(self, send: Callable[[object], None], name: str = "rig-notify") -> None:
        self._send = send
        self._queue: queue.Queue[object] = queue.Queue(maxsize=MAX_BACKLOG)
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        atexit.register(self.flush, FLUSH_TIMEOUT_S)

    def put(self, item: object) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._deliver(item)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every queued item was handled; False if ``timeout`` s passed first."""
        if self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            self._deliver(item)

    def _deliver(self, item: object) -> None:
        try:
            self._send(item)
        except Exception:  # noqa: BLE001 - the job is already queued; a lost nudge only delays it
            log.warning("could not send a submission message; the dispatcher still finds the job",
                        exc_info=True)
