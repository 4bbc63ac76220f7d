"""A narrow guard around one kombu failure seen here when Redis goes away for good seconds.

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


def _best_effort(method, what: str):  # noqa: ANN001, ANN202
    @functools.wraps(method)
    def guarded(self, delivery_tag, *args, **kwargs):  # noqa: ANN001, ANN202
        try:
            return method(self, delivery_tag, *args, **kwargs)
        except (AttributeError, redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("dropping the %s of message %s: its channel is gone (%s)", what, delivery_tag, exc)
            return None

    return guarded
