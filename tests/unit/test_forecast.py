"""The start-time simulation (rig.forecast.simulate) on hand-made cards and jobs: the
dispatcher's order, card rule and holds replayed at each expected end. No Redis is used."""

from __future__ import annotations

import math
import time

import fakeredis
import pytest

from rig.config import load_settings
from rig.fairshare import TeamState
from rig.forecast import CAVEAT, NO_CARD_OPEN, NO_RUNS, StartEstimate, simulate
from rig.memory import GIB
from rig.models import CardState, Priority
from rig.placement import Release
from workers.dispatcher import Dispatcher, Waiting

NOW = 1_800_000_000.0


@pytest.fixture
def dispatcher(tmp_path) -> Dispatcher:
    settings = load_settings(key_prefix="forecast-unit:", node_name="n1", home=tmp_path, fair_share=False)
    return Dispatcher(settings, lambda *a: None, client=fakeredis.FakeRedis(decode_responses=True))


def card(index: int, used_gib: int, *, jobs: int = 0, total_gib: int = 80, healthy: bool = True) -> CardState:
    return CardState(node="n1", index=index, total=total_gib * GIB, usable=total_gib * GIB,
                     reserved=used_gib * GIB, jobs=jobs, max_jobs=4, healthy=healthy)


def job(jid: int, gib: int, *, gpus: int = 1, priority: Priority = Priority.MEDIUM,
        runs: float | None = 60.0) -> Waiting:
    return Waiting(jid, gpu_memory=gib * GIB, gpus=gpus, priority=priority, created_at=NOW - 1,
                   wait_reason=None, user="u", expected_seconds=runs)


def ends(**per_card: list[tuple[float, int]]) -> dict[str, list[Release]]:
    """``n1_0=[(seconds from NOW, GiB)]`` -> releases by card id."""
    return {cid.replace("_", "/"): [Release(NOW + after, gib * GIB) for after, gib in rs]
            for cid, rs in per_card.items()}


def test_a_job_that_fits_beside_a_running_one_starts_now(dispatcher):
    got = simulate(dispatcher, [card(0, 40, jobs=1)], ends(n1_0=[(100, 40)]), TeamState(), [job(1, 30)], NOW)
    assert got[1].at == NOW


def test_a_job_behind_a_two_card_job_waits_for_it_to_end(dispatcher):
    # Two cards, each half taken by a running job (ends in 100 s and 200 s). A high-priority
    # 2-card job needs both whole: it holds them and starts at 200 s. The 1-card job behind it
    # (500 s long, so it cannot backfill in front) starts when the 2-card job ends (+60 s), not
    # at 100 s on the first card freed, which would delay the 2-card job.
    cards = [card(0, 40, jobs=1), card(1, 40, jobs=1)]
    big = job(1, 80, gpus=2, priority=Priority.HIGH)
    small = job(2, 80, runs=500.0)
    got = simulate(dispatcher, cards, ends(n1_0=[(100, 40)], n1_1=[(200, 40)]), TeamState(), [small, big], NOW)
    assert got[1].at == NOW + 200
    assert got[2].at == NOW + 260


def test_a_short_job_backfills_in_front_of_a_held_card(dispatcher):
    # The same, but the 1-card job has a time limit that surely ends it before 200 s: it starts
    # on card 0 at 100 s without delaying the held 2-card job.
    cards = [card(0, 40, jobs=1), card(1, 40, jobs=1)]
    small = Waiting(2, gpu_memory=80 * GIB, gpus=1, priority=Priority.MEDIUM, created_at=NOW - 1,
                    wait_reason=None, user="u", expected_seconds=30.0, time_limit=30.0)
    got = simulate(dispatcher, cards, ends(n1_0=[(100, 40)], n1_1=[(200, 40)]), TeamState(),
                   [small, job(1, 80, gpus=2, priority=Priority.HIGH)], NOW)
    assert got[2].at == NOW + 100 and got[1].at == NOW + 200


def test_run_order_is_the_dispatchers_largest_first(dispatcher):
    # One free 80 GiB card, two medium jobs of 50 and 60 GiB: largest-first puts 60 GiB first.
    got = simulate(dispatcher, [card(0, 0)], {}, TeamState(), [job(1, 50), job(2, 60, runs=90.0)], NOW)
    assert got[2].at == NOW and got[1].at == NOW + 90


