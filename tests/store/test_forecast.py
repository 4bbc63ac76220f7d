"""Estimated starts (rig.forecast.forecast, what the leader publishes), from what a real dispatcher pass
left in Redis: fakeredis and real Redis."""

from __future__ import annotations

import time

import pytest

import rig.forecast
from rig.client import Client
from rig.clock import clock_for, shared_now
from rig.config import load_settings
from rig.forecast import CAVEAT, forecast
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.waiting import NO_DISPATCHER
from tests.store.conftest import add_cards, ledger_with_cards
from workers.dispatcher import Dispatcher


@pytest.fixture
def world(redis_client, key_prefix, make_ledger, tmp_path):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=0, home=tmp_path / "home")
    ledger = make_ledger(2, 40)
    return ledger, Client(settings, redis_client=redis_client), Dispatcher(settings, lambda *a: None,
                                                                          client=redis_client)


def submit(ledger: Ledger, gib: float, expected: float | None) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
        expected_seconds=expected,
    )).id


def test_estimated_starts_follow_the_expected_ends(world):
    ledger, client, dispatcher = world
    # Two running jobs placed by the dispatcher: 30 GiB for ~100 s, 40 GiB for ~50 s.
    long_one, short_one = submit(ledger, 30, 100.0), submit(ledger, 40, 50.0)
    assert dispatcher.dispatch_pass() == 2
    # Waiting, not yet passed over: 40 GiB (it waits for the 40 GiB job's end, ~50 s) and
    # 10 GiB (fits now beside the 30 GiB job).
    big, small = submit(ledger, 40, 60.0), submit(ledger, 10, None)
    # No dispatcher holds the lock: no time, and it says why.
    got = forecast(client)
    assert got.of(big).at is None and got.of(big).why_none == NO_DISPATCHER
    assert NO_DISPATCHER in got.of(small).sentence(got.now)

    client.r.set(client.keys.sched_leader, "someone", px=60_000)  # a dispatcher runs
    got = forecast(client)
    assert got.of(small).at == got.now
    assert got.of(small).sentence(got.now) == "now (waiting for the dispatcher's next pass)"
    assert got.now + 45 <= got.of(big).at <= got.now + 51
    assert CAVEAT in got.of(big).sentence(got.now)
    assert {long_one, short_one}.isdisjoint(got.starts)  # running jobs get none


def test_beyond_the_simulated_head_a_job_is_later(world, monkeypatch):
    ledger, client, _ = world
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    first, second = submit(ledger, 10, 5.0), submit(ledger, 10, 5.0)
    monkeypatch.setattr(rig.forecast, "FORECAST_JOBS", 1)
    got = forecast(client)
    assert got.of(first).at == got.now
    assert got.of(second).later and got.of(second).short(got.now) == "later"
    # it has exactly one job ahead of it, and is told so truly (was "more than 1 jobs ahead")
    assert got.of(second).sentence(got.now).startswith("later (1 or more jobs ahead of it"), got.of(second).sentence(got.now)


def test_a_low_priority_job_aged_past_the_others_is_estimated_first(world, monkeypatch):
    ledger, client, _ = world
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    fresh = submit(ledger, 10, 5.0)
    aged = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=10 * GIB, gpus=1, priority=Priority.LOW,
        state=JobState.PENDING, workdir="/", created_at=time.time() - 3 * client.settings.aging_seconds)).id
    monkeypatch.setattr(rig.forecast, "FORECAST_JOBS", 1)
    got = forecast(client)
    assert got.of(aged).at == got.now and got.of(fresh).later


def test_a_damaged_waiting_record_gets_no_time_and_the_rest_are_estimated(world):
    ledger, client, _ = world
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    bad, good = submit(ledger, 10, 5.0), submit(ledger, 10, 5.0)
    client.r.hset(client.keys.job(bad), "gpu_memory", "lots")
    got = forecast(client)
    assert got.of(bad).at is None and got.of(bad).why_none.startswith("never: its record is invalid")
    assert got.of(good).at == got.now


