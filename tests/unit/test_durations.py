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
