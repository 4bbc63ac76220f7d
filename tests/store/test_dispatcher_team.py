"""The dispatcher with a team: fair share, per-user limits, pools, backfill with expected
durations, and records that are not what submit() writes. Real ledger (fakeredis and real
Redis), no workers."""

from __future__ import annotations

import time

import pytest

from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.waiting import expected_clock
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher


@pytest.fixture
def make(redis_client, key_prefix, make_ledger):
    """make(**settings) -> (ledger, dispatcher, started): 2 cards x 40 GiB on n1, 2 jobs each."""
    ledger = make_ledger(2, 40, max_jobs=2)

    def build(**overrides):
        values = dict(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                      hold_after_seconds=0)
        values.update(overrides)
        started: list[tuple[int, str, str, int]] = []
        dispatcher = Dispatcher(load_settings(**values), lambda *a: started.append(a), client=redis_client)
        return ledger, dispatcher, started

    return build


def submit(ledger: Ledger, gib: float, user: str = "alice", priority=Priority.MEDIUM, gpus=1,
           **fields) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user=user, command=["true"], gpu_memory=int(gib * GIB), gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r), **fields,
    )).id


def users_of(ledger: Ledger, started) -> list[str]:
    return [ledger.store.get(s[0]).user for s in started]


def test_starts_alternate_between_users_not_by_who_submitted_first(make):
    ledger, dispatcher, started = make()
    for _ in range(6):
        submit(ledger, 1, "alice")
    for _ in range(6):
        submit(ledger, 1, "bob")  # all after alice's
    assert dispatcher.dispatch_pass() == 4  # 2 cards x 2 slots
    assert users_of(ledger, started) == ["alice", "bob", "alice", "bob"]


def test_the_user_with_less_recent_usage_goes_first(make, redis_client, key_prefix):
    ledger, dispatcher, started = make()
    redis_client.hset(Keys(key_prefix).usage("alice"), mapping={"value": 500.0, "at": time.time()})
    for _ in range(4):
        submit(ledger, 1, "alice")
    for _ in range(4):
        submit(ledger, 1, "bob")
    dispatcher.dispatch_pass()
    assert users_of(ledger, started) == ["bob"] * 4


def test_without_fair_share_the_queue_is_fifo(make):
    ledger, dispatcher, started = make(fair_share=False)
    for user in ("alice", "alice", "alice", "bob"):
        submit(ledger, 1, user)
    dispatcher.dispatch_pass()
    assert users_of(ledger, started) == ["alice", "alice", "alice", "bob"]


def test_a_second_users_jobs_are_seen_behind_a_long_first_queue(make):
    ledger, dispatcher, started = make()
    for _ in range(80):  # more than the global lookahead
        submit(ledger, 1, "alice")
    bob = submit(ledger, 1, "bob")
    dispatcher.dispatch_pass()
    assert bob in [s[0] for s in started[:2]]


def test_per_user_job_limit_makes_the_job_wait_with_that_reason(make):
    ledger, dispatcher, started = make(max_jobs_per_user=1, user_limits={"bob": {"max_jobs": 2}})
    a1, a2 = submit(ledger, 1, "alice"), submit(ledger, 1, "alice")
    b1, b2 = submit(ledger, 1, "bob"), submit(ledger, 1, "bob")
    assert dispatcher.dispatch_pass() == 3
    assert {s[0] for s in started} == {a1, b1, b2}
    reason = ledger.store.get(a2).wait_reason
    assert reason.startswith("user alice has 1 job(s) placed or running (limit 1)")
    ledger.transition(a1, JobState.SUCCEEDED)
    assert dispatcher.dispatch_pass() == 1 and started[-1][0] == a2


def test_per_user_memory_limit(make):
    ledger, dispatcher, started = make(max_gpu_memory_per_user="30G")
    first, second = submit(ledger, 20, "alice"), submit(ledger, 20, "alice")
    pair = submit(ledger, 10, "alice", gpus=2)  # 20 GiB in all: over too
    other = submit(ledger, 20, "bob")
    dispatcher.dispatch_pass()
    assert {s[0] for s in started} == {first, other}
    assert "limit 30.0 GiB" in ledger.store.get(second).wait_reason
    assert ledger.store.get(pair).state is JobState.PENDING


