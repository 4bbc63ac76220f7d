"""A card's reserved/jobs counters are its reservations' sum and count (lib_card.lua's
card_recount). An operator who "frees a leak" with `HSET card reserved 0 jobs 0` must not make
rig put more on the card than it holds (a tester's run: four 35 GiB jobs on a 76 GiB card), nor
leave negative counters once the jobs end; a reading puts the counters right within one tick."""

from __future__ import annotations

import time

from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards


def _card(ledger: Ledger) -> None:
    add_cards(ledger, 1, 80, uuid="GPU-n1-0", reserve_fraction=0.05)


def _job(ledger: Ledger, size: int) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=size, gpus=1, max_retries=0,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time(),
    )).id


def _placed(ledger: Ledger, size: int) -> tuple[int, str]:
    job_id = _job(ledger, size)
    ok, token = ledger.reserve(job_id, "n1", [0], size, user="u")
    assert ok, token
    return job_id, token


def _zero_counters(ledger: Ledger) -> None:
    ledger.r.hset(ledger.keys.card("n1", 0), mapping={"reserved": 0, "jobs": 0})


def test_a_card_whose_counters_were_zeroed_by_hand_takes_no_more_than_it_holds(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    _card(ledger)
    placed = [_placed(ledger, 35 * GIB) for _ in range(2)]
    _zero_counters(ledger)
    ok, detail = ledger.reserve(_job(ledger, 35 * GIB), "n1", [0], 35 * GIB, user="u")
    assert not ok and detail.startswith("card-full"), detail
    card = ledger.card("n1", 0)
    assert (card.reserved, card.jobs) == (70 * GIB, 2)
    for job_id, token in placed:  # they end: nothing below zero, nothing left
        assert ledger.transition(job_id, JobState.SUCCEEDED, token=token)[0] == 1
    card = ledger.card("n1", 0)
    assert (card.reserved, card.jobs) == (0, 0)


def test_a_release_after_a_hand_edit_never_goes_below_what_is_still_reserved(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    _card(ledger)
    (first, token), _second = _placed(ledger, 30 * GIB), _placed(ledger, 20 * GIB)
    _zero_counters(ledger)
    assert ledger.transition(first, JobState.SUCCEEDED, token=token)[0] == 1
    card = ledger.card("n1", 0)
    assert (card.reserved, card.jobs) == (20 * GIB, 1)


def test_a_reading_puts_hand_edited_counters_right_and_moves_the_version(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    _card(ledger)
    _placed(ledger, 35 * GIB)
    reading = GpuReading(index=0, uuid="GPU-n1-0", model="m", total=80 * GIB, used=0)
    assert ledger.record_reading("n1", reading) is False  # nothing to correct
    _zero_counters(ledger)
    version = ledger.r.hget(ledger.keys.card("n1", 0), "version")
    assert ledger.record_reading("n1", reading) is True
    card = ledger.card("n1", 0)
    assert (card.reserved, card.jobs) == (35 * GIB, 1)
    assert ledger.r.hget(ledger.keys.card("n1", 0), "version") != version


def test_garbage_in_a_counter_is_left_for_the_card_rule_to_refuse(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    _card(ledger)
    ledger.r.hset(ledger.keys.card("n1", 0), "reserved", "lots")
    ok, detail = ledger.reserve(_job(ledger, GIB), "n1", [0], GIB, user="u")
    assert not ok and detail.startswith("card-invalid"), detail
    assert ledger.r.hget(ledger.keys.card("n1", 0), "reserved") == "lots"