def test_a_wait_on_an_end_nobody_can_estimate_has_no_time(dispatcher):
    got = simulate(dispatcher, [card(0, 60, jobs=1)], ends(n1_0=[(math.inf, 60)]), TeamState(),
                   [job(1, 30), job(2, 20, runs=None), job(3, 10)], NOW)
    assert got[2].at == NOW  # fits beside it now (largest first); its own run time is unknown ...
    assert got[1].at is None and got[1].why_none == NO_RUNS  # ... and so is the end it waits for
    assert got[3].at is None and got[3].why_none == NO_RUNS  # the card is full behind the unknown one


def test_a_job_that_never_fits_or_has_no_open_card_says_why(dispatcher):
    got = simulate(dispatcher, [card(0, 0)], {}, TeamState(), [job(1, 100)], NOW)
    assert got[1].at is None and got[1].why_none.startswith("never: needs 100.0 GiB")
    got = simulate(dispatcher, [card(0, 0, healthy=False)], {}, TeamState(), [job(1, 10)], NOW)
    assert got[1].why_none == NO_CARD_OPEN


def test_every_view_labels_it_an_estimate():
    now = time.time()
    later = StartEstimate(1, now + 25 * 60)
    assert later.sentence(now).startswith("~") and f"in ~25 min; {CAVEAT}" in later.sentence(now)
    assert later.short(now).startswith("~")
    assert StartEstimate(1, now).sentence(now) == "now (waiting for the dispatcher's next pass)"
    assert StartEstimate(1, None, NO_RUNS).sentence(now) == f"unknown ({NO_RUNS})"
    assert StartEstimate(1, None, later=True).short(now) == "later"


def test_a_stored_estimate_that_passed_is_overdue_not_now():
    """A tester saw "now (waiting for the dispatcher's next pass)" for a job blocked by full
    cards: its stored estimate (made earlier) had passed while the jobs ahead ran on."""
    made = time.time()
    passed = StartEstimate(1, made + 20)
    now = made + 42
    assert passed.short(now, made) == "overdue"
    assert passed.sentence(now, made).startswith("overdue: expected ~") and "running longer" in passed.sentence(now, made)
    # Startable when the forecast was made: it is waiting for the next pass.
    assert StartEstimate(1, made).short(now, made) == "now"
    assert StartEstimate(1, made).sentence(now, made) == "now (waiting for the dispatcher's next pass)"
    # Still ahead: a time.
    assert StartEstimate(1, now + 60).short(now, made).startswith("~")


def test_beyond_the_passes_replayed_a_job_starts_after_the_next_end(dispatcher, monkeypatch):
    import rig.forecast

    monkeypatch.setattr(rig.forecast, "MAX_PASSES", 1)  # only the pass at NOW is replayed
    got = simulate(dispatcher, [card(0, 70, jobs=1)], ends(n1_0=[(100, 70)]), TeamState(), [job(1, 40)], NOW)
    assert got[1].at is None and got[1].after == NOW + 100  # nothing frees room before that end
    assert got[1].sentence(NOW).startswith("after ~") and CAVEAT in got[1].sentence(NOW)


def test_a_user_limit_is_lifted_by_the_simulated_end_of_their_job(tmp_path):
    settings = load_settings(key_prefix="forecast-unit:", node_name="n1", home=tmp_path, max_jobs_per_user=1)
    dispatcher = Dispatcher(settings, lambda *a: None, client=fakeredis.FakeRedis(decode_responses=True))
    got = simulate(dispatcher, [card(0, 0)], {}, TeamState(), [job(1, 10, runs=30.0), job(2, 10)], NOW)
    assert got[1].at == NOW and got[2].at == NOW + 30  # room for both, but one job at a time


def test_no_card_open_names_the_pool_only_of_a_pool_job():
    from rig.forecast import no_card_open

    assert no_card_open(None) == NO_CARD_OPEN and "pool" not in NO_CARD_OPEN
    assert "no card of pool 'a100' that could hold it" in no_card_open("a100")
