"""A broker outage said once a minute per worker, in one line, instead of Celery's three-line
"consumer: Cannot connect to ...: No master found ... Trying again in N seconds" every 1.5-5 s
and a six-line CPendingDeprecationWarning (worker_cancel_long_running_tasks_on_connection_loss)
at every connection loss (finding 13 of issue 15). Lines about a write Redis refuses (full,
read-only) are workers.consumer_backoff's, which says them its own way.

rig keeps Celery's default for that setting (False) on purpose: cancelling the running start
tasks on a connection loss would only redeliver them, and a job's start is fenced by its claim;
the warning about a future default is therefore noise here.
"""

from __future__ import annotations

import logging
import re
import warnings

from rig.lograte import Throttle
from workers.consumer_backoff import refused_in

#: Celery's consumer logger, which says "Cannot connect".
CONSUMER_LOGGER = "celery.worker.consumer.consumer"
#: The same connection error is logged again only after this long (s).
REPEAT_AFTER_S = 60.0


#: redis-py's repr of a sentinel's client, as its "No master found" error lists each one: ~1.2 KB
#: holding object addresses (``<redis.retry.Retry object at 0x7f68...>``) new at every try.
_CLIENT_REPR = re.compile(r"<redis\.client\.Redis\(<redis\.connection\.\w*ConnectionPool\(<redis\.connection\.\w*"
                          r"Connection\((?P<fields>.*?)\)>\)>\)>")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def readable(text: str) -> str:
    """``text`` with each sentinel client's repr cut to ``sentinel HOST:PORT`` and any other
    object address dropped: the same outage reads the same at every try (the throttle's key),
    in a line a person can read."""
    def short(match: re.Match[str]) -> str:
        fields = match.group("fields")
        host, port = re.search(r"\bhost=([^,]*)", fields), re.search(r"\bport=(\d+)", fields)
        return f"sentinel {host.group(1) if host else '?'}:{port.group(1) if port else '?'}"

    return _ADDRESS.sub("", _CLIENT_REPR.sub(short, text))


def outage_words(exc: BaseException, limit: int = 200) -> str:
    """A Redis error as a once-while-it-lasts line says it (rig.lograte.Throttle keys on the
    line): readable(), then cut to ``limit`` characters. Cut first, redis-py's "No master found"
    kept an object address new at every try in its first 200 characters, so the control
    worker's "local health check skipped" and the Flower bridge's "not listening" were said
    again at every pass of an outage."""
    return readable(str(exc))[:limit]


class ConnectErrorThrottle(logging.Filter):
    """Lets a "Cannot connect" record through once per REPEAT_AFTER_S per error text (the retry
    count in it changes every time; object addresses too: :func:`readable`), on one line, with
    how many were kept quiet."""

    def __init__(self, every: float = REPEAT_AFTER_S) -> None:
        super().__init__()
        self.throttle = Throttle(every)

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("consumer: Cannot connect"):
            return True
        if refused_in(record) is not None:
            return True  # a refused write: workers.consumer_backoff says it (and backs off)
        args = record.args if isinstance(record.args, tuple) else ()
        cause = readable(str(args[1]) if len(args) > 1 else record.getMessage())
        if not self.throttle.due(cause):
            return False
        quiet = self.throttle.said()
        record.msg = readable(" ".join(record.getMessage().split()))  # one line
        if quiet:
            record.msg += f" ({quiet} more 'Cannot connect' line(s) since the last one shown, not logged)"
        record.args = ()
        return True


def install() -> None:
    """Once per worker process (idempotent): the filter now; the warning's silencing now and
    again when the worker is ready, because Celery's logging set-up puts an ``always`` filter for
    its deprecation warnings in front of every earlier one (celery.app.log.Logging.setup)."""
    logger = logging.getLogger(CONSUMER_LOGGER)
    if not any(isinstance(f, ConnectErrorThrottle) for f in logger.filters):
        logger.addFilter(ConnectErrorThrottle())
    from celery.signals import worker_ready

    _silence_cancel_warning()
    worker_ready.connect(_silence_cancel_warning, weak=False, dispatch_uid="rig.broker_quiet")


def _silence_cancel_warning(**_: object) -> None:
    from celery.exceptions import CPendingDeprecationWarning

    warnings.filterwarnings("ignore", message=r"\s*In Celery 5\.1 we introduced an optional breaking change",
                            category=CPendingDeprecationWarning)
