"""One rule for what an estimated start says (rig.forecast.start_words): `rig jobs`' cell and
`rig show`'s sentence are two wordings of one decision, never two decisions (a tester saw
"now" in one and "overdue" in the other)."""

from __future__ import annotations

import itertools
import time

import pytest

from rig.forecast import LATER, StartEstimate, start_words

MADE = time.time()

#: The sentence that goes with each table cell (its first words).
KIND = {"now": "now (waiting for the dispatcher's next pass)", "overdue": "overdue: expected ~",
        "later": LATER, "not yet": "not estimated yet (", "unknown": "unknown ("}


def _estimates() -> list[StartEstimate]:
    found = [StartEstimate(1, None, "why", later=True), StartEstimate(1, None, "why", not_yet=True),
             StartEstimate(1, None, "why"), StartEstimate(1, None, after=MADE + 900)]
    for offset, overrun in itertools.product((-5.0, 0.0, 0.3, 0.7, 4.0, 30.0, 4000.0), (False, True)):
        found.append(StartEstimate(1, MADE + offset, overrun=overrun))
    return found


@pytest.mark.parametrize("read_after", [0.0, 0.2, 0.5, 3.0, 12.0, 600.0])
def test_the_cell_and_the_sentence_say_the_same_thing(read_after):
    now = MADE + read_after
    for estimate in _estimates():
        short, sentence = start_words(estimate, now, MADE)
        assert (short, sentence) == (estimate.short(now, MADE), estimate.sentence(now, MADE))
        assert estimate.as_dict(now, MADE)["estimated_start_short"] == short
        if short in KIND:
            assert sentence.startswith(KIND[short]), (short, sentence)
        else:  # a time: the same time in both
            assert short.startswith(("~", "after ~")) and sentence.startswith(short + " ("), (short, sentence)


def test_a_start_expected_just_after_the_forecast_was_made_is_overdue_once_passed():
    """It waited for a job expected to end 0.3 s after the forecast was made: while that job
    ran on, the 0.5 s of grace the rule had let it read "now (waiting for the dispatcher's next
    pass)" for the forecast's whole life, while the next forecast said "overdue"."""
    soon = StartEstimate(1, MADE + 0.3)
    assert soon.short(MADE + 5, MADE) == "overdue"
    assert soon.sentence(MADE + 5, MADE).startswith("overdue: expected ~")
    assert soon.short(MADE + 0.1, MADE).startswith("~")  # not passed yet: a time
    assert StartEstimate(1, MADE).short(MADE + 5, MADE) == "now"  # the first pass starts it


def test_a_start_that_needed_an_overrunning_job_freed_is_overdue_from_the_first_look():
    late = StartEstimate(1, MADE, overrun=True)
    assert late.short(MADE, MADE) == "overdue" and late.short(MADE + 20, MADE) == "overdue"
    assert late.sentence(MADE, MADE).startswith("overdue: expected ~")


def test_the_flag_survives_the_store():
    from rig.forecast_store import decode, encode

    late = StartEstimate(4, MADE, overrun=True, run=60.0, run_source="limit")
    assert decode(4, encode(late)) == late
    assert '"o"' not in encode(StartEstimate(4, MADE))


def test_a_time_is_worded_to_the_nearest_minute_so_the_clock_and_the_wait_agree():
    """Issue 13: a start at 12:30:58 estimated at 12:29:19 read "~12:30 (in ~2 min ...)" (the
    minute was cut, the wait rounded); and a hold's "expected free ~12:42" sat beside a start
    "~12:41" for one time. Every "~HH:MM" rounds (rig.waiting.nearest_minute)."""
    from rig.waiting import expected_clock

    base = time.mktime((2026, 12, 7, 12, 29, 19, 0, 0, -1))
    at = base + 99.0  # 12:30:58
    short, sentence = start_words(StartEstimate(1, at), base, base)
    assert short == "~12:31" and sentence.startswith("~12:31 (in ~2 min"), (short, sentence)
    assert " 12:31 " in expected_clock(at), expected_clock(at)
    assert " 12:30 " in expected_clock(base + 70.0)  # 12:30:29 rounds down
    assert " 12:31 " in expected_clock(base + 71.0)  # 12:30:30 rounds up
