"""The "submitted" Celery messages: what they are for, and why none is ever "dropped".

Decision (issue 10, item 12): these messages are **not part of a submission**. A submission is
complete, and the job safe, once its record and its place in the pending queue are written:
one Redis transaction, which also pushes the dispatcher's wake-up (``sched_wake``); and the
dispatcher looks at the queue at least once a second regardless. The ``rig.submitted`` task
(workers/app.py) only pushes that same wake-up again. The message exists so that Flower shows
submissions on the rig.high / rig.medium / rig.low queues. So a message that is never sent
loses nothing and delays nothing, and rig never reports one as "dropped".

:func:`announce` is the way to send them: one message per submit call and priority (a
``submit_many`` of 1,000 jobs is one message naming the id range, ~0.4 ms), on the caller's
thread, before the call returns, so nothing is left pending when it returns. A send that fails
(broker unreachable) is logged at debug level and ignored, for the reason above.

The background sender below is the older way (one message per job, off the caller's thread);
it stays for callers that still use it. Its exit hook waits as long as messages keep going out
(a backlog of thousands takes seconds) and gives up only after NO_PROGRESS_S without one sent
(a broker that is gone); what is left then is logged at debug level, not as a warning.

Background sender, details:

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
* at a normal exit an ``atexit`` hook waits while messages keep being sent, until none is
  left, or until NO_PROGRESS_S pass without one (a debug line then, nothing else);
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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rig.models import Job

log = logging.getLogger(__name__)

#: How long flush() waits by default (s).
FLUSH_TIMEOUT_S = 5.0
#: The exit hook gives up when no message was sent for this long (s): the broker is gone.
NO_PROGRESS_S = 5.0
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


def _flush_at_exit(stall: float = NO_PROGRESS_S) -> None:
    """At interpreter exit: let the thread send what is queued, however long that takes while
    messages keep going out; stop waiting after ``stall`` s without one. Nothing of a job is
    lost either way (module doc), so what is left is a debug line, not a warning."""
    dispatcher = _dispatcher
    if dispatcher is None:
        return
    left = dispatcher.unsent()
    while left and not dispatcher.flush(stall):
        now_left = dispatcher.unsent()
        if now_left >= left:  # none sent for `stall` s
            log.debug("%d 'submitted' message(s) for Flower not sent at exit (broker not answering); "
                      "the jobs are queued, nothing is lost", now_left)
            return
        left = now_left


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


def announce(celery, jobs: Sequence[Job]) -> int:  # noqa: ANN001 - a Celery app, imported lazily
    """Send the "submitted" message(s) for ``jobs``, just stored by one submit call: one message
    per priority among them, on that priority's queue, named for Flower (``job 12 'bert' by ana:
    12.0 GiB x 1, high`` or ``jobs 12-1011 (1000) 'sweep' by ana, low``). Runs on the caller's
    thread and returns when sent; a failure is logged at debug level and ignored (module doc).
    Returns how many messages were sent."""
    from rig.celery_config import TASK_SUBMITTED
    from rig.memory import format_memory

    by_priority: dict[object, list[Job]] = {}
    for job in jobs:
        by_priority.setdefault(job.priority, []).append(job)
    sent = 0
    for priority, group in by_priority.items():
        first = group[0]
        if len(group) == 1:
            label = (f"job {first.id} '{first.name}' by {first.user}: {format_memory(first.gpu_memory)} x "
                     f"{first.gpus}, {priority.value}")
        else:
            ids = sorted(j.id for j in group)
            span = f"{ids[0]}-{ids[-1]}" if ids[-1] - ids[0] + 1 == len(ids) else f"{ids[0]}..{ids[-1]}"
            names = sorted({j.name for j in group})
            users = sorted({j.user for j in group})
            label = (f"jobs {span} ({len(group)}) '{names[0]}'{' and others' if len(names) > 1 else ''} "
                     f"by {', '.join(users[:3])}{' ...' if len(users) > 3 else ''}, {priority.value}")
        try:
            # The task only wakes the dispatcher; its argument is the first id, for Flower.
            celery.send_task(TASK_SUBMITTED, args=[first.id], queue=priority.queue, retry=False,
                             argsrepr=label[:400])
            sent += 1
        except Exception:  # noqa: BLE001 - the jobs are queued; this message is for Flower only
            log.debug("could not send the 'submitted' message for %s; the jobs are queued", label,
                      exc_info=True)
    return sent
