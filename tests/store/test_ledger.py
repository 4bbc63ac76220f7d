"""The ledger and the job store, on fakeredis[lua] and on real Redis (one parametrised fixture)."""

from __future__ import annotations

import threading
import time

import pytest

from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.store import JobStore
from tests.store.conftest import add_cards, ledger_with_cards


def make_job(store: JobStore, gib: int = 10, priority: Priority = Priority.MEDIUM, gpus: int = 1) -> Job:
    return store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=gib * GIB, gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=time.time(),
    ))


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(2, 100, max_jobs=2, reserve_fraction=0.2)


def test_register_keeps_reservations(ledger):
    job = make_job(ledger.store, 30)
    ok, _ = ledger.reserve(job.id, "n1", [0], job.gpu_memory)
    assert ok
    add_cards(ledger, 1, 100, max_jobs=2, reserve_fraction=0.2)
    card = ledger.card("n1", 0)
    assert card.usable == 80 * GIB and card.reserved == 30 * GIB and card.jobs == 1


def test_store_create_get_list_and_indexes(ledger):
    store = ledger.store
    a = make_job(store, priority=Priority.LOW)
    b = make_job(store, priority=Priority.HIGH)
    c = make_job(store, priority=Priority.MEDIUM)
    assert store.get(a.id).priority is Priority.LOW
    assert [j.id for j in store.list(JobState.PENDING)] == [c.id, b.id, a.id]
    assert store.pending_head(3) == [b.id, c.id, a.id]  # strict priority, then FIFO
    assert store.pending_counts() == {Priority.HIGH: 1, Priority.MEDIUM: 1, Priority.LOW: 1}
    assert store.count_by_state()[JobState.PENDING] == 3
    assert store.pending_position(a.id) == 2


def test_reserve_respects_memory_cap(ledger):
    store = ledger.store
    first, second = make_job(store, 50), make_job(store, 31)
    assert ledger.reserve(first.id, "n1", [0], first.gpu_memory)[0]
    ok, reason = ledger.reserve(second.id, "n1", [0], second.gpu_memory)
    assert not ok and reason.startswith("card-full")
    assert store.get(second.id).state is JobState.PENDING  # untouched
    assert ledger.card("n1", 0).reserved == 50 * GIB


def test_reserve_respects_job_cap(ledger):
    store = ledger.store
    jobs = [make_job(store, 1) for _ in range(3)]
    assert ledger.reserve(jobs[0].id, "n1", [0], GIB)[0]
    assert ledger.reserve(jobs[1].id, "n1", [0], GIB)[0]
    ok, reason = ledger.reserve(jobs[2].id, "n1", [0], GIB)
    assert not ok and reason.startswith("card-busy")


def test_reserve_refuses_card_outside_whitelist_and_unhealthy(ledger):
    add_cards(ledger, 1, 100, max_jobs=2, first=5, allowed=False)
    job = make_job(ledger.store, 1)
    assert ledger.reserve(job.id, "n1", [5], GIB)[1].startswith("card-not-allowed")
    ledger.set_healthy("n1", 1, False, "too hot")
    assert ledger.reserve(job.id, "n1", [1], GIB)[1].startswith("card-unhealthy")


def test_multi_card_reservation_is_all_or_nothing(ledger):
    store = ledger.store
    filler = make_job(store, 70)
    assert ledger.reserve(filler.id, "n1", [1], filler.gpu_memory)[0]
    big = make_job(store, 20, gpus=2)
    ok, _ = ledger.reserve(big.id, "n1", [0, 1], big.gpu_memory)
    assert not ok
    assert ledger.card("n1", 0).reserved == 0  # card 0 was not half-taken


def test_claim_is_fenced_by_token(ledger):
    job = make_job(ledger.store)
    ok, token = ledger.reserve(job.id, "n1", [0], job.gpu_memory)
    assert ledger.claim(job.id, "999", "w")[0] is False
    ok, attempt = ledger.claim(job.id, token, "w")
    assert ok and attempt == "1"
    again, state = ledger.claim(job.id, token, "w2")  # a duplicate delivery
    assert not again and state == "RUNNING"
    assert ledger.store.get(job.id).worker == "w"


def test_transition_releases_once(ledger):
    job = make_job(ledger.store, 40, gpus=2)
    ok, token = ledger.reserve(job.id, "n1", [0, 1], job.gpu_memory)
    ledger.claim(job.id, token, "w")
    code, prev = ledger.transition(job.id, JobState.SUCCEEDED, token=token, fields={"exit_code": 0})
    assert (code, prev) == (1, "RUNNING")
    for i in (0, 1):
        card = ledger.card("n1", i)
        assert card.reserved == 0 and card.jobs == 0
        assert ledger.holdings("n1", i) == {}
    code, state = ledger.transition(job.id, JobState.FAILED, token=token)
    assert (code, state) == (0, "SUCCEEDED")  # terminal: nothing changes, nothing released twice
    assert ledger.card("n1", 0).reserved == 0
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0 and done.ended_at
    assert ledger.store.ids_in_state(JobState.SUCCEEDED) == [job.id]
    assert ledger.store.ids_in_state(JobState.RUNNING) == []


