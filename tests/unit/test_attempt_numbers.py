"""One numbering of attempts for the record, `rig show` and `rig log --attempt N` (issue 11.7):
an attempt that never started keeps its number and has no log, said in one line; a success
clears the failure class an earlier attempt left. No Redis."""

from __future__ import annotations

import io
import time

import pytest

from rig.cli.logview import attempt_logs, last_attempt, show_log
from rig.errors import InvalidInput
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.outcomes import AttemptEnd, decide, never_started


def _job(**fields) -> Job:  # noqa: ANN003
    base = dict(id=12, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())
    return Job(**{**base, **fields})


def _start_error_then_success(tmp_path) -> Job:
    """Attempt 1 refused before it started (start_error), `rig retry`, attempt 2 succeeded."""
    refused = never_started(_job(attempt=1, node="n1", cards=[0]), "start_error", "rig could not start it: x")
    a2 = tmp_path / "attempt-2.log"
    a2.write_text("two\n")
    return _job(state=JobState.SUCCEEDED, attempt=2, log_paths=[str(a2)], exit_code=0,
                attempts=[refused, {"attempt": 2, "node": "n1", "cards": [0], "outcome": "succeeded"}])


def test_the_log_of_attempt_2_is_attempt_2s(tmp_path):
    job = _start_error_then_success(tmp_path)
    assert attempt_logs(job) == {2: str(tmp_path / "attempt-2.log")} and last_attempt(job) == 2
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=2, follow=False, out=out, say=said.append)
    assert out.getvalue() == b"two\n" and said == ["--- job 12, attempt 2 of 2 (n1/0) ---"]
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=None, follow=False, out=out, say=said.append)
    assert out.getvalue() == b"two\n"


def test_an_attempt_that_never_started_says_so_in_one_line(tmp_path):
    job = _start_error_then_success(tmp_path)
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=1, follow=False, out=out, say=said.append)
    assert out.getvalue() == b""
    assert said == ["--- job 12, attempt 1 never started, so it has no log: rig could not start it: x ---"]
    with pytest.raises(InvalidInput, match="pick --attempt 1..2"):
        show_log(lambda: job, attempt=3, follow=False, out=io.BytesIO(), say=said.append)


def test_follow_skips_an_attempt_that_never_started(tmp_path):
    job = _start_error_then_success(tmp_path)
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=1, follow=True, out=out, say=said.append, sleep=lambda s: None)
    assert said[0].startswith("--- job 12, attempt 1 never started")
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=None, follow=True, out=out, say=said.append, sleep=lambda s: None)
    assert out.getvalue() == b"two\n" and said[-1] == "--- job 12 SUCCEEDED after 2 attempt(s) ---"


def test_older_records_without_numbered_files_count_by_position(tmp_path):
    job = _job(log_paths=["/x/first.log", "/x/second.log"], attempt=2)
    assert attempt_logs(job) == {1: "/x/first.log", 2: "/x/second.log"}


def test_a_success_clears_the_failure_an_earlier_attempt_left(tmp_path):
    log = tmp_path / "attempt-2.log"
    log.write_text("")
    job = _job(state=JobState.RUNNING, attempt=2, log_paths=[str(log)], failure="start_error",
               evidence=["x"], node="n1", cards=[0], started_at=time.time())
    d = decide(job, AttemptEnd(exit_code=0), 80 * GIB)
    assert d.state is JobState.SUCCEEDED
    assert d.fields["failure"] is None and d.fields["evidence"] == [] and d.fields["suggested_gpu_memory"] is None
    assert d.fields["attempts"][-1]["outcome"] == "succeeded"


def test_a_job_whose_only_attempt_never_started_says_so(tmp_path):
    refused = never_started(_job(attempt=1, node="n1", cards=[0]), "start_error", "rig could not start it: x")
    job = _job(state=JobState.FAILED, attempt=1, attempts=[refused], failure="start_error")
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=None, follow=False, out=out, say=said.append)
    assert said == ["--- job 12, attempt 1 never started, so it has no log: rig could not start it: x ---"]
