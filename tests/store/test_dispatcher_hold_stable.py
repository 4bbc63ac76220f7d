"""A hold stays on its cards while they are about as good as the best plan (issue 13, item 1:
rig.placement.keeps_hold): with 8 equal blockers whose expected ends reorder as their ages cross
the samples of their kind, the held card named in the waiting job's reason used to change every
~10 s. The shared clock is frozen and stepped by the test."""
from __future__ import annotations

import re

import pytest

from rig.clock import clock_for
from rig.config import load_settings
from rig.estimates import record_run
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher

START = 1_900_000_000.0


class _Clock:
    """The shared clock every rig call of the test reads (epoch s), moved by the test."""

    def __init__(self) -> None:
        self.t = START


def _job(user: str, gib: int, created: float, priority: Priority = Priority.MEDIUM) -> Job:
    return Job(id=0, name="new-cmd", user=user, command=["sleep", "150"], gpu_memory=gib * GIB, gpus=1,
               priority=priority, state=JobState.PENDING, workdir="/tmp", created_at=created)


@pytest.fixture
def blocked(redis_client, key_prefix, monkeypatch):
    """8 x 80 GiB cards on n7, each running a 60 GiB job begun 20-23.5 s before START (0.5 s
    apart), whose kind ran 60, 70, ..., 240 s (the user's recent runs of that size); a high
    70 GiB job submitted at START holds a card at once."""
    r = redis_client
    clock = _Clock()
    monkeypatch.setattr(type(clock_for(r)), "now", lambda self, refresh=True: clock.t)
    keys = Keys(key_prefix)
    ledger = Ledger(r, keys)
    pipe = r.pipeline(transaction=False)
    for seconds in range(60, 250, 10):
        record_run(pipe, keys, user="ann", name="earlier", template=None, command=["other"], nbytes=60 * GIB,
                   gpus=1, seconds=float(seconds), ended_at=START - 1000)
    pipe.execute()
    add_cards(ledger, 8, 80, node="n7")
    for index in range(8):
        clock.t = START - 20.0 - 0.5 * index
        job = ledger.store.create_many([(_job("ann", 60, clock.t), None)])[0]
        ok, token = ledger.reserve(job.id, "n7", [index], job.gpu_memory, user="ann")
        assert ok, token
        ledger.claim(job.id, token, f"card{index}@n7")
    clock.t = START
    dispatcher = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n7", hold_after_seconds=20.0),
                            lambda *a: None, client=r)
    high = ledger.store.create_many([(_job("bob", 70, START, Priority.HIGH), None)])[0].id
    return clock, ledger, dispatcher, high


def _held(ledger: Ledger, job_id: int) -> str:
    reason = ledger.store.get(job_id).wait_reason or ""
    found = re.search(r"(n7/\d) held for it", reason)
    assert found, reason
    return found[1]


def test_the_held_card_stays_while_the_blockers_ends_reorder(blocked):
    clock, ledger, dispatcher, high = blocked
    seen = []
    for _ in range(50):  # 100 s: on main the best card changed at 48 s, 68 s, 88 s (n7/7 <-> n7/3)
        assert dispatcher.dispatch_pass() == 0
        seen.append(_held(ledger, high))
        clock.t += 2.0
    assert set(seen) == {seen[0]}, seen
    assert ledger.store.get(high).held_at == START


def test_the_forecast_holds_the_cards_the_dispatcher_holds(blocked, monkeypatch):
    """The forecast replays the dispatcher's holds with the same preference (the record's
    last_held_cards): its first hold for the job is the card the job's reason names, pass after pass."""
    from rig.client import Client
    from rig.forecast import forecast
    from workers.dispatcher import _Holds

    clock, ledger, dispatcher, high = blocked
    planned: list[tuple[str, ...]] = []
    real = _Holds.plan

    def plan(self, job, cards, request):  # noqa: ANN001, ANN202
        hold = real(self, job, cards, request)
        if job.id == high and hold is not None:
            planned.append(hold.cards)
        return hold

    client = Client(dispatcher.settings, redis_client=ledger.r)
    for _ in range(30):  # 60 s: on main the best card changed at 48 s (n7/7 -> n7/3)
        dispatcher.dispatch_pass()
        held = _held(ledger, high)
        ledger.r.set(dispatcher.keys.sched_leader, "someone", px=60_000)
        planned.clear()
        monkeypatch.setattr(_Holds, "plan", plan)
        forecast(client)
        monkeypatch.setattr(_Holds, "plan", real)
        assert planned and planned[0] == (held,), (clock.t - START, held, planned[:3])
        clock.t += 2.0


def test_a_damaged_held_cards_is_only_a_preference_lost(blocked):
    """held_cards and last_held_cards are rig's own bookkeeping: cards that are not the job's to
    hold (unknown, on two nodes, too many) are ignored, the hold planned afresh and the fields
    written again."""
    clock, ledger, dispatcher, high = blocked
    dispatcher.dispatch_pass()
    held = _held(ledger, high)
    assert ledger.r.hmget(dispatcher.keys.job(high), "held_cards", "last_held_cards") == [held, held]
    for damaged in ("zz/9", "n7/1,n7/2", "n7/1,x/0", ","):
        ledger.store.update(high, held_cards=damaged, last_held_cards=damaged)
        clock.t += 1.0
        assert dispatcher.dispatch_pass() == 0
        assert ledger.store.get(high).state == JobState.PENDING
        now_held = _held(ledger, high)
        assert ledger.r.hmget(dispatcher.keys.job(high), "held_cards", "last_held_cards") == [now_held, now_held]