def test_pool_job_runs_only_on_its_pool_and_unknown_pool_ends(make, redis_client, key_prefix):
    ledger, dispatcher, started = make(pools={"left": ["n1:0"], "right": ["n1:1"], "all": ["n1"]})
    left = [submit(ledger, 1, pool="left") for _ in range(3)]
    anywhere = submit(ledger, 1, pool="all")
    gone = submit(ledger, 1, pool="retired")
    dispatcher.dispatch_pass()
    assert [ledger.store.get(j).cards for j in left[:2]] == [[0], [0]]
    assert ledger.store.get(left[2]).state is JobState.PENDING  # card 0 is full; card 1 not its pool
    assert ledger.store.get(anywhere).cards == [1]
    job = ledger.store.get(gone)
    assert job.state is JobState.FAILED and "pool 'retired' is no longer configured" in job.reason
    too_big = submit(ledger, 30, pool="left", gpus=2)
    dispatcher.dispatch_pass()
    job = ledger.store.get(too_big)
    assert job.state is JobState.FAILED and "in pool 'left'" in job.reason


def test_short_jobs_backfill_a_held_card_when_they_end_before_its_shadow_time(make):
    ledger, dispatcher, started = make()
    blockers = [submit(ledger, 30, expected_seconds=60), submit(ledger, 30, expected_seconds=600)]
    assert dispatcher.dispatch_pass() == 2
    card_of = {ledger.store.get(b).cards[0]: b for b in blockers}
    # 36 GiB: holds the card freeing first (in 60 s); 5 GiB beside it there would not leave room.
    big = submit(ledger, 36, priority=Priority.HIGH)
    # An enforced time limit (+ kill grace, 10 s, + 1 s to start) lets a job backfill in front
    # of the held one when it surely ends before the held one could start.
    long_small = submit(ledger, 5, priority=Priority.LOW, time_limit=120)
    short_small = submit(ledger, 5, priority=Priority.LOW, time_limit=30)
    guessed = submit(ledger, 5, priority=Priority.LOW, expected_seconds=1)
    assert dispatcher.dispatch_pass() == 2
    held = 0 if card_of[0] == blockers[0] else 1
    reason = ledger.store.get(big).wait_reason
    blocker = ledger.store.get(blockers[held])
    # An absolute time, so the stored sentence stays true as the clock moves.
    assert f"n1/{held} held for it (expected free ~{expected_clock(blocker.assigned_at + 60)})" in reason
    assert ledger.store.get(short_small).cards == [held]  # ends before the big job could start
    assert ledger.store.get(long_small).cards == [1 - held]  # would delay it: the other card
    assert ledger.store.get(guessed).state is JobState.PENDING  # 2 jobs on each card: no room left


def _recent(redis_client, key_prefix, *runs: tuple[float, float, str]) -> None:
    """Record the cluster's recent runs: (seconds, GiB, user) each (rig.estimates)."""
    from rig import estimates

    pipe = redis_client.pipeline()
    for seconds, gib, user in runs:
        estimates.record_run(pipe, Keys(key_prefix), user=user, name=f"r{seconds}", template=None,
                             command=["true"], nbytes=int(gib * GIB), gpus=1, seconds=seconds)
    pipe.execute()


@pytest.mark.parametrize("budget,held_for,backfills", [
    (300, None, True),  # opted in: an estimated end before the shadow time: it backfills
    (0, None, False),  # the default: estimates never let a job in front of a held job
    (300, 400, False),  # the held job has held for longer than the budget: no more estimates
])
def test_estimated_ends_backfill_a_held_card_within_the_delay_budget(make, budget, held_for, backfills):
    ledger, dispatcher, started = make(backfill_estimate_delay_seconds=budget)
    blockers = [submit(ledger, 30, expected_seconds=60), submit(ledger, 30, expected_seconds=600)]
    assert dispatcher.dispatch_pass() == 2
    held = next(ledger.store.get(b).cards[0] for b in blockers if ledger.store.get(b).expected_seconds == 60)
    fields = {"held_at": time.time() - held_for} if held_for else {}
    big = submit(ledger, 36, priority=Priority.HIGH, **fields)
    guessed = submit(ledger, 5, priority=Priority.LOW, expected_seconds=2)  # no time limit
    dispatcher.dispatch_pass()
    job = ledger.store.get(guessed)
    if backfills:
        assert job.cards == [held]
    else:  # the other card has room (10 GiB, 1 slot): it goes there instead, never to the held one
        assert job.cards == [1 - held]
    record = ledger.store.get(big)
    assert record.state is JobState.PENDING and record.held_at
    if not held_for:  # the budget counts from its first hold
        assert record.held_at == pytest.approx(time.time(), abs=5)


