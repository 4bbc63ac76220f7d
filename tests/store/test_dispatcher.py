"""The dispatcher's decisions against a real ledger (fakeredis and real Redis), no workers."""

from __future__ import annotations

import time

import pytest

from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.dispatcher import Dispatcher


@pytest.fixture
def setup(redis_client, key_prefix):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1")
    ledger = Ledger(redis_client, Keys(key_prefix))
    for i in range(2):
        ledger.register_card("n1", GpuReading(index=i, uuid=f"u{i}", model="m", total=40 * GIB),
                             max_jobs=2, reserve_fraction=0.0, allowed=True, fake=True)
    started: list[tuple[int, str, str, int]] = []
    dispatcher = Dispatcher(settings, lambda *a: started.append(a), client=redis_client)
    return ledger, dispatcher, started


def submit(ledger: Ledger, gib: float, priority=Priority.MEDIUM, gpus=1) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=time.time(),
    )).id


def test_places_in_priority_then_fifo_order(setup):
    ledger, dispatcher, started = setup
    low = submit(ledger, 10, Priority.LOW)
    med = submit(ledger, 10, Priority.MEDIUM)
    high1 = submit(ledger, 10, Priority.HIGH)
    high2 = submit(ledger, 10, Priority.HIGH)
    assert dispatcher.dispatch_pass() == 4
    assert [s[0] for s in started] == [high1, high2, med, low]
    for job_id, token, node, card in started:
        job = ledger.store.get(job_id)
        assert job.state is JobState.ASSIGNED and job.node == node == "n1"
        assert job.cards[0] == card and str(job.assignments) == token


def test_head_that_does_not_fit_blocks_lower_priority(setup):
    ledger, dispatcher, started = setup
    blocker = submit(ledger, 30)
    assert dispatcher.dispatch_pass() == 1
    blocker2 = submit(ledger, 30)
    assert dispatcher.dispatch_pass() == 1
    big = submit(ledger, 35, Priority.HIGH)  # fits no card now (10 GiB free on each)
    small = submit(ledger, 5, Priority.LOW)  # would fit, but must not jump the high job
    assert dispatcher.dispatch_pass() == 0
    assert ledger.store.get(small).state is JobState.PENDING
    reason = ledger.store.get(big).wait_reason
    assert reason.startswith("needs 35.0 GiB on 1 card; largest free block 10.0 GiB")
    # Room appears: the high job goes first, then the low one.
    ledger.transition(blocker, JobState.SUCCEEDED)
    assert dispatcher.dispatch_pass() == 2
    assert [s[0] for s in started[-2:]] == [big, small]
    assert blocker2


def test_impossible_job_fails_with_reason_and_does_not_block(setup):
    ledger, dispatcher, started = setup
    huge = submit(ledger, 41)
    three = submit(ledger, 1, gpus=3)
    ok = submit(ledger, 1)
    assert dispatcher.dispatch_pass() == 1
    assert started[0][0] == ok
    for jid, text in ((huge, "largest card offers"), (three, "needs 3 cards")):
        job = ledger.store.get(jid)
        assert job.state is JobState.FAILED and "unschedulable" in job.reason and text in job.reason


def test_multi_gpu_job_gets_both_cards_at_once(setup):
    ledger, dispatcher, started = setup
    pair = submit(ledger, 20, gpus=2)
    assert dispatcher.dispatch_pass() == 1
    job = ledger.store.get(pair)
    assert job.cards == [0, 1]
    assert all(ledger.card("n1", i).reserved == 20 * GIB for i in (0, 1))


def test_only_one_leader(setup, redis_client, key_prefix):
    _, first, _ = setup
    settings = load_settings(key_prefix=key_prefix, node_name="n2")
    second = Dispatcher(settings, lambda *a: None, client=redis_client)
    assert first._lead() is True
    assert second._lead() is False
    assert first._lead() is True  # renews
    first._resign()
    assert second._lead() is True
