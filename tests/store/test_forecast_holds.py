"""The estimated starts agree with the cards the dispatcher holds (issue 14, item 2): the
reviewer's three-user load on 4 cards, a high 2-card job holding two of them and medium jobs
behind it, after a real dispatcher pass (fakeredis and real Redis)."""

from __future__ import annotations

import re
import time

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.forecast import forecast
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.waiting import expected_clock
from tests.store.conftest import ledger_with_cards
from workers.dispatcher import Dispatcher

MIN = 60.0


@pytest.fixture
def load(redis_client, key_prefix, tmp_path):
    """4 cards of 24 GiB, each running one job (time limits 2 h, 45 min, 30 min, 30 min), and
    waiting behind them (submitted a minute ago, past their hold time): three medium 20 GiB
    jobs (30 min), a high 2 x 16 GiB job (3 h) and a low 22 GiB one (no limit)."""
    settings = load_settings(key_prefix=key_prefix, node_name="demo", home=tmp_path / "home")
    ledger_with_cards(redis_client, key_prefix, 4, 24, node="demo")
    client = Client(settings, redis_client=redis_client)
    dispatcher = Dispatcher(settings, lambda *a: None, client=redis_client)

    def submit(user: str, gib: int, limit: float | None, prio: Priority = Priority.MEDIUM, gpus: int = 1,
               age: float = 0.0) -> int:
        return client.store.create(Job(
            id=0, name="t", user=user, command=["true"], gpu_memory=gib * GIB, gpus=gpus, priority=prio,
            state=JobState.PENDING, workdir="/", created_at=time.time() - age, time_limit=limit)).id

    for user, gib, limit in (("alice", 20, 120 * MIN), ("bob", 22, 45 * MIN), ("carol", 20, 30 * MIN),
                             ("carol", 20, 30 * MIN)):
        submit(user, gib, limit)
    assert dispatcher.dispatch_pass() == 4
    waiting = {name: submit(*args, age=60.0) for name, args in (
        ("m1", ("carol", 20, 30 * MIN)), ("m2", ("carol", 20, 30 * MIN)), ("m3", ("carol", 20, 30 * MIN)),
        ("high", ("alice", 16, 180 * MIN, Priority.HIGH, 2)), ("low", ("bob", 22, None, Priority.LOW)))}
    return client, dispatcher, waiting


def test_each_holder_is_estimated_to_start_when_its_held_cards_are_expected_free(load):
    client, dispatcher, waiting = load
    dispatcher.dispatch_pass()  # nothing starts: the high job, then two medium ones, hold cards
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    got = forecast(client)
    reasons = {name: client.get(jid).wait_reason for name, jid in waiting.items()}
    holders = {name for name, reason in reasons.items() if "held for it" in reason}
    assert {"high", "m1", "m2"} <= holders, reasons
    # The first two holders start when their held cards are expected free, as their reasons say:
    # the high job on the 30-min jobs' two cards, the first medium job on the 45-min job's card.
    for name, free_in in (("high", 30 * MIN), ("m1", 45 * MIN)):
        start = got.of(waiting[name]).at
        assert start == pytest.approx(got.now + free_in, abs=2 * MIN), (name, got.of(waiting[name]))
        said = re.search(r"held for it \(expected free ~([^)]*)\)", reasons[name])
        assert said and said[1] in {expected_clock(start + d) for d in (-60, 0, 60)}, (name, reasons[name])
    # No medium job goes ahead of the high one on the cards held for it.
    assert got.of(waiting["high"]).at < min(got.of(waiting[m]).at for m in ("m1", "m2", "m3"))


def test_the_first_forecast_after_a_burst_is_the_one_that_stays(redis_client, key_prefix, tmp_path):
    """Made before the medium jobs' hold time has come (the dispatcher has held cards only for
    the high job), the forecast foresees the holds they will make then: the next one, made after
    the dispatcher's pass at their hold time, gives every job the same start."""
    settings = load_settings(key_prefix=key_prefix, node_name="demo", home=tmp_path / "home",
                             hold_after_seconds=0.2)
    ledger_with_cards(redis_client, key_prefix, 4, 24, node="demo")
    client = Client(settings, redis_client=redis_client)
    dispatcher = Dispatcher(settings, lambda *a: None, client=redis_client)

    def submit(user: str, gib: int, limit: float | None, prio: Priority = Priority.MEDIUM, gpus: int = 1) -> int:
        return client.store.create(Job(
            id=0, name="t", user=user, command=["true"], gpu_memory=gib * GIB, gpus=gpus, priority=prio,
            state=JobState.PENDING, workdir="/", created_at=time.time(), time_limit=limit)).id

    for user, gib, limit in (("alice", 20, 120 * MIN), ("bob", 22, 45 * MIN), ("carol", 20, 30 * MIN),
                             ("carol", 20, 30 * MIN)):
        submit(user, gib, limit)
    assert dispatcher.dispatch_pass() == 4
    ids = [submit("carol", 20, 30 * MIN) for _ in range(3)]
    ids += [submit("alice", 16, 180 * MIN, Priority.HIGH, 2), submit("bob", 22, None, Priority.LOW)]
    dispatcher.dispatch_pass()  # the high job holds at once; the others' hold time has not come
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    first = forecast(client)
    time.sleep(2 * settings.hold_after_seconds + 0.1)  # the low job's hold time too
    dispatcher.dispatch_pass()
    assert client.get(ids[0]).held_at is not None
    second = forecast(client)
    for jid in ids:
        a, b = first.of(jid).at, second.of(jid).at
        assert (a is None) == (b is None) and (a is None or abs(a - b) < 5), (
            jid, {j: round((first.of(j).at or 0) - first.now) for j in ids},
            {j: round((second.of(j).at or 0) - second.now) for j in ids})


def test_the_run_time_assumed_and_its_source_reach_the_views(load):
    from rig.forecast_store import publish, read
    from rig.web.overview import overview

    client, dispatcher, waiting = load
    dispatcher.dispatch_pass()
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    # One medium job has earlier runs of its name (stored at submission): 20 min, under its limit.
    client.store.update(waiting["m3"], expected_seconds=1200.0, expected_source="name")
    publish(client.r, client.keys, forecast(client))
    stored = read(client.r, client.keys, waiting.values())
    limited = stored.row(waiting["m1"])
    assert (limited["expected_run"], limited["expected_run_source"]) == (30 * MIN, "limit")
    assert limited["expected_run_text"] == "~30 min (from its time limit)"
    assert "earlier runs" not in limited["estimated_start_text"]  # none were: the limits set the ends
    named = stored.row(waiting["m3"])
    assert named["expected_run_text"] == "~20 min (from earlier runs of this name)"
    assert stored.row(waiting["low"])["expected_run"] is None  # no limit, no runs: unknown
    rows = {j["id"]: j for j in overview(client, login="admin")["waiting"]["jobs"]}
    assert rows[waiting["high"]]["expected_run"] == 180 * MIN
    assert rows[waiting["high"]]["expected_run_source"] == "limit"