def test_a_time_limit_never_stops_a_job_backfilling_on_its_shorter_estimate(make):
    ledger, dispatcher, started = make(backfill_estimate_delay_seconds=300)
    blockers = [submit(ledger, 30, expected_seconds=60), submit(ledger, 30, expected_seconds=600)]
    assert dispatcher.dispatch_pass() == 2
    held = next(ledger.store.get(b).cards[0] for b in blockers if ledger.store.get(b).expected_seconds == 60)
    submit(ledger, 36, priority=Priority.HIGH)
    # Ran 2 s each time; declares a 2 h limit to be safe: it must not lose the backfill for it.
    careful = submit(ledger, 5, priority=Priority.LOW, expected_seconds=2, cautious_seconds=3, time_limit=7200)
    dispatcher.dispatch_pass()
    assert ledger.store.get(careful).cards == [held]


def test_own_history_backfills_on_its_80th_percentile_not_its_median(make):
    ledger, dispatcher, started = make(backfill_estimate_delay_seconds=300)
    blockers = [submit(ledger, 30, expected_seconds=60), submit(ledger, 30, expected_seconds=600)]
    assert dispatcher.dispatch_pass() == 2
    held = next(ledger.store.get(b).cards[0] for b in blockers if ledger.store.get(b).expected_seconds == 60)
    submit(ledger, 36, priority=Priority.HIGH)
    # Usually 10 s, but one run in three takes 100 s: it would outlive the 60 s shadow time.
    spiky = submit(ledger, 5, priority=Priority.LOW, expected_seconds=10, cautious_seconds=100)
    dispatcher.dispatch_pass()
    assert ledger.store.get(spiky).cards == [1 - held]


def test_leaving_room_counts_only_sure_ends(make, redis_client, key_prefix):
    """Jobs that backfill by leaving room may not count on estimated ends of jobs on the held
    card: one that proves wrong would take the held job's room for as long as it runs."""
    ledger, dispatcher, started = make(backfill_estimate_delay_seconds=0)
    add_cards(ledger, 2, 40, max_jobs=4)  # room for 4 jobs a card: the cap must not be what keeps them off
    blockers = [submit(ledger, 30, expected_seconds=60), submit(ledger, 30, expected_seconds=600)]
    assert dispatcher.dispatch_pass() == 2
    held = next(ledger.store.get(b).cards[0] for b in blockers if ledger.store.get(b).expected_seconds == 60)
    big = submit(ledger, 36, priority=Priority.HIGH)
    smalls = [submit(ledger, 4, priority=Priority.LOW, expected_seconds=0.1) for _ in range(3)]
    for _ in range(2):
        dispatcher.dispatch_pass()
    # The first leaves exactly the held job's 36 GiB once the blocker ends; a second would
    # count on the first one's 0.1 s estimate to leave room, which nothing guarantees.
    on_held = [s for s in smalls if ledger.store.get(s).cards == [held]]
    assert len(on_held) == 1, on_held
    blocker = next(b for b in blockers if ledger.store.get(b).cards == [held])
    ledger.transition(blocker, JobState.SUCCEEDED)
    dispatcher.dispatch_pass()
    assert ledger.store.get(big).state is JobState.ASSIGNED  # the small one still runs beside it


