"""The mixed-load benchmark's trace generator and metrics (rig.testing.trace): pure functions."""

from __future__ import annotations

import math

import pytest

from rig.testing.trace import (
    GIB,
    LowerBound,
    RunRecord,
    TraceJob,
    generate_trace,
    greedy_makespan,
    interval_oversubscription,
    job_command,
    lower_bound,
    makespan,
    percentile,
    refill_gaps,
    snapshot_over,
    vram_time_utilisation,
    waits_by_priority,
)


def rec(start: float | None, end: float | None, *, created: float = 0.0, gib: int = 10,
        cards: tuple[int, ...] = (0,), priority: str = "low", node: str = "n") -> RunRecord:
    return RunRecord(priority=priority, gpu_memory=gib * GIB, gpus=len(cards), cards=cards,
                     created_at=created, started_at=start, ended_at=end, state="SUCCEEDED",
                     node=node)


# -- trace -------------------------------------------------------------------------------------
def test_trace_is_seeded_and_has_the_requested_mix() -> None:
    trace = generate_trace(200, 8)
    assert trace == generate_trace(200, 8)
    assert trace != generate_trace(200, 9)
    assert len(trace) == 200 and sorted(j.index for j in trace) == list(range(200))
    kinds = [j.kind for j in trace]
    counts = (kinds.count("inference"), kinds.count("finetune"), kinds.count("large"))
    assert counts == (100, 64, 36)
    prios = [j.priority for j in trace]
    assert (prios.count("high"), prios.count("medium"), prios.count("low")) == (40, 80, 80)
    assert sum(1 for j in trace if j.gpus == 2) == 20
    assert all(j.kind != "inference" for j in trace if j.gpus == 2)
    assert sum(1 for j in trace if j.arrival == 0.0) == 100
    assert all(0.0 < j.arrival <= 20.0 for j in trace if j.arrival != 0.0)
    assert [j.arrival for j in trace] == sorted(j.arrival for j in trace)


def test_trace_sizes_stay_within_their_kind_and_the_card() -> None:
    ranges = {"inference": (2, 8), "finetune": (12, 30), "large": (40, 76)}
    for job in generate_trace(500, 3):
        lo, hi = ranges[job.kind]
        assert job.gpu_memory % GIB == 0 and lo <= job.gpu_memory // GIB <= hi
        assert job.gpu_memory <= 76 * GIB and job.duration > 0
    assert all(j.gpu_memory <= 50 * GIB for j in generate_trace(100, 1, max_gib_per_card=50))


def test_trace_edge_cases() -> None:
    assert generate_trace(0, 1) == []
    assert all(j.arrival == 0.0 for j in generate_trace(10, 1, burst_fraction=1.0))
    assert all(j.arrival > 0.0 for j in generate_trace(10, 1, burst_fraction=0.0))
    with pytest.raises(ValueError):
        generate_trace(10, 1, burst_fraction=1.5)
    with pytest.raises(ValueError):
        generate_trace(-1, 1)


def test_job_command_uses_its_memory_on_every_card_and_sleeps() -> None:
    job = TraceJob(3, "large", 40 * GIB, 2, "high", 1.0, 2.5)
    command = job_command(job)
    assert f"echo {40 * GIB}" in command and "sleep 2.50" in command
    assert '"$RIG_FAKE_GPU_DIR/$c/$$"' in command and "CUDA_VISIBLE_DEVICES" in command
    assert "rm -f" in command and "python" not in command


# -- lower bound -------------------------------------------------------------------------------
def test_lower_bound_takes_the_largest_of_three() -> None:
    jobs = [TraceJob(0, "large", 40 * GIB, 2, "low", 0.0, 10.0),
            TraceJob(1, "inference", 4 * GIB, 1, "low", 5.0, 2.0)]
    bound = lower_bound(jobs, cards=2, usable_per_card=80 * GIB, max_jobs_per_card=4)
    assert bound.memory_time == pytest.approx((40 * 2 * 10 + 4 * 2) / 160)
    assert bound.job_time == pytest.approx((2 * 10 + 2) / 8)
    assert bound.arrival == pytest.approx(10.0)
    assert bound.value == pytest.approx(10.0) and bound.binding == "arrival"
    assert LowerBound(3.0, 1.0, 2.0).binding == "memory-time"
    assert LowerBound(1.0, 3.0, 2.0).value == 3.0
    with pytest.raises(ValueError):
        lower_bound(jobs, cards=0, usable_per_card=1, max_jobs_per_card=1)


