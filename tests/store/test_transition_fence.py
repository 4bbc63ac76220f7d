"""Ledger.transition is fenced by the job's assignment number: a move computed from a read of
the job's cards never applies after the job was requeued and placed again (ABA on the state).
Deterministic: the racing moves run between transition's read and its script."""

from __future__ import annotations

import time

import pytest

from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority


@pytest.fixture
def ledgers(redis_client, key_prefix, make_ledger) -> tuple[Ledger, Ledger]:
    """Two ledgers on the same keys: the one under test and the racer (a dispatcher, a worker)."""
    return Ledger(redis_client, Keys(key_prefix)), make_ledger(2, 100, max_jobs=2)


def race_after_first_read(ledger: Ledger, race) -> None:  # noqa: ANN001
    """Run ``race()`` right after ``ledger``'s first read of a job, before its script."""
    real_get, done = ledger.store.get, []

    def get(job_id):  # noqa: ANN001, ANN202
        job = real_get(job_id)
        if not done:
            done.append(True)
            race()
        return job

    ledger.store.get = get  # type: ignore[method-assign]


@pytest.mark.parametrize("mode", ["cancel", "end"])
def test_a_kill_without_a_token_racing_a_requeue_and_new_placement_leaks_nothing(ledgers, mode):
    mine, racer = ledgers
    job = racer.store.create(Job(id=0, name="t", user="u", command=["true"], gpu_memory=10 * GIB, gpus=1,
                                 priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                 created_at=time.time()))
    assert racer.reserve(job.id, "n1", [0], 10 * GIB)[0]  # ASSIGNED on card 0, assignment 1

    def requeue_and_place_on_card_1() -> None:
        # Its worker was lost: requeued, then the dispatcher placed it on card 1 (assignment 2).
        assert racer.transition(job.id, JobState.PENDING)[0] == 1
        assert racer.reserve(job.id, "n1", [1], 10 * GIB)[0]

    race_after_first_read(mine, requeue_and_place_on_card_1)
    code, _ = mine.transition(job.id, JobState.CANCELLED, mode=mode, fields={"reason": "killed"})
    assert code == 1
    ended = racer.store.get(job.id)
    assert ended.state is JobState.CANCELLED
    for index in (0, 1):  # the new reservation was released with the job, not leaked
        assert racer.holdings("n1", index) == {}
        card = racer.card("n1", index)
        assert (card.reserved, card.jobs) == (0, 0)


def test_a_caller_expecting_a_state_is_told_the_job_moved(ledgers):
    """With ``expect`` the caller re-reads itself: a changed assignment is (3, state), not a move."""
    mine, racer = ledgers
    job = racer.store.create(Job(id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                                 priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                 created_at=time.time()))
    assert racer.reserve(job.id, "n1", [0], GIB)[0]

    def again() -> None:
        racer.transition(job.id, JobState.PENDING)
        racer.reserve(job.id, "n1", [1], GIB)

    race_after_first_read(mine, again)
    assert mine.transition(job.id, JobState.FAILED, expect=JobState.ASSIGNED) == (3, "ASSIGNED")
    assert racer.store.get(job.id).state is JobState.ASSIGNED
    assert racer.holdings("n1", 1) == {job.id: GIB}