def test_a_damaged_start_stamp_makes_an_end_unknown_not_a_bad_record(make, redis_client, key_prefix):
    ledger, dispatcher, started = make()
    blockers = [submit(ledger, 30), submit(ledger, 30)]
    assert dispatcher.dispatch_pass() == 2
    for b in blockers:
        ledger.store.update(b, started_at=-1e11)
    big = submit(ledger, 36, priority=Priority.HIGH)
    _recent(redis_client, key_prefix, *[(40.0, 30, "bob")] * 5)
    for _ in range(2):
        dispatcher.dispatch_pass()
    job = ledger.store.get(big)
    assert job.state is JobState.PENDING and not job.problems, job.problems
    assert "held for it" in job.wait_reason


def test_recent_runs_of_a_size_give_unknown_ends_a_shadow_time(make, redis_client, key_prefix):
    ledger, dispatcher, started = make()
    # Jobs without a time limit or history of their own: their ends come from the cluster's
    # recent runs of their size (30 GiB ran ~40 s; 5 GiB ran ~1 s).
    _recent(redis_client, key_prefix, *[(40.0, 30, "bob")] * 5, *[(1.0, 5, "bob")] * 5)
    for _ in range(2):
        submit(ledger, 30)
    assert dispatcher.dispatch_pass() == 2
    big = submit(ledger, 35, priority=Priority.HIGH)
    small = submit(ledger, 5, priority=Priority.LOW)
    assert dispatcher.dispatch_pass() == 1
    reason = ledger.store.get(big).wait_reason
    placed = [ledger.store.get(j) for j in ledger.store.ids_in_state(JobState.ASSIGNED)]
    assert any(f"held for it (expected free ~{expected_clock(j.assigned_at + 40)})" in reason
               for j in placed if j.gpu_memory == 30 * GIB), reason
    # Both cards have room for it; it may take either: it is expected to end long before.
    assert ledger.store.get(small).state is JobState.ASSIGNED


def test_unknown_durations_keep_the_held_card_closed(make):
    ledger, dispatcher, started = make()
    for _ in range(2):
        submit(ledger, 30)
    dispatcher.dispatch_pass()
    big = submit(ledger, 35, priority=Priority.HIGH)
    smalls = [submit(ledger, 5, priority=Priority.LOW, time_limit=1) for _ in range(2)]
    assert dispatcher.dispatch_pass() == 1
    assert "held for it" in ledger.store.get(big).wait_reason
    assert "expected free" not in ledger.store.get(big).wait_reason
    assert [ledger.store.get(s).state for s in smalls].count(JobState.PENDING) == 1


@pytest.mark.parametrize("field,value,problem", [
    ("gpus", "x", "field gpus"),
    ("gpu_memory", "-5", "field gpu_memory"),
    ("gpu_memory", "9" * 40, "field gpu_memory"),
    ("priority", "urgent; rm -rf /", "field priority"),
    ("user", "a b\n", "field user"),
    ("assignments", "1; x", "field assignments"),
    ("attempt", "-1", "field attempt"),
])
def test_an_invalid_waiting_record_fails_that_job_only(make, redis_client, key_prefix, field, value, problem):
    ledger, dispatcher, started = make()
    bad = submit(ledger, 1)
    good = submit(ledger, 1)
    redis_client.hset(Keys(key_prefix).job(bad), field, value)
    assert dispatcher.dispatch_pass() == 1
    assert started[0][0] == good
    job = redis_client.hgetall(Keys(key_prefix).job(bad))
    assert job["state"] == "FAILED"
    assert job["reason"].startswith("invalid record: " + problem)
    assert redis_client.zscore(Keys(key_prefix).pending, bad) is None


def test_a_finished_attempt_adds_its_gib_hours_to_the_users_usage(make, redis_client, key_prefix):
    ledger, dispatcher, _ = make()
    job_id = submit(ledger, 20, "carol", gpus=2)
    dispatcher.dispatch_pass()
    ok, _ = ledger.claim(job_id, ledger.store.get(job_id).assignments, "w")
    assert ok
    redis_client.hset(Keys(key_prefix).job(job_id), "started_at", time.time() - 1800)  # ran 30 min
    ledger.transition(job_id, JobState.SUCCEEDED)
    usage = redis_client.hgetall(Keys(key_prefix).usage("carol"))
    assert float(usage["value"]) == pytest.approx(20 * 2 * 0.5, rel=0.01)  # GiB x cards x hours
    assert not redis_client.sismember(Keys(key_prefix).pending_users, "carol")


