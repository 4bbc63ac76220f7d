"""What `rig-submit --wait` says as a job moves (rig.cli.submit.wait_line): which attempt."""

from __future__ import annotations

from rig.cli.submit import wait_line
from rig.models import Job, JobState, Priority


def job(state: JobState, attempt: int, node: str | None = None) -> Job:
    return Job(id=14, name="t", user="u", command=["true"], gpu_memory=1, gpus=1, priority=Priority.MEDIUM,
               state=state, workdir="/", created_at=0.0, attempt=attempt, node=node, cards=[0] if node else [])


def test_a_retry_waits_and_is_placed_as_its_next_attempt():
    # Breaker: attempt 1 failed, then "job 14: pending", "assigned", "running (attempt 2)",
    # and after attempt 2 failed "pending (attempt 2)" while attempt 3 waited.
    assert [wait_line(j) for j in (
        job(JobState.PENDING, 0), job(JobState.ASSIGNED, 0, "n"), job(JobState.RUNNING, 1, "n"),
        job(JobState.PENDING, 1), job(JobState.ASSIGNED, 1, "n"), job(JobState.RUNNING, 2, "n"),
        job(JobState.PENDING, 2), job(JobState.FAILED, 3, "n"))] == [
        "job 14: pending", "job 14: assigned on n/0", "job 14: running on n/0",
        "job 14: pending (attempt 2)", "job 14: assigned on n/0 (attempt 2)", "job 14: running on n/0 (attempt 2)",
        "job 14: pending (attempt 3)", "job 14: failed on n/0 (attempt 3)"]
