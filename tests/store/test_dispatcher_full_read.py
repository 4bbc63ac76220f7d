"""The full read every FULL_READ_S (the backstop for a write that moved no card version) keeps
the repeat memo (Dispatcher._full_read): the next pass compares it with everything read afresh,
the cards, their reservations and every placed job's fields, so an idle cluster is not worked
out in full every FULL_READ_S, and a change only the full read can see still is."""
from __future__ import annotations

import pytest

from rig.clock import clock_for
from rig.config import load_settings
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.dispatcher import FULL_READ_S, Dispatcher

NOW = 1_900_000_000.0


@pytest.fixture
def idle(redis_client, key_prefix, make_ledger, monkeypatch):
    """Two full cards (a running job of 30 GiB each), two users' jobs of 36 GiB waiting (fair
    share reads the placed jobs), the clock frozen; the dispatcher's passes until one repeats.
    Yields (dispatcher, ledger, running job ids, the list of _repeats' answers)."""
    r = redis_client
    monkeypatch.setattr(type(clock_for(r)), "now", lambda self, refresh=True: NOW)
    ledger = make_ledger(2, 40, max_jobs=2)

    def make(user: str, gib: int, expected: float | None = None) -> int:
        job = Job(id=0, name="t", user=user, command=["true"], gpu_memory=gib * GIB, gpus=1,
                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=NOW - 60.0,
                  expected_seconds=expected)
        return ledger.store.create_many([(job, None)])[0].id

    running = []
    for index in range(2):
        job = make("ann", 30, 600.0)
        ok, token = ledger.reserve(job, "n1", [index], 30 * GIB, user="ann")
        assert ok, token
        ledger.claim(job, token, f"card{index}@n1")
        running.append(job)
    make("ann", 36)
    make("bob", 36)
    dispatcher = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n1", fair_share=True),
                            lambda *a: None, client=r)
    answers: list[bool] = []
    real = dispatcher._repeats
    dispatcher._repeats = lambda *a: answers.append(real(*a)) or answers[-1]
    for _ in range(4):
        assert dispatcher.dispatch_pass() == 0
    assert answers[-1], answers  # idle: repeated
    assert dispatcher._repeat is not None and dispatcher._repeat.holdings
    return dispatcher, ledger, running, answers


def _full_read_due(dispatcher: Dispatcher) -> None:
    dispatcher._full_read_at -= FULL_READ_S + 1.0


def test_a_full_read_that_finds_everything_as_it_was_still_repeats(idle):
    dispatcher, _ledger, running, answers = idle
    _full_read_due(dispatcher)
    assert dispatcher.dispatch_pass() == 0
    assert answers[-1], "the full read dropped the repeat: the idle pass was worked out in full"
    assert sorted(dispatcher._kept_jobs) == sorted(running)  # the placed jobs' fields, as compared
    assert dispatcher.dispatch_pass() == 0 and answers[-1]


def test_a_placed_jobs_field_written_behind_the_versions_is_seen_at_the_full_read(idle):
    dispatcher, ledger, running, answers = idle
    ledger.r.hset(ledger.keys.job(running[0]), "expected_seconds", "7200")  # moves no card version
    assert dispatcher.dispatch_pass() == 0 and answers[-1]  # kept: unseen until the full read
    _full_read_due(dispatcher)
    assert dispatcher.dispatch_pass() == 0
    assert not answers[-1], "the full read's placed job differs: the pass must be worked out in full"
    assert dispatcher._kept_jobs[running[0]][RUNNING_EXPECTED] == "7200"


def test_reservations_written_behind_the_versions_are_seen_at_the_full_read(idle):
    """Another job in a card's reservations, its record alike (the same CardState object)."""
    dispatcher, ledger, running, answers = idle
    r, keys = ledger.r, ledger.keys
    r.hdel(keys.card_jobs("n1", 0), str(running[0]))
    r.hset(keys.card_jobs("n1", 0), str(running[1]), 30 * GIB)
    _full_read_due(dispatcher)
    assert dispatcher.dispatch_pass() == 0
    assert not answers[-1], "another job holds card 0 now: the pass must be worked out in full"


RUNNING_EXPECTED = 5  # expected_seconds' place in workers.dispatcher.RUNNING_FIELDS