def test_fair_share_two_users_fifty_jobs_each_one_all_at_once_first(make):
    """The issue's measure: alice submits 50 jobs at once, then bob 50. Jobs end one at a time
    (oldest first); each end is followed by a pass. Bob's jobs must not wait for all of alice's:
    once he has submitted, starts go to the user with less recent usage. (Default hold time:
    a job blocked past it holds a card and then goes first, at most one per free card set.)"""
    ledger, dispatcher, started = make(hold_after_seconds=20)
    alice = [submit(ledger, 1, "alice") for _ in range(50)]
    dispatcher.dispatch_pass()
    assert len(started) == 4
    bob = [submit(ledger, 1, "bob") for _ in range(50)]
    after_bob: list[str] = []
    running = [s[0] for s in started]
    while running:
        ledger.transition(running.pop(0), JobState.SUCCEEDED)
        before = len(started)
        dispatcher.dispatch_pass()
        for job_id, *_ in started[before:]:
            running.append(job_id)
            after_bob.append(ledger.store.get(job_id).user)
    assert len(after_bob) == 96 and sorted(after_bob).count("bob") == 50
    first_20 = after_bob[:20]
    assert first_20.count("bob") >= 10, first_20
    # While both wait, they share: every 10 consecutive starts hold 3 to 7 of bob's (FIFO
    # would give alice all of her 46 remaining first, bob none).
    for i in range(0, 80):
        assert 3 <= after_bob[i:i + 10].count("bob") <= 7, (i, after_bob)
    assert alice and bob


@pytest.mark.parametrize("order,expected,fit", [("largest-first", ["big", "pair", "small"], 3),
                                                 ("fifo", ["small", "big", "pair"], 2)])
def test_queue_order_within_a_priority(make, order, expected, fit):
    """Largest first packs better: FIFO puts small and big on one card (best fit), leaving no
    card pair with 10 GiB each for the 2-card job."""
    ledger, dispatcher, started = make(queue_order=order)
    ids = {"small": submit(ledger, 1), "big": submit(ledger, 30), "pair": submit(ledger, 10, gpus=2)}
    names = {v: k for k, v in ids.items()}
    assert [j.id for j in dispatcher.fair_order(dispatcher._read_waiting(), _team(), time.time())] == \
        [ids[n] for n in expected]
    assert dispatcher.dispatch_pass() == fit and names[started[0][0]] == expected[0]


def _team():
    from rig.fairshare import TeamState

    return TeamState()


def test_the_reservation_script_refuses_a_bad_counter_before_any_write(make, redis_client, key_prefix):
    ledger, _, _ = make()
    job_id = submit(ledger, 10)
    redis_client.hset(Keys(key_prefix).job(job_id), "assignments", "many")
    ok, detail = ledger.reserve(job_id, "n1", [0], 10 * GIB)
    assert (ok, detail) == (False, "bad-record:assignments")
    card = ledger.card("n1", 0)
    assert card.reserved == 0 and card.jobs == 0 and ledger.holdings("n1", 0) == {}


def test_reclaim_leaves_a_live_job_with_undecodable_cards_alone(make, redis_client, key_prefix):
    ledger, dispatcher, _ = make()
    job_id = submit(ledger, 10)
    dispatcher.dispatch_pass()
    card = ledger.store.get(job_id).cards[0]
    redis_client.hset(Keys(key_prefix).job(job_id), "cards", "{not json")
    assert ledger.reclaim("n1", card, job_id) == 0  # no script error, nothing taken
    assert ledger.card("n1", card).reserved == 10 * GIB