def test_the_bounds_count_from_the_first_arrival_as_a_runs_makespan_does() -> None:
    """A trace whose first job arrives at 2 s (`bench_peers.py --jobs 1`): measured from the first
    submission a perfect run took 2.3 s, and the table said "x 0.44" of a bound counted from 0."""
    jobs = [TraceJob(0, "inference", 3 * GIB, 1, "low", 2.0, 2.3)]
    kw = {"cards": 8, "usable_per_card": 76 * GIB, "max_jobs_per_card": 4}
    bound = lower_bound(jobs, **kw)
    assert bound.arrival == pytest.approx(2.3) and bound.value == pytest.approx(2.3)
    assert greedy_makespan(jobs, **kw) == pytest.approx(2.3)
    for seed in (3, 5, 8):  # the smallest traces the benchmarks allow: at least the bound, never below
        trace = generate_trace(1, seed)
        assert lower_bound(trace, **kw).value == pytest.approx(trace[0].duration)
        assert lower_bound(trace, **kw).value <= greedy_makespan(trace, **kw) + 1e-9


# -- metrics -----------------------------------------------------------------------------------
def test_percentile_interpolates() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)
    assert percentile([5.0], 0.99) == 5.0
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_makespan_waits_and_utilisation() -> None:
    records = [rec(1.0, 5.0, created=0.0, priority="high"),
               rec(3.0, 9.0, created=2.0, gib=20, cards=(0, 1), priority="low"),
               rec(None, None, created=4.0, priority="medium")]
    assert makespan(records) == pytest.approx(9.0)
    assert math.isnan(makespan([])) and math.isnan(makespan([rec(None, None)]))
    waits = waits_by_priority(records)
    assert waits == {"high": [1.0], "medium": [], "low": [1.0]}
    # 10 GiB x 4 s + 20 GiB x 2 cards x 6 s = 280 GiB s over 2 x 80 GiB x 10 s
    util = vram_time_utilisation(records, capacity_bytes=160 * GIB, span_s=10.0)
    assert util == pytest.approx(280 / 1600)
    assert math.isnan(vram_time_utilisation(records, capacity_bytes=160 * GIB, span_s=0.0))


def test_interval_oversubscription_by_memory_and_by_count() -> None:
    usable = 76 * GIB
    fine = [rec(0.0, 5.0, gib=40), rec(5.0, 9.0, gib=40), rec(1.0, 4.0, gib=36)]
    assert interval_oversubscription(fine, usable_per_card=usable, max_jobs_per_card=4) == 0.0
    # 40 + 40 GiB overlap on card 0 for 2 s
    over = [rec(0.0, 5.0, gib=40), rec(3.0, 9.0, gib=40)]
    assert interval_oversubscription(over, usable_per_card=usable, max_jobs_per_card=4) \
        == pytest.approx(2.0)
    # the same jobs on two nodes' card 0: no overlap
    apart = [rec(0.0, 5.0, gib=40, node="a"), rec(3.0, 9.0, gib=40, node="b")]
    assert interval_oversubscription(apart, usable_per_card=usable, max_jobs_per_card=4) == 0.0
    # three small jobs at once, max 2 a card: over for 1 s; a 2-card job counts on both cards
    crowd = [rec(0.0, 3.0, gib=1), rec(1.0, 3.0, gib=1), rec(2.0, 3.0, gib=1)]
    assert interval_oversubscription(crowd, usable_per_card=usable, max_jobs_per_card=2) \
        == pytest.approx(1.0)
    wide = [rec(0.0, 4.0, gib=50, cards=(0, 1)), rec(2.0, 5.0, gib=30, cards=(1,))]
    assert interval_oversubscription(wide, usable_per_card=usable, max_jobs_per_card=4) \
        == pytest.approx(2.0)


def test_refill_gaps_measure_from_the_last_end_on_the_cards() -> None:
    records = [rec(0.0, 4.0, cards=(0,)), rec(0.0, 6.0, cards=(1,)),
               rec(4.3, 8.0, created=0.0, cards=(0,)),  # waited; card 0 freed at 4.0
               rec(6.1, 7.0, created=0.0, cards=(0, 1)),  # waited; last end 6.0 on card 1
               rec(2.05, 3.0, created=2.0, cards=(2,))]  # did not wait
    assert refill_gaps(records) == pytest.approx([0.3, 0.1])
    assert refill_gaps([rec(5.0, 6.0, created=0.0, cards=(3,))]) == []


def test_snapshot_over_flags_cards_beyond_their_limits() -> None:
    cards = [
        {"reserved": "10", "usable": "10", "jobs": "4", "max_jobs": "4"},
        {"reserved": "11", "usable": "10", "jobs": "1", "max_jobs": "4"},
        {"reserved": "0", "usable": "10", "jobs": "5", "max_jobs": "4"},
        {},
    ]
    assert snapshot_over(cards) == [1, 2]


# -- offline reference -----------------------------------------------------------------------------
def tj(index: int, gib: int, duration: float, *, arrival: float = 0.0, gpus: int = 1,
       priority: str = "low") -> TraceJob:
    return TraceJob(index, "x", gib * GIB, gpus, priority, arrival, duration)


