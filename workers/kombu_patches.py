"""A narrow guard around one kombu failure seen here when Redis goes away for good seconds
(and, at the end, shorter waits between a worker's broker reconnections).

On a lost broker connection the consumer closes its channel, and closing restores the
unacknowledged messages. With the server still down, kombu 5.7 builds the restore client from a
connection whose ``client`` is already None and raises AttributeError, which Celery reports as
"Unrecoverable error" and the whole worker exits (measured here: SIGKILL of redis-server with
three jobs running). rig does not need that restore: the unacked messages stay in Redis, and a
job's start is fenced by its claim and re-sent by rig's own recovery (CardRunner.adopt). So the
restore is made best effort: it is skipped with a warning, and the worker keeps reconnecting.

The same happens when a job that ran through the outage ends and its start message is acked
(``task_acks_late``) on the channel that died: the ack is dropped with a warning. The message
then stays in kombu's unacked set; if it is ever delivered again, the job's claim refuses it.
"""

from __future__ import annotations

import functools
import logging

import redis
from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)


def install() -> None:
    qos = kombu_redis.QoS
    if getattr(qos.restore_unacked, "_rig_guarded", False):
        return
    original = qos.restore_unacked

    @functools.wraps(original)
    def restore_unacked(self, client=None):  # noqa: ANN001, ANN202 - kombu's signature
        try:
            return original(self, client)
        except (AttributeError, redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("not restoring %d unacked message(s) while the broker is away (%s); "
                        "rig re-sends job starts itself", len(self._delivered), exc)
            self._delivered.clear()
            return None

    restore_unacked._rig_guarded = True  # type: ignore[attr-defined]
    qos.restore_unacked = restore_unacked
    qos.ack = _best_effort(qos.ack, "ack")
    qos.reject = _best_effort(qos.reject, "reject")
    from workers import consumer_backoff

    consumer_backoff.install()  # a consumer started while Redis refuses writes waits
    _reconnect_sooner()


#: Waits between a worker's tries to reconnect to the broker (s): the first, the step added
#: each time, the most. kombu's defaults (2, 2, 30) brought consumers back 6 s after a Sentinel
#: fail-over that took 2.5 s (tries at +0, +2, +6 s), and up to 30 s late after a long outage.
RECONNECT_START_S, RECONNECT_STEP_S, RECONNECT_MAX_S = 0.5, 0.5, 5.0


def _reconnect_sooner() -> None:
    """Celery's consumer calls kombu's ensure_connection with kombu's default waits; give it
    RECONNECT_* instead (a caller that names its own waits keeps them)."""
    from kombu import Connection

    original = Connection.ensure_connection
    if getattr(original, "_rig_sooner", False):
        return

    @functools.wraps(original)
    def ensure_connection(self, *args, **kwargs):  # noqa: ANN001, ANN202 - kombu's signature
        if len(args) <= 2:  # (errback, max_retries) at most: the waits were not given by position
            kwargs.setdefault("interval_start", RECONNECT_START_S)
            kwargs.setdefault("interval_step", RECONNECT_STEP_S)
            kwargs.setdefault("interval_max", RECONNECT_MAX_S)
        return original(self, *args, **kwargs)

    ensure_connection._rig_sooner = True  # type: ignore[attr-defined]
    Connection.ensure_connection = ensure_connection  # type: ignore[method-assign]


def _best_effort(method, what: str):  # noqa: ANN001, ANN202
    @functools.wraps(method)
    def guarded(self, delivery_tag, *args, **kwargs):  # noqa: ANN001, ANN202
        try:
            return method(self, delivery_tag, *args, **kwargs)
        except (AttributeError, redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("dropping the %s of message %s: its channel is gone (%s)", what, delivery_tag, exc)
            return None

    return guarded
