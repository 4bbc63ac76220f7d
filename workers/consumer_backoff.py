"""Celery's consumer, started while Redis refuses writes, backs off instead of spinning.

A worker that starts while Redis is full (or a read-only replica, or MISCONF: rig.redis_writes)
cannot bind its queues (kombu writes the bindings), so its consumer fails at once and Celery
restarts it at once: about six "Cannot connect ... OOM command not allowed" lines a second and,
each second, a CRITICAL "Frequent restarts detected: RestartFreqExceeded" traceback (Celery
allows 5 restarts a second). A worker already consuming when Redis filled behaves, because its
reads keep working. Here a refused write before or after connecting waits (1 s, doubling up to
MAX_WAIT_S; at least a second, so Celery's restart limit is never reached) and is said once per
SAY_EVERY_S; Celery's own per-try lines for it are dropped. Shutdown stays prompt: the wait
checks for it every half second.
"""

from __future__ import annotations

import functools
import logging
import time

from rig.redis_writes import refusal

log = logging.getLogger("rig.worker")

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 10.0
SAY_EVERY_S = 60.0
#: A refusal this long after the previous one starts the backoff again from FIRST_WAIT_S.
RESET_AFTER_S = 120.0


class _State:
    wait = FIRST_WAIT_S
    last_refused = float("-inf")
    last_said = float("-inf")
    dropped = 0


def refused_in(record: logging.LogRecord) -> BaseException | None:
    """The refused write a Celery per-try line is about, or None."""
    args = record.args if isinstance(record.args, tuple) else ()
    found = [a for a in args if isinstance(a, BaseException) and refusal(a) is not None]
    if record.exc_info and record.exc_info[1] is not None and refusal(record.exc_info[1]) is not None:
        found.append(record.exc_info[1])
    return found[0] if found else None


class _DropRefusals(logging.Filter):
    """Drops Celery's per-try lines about a refused write; says it once per SAY_EVERY_S instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = refused_in(record)
        if exc is None:
            return True
        _State.dropped += 1
        say(exc)
        return False


def say(exc: BaseException, *, now=time.monotonic) -> None:  # noqa: ANN001
    """One warning about the refused write ``exc``, at most once per SAY_EVERY_S."""
    t = now()
    if t - _State.last_said < SAY_EVERY_S:
        return
    _State.last_said = t
    log.warning("consumer: Redis refuses rig's writes (%s; kind %s); the worker waits and retries "
                "(every %.0f s at most; said again in %.0f s if it goes on)",
                str(exc).splitlines()[0][:160], refusal(exc), MAX_WAIT_S, SAY_EVERY_S)


def wait_out(exc: BaseException, *, sleep=time.sleep, now=time.monotonic) -> None:  # noqa: ANN001
    """Wait before the consumer's next try after a refused write ``exc``; say so at most once
    per SAY_EVERY_S (with how many tries were refused meanwhile)."""
    from celery.worker.state import maybe_shutdown

    t = now()
    if t - _State.last_refused > RESET_AFTER_S:
        _State.wait = FIRST_WAIT_S
    _State.last_refused = t
    wait = _State.wait
    _State.wait = min(MAX_WAIT_S, _State.wait * 2)
    say(exc, now=now)
    end = now() + wait
    while True:
        maybe_shutdown()
        left = end - now()
        if left <= 0:
            return
        sleep(min(0.5, left))


def install() -> None:
    """Wrap the consumer's connection-error hooks (idempotent) and filter Celery's lines."""
    from celery.worker.consumer import consumer as mod

    cls = mod.Consumer
    if getattr(cls.on_connection_error_before_connected, "_rig_backoff", False):
        return
    for name in ("on_connection_error_before_connected", "on_connection_error_after_connected"):
        original = getattr(cls, name)

        def wrapped(self, exc, _original=original):  # noqa: ANN001, ANN202 - Celery's signature
            result = _original(self, exc)
            if refusal(exc) is not None:
                wait_out(exc)
            return result

        functools.update_wrapper(wrapped, original)
        wrapped._rig_backoff = True  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)
    mod.logger.addFilter(_DropRefusals())
