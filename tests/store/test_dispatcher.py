"""The dispatcher's decisions against a real ledger (fakeredis and real Redis), no workers."""

from __future__ import annotations

import threading
import time

import pytest

from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.dispatcher import Dispatcher


@pytest.fixture
def setup(redis_client, key_prefix, make_ledger):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=0)
    ledger = make_ledger(2, 40, max_jobs=2)
    started: list[tuple[int, str, str, int]] = []
    dispatcher = Dispatcher(settings, lambda *a: started.append(a), client=redis_client)
    return ledger, dispatcher, started


def submit(ledger: Ledger, gib: float, priority=Priority.MEDIUM, gpus=1) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
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


def test_blocked_job_holds_its_card_and_lower_work_backfills_elsewhere(setup):
    ledger, dispatcher, started = setup  # 2 cards x 40 GiB, at most 2 jobs each
    blockers = [submit(ledger, 30), submit(ledger, 30)]
    assert dispatcher.dispatch_pass() == 2  # one on each card: 10 GiB free on each
    placed = {ledger.store.get(b).cards[0]: b for b in blockers}
    big = submit(ledger, 35, Priority.HIGH)  # fits no card now
    small = submit(ledger, 5, Priority.LOW)
    small2 = submit(ledger, 5, Priority.LOW)
    # The big job holds card 0 (equal deficits: lower index); the first small job backfills
    # card 1; the second would fit card 0's free 10 GiB but must not take the held card.
    assert dispatcher.dispatch_pass() == 1
    assert ledger.store.get(small).cards == [1]
    assert ledger.store.get(small2).state is JobState.PENDING
    reason = ledger.store.get(big).wait_reason
    assert reason.startswith("needs 35.0 GiB on 1 card; largest free block 10.0 GiB")
    assert "n1/0 held for it" in reason
    # The held card frees: the big job takes it first, then the small one fits beside it.
    ledger.transition(placed[0], JobState.SUCCEEDED)
    assert dispatcher.dispatch_pass() == 2
    assert [s[0] for s in started[-2:]] == [big, small2]
    assert ledger.store.get(big).cards == [0] and ledger.store.get(small2).cards == [0]


def test_no_hold_before_a_job_has_waited_hold_after_seconds(setup, redis_client, key_prefix):
    ledger, _, started = setup
    settings = load_settings(key_prefix=key_prefix, node_name="n1", hold_after_seconds=60)
    dispatcher = Dispatcher(settings, lambda *a: started.append(a), client=redis_client)
    blockers = [submit(ledger, 30), submit(ledger, 30)]
    assert dispatcher.dispatch_pass() == 2
    big = submit(ledger, 35, Priority.MEDIUM)  # high would hold at once
    smalls = [submit(ledger, 5, Priority.LOW), submit(ledger, 5, Priority.LOW)]
    assert dispatcher.dispatch_pass() == 2  # both backfill: the big job has not waited long
    assert sorted(ledger.store.get(s).cards[0] for s in smalls) == [0, 1]
    assert "held for it" not in ledger.store.get(big).wait_reason
    redis_client.hset(Keys(key_prefix).job(big), "created_at", time.time() - 61)
    on_card0 = next(s for s in smalls if ledger.store.get(s).cards == [0])
    ledger.transition(on_card0, JobState.SUCCEEDED)  # card 0: 10 GiB and a slot free again
    later = submit(ledger, 1, Priority.LOW)
    assert dispatcher.dispatch_pass() == 0
    assert "n1/0 held for it" in ledger.store.get(big).wait_reason  # it has waited: card 0 held
    assert blockers and ledger.store.get(later).state is JobState.PENDING


def test_aging_lifts_a_long_waiting_low_job(setup, redis_client, key_prefix):
    ledger, _, started = setup
    settings = load_settings(key_prefix=key_prefix, node_name="n1", aging_seconds=60)
    dispatcher = Dispatcher(settings, lambda *a: started.append(a), client=redis_client)
    old_low = submit(ledger, 10, Priority.LOW)
    redis_client.hset(Keys(key_prefix).job(old_low), "created_at", time.time() - 150)  # 2 levels
    fresh_high = submit(ledger, 10, Priority.HIGH)
    fresh_medium = submit(ledger, 10, Priority.MEDIUM)
    order = [j.id for j in dispatcher.waiting_in_order()]
    assert order == [old_low, fresh_high, fresh_medium]  # aged to high; older id first


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


def test_a_dispatcher_standing_by_leaves_the_wake_ups_to_the_leader(setup, redis_client, key_prefix):
    """Issue 15: a standby that took a nudge off the list left the leader waiting for its idle
    second (submit -> placement ~1 s with 8 dispatchers instead of ms)."""
    _, leader, _ = setup
    assert leader._lead() is True
    redis_client.lpush(leader.keys.sched_wake, "1")
    standby = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n2"), lambda *a: None, client=redis_client)

    idle, wait = threading.Event(), standby.stop_event.wait

    def one_turn(timeout: float | None = None) -> bool:  # the standby's idle wait: the test's cue
        idle.set()
        return wait(timeout)

    standby.stop_event.wait = one_turn  # type: ignore[method-assign]
    loop = threading.Thread(target=standby.run_forever, daemon=True)
    loop.start()
    try:
        assert idle.wait(10), "the standby never went idle (it waits on the wake-up list instead)"
        assert redis_client.llen(leader.keys.sched_wake) == 1  # still there for the leader
    finally:
        standby.stop()
        loop.join(10)
    assert redis_client.get(leader.keys.sched_leader) == leader.identity


def test_only_one_leader(setup, redis_client, key_prefix):
    _, first, _ = setup
    settings = load_settings(key_prefix=key_prefix, node_name="n2")
    second = Dispatcher(settings, lambda *a: None, client=redis_client)
    assert first._lead() is True
    assert second._lead() is False
    assert first._lead() is True  # renews
    first._resign()
    assert second._lead() is True


def test_a_remembered_wait_reason_follows_the_cards_between_passes(setup, redis_client, key_prefix):
    """Issue 15: wait sentences are remembered across passes; a change of the cards words them anew."""
    ledger, _, started = setup  # 2 cards x 40 GiB
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=3600)  # no holds: only the cards change the sentence
    dispatcher = Dispatcher(settings, lambda *a: started.append(a), client=redis_client)
    submit(ledger, 30)
    submit(ledger, 30)
    assert dispatcher.dispatch_pass() == 2  # one on each card: 10 GiB free on each
    big = submit(ledger, 35, Priority.LOW)
    dispatcher.dispatch_pass()
    assert "largest free block" in ledger.store.get(big).wait_reason
    assert "(n1/0)" in ledger.store.get(big).wait_reason.split("largest free block")[1].split(";")[0]
    side = submit(ledger, 5)
    assert ledger.reserve(side, "n1", [0], 5 * GIB)[0]  # placed by someone else: n1/0 has 5 GiB free now
    dispatcher.dispatch_pass()
    assert "(n1/1)" in ledger.store.get(big).wait_reason.split("largest free block")[1].split(";")[0]
