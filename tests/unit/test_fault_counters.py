"""The keeper-sigkill fault scenario's count of what a keeper's death lost
(rig.testing.faults_jobs): missing counters and the gaps they form."""

from __future__ import annotations

from rig.testing.faults_jobs import counters, missing_counters


def test_numbered_lines_are_read_in_log_order():
    text = b"line 0\nline 1\n[rig: the log keeper (pid 9) died]\nline 1x\nline 4\nlast-line\n"
    assert counters(text) == [0, 1, 4]


def test_missing_counters_and_their_gaps():
    assert missing_counters([0, 1, 2, 3]) == ([], 0)
    assert missing_counters([0, 1, 5, 6]) == ([2, 3, 4], 1)  # one read lost: one gap
    assert missing_counters([0, 2, 3, 6]) == ([1, 4, 5], 2)  # two gaps: more than one read
    assert missing_counters([]) == ([], 0)
