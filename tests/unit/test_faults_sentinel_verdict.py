"""The sentinel_failover fault scenario's verdict (rig.testing.faults_sentinel._verdict): which
acknowledged jobs may be gone after the fail-over, and which count as lost."""

from __future__ import annotations

from rig.models import JobState
from rig.testing.faults_sentinel import Ack, _verdict

KILL = 100.0


def _ack(job_id: int, at: float, warned: bool) -> Ack:
    return Ack(job_id, f"i{job_id}", at, warned)


def test_a_job_warned_before_the_kill_may_be_gone():
    lag = _ack(13, KILL, warned=True)  # the lag batch: warned, acknowledged as the master dies
    verdict = _verdict([lag], {}, {}, KILL)
    assert verdict.lost == [] and verdict.gone_as_warned == [13] and verdict.never_ran == []


def test_a_job_acknowledged_after_the_kill_is_lost_when_gone_though_warned():
    # After the kill the new master has no replica, so every submission is warned; no second
    # failure comes, so such a job must still run: gone is lost, not "lost as warned".
    after = _ack(16, KILL + 3, warned=True)
    verdict = _verdict([after], {}, {}, KILL)
    assert verdict.lost == [16] and verdict.gone_as_warned == [] and verdict.never_ran == [16]


def test_jobs_that_ran_once_and_succeeded_are_neither_lost_nor_duplicated():
    acks = [_ack(1, KILL - 5, warned=False), _ack(16, KILL + 3, warned=True)]
    finals = {a: JobState.SUCCEEDED for a in acks}
    starts = {(1, "i1"): [KILL - 4], (16, "i16"): [KILL + 4]}
    verdict = _verdict(acks, finals, starts, KILL)
    assert (verdict.lost, verdict.never_ran, verdict.duplicated) == ([], [], 0)


def test_a_second_start_is_a_duplicate():
    ack = _ack(2, KILL - 5, warned=False)
    verdict = _verdict([ack], {ack: JobState.SUCCEEDED}, {(2, "i2"): [KILL - 4, KILL + 4]}, KILL)
    assert verdict.duplicated == 1 and verdict.lost == []