def test_fair_share_cannot_starve_a_job_past_its_hold_time(make, redis_client, key_prefix):
    """Alice has much recent usage, so fair share puts bob's stream of small jobs first; her big
    job, once past its hold time, still holds the card that drains first and gets it."""
    ledger, dispatcher, started = make(hold_after_seconds=20)
    keys = Keys(key_prefix)
    redis_client.hset(keys.usage("alice"), mapping={"value": 100.0, "at": time.time()})
    bobs = [submit(ledger, 1, "bob", priority=Priority.HIGH) for _ in range(4)]
    dispatcher.dispatch_pass()  # 2 on each card: every slot taken
    big = submit(ledger, 40, "alice", priority=Priority.HIGH)
    redis_client.hset(keys.job(big), "created_at", time.time() - 3600)  # long past its hold time
    first_card = ledger.store.get(bobs[0]).cards[0]
    on_first = [b for b in bobs if ledger.store.get(b).cards[0] == first_card]
    more = [submit(ledger, 1, "bob", priority=Priority.HIGH) for _ in range(4)]
    ledger.transition(on_first[0], JobState.SUCCEEDED)  # a slot frees on that card
    dispatcher.dispatch_pass()
    assert all(ledger.store.get(m).cards != [first_card] for m in more)  # held for alice
    assert f"n1/{first_card} held for it" in ledger.store.get(big).wait_reason
    ledger.transition(on_first[1], JobState.SUCCEEDED)  # the card is empty now
    dispatcher.dispatch_pass()
    assert ledger.store.get(big).state is JobState.ASSIGNED and ledger.store.get(big).cards == [first_card]



def test_a_hold_planned_for_a_job_behind_does_not_take_the_card_of_a_holder_ahead(make):
    """Breaker (break14): bob's job held card 1 since before alice's pair job began to hold.
    Card 1 emptied; in that pass bob's job could start, so the first sweep planned nothing for
    it, and then held cards 0 and 1 for alice's pair job behind it: bob's job found card 1 held
    'for jobs ahead of it' and lost it (a low job took it, leaving room for the pair)."""
    ledger, dispatcher, started = make()  # 2 cards x 40 GiB, hold_after_seconds=0
    blockers = [submit(ledger, 35, "root"), submit(ledger, 35, "root")]
    assert dispatcher.dispatch_pass() == 2  # unknown ends: a hold on either has no shadow time
    holder = submit(ledger, 35, "bob", held_at=time.time() - 30)  # first in its rank
    pair = submit(ledger, 10, "alice", gpus=2)  # behind it: not yet holding
    freed = ledger.store.get(blockers[1]).cards[0]
    ledger.transition(blockers[1], JobState.SUCCEEDED)
    dispatcher.dispatch_pass()
    job = ledger.store.get(holder)
    assert job.state is JobState.ASSIGNED and job.cards == [freed], job.wait_reason
    assert ledger.store.get(pair).state is JobState.PENDING

def test_every_waiting_user_is_seen_with_many_users(make):
    ledger, dispatcher, started = make(max_jobs_per_user=1)
    for number in range(80):
        for _ in range(3):
            submit(ledger, 0.01, f"u{number:02d}")
    add_cards(ledger, 2, 40, max_jobs=40, first=2, uuid="x{index}")  # room for 80 jobs: every user's first one
    dispatcher.dispatch_pass()
    assert sorted({ledger.store.get(s[0]).user for s in started}) == [f"u{n:02d}" for n in range(80)]


def test_stale_ids_are_taken_out_of_the_waiting_queues(make, redis_client, key_prefix):
    ledger, dispatcher, started = make()
    keys = Keys(key_prefix)
    gone = submit(ledger, 1, "erin")
    redis_client.delete(keys.job(gone))  # deleted by hand; still queued
    moved = submit(ledger, 1, "erin")
    redis_client.hset(keys.job(moved), "user", "frank")  # changed while waiting
    good = submit(ledger, 1, "gina")
    dispatcher.dispatch_pass()
    assert [s[0] for s in started] == [good]
    assert redis_client.zscore(keys.pending, gone) is None
    assert redis_client.zscore(keys.pending_user("erin"), gone) is None
    job = redis_client.hgetall(keys.job(moved))
    assert job["state"] == "FAILED" and "field user" in job["reason"]
    assert not redis_client.sismember(keys.pending_users, "erin")
    assert redis_client.zcard(keys.pending_user("erin")) == 0


def test_a_job_bigger_than_its_users_memory_limit_ends_instead_of_waiting(make):
    ledger, dispatcher, started = make(max_gpu_memory_per_user="20G")
    too_big = submit(ledger, 15, gpus=2)
    dispatcher.dispatch_pass()
    job = ledger.store.get(too_big)
    assert job.state is JobState.FAILED and "may hold at most 20.0 GiB" in job.reason
