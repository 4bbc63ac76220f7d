"""The retry / error-queue policy as a pure function (workers.outcomes.decide)."""

from __future__ import annotations

import time

from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.outcomes import AttemptEnd, decide

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"


def job(tmp_path, *, attempt=1, max_retries=2, log="", grow=False, memory=10 * GIB) -> Job:
    path = tmp_path / f"attempt-{attempt}.log"
    path.write_text(log)
    return Job(id=7, name="t", user="u", command=["x"], gpu_memory=memory, gpus=1,
               priority=Priority.MEDIUM, state=JobState.RUNNING, workdir="/", created_at=time.time(),
               attempt=attempt, max_retries=max_retries, log_paths=[str(path)], oom_retry_grow=grow,
               node="n", cards=[0], started_at=time.time() - 5)


def test_success(tmp_path):
    d = decide(job(tmp_path), AttemptEnd(exit_code=0), 80 * GIB)
    assert d.state is JobState.SUCCEEDED and not d.error_queue
    assert d.fields["attempts"][-1]["outcome"] == "succeeded"


def test_failure_retried_until_the_cap_then_error_queue(tmp_path):
    for attempt, state, queued in ((1, JobState.PENDING, False), (2, JobState.PENDING, False),
                                   (3, JobState.FAILED, True)):
        d = decide(job(tmp_path, attempt=attempt), AttemptEnd(exit_code=3), 80 * GIB)
        assert (d.state, d.error_queue) == (state, queued)
        assert d.fields["failure"] == "nonzero_exit" and d.fields["exit_code"] == 3


def test_no_retries_goes_straight_to_the_error_queue(tmp_path):
    d = decide(job(tmp_path, max_retries=0), AttemptEnd(exit_code=1), 80 * GIB)
    assert d.state is JobState.FAILED and d.error_queue


def test_oom_is_not_retried_with_the_same_declaration(tmp_path):
    d = decide(job(tmp_path, log=OOM), AttemptEnd(exit_code=1), 80 * GIB)
    assert d.state is JobState.FAILED and d.error_queue
    assert d.fields["failure"] == "cuda_oom"
    assert d.fields["suggested_gpu_memory"] == 15 * GIB
    assert "rig retry 7 --gpu-memory 15G" in d.fields["reason"]
    assert OOM.strip() in d.fields["evidence"]


def test_oom_grow_retries_with_more_memory_capped_by_the_largest_card(tmp_path):
    d = decide(job(tmp_path, log=OOM, grow=True), AttemptEnd(exit_code=1), 80 * GIB)
    assert d.state is JobState.PENDING and d.fields["gpu_memory"] == 15 * GIB
    capped = decide(job(tmp_path, log=OOM, grow=True, memory=70 * GIB), AttemptEnd(exit_code=1), 76 * GIB)
    assert capped.fields["gpu_memory"] == 76 * GIB
    full = decide(job(tmp_path, log=OOM, grow=True, memory=76 * GIB), AttemptEnd(exit_code=1), 76 * GIB)
    assert full.state is JobState.FAILED and full.error_queue  # cannot grow any more


def test_timeout_cancel_and_lost(tmp_path):
    assert decide(job(tmp_path), AttemptEnd(exit_code=143, timed_out=True), 80 * GIB).state is JobState.TIMEOUT
    c = decide(job(tmp_path), AttemptEnd(exit_code=143, cancelled=True, cancelled_by="ana"), 80 * GIB)
    assert c.state is JobState.CANCELLED and c.fields["reason"] == "cancelled by ana" and not c.error_queue
    lost = decide(job(tmp_path), AttemptEnd(exit_code=None, lost=True, note="its worker died"), 80 * GIB)
    assert lost.state is JobState.PENDING and lost.fields["failure"] == "lost"
    assert "its worker died" in lost.fields["reason"]


def test_a_timeout_says_how_to_give_it_more_time(tmp_path):
    """It said only "time limit exceeded": `rig retry` ran it again under the same limit (and
    rig.failures' advice, "raise its time limit", named no way to)."""
    timed = job(tmp_path)
    timed.time_limit = 3600
    d = decide(timed, AttemptEnd(exit_code=143, timed_out=True), 80 * GIB)
    assert d.state is JobState.TIMEOUT and d.error_queue
    assert d.fields["reason"] == "time limit exceeded (1h00m); to give it more time: `rig retry 7 --time-limit 2h00m`"
    from rig.durations import parse_duration

    assert parse_duration("2h00m") == 7200  # the suggestion is a value the flag takes
    for limit, words in ((0.001, "(1ms); to give it more time: `rig retry 7 --time-limit 1s`"),
                         (1.5, "(1s); to give it more time: `rig retry 7 --time-limit 3s`")):
        timed.time_limit = limit
        reason = decide(timed, AttemptEnd(exit_code=143, timed_out=True), 80 * GIB).fields["reason"]
        assert reason == f"time limit exceeded {words}"


def test_attempt_history_accumulates(tmp_path):
    first = job(tmp_path)
    d = decide(first, AttemptEnd(exit_code=2), 80 * GIB)
    first.attempts = d.fields["attempts"]
    first.attempt = 2
    d2 = decide(first, AttemptEnd(exit_code=0), 80 * GIB)
    assert [a["outcome"] for a in d2.fields["attempts"]] == ["nonzero_exit", "succeeded"]
    assert [a["attempt"] for a in d2.fields["attempts"]] == [1, 2]


