"""rig.timeline's pure parts: jobs ended per hour from cumulative samples (growth, resets,
hours before the first sample), the memory window, and samples that do not parse."""

from __future__ import annotations

from rig.models import CardState
from rig.timeline import (
    EndedBefore,
    HourCount,
    Sample,
    ended_before_first,
    ended_per_hour,
    memory_series,
    sample_of,
)

HOUR = 3600
T0 = 1_800_000_000 // HOUR * HOUR  # an hour's start


def test_ended_per_hour_is_the_growth_between_samples():
    samples = [Sample(at=T0 + 60 * i, succeeded=10 + i, failed=2) for i in range(3)]
    samples.append(Sample(at=T0 + HOUR + 60, succeeded=20, failed=5, cancelled=1))
    assert ended_per_hour(samples, now=T0 + HOUR + 90) == [
        HourCount(T0, succeeded=2, failed=0, cancelled=0),
        HourCount(T0 + HOUR, succeeded=8, failed=3, cancelled=1)]


def test_a_counter_that_drops_was_reset_and_counts_from_zero():
    """Redis restarted empty: the counters start again at 0; what they hold then is new."""
    samples = [Sample(at=T0, succeeded=50), Sample(at=T0 + 60, succeeded=2), Sample(at=T0 + 120, succeeded=5)]
    assert ended_per_hour(samples, now=T0 + 130)[0].succeeded == 2 + 3


def test_only_known_hours_are_listed_and_at_most_the_window():
    samples = [Sample(at=T0 + 60 * i, succeeded=i) for i in range(0, 30 * 60, 30)]  # 30 h, every 30 min
    hours = ended_per_hour(samples, now=samples[-1].at, hours=24)
    assert len(hours) == 24 and hours[-1].start == samples[-1].at // HOUR * HOUR
    assert ended_per_hour([], now=T0) == []
    assert [h.start for h in ended_per_hour([Sample(at=T0 + 5)], now=T0 + 2 * HOUR)] == [T0, T0 + HOUR, T0 + 2 * HOUR]


def test_memory_series_keeps_the_last_hours():
    samples = [Sample(at=T0 + 60 * i, used=i) for i in range(10 * 60)]
    kept = memory_series(samples, now=samples[-1].at, hours=6)
    assert kept[0].at == samples[-1].at - 6 * HOUR and len(kept) == 6 * 60 + 1


def test_sample_of_sums_cards_and_reads_the_ended_counters():
    cards = [CardState(node="n", index=i, total=100, usable=90, reserved=10 * i, used=None if i else 7)
             for i in range(3)]
    counters = {"ended:SUCCEEDED:": 4, "ended:FAILED:cuda_oom": 2, "ended:TIMEOUT:": 1,
                "ended:CANCELLED:": 3, "submitted": 99, "started": 12}
    sample = sample_of(counters, cards, now=T0 + 75)
    assert sample == Sample(at=T0 + 60, succeeded=4, failed=3, cancelled=3, used=7, reserved=30, usable=270,
                           taken=T0 + 75)


def test_a_member_that_is_not_a_sample_is_skipped():
    assert Sample.decode("not json") is None and Sample.decode("[1, 2]") is None
    assert Sample.decode('{"at": "x"}') is None
    good = Sample(at=T0, succeeded=1)
    assert Sample.decode(good.encode()) == good


def test_jobs_ended_before_the_first_sample_are_said_not_lost():
    """quickstart's 7 jobs end before the health pass writes its first sample: the bars cannot
    place them (when is unknown), so they are given beside the bars (issue 14 item 2, #3)."""
    samples = [Sample(at=T0 + 60, succeeded=6, failed=1), Sample(at=T0 + 120, succeeded=8, failed=1)]
    assert sum(h.succeeded + h.failed for h in ended_per_hour(samples, now=T0 + 130)) == 2
    # Samples that do not say when they were read: by the end of the first one's minute.
    assert ended_before_first(samples, now=T0 + 130) == EndedBefore(T0 + 120, succeeded=6, failed=1, cancelled=0)
    # Jobs that ended inside the first sample's minute, before it was taken: by that moment.
    taken = [Sample(at=T0 + 60, succeeded=6, failed=1, taken=T0 + 97), samples[1]]
    assert ended_before_first(taken, now=T0 + 130).by == T0 + 97
    # Samples that began before the window: their jobs lie before it; none counted: nothing to say.
    assert ended_before_first(samples, now=T0 + 25 * HOUR) is None
    assert ended_before_first([Sample(at=T0)], now=T0 + 5) is None and ended_before_first([], now=T0) is None