@pytest.mark.parametrize("seed", range(8))
def test_the_jobs_estimated_to_start_now_are_those_the_dispatcher_starts(redis_client, key_prefix, tmp_path, seed,
                                                                           monkeypatch):
    """The replay's first pass is the dispatcher's next pass: on a seeded mix (sizes, 2-card
    jobs, priorities, users, time limits, jobs running with known ends), the jobs told "now"
    are exactly those a real pass then starts. (Seed 4 needs the second round: a start while
    cards are held re-plans the holds, which lets a time-limited job backfill at once.)"""
    import random

    rnd = random.Random(seed)
    settings = load_settings(key_prefix=key_prefix, node_name="n1", home=tmp_path / "home", hold_after_seconds=0)
    ledger = ledger_with_cards(redis_client, key_prefix, 0)
    for node in ("n1", "n2"):
        add_cards(ledger, 2, 80, node=node, uuid="{node}-{index}")
    client = Client(settings, redis_client=redis_client)
    dispatcher = Dispatcher(settings, lambda *a: None, client=redis_client)

    def mix(count: int) -> None:
        client.store.create_many([(Job(
            id=0, name="t", user=rnd.choice("uvw"), command=["true"], gpu_memory=rnd.choice((4, 10, 20, 40, 70)) * GIB,
            gpus=rnd.choice((1, 1, 1, 2)), priority=rnd.choice(list(Priority)), state=JobState.PENDING,
            workdir="/", created_at=time.time(), expected_seconds=rnd.choice((None, 30.0, 300.0)),
            time_limit=rnd.choice((None, 60.0))), None) for _ in range(count)])

    mix(8)
    dispatcher.dispatch_pass()  # some run now, with their ends known or not
    mix(16)
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    # One instant for the replay and the pass it foretells: on a loaded host seconds may pass
    # between them, and a time-limited job that fits before a hold's shadow time at the first
    # may no longer at the second (a test of the rule, not of the host's speed).
    instant = clock_for(client.r).now()
    monkeypatch.setattr(type(clock_for(client.r)), "now", lambda self, refresh=True: instant)
    got = forecast(client)
    now_ids = {jid for jid, e in got.starts.items() if e.at == got.now and not e.overrun}
    pending = set(client.store.pending_head(100))
    dispatcher.dispatch_pass()
    started = pending - set(client.store.pending_head(100))
    assert now_ids == started, (sorted(now_ids), sorted(started))


def test_the_cards_of_a_stopped_node_take_nothing_and_end_nothing(world):
    from rig.forecast import NO_CARD_OPEN
    from rig.nodes import NodeRegistry

    ledger, client, _ = world
    nodes = NodeRegistry(client.r, client.keys)
    nodes.register("n1", ttl=30, backend="fake", cards=2)
    nodes.mark_stopped("n1")  # `rig down`: the health pass has not closed its cards yet
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    job = submit(ledger, 10, 5.0)
    got = forecast(client).of(job)
    assert got.at is None and got.why_none == NO_CARD_OPEN  # neither "now" nor "never"


def test_a_user_at_their_limit_starts_when_their_running_job_ends(redis_client, key_prefix, tmp_path):
    settings = load_settings(key_prefix=key_prefix, node_name="n1", home=tmp_path / "home", max_jobs_per_user=1)
    ledger = ledger_with_cards(redis_client, key_prefix, 1, 80)
    client = Client(settings, redis_client=redis_client)
    first = submit(ledger, 10, 100.0)
    assert Dispatcher(settings, lambda *a: None, client=redis_client).dispatch_pass() == 1
    second = submit(ledger, 10, 5.0)  # room for it, but its user runs their one job
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    got = forecast(client)
    assert got.of(second).at == pytest.approx(client.get(first).assigned_at + 100, abs=0.01)
