"""Sending the "submitted" Celery message off the caller's thread.

A submission is durable once its record and its place in the pending queue are written (one
Redis transaction that also wakes the dispatcher). The Celery message that follows only makes
the job visible as a task in Flower and wakes the dispatcher a second time, yet publishing it
costs more than the whole Redis write. So a daemon thread publishes it: ``submit()`` returns as
soon as the job is safe, and a burst of submissions is not held up by kombu.

One thread serves the whole process: it is made on the first message and carries (send
function, item) pairs, so any number of Clients share it. At most MAX_BACKLOG messages wait;
beyond that the caller sends its own message (back-pressure, bounded memory). Messages of the
queue go out in the order they were queued.

Failures are logged and lost, since the job is already queued and the dispatcher finds it
anyway:

* a ``send`` that raises is logged (warning with the traceback), and the next message still goes;
* at a normal exit an ``atexit`` hook waits up to FLUSH_TIMEOUT_S for the unsent messages, and
  logs a warning with the number it drops when that time runs out;
* a process that ends with ``os._exit`` (a multiprocessing child, a forked worker) runs no exit
  hook, so what it had not sent yet is dropped without a log line; call ``flush()`` first if
  that matters;
* after ``fork()`` the child starts with an empty queue and no thread (``os.register_at_fork``):
  the parent's unsent messages stay the parent's, the child's first message starts its own
  thread, and nothing the parent's thread held (its locks) can block the child.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long the exit hook waits for unsent messages (s).
FLUSH_TIMEOUT_S = 5.0
#: Messages waiting beyond this are sent by the caller itself (back-pressure, bounded memory).
MAX_BACKLOG = 10_000
#: How often a waiting flush() looks whether the thread is still alive (s).
_POLL_S = 0.1

Send = Callable[[object], None]


class _Dispatcher:
    """The process-wide queue of (send, item) pairs and the one daemon thread that empties it."""

    def __init__(self, name: str = "rig-notify") -> None:
        self._queue: queue.Queue[tuple[Send, object]] = queue.Queue(maxsize=MAX_BACKLOG)
        self._name = name
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # starting the thread; numbering the queued messages
        self._done_cond = threading.Condition(threading.Lock())
        self._queued = 0  # messages ever put on the queue (not those sent by the caller)
        self._done = 0  # of those, how many were handled (sent, or failed and logged)

    def put(self, send: Send, item: object) -> None:
        self._ensure_thread()
        with self._lock:  # the count and the queue order agree, so flush() can trust _done
            try:
                self._queue.put_nowait((send, item))
            except queue.Full:
                full = True
            else:
                full = False
                self._queued += 1
        if full:
            _deliver(send, item)

    def unsent(self) -> int:
        """Messages queued but not handled yet (the one being sent counts)."""
        with self._lock, self._done_cond:
            return self._queued - self._done

    def flush(self, timeout: float) -> bool:
        """Wait until every message queued before this call was handled; False if ``timeout``
        s passed first. Returns at once when nothing is queued; when the thread is gone, sends
        what is left on the caller's thread."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._queued
        while True:
            with self._done_cond:
                if self._done >= target:
                    return True
                thread = self._thread
                if thread is not None and thread.is_alive():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._done_cond.wait(min(remaining, _POLL_S))
                    continue
            return self._drain(deadline)

    def _drain(self, deadline: float) -> bool:
        """Send the queued messages here, in order (the thread died, e.g. a BaseException)."""
        while time.monotonic() < deadline:
            try:
                send, item = self._queue.get_nowait()
            except queue.Empty:
                return True
            try:
                _deliver(send, item)
            finally:
                self._mark_done()
        return self._queue.empty()

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            send, item = self._queue.get()
            try:
                _deliver(send, item)
            finally:
                self._mark_done()

    def _mark_done(self) -> None:
        with self._done_cond:
            self._done += 1
            self._done_cond.notify_all()


def _deliver(send: Send, item: object) -> None:
    try:
        send(item)
    except Exception:  # noqa: BLE001 - the job is already queued; a lost nudge only delays it
        log.warning("could not send a submission message; the dispatcher still finds the job",
                    exc_info=True)


_dispatcher: _Dispatcher | None = None
_dispatcher_lock = threading.Lock()


def _shared() -> _Dispatcher:
    global _dispatcher
    dispatcher = _dispatcher
    if dispatcher is None:
        with _dispatcher_lock:
            if _dispatcher is None:
                _dispatcher = _Dispatcher()
            dispatcher = _dispatcher
    return dispatcher


def _reset() -> None:
    """Forget the queue, its locks and its thread (a forked child: the thread is not there, and
    a lock may have been held by it at the fork). The parent sends its own messages."""
    global _dispatcher, _dispatcher_lock
    _dispatcher_lock = threading.Lock()
    _dispatcher = None


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_reset)


def send_later(send: Send, item: object) -> None:
    """Queue ``send(item)`` for the process-wide thread (made on the first call)."""
    _shared().put(send, item)


def flush(timeout: float = FLUSH_TIMEOUT_S) -> bool:
    """Wait until the messages queued so far in this process were handled; False if ``timeout``
    s passed first. True at once when nothing is queued."""
    dispatcher = _dispatcher
    return True if dispatcher is None else dispatcher.flush(timeout)


def _flush_at_exit(timeout: float = FLUSH_TIMEOUT_S) -> None:
    dispatcher = _dispatcher
    if dispatcher is None or dispatcher.flush(timeout):
        return
    log.warning("%d submission message(s) still unsent after %.1f s at exit, dropped; the jobs "
                "are queued and the dispatcher still finds them", dispatcher.unsent(), timeout)


atexit.register(_flush_at_exit)  # once per process; reads the current (post-fork) dispatcher


class BackgroundSender:
    """A handle that runs ``send(item)`` for each put item on the process-wide thread, in order.

    Cheap: every sender shares the one thread and queue, so ``flush()`` waits for the messages
    of all of them."""

    def __init__(self, send: Send) -> None:
        self._send = send

    def put(self, item: object) -> None:
        send_later(self._send, item)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every message queued so far was handled; False if ``timeout`` s passed
        first."""
        return flush(timeout)
