"""A Celery consumer started while Redis refuses writes waits between tries and says so once
per interval (workers.consumer_backoff), instead of ~6 "Cannot connect ... OOM" lines and a
RestartFreqExceeded traceback a second (measured against a full private redis-server: 14.7 KB
in 10 s before, one warning after, and the worker connects once memory is freed)."""

from __future__ import annotations

import logging

import pytest
import redis

from workers import consumer_backoff as B

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(B._State, "wait", B.FIRST_WAIT_S)
    monkeypatch.setattr(B._State, "last_refused", float("-inf"))
    monkeypatch.setattr(B._State, "last_said", float("-inf"))


def test_waits_at_least_a_second_doubling_to_the_cap_and_says_it_once(caplog):
    clock, waits = _Clock(), []
    with caplog.at_level(logging.WARNING, logger="rig.worker"):
        for _ in range(8):
            before = clock.t
            B.wait_out(OOM, sleep=clock.sleep, now=clock.now)
            waits.append(round(clock.t - before, 3))
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0]
    said = [r.getMessage() for r in caplog.records if "refuses rig's writes" in r.getMessage()]
    assert len(said) == 1 and "kind full" in said[0]  # 55 s of refusals: under SAY_EVERY_S
    clock.t += B.RESET_AFTER_S + 1  # a later, separate outage starts over
    before = clock.t
    B.wait_out(OOM, sleep=clock.sleep, now=clock.now)
    assert clock.t - before == B.FIRST_WAIT_S


def test_celerys_per_try_lines_about_a_refusal_are_replaced_by_one(caplog):
    from celery.worker.consumer import consumer as mod

    B.install()
    B.install()  # idempotent
    assert getattr(mod.Consumer.on_connection_error_before_connected, "_rig_backoff", False)
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            mod.logger.error("consumer: Cannot connect to %s: %s.\n%s\n", "redis://x", OOM, "Trying again")
        mod.logger.error("consumer: Cannot connect to %s: %s.\n%s\n", "redis://x",
                         redis.ConnectionError("refused"), "Trying again")
    shown = [r.getMessage() for r in caplog.records]
    assert sum("Cannot connect" in m for m in shown) == 1  # the unreachable one stays
    assert sum("refuses rig's writes" in m for m in shown) == 1
