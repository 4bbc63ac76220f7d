"""The stored forecast (rig.forecast_store) and the leader's thread that makes it
(workers.forecaster): what the views read, on fakeredis and real Redis."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

import workers.forecaster
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.forecast import LATER, Forecast, StartEstimate
from rig.forecast_store import FORECAST_EVERY_S, NOT_MADE_YET, TTL_INTERVALS, publish, read
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.waiting import NO_DISPATCHER
from workers.dispatcher import Dispatcher
from workers.forecaster import Forecaster


@pytest.fixture
def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)


def _lead(r, keys: Keys, who: str = "someone") -> None:
    r.set(keys.sched_leader, who, px=60_000)


def test_what_is_published_is_what_a_view_reads(redis_client, keys):
    _lead(redis_client, keys)
    made = time.time() - 12
    publish(redis_client, keys, Forecast(made, {
        1: StartEstimate(1, made), 2: StartEstimate(2, made + 1500), 3: StartEstimate(3, None, "never: too big"),
        4: StartEstimate(4, None, after=made + 7200)}, made_at=made, complete=False, newest_id=6))
    got = read(redis_client, keys, [2, 1, 3, 4, 5, 7])
    assert got.made_at == pytest.approx(made) and set(got.starts) == {1, 2, 3, 4, 5, 7}
    assert got.of(1).short(got.now) == "now" and got.of(2).at == pytest.approx(made + 1500)
    assert got.of(3).sentence(got.now) == "unknown (never: too big)"
    assert got.of(4).after == pytest.approx(made + 7200)
    assert got.of(5).sentence(got.now) == LATER  # waiting then, beyond the simulated head
    assert got.of(7).short(got.now) == "not yet" and "submitted after the last forecast" in got.of(7).sentence(got.now)
    row = got.row(2)
    assert row["estimated_at"] == pytest.approx(made) and row["estimated_start_text"].endswith("(as of 12 s ago)")
    assert "as of" not in got.row(3)["estimated_start_text"]  # only a time says how old it is
    assert set(read(redis_client, keys).starts) == {1, 2, 3, 4}  # no ids: all it holds
    redis_client.hset(keys.forecast, mapping={"every": "190.0", "2": "{not json"})  # a stretched interval
    got = read(redis_client, keys, [2, 7])
    assert got.of(2).not_yet and "unreadable" in got.of(2).sentence(got.now)
    assert got.of(7).sentence(got.now).endswith("makes one every 190 s)")


def test_a_complete_forecast_says_a_missing_job_is_not_estimated_yet(redis_client, keys):
    _lead(redis_client, keys)
    publish(redis_client, keys, Forecast(time.time(), {}, made_at=time.time(), complete=True, newest_id=9))
    got = read(redis_client, keys, [3])
    assert got.of(3).not_yet and not got.of(3).later


def test_without_a_forecast_or_a_dispatcher_each_view_says_so(redis_client, keys):
    publish(redis_client, keys, Forecast(time.time(), {1: StartEstimate(1, time.time())}, made_at=time.time()))
    got = read(redis_client, keys, [1])  # a dead leader's forecast is not shown
    assert got.of(1).why_none == NO_DISPATCHER and got.row(1)["estimated_at"] is None
    _lead(redis_client, keys)
    redis_client.delete(keys.forecast)
    got = read(redis_client, keys, [1])
    assert got.of(1).sentence(got.now) == f"not estimated yet ({NOT_MADE_YET})"
    assert "every 10 s" in NOT_MADE_YET


def test_a_stored_forecast_expires_after_a_few_intervals(redis_client, keys):
    publish(redis_client, keys, Forecast(time.time(), {}, made_at=time.time()), every=FORECAST_EVERY_S)
    assert 0 < redis_client.ttl(keys.forecast) <= FORECAST_EVERY_S * TTL_INTERVALS
    publish(redis_client, keys, Forecast(time.time(), {}, made_at=time.time()), every=100.0)
    assert redis_client.ttl(keys.forecast) > FORECAST_EVERY_S * TTL_INTERVALS  # a stretched interval lives longer


@pytest.mark.redis
def test_a_reader_never_sees_half_a_forecast(real_redis, keys):
    """Two forecasts of disjoint jobs replace each other while a view reads: every read holds
    one of them, with its own stamp, never a mix, a part or nothing."""
    _lead(real_redis, keys)
    first = Forecast(1.0, {j: StartEstimate(j, 1.0) for j in range(1, 1001)}, made_at=1.0)
    second = Forecast(2.0, {j: StartEstimate(j, 2.0) for j in range(1001, 2001)}, made_at=2.0)
    ends = {1.0: {1, 1000}, 2.0: {1001, 2000}}  # the first and last fields each one writes
    stop = threading.Event()

    def publisher() -> None:
        while not stop.is_set():
            for one in (first, second):
                publish(real_redis, keys, one)

    thread = threading.Thread(target=publisher, daemon=True)
    publish(real_redis, keys, first)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the reader gets the GIL back soon after each answer
    thread.start()
    try:
        for _ in range(200):
            got = read(real_redis, keys, (1, 1000, 1001, 2000))
            timed = {j for j, e in got.starts.items() if e.at is not None}
            assert got.made_at in ends and timed == ends[got.made_at], (got.made_at, timed)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)


@pytest.fixture
def leader(redis_client, key_prefix, make_ledger, tmp_path):
    settings = load_settings(key_prefix=key_prefix, node_name="n1", hold_after_seconds=0, home=tmp_path / "home")
    ledger = make_ledger(1, 40)
    dispatcher = Dispatcher(settings, lambda *a: None, client=redis_client)
    return ledger, Client(settings, redis_client=redis_client), dispatcher, Forecaster(dispatcher)


def _submit(ledger: Ledger, gib: float) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r), expected_seconds=60.0)).id


def test_only_the_leader_publishes_and_only_while_jobs_wait(leader):
    ledger, client, dispatcher, forecaster = leader
    assert not forecaster.step()  # nobody leads
    assert dispatcher._lead()  # noqa: SLF001 - it takes the lock as its pass does
    assert not forecaster.step() and not client.r.exists(client.keys.forecast)  # nothing waits
    running, waiting = _submit(ledger, 30), _submit(ledger, 30)
    dispatcher.dispatch_pass()
    assert forecaster.step() and forecaster.every == FORECAST_EVERY_S and forecaster.took > 0
    got = client.start_estimates([waiting, running])
    assert got.now - 2 <= got.made_at <= got.now
    assert got.of(waiting).at == pytest.approx(client.get(running).assigned_at + 60, abs=0.01)
    assert got.row(waiting)["estimated_start_text"].endswith("s ago)")
    client.r.set(client.keys.sched_leader, "another")
    assert not forecaster.step()  # another leads now


def test_a_costly_forecast_stretches_its_interval(leader, monkeypatch):
    ledger, client, dispatcher, forecaster = leader
    dispatcher._lead()  # noqa: SLF001
    _submit(ledger, 50)  # never fits: still a waiting job to estimate
    monkeypatch.setattr(workers.forecaster, "MAX_CORE_SHARE", 1e-9)
    assert forecaster.step() and forecaster.every > FORECAST_EVERY_S
    assert client.r.ttl(client.keys.forecast) > FORECAST_EVERY_S * TTL_INTERVALS


def test_a_failing_forecast_never_raises_and_is_logged_once_a_minute(leader, monkeypatch, caplog):
    ledger, _client, dispatcher, forecaster = leader
    dispatcher._lead()  # noqa: SLF001
    _submit(ledger, 10)

    def broken(_client: Client) -> Forecast:
        raise ValueError("a bug in the simulation")

    monkeypatch.setattr(workers.forecaster, "forecast", broken)
    with caplog.at_level(logging.WARNING, logger="workers.forecaster"):
        assert not forecaster.step() and not forecaster.step() and forecaster.failing
    said = [r for r in caplog.records if "estimated starts not updated" in r.getMessage()]
    assert len(said) == 1 and "a bug in the simulation" in said[0].getMessage()


def test_the_thread_stores_one_soon_after_a_job_waits(leader, monkeypatch):
    ledger, client, dispatcher, forecaster = leader
    monkeypatch.setattr(workers.forecaster, "IDLE_CHECK_S", 0.02)
    monkeypatch.setattr(workers.forecaster, "SWITCH_INTERVAL_S", sys.getswitchinterval())  # this process' own
    dispatcher._lead()  # noqa: SLF001
    forecaster.start()
    try:
        job = _submit(ledger, 50)  # never fits this card: it waits
        deadline = time.monotonic() + 10
        while client.start_estimates([job]).made_at is None and time.monotonic() < deadline:
            forecaster.stop_event.wait(0.02)  # polls Redis for what another thread writes
        assert client.start_estimates([job]).of(job).why_none.startswith("never:")
    finally:
        forecaster.stop()
        forecaster._thread.join(5)  # noqa: SLF001
    assert not forecaster._thread.is_alive()  # noqa: SLF001
