"""rig.durations: what people type for --since / --time-limit, and the one line when it is wrong."""

from __future__ import annotations

import pytest

from rig.durations import parse_duration
from rig.errors import InvalidInput


def test_days_hours_and_plain_seconds_read_and_the_error_names_days():
    assert parse_duration("7d", what="--since") == 7 * 86400
    assert parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    with pytest.raises(InvalidInput, match=r"--since: cannot read '7x'; write it like 90s, 30m, 2h, 7d or 1h30m"):
        parse_duration("7x", what="--since")


@pytest.mark.parametrize("text", ["7", "30", "0", "1.5", " 12 ", 7, 0.5])
def test_since_refuses_a_bare_number_in_one_line_naming_the_units(text):
    with pytest.raises(InvalidInput) as err:
        parse_duration(text, what="--since", unit_required=True)
    assert str(err.value) == f"--since needs a unit: 90s, 30m, 12h, 7d (got {str(text)!r})"
    assert parse_duration(text if text not in ("0", 0) else "1") > 0  # --time-limit still takes seconds


@pytest.mark.parametrize("text", ["0s", "0m", "0d", "0h0m"])
def test_zero_is_refused_quoting_the_value_as_every_other_refusal_does(text):
    with pytest.raises(InvalidInput) as err:
        parse_duration(text, what="--since", unit_required=True)
    assert str(err.value) == f"--since must be more than 0 seconds (got {text!r})"
    assert parse_duration("7d", what="--since", unit_required=True) == 7 * 86400


def test_milliseconds_read_as_the_time_limit_refusal_asks_for_them():
    """Issue 13: ``--time-limit 0.0001`` said "give at least 1ms", and ``1ms`` was then refused
    ("cannot read '1ms'"): the message and the parser disagreed."""
    from rig.request_rules import parse_time_limit

    with pytest.raises(InvalidInput, match="give at least 1ms"):
        parse_time_limit("0.0001")
    assert parse_time_limit("1ms") == pytest.approx(0.001) and parse_time_limit("5ms") == pytest.approx(0.005)
    assert parse_duration("1m5s") == 65 and parse_duration("1m") == 60  # "ms" is not read as minutes


@pytest.mark.parametrize("text", ["9" * 330 + "d", "9" * 330, "9" * 320 + "h1s"])
def test_a_duration_too_long_for_a_float_is_one_line(text):
    """`rig usage --since 999...9d` (330 digits) read inf and ended in an OverflowError traceback."""
    with pytest.raises(InvalidInput, match=r"^--since: '9+.*' is too long to be a duration; write it like 90s"):
        parse_duration(text, what="--since")