# -- failures a retry cannot help (rig.failures.RETRY) -------------------------------------------
def test_failures_a_retry_cannot_help_go_straight_to_the_error_queue(tmp_path):
    from rig.failures import FailureClass

    cases = [
        (AttemptEnd(exit_code=127), "rig: command not found: trian.py (exit 127)\n", "command_not_found",
         "command not found"),
        (AttemptEnd(exit_code=126, note="could not start in /gone: No such file or directory",
                    failure=FailureClass.START_FAILED), "", "start_failed", "working folder"),
    ]
    for end, log, failure, words in cases:
        d = decide(job(tmp_path, max_retries=3, log=log), end, 80 * GIB)
        assert (d.state, d.error_queue, d.fields["failure"]) == (JobState.FAILED, True, failure)
        assert "not retried" in d.fields["reason"] and words in d.fields["reason"]


def test_a_program_that_ran_and_exited_127_is_retried(tmp_path):
    d = decide(job(tmp_path, max_retries=3, log="real program ran\n"), AttemptEnd(exit_code=127), 80 * GIB)
    assert d.state is JobState.PENDING and d.fields["failure"] == "nonzero_exit"


def test_a_python_call_that_cannot_be_loaded_or_whose_result_cannot_pickle_is_not_retried(tmp_path):
    j = job(tmp_path, max_retries=3, log="rig.call: job 7: cannot import the function: boom\n")
    j.kind = "python"
    bad = decide(j, AttemptEnd(exit_code=2), 80 * GIB)
    assert (bad.state, bad.error_queue, bad.fields["failure"]) == (JobState.FAILED, True, "bad_call")
    assert bad.fields["evidence"] == ["rig.call: job 7: cannot import the function: boom"]
    result = decide(j, AttemptEnd(exit_code=3), 80 * GIB)
    assert (result.state, result.fields["failure"]) == (JobState.FAILED, "bad_result")
    # The same exit codes from a plain command are its own: retried as usual.
    j.kind = "command"
    assert decide(j, AttemptEnd(exit_code=2), 80 * GIB).state is JobState.PENDING


def test_every_failure_class_has_a_retry_rule():
    from rig.failures import RETRY, FailureClass

    assert set(RETRY) == set(FailureClass)
    assert all(rule.advice for rule in RETRY.values() if not rule.helps)


def test_rigs_own_fault_spends_no_retry_but_only_up_to_a_bound(tmp_path):
    """An attempt its log keeper failed (FailureClass.INFRASTRUCTURE) is retried without counting
    against the job's retries; FREE_RETRIES_MAX such attempts at most go uncounted."""
    from rig.failures import FREE_RETRIES_MAX, FailureClass

    rig_fault = AttemptEnd(exit_code=141, failure=FailureClass.INFRASTRUCTURE)
    first = decide(job(tmp_path, max_retries=0), rig_fault, 80 * GIB)
    assert first.state is JobState.PENDING and first.fields["failure"] == "infrastructure"
    assert "rig's fault" in first.fields["reason"] and "not counted" in first.fields["reason"]
    # The next attempt then fails by itself: the job had no retries, and still has none to spend.
    then = job(tmp_path, attempt=2, max_retries=0)
    then.attempts = first.fields["attempts"]
    own = decide(then, AttemptEnd(exit_code=3), 80 * GIB)
    assert own.state is JobState.FAILED and own.error_queue
    # ... whereas with one retry it is retried, as "retry 1 of 1".
    then.max_retries = 1
    assert "retry 1 of 1" in decide(then, AttemptEnd(exit_code=3), 80 * GIB).fields["reason"]
    # A fault that keeps coming ends: past FREE_RETRIES_MAX it counts like any failure.
    many = job(tmp_path, attempt=FREE_RETRIES_MAX + 1, max_retries=0)
    many.attempts = [{"attempt": n, "outcome": "infrastructure"} for n in range(1, FREE_RETRIES_MAX + 1)]
    assert decide(many, rig_fault, 80 * GIB).state is JobState.FAILED


def test_an_attempt_whose_samples_never_saw_memory_records_no_measurement(tmp_path):
    """Samples taken but none saw the job's processes on its card (vram_sum 0): the attempt
    records None for its peak and its mean alike (rig.memory.measured), as rig metrics shows
    '-'; its mean was recorded as 0, which rig usage counted as 0 GiB-h used."""
    quiet = job(tmp_path)
    quiet.vram_samples, quiet.util_samples = 4, 4
    record = decide(quiet, AttemptEnd(exit_code=0), 80 * GIB).fields["attempts"][-1]
    assert (record["vram_peak"], record["vram_mean"]) == (None, None)
    seen = job(tmp_path)
    seen.vram_samples, seen.vram_sum, seen.vram_peak = 2, 6 * GIB, 4 * GIB
    record = decide(seen, AttemptEnd(exit_code=0), 80 * GIB).fields["attempts"][-1]
    assert (record["vram_peak"], record["vram_mean"]) == (4 * GIB, 3 * GIB)