def test_stale_token_cannot_end_a_job(ledger):
    job = make_job(ledger.store)
    ok, token = ledger.reserve(job.id, "n1", [0], job.gpu_memory)
    code, detail = ledger.transition(job.id, JobState.FAILED, token="41")
    assert code == 0 and detail.startswith("token")
    assert ledger.card("n1", 0).reserved == job.gpu_memory


def test_cancel_pending_assigned_running(ledger):
    store = ledger.store
    pending, assigned, running = make_job(store), make_job(store), make_job(store)
    _, t1 = ledger.reserve(assigned.id, "n1", [0], assigned.gpu_memory)
    _, t2 = ledger.reserve(running.id, "n1", [1], running.gpu_memory)
    ledger.claim(running.id, t2, "w")
    assert ledger.transition(pending.id, JobState.CANCELLED, mode="cancel")[0] == 1
    assert store.pending_head(10) == []
    assert ledger.transition(assigned.id, JobState.CANCELLED, mode="cancel")[0] == 1
    assert ledger.card("n1", 0).reserved == 0
    assert ledger.claim(assigned.id, t1, "w")[0] is False  # a late start message does nothing
    assert ledger.transition(running.id, JobState.CANCELLED, mode="cancel") == (2, "RUNNING")
    assert store.get(running.id).cancel_requested
    assert ledger.card("n1", 1).reserved == running.gpu_memory  # the worker releases it


def test_requeue_puts_job_back_in_order(ledger):
    store = ledger.store
    a, b = make_job(store), make_job(store)
    _, token = ledger.reserve(a.id, "n1", [0], a.gpu_memory)
    ledger.transition(a.id, JobState.PENDING, token=token)
    assert store.pending_head(2) == [a.id, b.id]
    assert ledger.card("n1", 0).reserved == 0
    assert store.get(a.id).node is None


@pytest.mark.redis
def test_concurrent_reservations_never_oversubscribe(real_redis, key_prefix):
    """Many threads race for one card's last gigabytes: the cap holds, nothing leaks."""
    ledger = ledger_with_cards(real_redis, key_prefix, 1, 100, max_jobs=1000, uuid="u")
    jobs = [make_job(ledger.store, 7) for _ in range(60)]
    barrier = threading.Barrier(12)
    won: list[int] = []
    lock = threading.Lock()

    def racer(chunk: list[Job]) -> None:
        import redis as redis_lib

        from tests.conftest import REDIS_URL

        # Each racer has its own connection, as separate dispatcher processes would.
        mine = Ledger(redis_lib.Redis.from_url(REDIS_URL, decode_responses=True), Keys(key_prefix))
        barrier.wait()
        for job in chunk:
            if mine.reserve(job.id, "n1", [0], job.gpu_memory)[0]:
                with lock:
                    won.append(job.id)

    threads = [threading.Thread(target=racer, args=(jobs[i::12],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    card = ledger.card("n1", 0)
    assert len(won) == 14  # floor(100 / 7)
    assert card.reserved == 14 * 7 * GIB <= card.usable
    assert sorted(ledger.holdings("n1", 0)) == sorted(won)


def test_store_fields_reads_some_fields_with_the_same_checks_as_get(ledger):
    from rig.errors import JobNotFound

    job = make_job(ledger.store)
    ledger.r.hset(ledger.keys.job(job.id), mapping={"gpus": "x"})
    part = ledger.store.fields(job.id, "user", "gpu_memory")
    assert (part.user, part.gpu_memory, part.problems) == ("u", 10 * GIB, [])
    assert ledger.store.fields(job.id, "gpus").problems == [ledger.store.get(job.id).problems[0]]
    with pytest.raises(JobNotFound):
        ledger.store.fields(10**6, "user")


def test_cards_of_one_node_and_reservations_of_many_cards_in_one_read(ledger):
    """Issue 15: a node's checks read its own cards; status and the health pass read every
    card's reservations in one round trip (rig.hashes)."""
    add_cards(ledger, 1, 40, node="n2", max_jobs=2, uuid="v{index}")
    assert [c.id for c in ledger.cards("n2")] == ["n2/0"]
    assert [c.id for c in ledger.cards()] == ["n1/0", "n1/1", "n2/0"]
    job = make_job(ledger.store)
    assert ledger.reserve(job.id, "n1", [1], 10 * GIB)[0]
    assert ledger.holdings_of(ledger.cards()) == {"n1/0": {}, "n1/1": {job.id: 10 * GIB}, "n2/0": {}}
