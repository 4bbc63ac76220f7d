"""Finding 13 of issue 15: a broker outage is one line a minute per worker, and Celery's
six-line CPendingDeprecationWarning at every connection loss is not printed."""

from __future__ import annotations

import logging
import warnings

from workers.broker_quiet import CONSUMER_LOGGER, ConnectErrorThrottle, install

CONNECTION_ERROR = "consumer: Cannot connect to %s: %s.\n%s\n"


def _record(retry: int, cause: str = "No master found for 'rigm'") -> logging.LogRecord:
    return logging.LogRecord(CONSUMER_LOGGER, logging.ERROR, __file__, 1, CONNECTION_ERROR,
                             ("sentinel://h1:26379//", cause, f"Trying again in 2.00 seconds... ({retry}/100)"), None)


def test_the_same_connection_error_is_said_once_then_with_a_count():
    throttle = ConnectErrorThrottle(every=3600)
    first = _record(1)
    assert throttle.filter(first) and "\n" not in first.getMessage()
    assert "No master found for 'rigm'" in first.getMessage()
    assert not any(throttle.filter(_record(n)) for n in range(2, 6))
    other = _record(6, "Connection refused")
    assert throttle.filter(other)
    assert "(4 more 'Cannot connect' line(s) since the last one shown" in other.getMessage()
    unrelated = logging.LogRecord(CONSUMER_LOGGER, logging.WARNING, __file__, 1, "consumer: other", (), None)
    assert throttle.filter(unrelated) and throttle.filter(unrelated)


def test_the_cancel_on_connection_loss_warning_is_silenced_after_celerys_logging_setup():
    from celery.exceptions import CPendingDeprecationWarning
    from celery.signals import worker_ready
    from celery.worker.consumer.consumer import CANCEL_TASKS_BY_DEFAULT

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        install()  # at import of workers.app
        warnings.filterwarnings("always", category=CPendingDeprecationWarning)  # what Celery's logging setup does
        # When the worker is ready (not sent here: workers.app's own receivers would run too).
        assert any(key[0] == "rig.broker_quiet" for key, _ in worker_ready.receivers)
        from workers.broker_quiet import _silence_cancel_warning

        _silence_cancel_warning()
        warnings.warn(CANCEL_TASKS_BY_DEFAULT, CPendingDeprecationWarning, stacklevel=1)
    assert caught == []


def _no_master_found(ports: list[int]) -> str:
    """redis-py's own error when no sentinel answers (nothing listens on the ports)."""
    import pytest
    from redis.sentinel import MasterNotFoundError, Sentinel

    sentinel = Sentinel([("127.0.0.1", port) for port in ports], socket_timeout=0.5)
    with pytest.raises(MasterNotFoundError) as info:
        sentinel.discover_master("rigm")
    return str(info.value)


def test_redis_pys_no_master_found_is_said_once_and_short():
    """Its text holds each sentinel client's repr with object addresses new at every try: every
    try (3 a 5 s per worker, ~2.5 KB each) was a new cause and logged, through a whole outage."""
    throttle = ConnectErrorThrottle(every=3600)
    from rig.testing.sentinel_set import free_port

    ports = [free_port(), free_port()]
    first, second = _no_master_found(ports), _no_master_found(ports)
    assert first != second  # the addresses differ: the reason the throttle let each one through
    shown = _record(1, first)
    assert throttle.filter(shown) and not throttle.filter(_record(2, second))
    line = shown.getMessage()
    assert "0x" not in line and "ConnectionPool" not in line and len(line) < 600, line
    assert line.count("sentinel 127.0.0.1:") == 2 and "Connection refused" in line


def test_an_outage_is_worded_alike_at_every_try():
    """The control worker's "local health check skipped: Redis: ..." and the Flower bridge's
    "not listening" are said once while they last (Throttle keys on the line): cut to 200
    characters before readable(), redis-py's "No master found" kept an object address new at
    every try, and so a line at every health pass (5 s) and every second of an outage."""
    from redis.sentinel import MasterNotFoundError

    from rig.testing.sentinel_set import free_port
    from workers.broker_quiet import outage_words

    ports = [free_port(), free_port()]
    first, second = (MasterNotFoundError(_no_master_found(ports)) for _ in range(2))
    assert str(first) != str(second)
    assert outage_words(first) == outage_words(second) and "0x" not in outage_words(first)
    assert outage_words(first).startswith("No master found for 'rigm'")
