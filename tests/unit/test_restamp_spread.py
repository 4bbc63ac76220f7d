"""An unchanged wait reason is stamped again between REFRESH_S/2 and REFRESH_S after its last
stamp, spread by job id, so one pass does not re-stamp every reason at once (issue 15: that
pass was the idle p95 at 512 cards)."""

from __future__ import annotations

from collections import Counter

from rig.waiting import REFRESH_S, STALE_AFTER_S
from workers.dispatcher import restamp_after


def test_reasons_are_restamped_in_time_and_spread():
    ages = [restamp_after(job_id) for job_id in range(1, 481)]
    assert all(REFRESH_S / 2 <= age <= REFRESH_S < STALE_AFTER_S for age in ages)
    # 480 reasons written in one pass come due over 8 slices of that window, none holding a
    # quarter of them.
    slices = Counter(int((age - REFRESH_S / 2) / (REFRESH_S / 16)) for age in ages)
    assert len(slices) == 8 and max(slices.values()) < 480 / 4