def greedy(jobs: list[TraceJob], *, cards: int = 1, max_jobs: int = 4,
           holds: bool = False) -> float:
    return greedy_makespan(jobs, cards=cards, usable_per_card=76 * GIB,
                           max_jobs_per_card=max_jobs, holds=holds)


def test_greedy_packs_by_memory_and_job_count() -> None:
    assert greedy([]) == 0.0
    assert greedy([tj(0, 10, 2.0, arrival=3.0)]) == pytest.approx(2.0)  # from the first arrival, as a run's
    assert greedy([tj(0, 30, 2.0), tj(1, 30, 3.0)]) == pytest.approx(3.0)  # share the card
    assert greedy([tj(0, 50, 2.0), tj(1, 50, 3.0)]) == pytest.approx(5.0)  # one after the other
    assert greedy([tj(i, 1, 1.0) for i in range(3)], max_jobs=2) == pytest.approx(2.0)
    assert greedy([tj(0, 50, 2.0), tj(1, 50, 3.0)], cards=2) == pytest.approx(3.0)
    assert greedy([tj(0, 80, 1.0)]) == 0.0  # never fits: left out
    assert greedy([tj(0, 80, 1.0, arrival=3.0)]) == 0.0


def test_greedy_holds_keep_cards_for_a_blocked_job() -> None:
    jobs = [tj(0, 40, 10.0), tj(1, 40, 2.0),
            tj(2, 50, 1.0, arrival=1.0, gpus=2, priority="high"), tj(3, 30, 10.0, arrival=1.0)]
    # without holds the small job slips in at 1 s and the high job waits for it (ends at 12 s);
    # with holds the high job starts when card 0 frees at 10 s and the small one after it
    assert greedy(jobs, cards=2) == pytest.approx(12.0)
    assert greedy(jobs, cards=2, holds=True) == pytest.approx(21.0)


def test_greedy_is_at_least_the_lower_bound() -> None:
    trace = generate_trace(200, 8)
    kw = {"cards": 8, "usable_per_card": 76 * GIB, "max_jobs_per_card": 4}
    bound = lower_bound(trace, **kw).value
    assert bound <= greedy_makespan(trace, **kw)
    assert bound <= greedy_makespan(trace, holds=True, **kw)


def test_simulated_backfill_lets_a_short_job_use_a_held_card() -> None:
    from rig.testing.trace import Policy, simulate

    # Card 0 runs a 40 GiB job for 10 s; a 50 GiB high job arriving at 1 s must wait for it
    # and holds card 0 (card 1 runs a 60 GiB job for 20 s). A 30 GiB, 2 s low job arriving at
    # 1 s fits beside the 40 GiB one: a closed card without backfill, allowed with it (it ends
    # at 3 s, before the shadow time 10 s); a 30 GiB, 15 s one would delay the high job: not.
    jobs = [tj(0, 40, 10.0, priority="medium"), tj(1, 60, 20.0, priority="medium"),
            tj(2, 50, 1.0, arrival=1.0, priority="high"),
            tj(3, 30, 2.0, arrival=1.0), tj(4, 30, 15.0, arrival=1.0)]
    shape = {"cards": 2, "usable_per_card": 76 * GIB, "max_jobs_per_card": 4}
    holds = Policy("holds", hold_after=(0.0, 0.0, 0.0))
    easy = Policy("easy", hold_after=(0.0, 0.0, 0.0), backfill=True)
    _, plain = simulate(jobs, holds, **shape)
    _, backfilled = simulate(jobs, easy, **shape)
    assert sorted(plain["low"]) == pytest.approx([10.0, 10.0])  # both wait until the high job ends
    assert sorted(backfilled["low"]) == pytest.approx([0.0, 10.0])  # the short one starts at once
    assert plain["high"] == backfilled["high"] == pytest.approx([9.0])  # never delayed


def test_busy_utilisation_counts_only_until_the_last_start():
    from rig.testing.trace import RunRecord, busy_utilisation

    gib = 2**30
    # Two cards of 10 GiB (capacity 20 GiB); jobs submitted at 0. One 10 GiB job runs 0-4 s,
    # another starts at 2 s and runs to 10 s: the busy part is 0-2 s, when one card of two
    # was used: 50 %, whatever ran after the last start.
    recs = [RunRecord("low", 10 * gib, 1, (0,), 0.0, 0.0, 4.0, "SUCCEEDED"),
            RunRecord("low", 10 * gib, 1, (1,), 0.0, 2.0, 10.0, "SUCCEEDED")]
    assert busy_utilisation(recs, capacity_bytes=20 * gib) == 0.5
    assert math.isnan(busy_utilisation([], capacity_bytes=20 * gib))
