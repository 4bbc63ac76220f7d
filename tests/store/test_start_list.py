"""The start list (workers.start_list): a reservation pushes its start in the same script, and
the taking list's moves (fakeredis and real Redis)."""

from __future__ import annotations

import time

import pytest

from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.start_list import Start, StartList, entry


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(2, 40, max_jobs=1)


def submit(ledger: Ledger, gpus: int = 1) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=gpus, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time())).id


def test_a_reservation_pushes_its_start_onto_its_first_card(ledger):
    first, second = StartList(ledger.r, ledger.keys, "n1", 0), StartList(ledger.r, ledger.keys, "n1", 1)
    multi = submit(ledger, gpus=2)
    ok, token = ledger.reserve(multi, "n1", [1, 0], GIB)
    assert ok
    assert second.listed() == ([entry(multi, token)], []) and first.listed() == ([], [])
    # A refused reservation (the cards are busy now) pushes nothing.
    other = submit(ledger)
    ok, reason = ledger.reserve(other, "n1", [0], GIB)
    assert not ok and reason.startswith("card-busy")
    assert first.listed() == ([], []) and second.listed() == ([entry(multi, token)], [])


def test_taken_starts_go_back_to_the_head_once(ledger):
    starts = StartList(ledger.r, ledger.keys, "n1", 0)
    for job_id in (1, 2, 3):
        starts.push(job_id, "1")
    assert starts.take() == "1 1" and starts.take() == "2 1"
    assert starts.listed() == (["3 1"], ["1 1", "2 1"])
    assert starts.put_back(["1 1", "2 1"]) == 2
    assert starts.listed() == (["1 1", "2 1", "3 1"], [])  # in their order, ahead of the rest
    assert starts.put_back(["1 1"]) == 0  # not taken: never a second copy
    assert starts.take() == "1 1"
    starts.release("1 1")
    assert starts.listed() == (["2 1", "3 1"], [])


def test_an_entry_parses_or_is_refused():
    assert Start.parse("12 3") == Start(12, "3")
    assert Start.parse(entry(12, 3)) == Start(12, "3")
    for bad in ("", "12", "12 ", "x 3", "12 3 4", "-1 3"):
        assert Start.parse(bad) is None


@pytest.mark.parametrize(("joined", "in_redis"), [
    (None, None), (None, "inst-a"), ("inst-a", "inst-a"), ("inst-a", None), ("inst-a", "inst-b")])
def test_the_claim_refuses_exactly_where_the_installation_verdict_is_a_mismatch(ledger, joined, in_redis):
    """claim.lua's installation check mirrors rig.installation.verdict(...).mismatch."""
    from rig.installation import verdict

    if in_redis is not None:
        ledger.r.hset(ledger.keys.installation, "id", in_redis)
    job_id = submit(ledger)
    ok, token = ledger.reserve(job_id, "n1", [0], GIB)
    assert ok
    ledger.load_scripts()  # queued as EVALSHA: loaded first
    pipe = ledger.r.pipeline(transaction=False)
    ledger.queue_claim(pipe, job_id, token, "w", joined)
    claimed, detail = ledger.claim_answer(pipe.execute()[0])
    mismatch = verdict(joined, in_redis).mismatch
    assert (detail == "installation-mismatch") is mismatch
    assert claimed is not mismatch
    assert ledger.store.get(job_id).state is (JobState.ASSIGNED if mismatch else JobState.RUNNING)
