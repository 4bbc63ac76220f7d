"""An idle submission's pass on a small cluster in three round trips (the cards, the pending
users and the queue heads in one pipeline; the heads' fields; the reservation), and the reads
it folds still see every change: a card set that changed, pending users other than the last
ones, scripts Redis lost, and the leader check riding in the same pipeline."""
from __future__ import annotations

import time

import pytest
import redis.connection

from rig.config import load_settings
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher


@pytest.fixture
def world(redis_client, key_prefix, make_ledger):
    ledger = make_ledger(8, 80)
    started: list = []
    dispatcher = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n1", max_task_per_gpu=4),
                            lambda *a: started.append(a), client=redis_client)
    return dispatcher, ledger, started


def _job(ledger: Ledger, gib: float, user: str = "alice") -> int:
    return ledger.store.create(Job(id=0, name="t", user=user, command=["true"], gpu_memory=int(gib * GIB), gpus=1,
                                   priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                   created_at=time.time())).id


@pytest.fixture
def sends(monkeypatch):
    """The requests written to Redis (one per command, one per pipeline), as lists of their
    commands' names; TIME (the shared clock's anchor, refreshed now and then) left out."""
    sent: list[list[str]] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self, command, check_health=True):
        parts = command if isinstance(command, list) else [command]
        names = [bytes(p).split(b"\r\n")[2].decode() for p in b"".join(map(bytes, parts)).split(b"*")[1:]
                 if p[:1].isdigit() and len(bytes(p).split(b"\r\n")) > 2]
        if names != ["TIME"]:
            sent.append(names)
        return original(self, command, check_health)
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    return sent


def test_an_idle_submissions_pass_takes_three_round_trips(world, sends):
    dispatcher, ledger, started = world
    assert dispatcher.dispatch_pass() == 0  # nothing waits: the cards are kept
    _job(ledger, 2)
    assert dispatcher.dispatch_pass() == 1  # the scripts' first use loads them (a fresh Redis)
    for _ in range(6):
        _job(ledger, 2)
        sends.clear()
        assert dispatcher.dispatch_pass() == 1
        assert len(sends) == 3, sends  # the reads' pipeline, the heads' fields, the reservation
        assert sends[0][:2] == ["SMEMBERS", "EVALSHA"] and "ZRANGEBYSCORE" in sends[0]
        assert "SCRIPT" not in {name for names in sends for name in names}, sends


def test_a_card_set_that_changed_is_read_again(world):
    dispatcher, ledger, started = world
    assert dispatcher.dispatch_pass() == 0  # the 8 cards are kept
    add_cards(ledger, 1, 160, node="n2", uuid="big")
    _job(ledger, 120)  # fits the new card only
    assert dispatcher.dispatch_pass() == 1
    assert started[-1][2:] == ("n2", 0)


def test_pending_users_other_than_the_last_ones_are_read(world):
    dispatcher, ledger, started = world
    dispatcher.settings = dispatcher.settings.model_copy(update={"hold_after_seconds": 3600.0})
    for index in range(8):  # every card nearly full: nothing of 40 GiB starts, every head is read
        for _ in range(2):
            ok, token = ledger.reserve(_job(ledger, 39, "filler"), "n1", [index], 39 * GIB, user="filler")
            assert ok, token
    alone = _job(ledger, 40, "alice")
    assert dispatcher.dispatch_pass() == 0 and dispatcher._users_read == ["alice"]
    for user in ("bob", "carol"):
        _job(ledger, 40, user)
    assert dispatcher.dispatch_pass() == 0
    assert dispatcher._users_read == ["alice", "bob", "carol"]
    assert {j.user for j in dispatcher._read_waiting()} == {"alice", "bob", "carol"}
    small = _job(ledger, 1, "dave")  # a fourth user, unknown to the guess: its job starts
    assert dispatcher.dispatch_pass() == 1 and started[-1][0] == small
    ledger.transition(alone, JobState.CANCELLED, expect=JobState.PENDING)
    assert dispatcher.dispatch_pass() == 0 and dispatcher._users_read == ["bob", "carol"]


def test_scripts_redis_lost_are_loaded_again(world):
    dispatcher, ledger, started = world
    assert dispatcher.dispatch_pass() == 0
    ledger.r.script_flush()
    first = _job(ledger, 2)
    assert dispatcher.dispatch_pass() == 1 and started[-1][0] == first
    ledger.r.script_flush()
    assert dispatcher._read_fields([ledger.keys.job(first)], ("user",)) == [["alice"]]


def test_the_leader_check_rides_in_the_first_reads(world, sends):
    dispatcher, ledger, started = world
    keys = ledger.keys
    assert dispatcher._lead() and dispatcher._leading
    _job(ledger, 2)
    assert dispatcher.dispatch_pass() == 1  # the cards are kept, the scripts loaded
    ledger.r.rpush(keys.sched_wake, "1")
    job = _job(ledger, 2)
    sends.clear()
    assert dispatcher.dispatch_pass(check_lead=True) == 1 and started[-1][0] == job
    assert len(sends) == 3 and sends[0][:2] == ["DEL", "EVAL"], sends
    assert not ledger.r.exists(keys.sched_wake)  # drained in the same round trip
    ledger.r.set(keys.sched_leader, "someone else")
    _job(ledger, 2)
    assert dispatcher.dispatch_pass(check_lead=False) == 0 and not dispatcher._leading
    assert len(started) == 2


def test_reasons_are_written_after_redis_lost_the_scripts(world):
    """The reasons go in one write_reasons.lua call by SHA: Redis that lost its scripts (a
    restart, SCRIPT FLUSH) gets it loaded again and the reasons written, not a failed pass."""
    dispatcher, ledger, started = world
    for _ in range(8):
        _job(ledger, 75)  # one on each card: 5 GiB left on each
    assert dispatcher.dispatch_pass() == 8
    ledger.r.script_flush()
    waiting = _job(ledger, 10)
    assert dispatcher.dispatch_pass() == 0
    assert ledger.r.hget(ledger.keys.job(waiting), "wait_reason")
    assert ledger.r.hget(ledger.keys.job(waiting), "wait_reason_at")
