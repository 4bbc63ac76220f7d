"""The start path of a card worker on a disk that refuses writes (issue 11.3): a job is either
not started (requeued, not counted, the card out) or started (supervised to its own end), never
reported as one while being the other. Writes fail by injected OSError(ENOSPC); the fault
scenarios disk-* do the same on a real full tmpfs."""

from __future__ import annotations

import errno
import json
import os

import pytest

from rig import logspace
from rig.logs import AttemptFiles, job_folder
from rig.models import JobState
from tests.integration.test_card_runner import placed

pytestmark = pytest.mark.redis


@pytest.fixture
def env(card_runner_env):
    return card_runner_env  # tests/integration/conftest.py


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_before_start_requeues_without_running(env, tmp_path, monkeypatch):
    settings, ledger, runner, _ = env
    marker = tmp_path / "ran"
    job, token = placed(ledger, f"touch {marker}", tmp_path)
    monkeypatch.setattr("workers.log_space.logspace.preallocate", _enospc)
    assert runner.run_job(job.id, token) == "requeued:not-started"
    back = ledger.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempt == 0 and not back.failure
    assert "never started" in back.reason and logspace.REASON_PREFIX in back.reason
    assert not marker.exists()
    assert ledger.store.pending_head(5) == [job.id]
    card = ledger.card("n1", 0)
    assert card.reserved == 0 and not card.healthy and logspace.is_log_space_reason(card.health_reason)
    folder = job_folder(settings.job_log_dir, job.id, back.instance)
    assert not list(folder.glob("attempt-1.*"))  # its number is free again: no sign it ran
    # Space returns: the guard's next probe puts the card back.
    monkeypatch.undo()
    runner.log_space.min_free = 0
    runner.log_space._next = 0.0
    assert runner.log_space.check() is None
    assert ledger.card("n1", 0).healthy


def test_a_card_out_for_another_reason_is_not_put_back_by_the_guard(env):
    _settings, ledger, runner, _ = env
    ledger.set_healthy("n1", 0, False, "temperature 99 C > 90 C")
    runner.log_space.min_free = 0
    assert runner.log_space.check() is None
    assert ledger.card("n1", 0).health_reason == "temperature 99 C > 90 C"


def test_guard_takes_the_card_out_when_space_is_low(env, tmp_path):
    _settings, ledger, runner, _ = env
    runner.log_space.min_free = 1 << 62
    problem = runner.log_space.check()
    assert problem and "free" in problem
    assert ledger.card("n1", 0).health_reason == problem


def test_other_start_errors_stay_start_errors_with_a_history_row(env, tmp_path, monkeypatch):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    monkeypatch.setattr("workers.log_space.logspace.preallocate",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied")))
    assert runner.run_job(job.id, token) == "failed-to-start"
    done = ledger.store.get(job.id)
    assert done.state is JobState.FAILED and done.failure == "start_error"
    assert done.attempts[-1]["started"] is False and done.attempts[-1]["attempt"] == 1
    assert ledger.card("n1", 0).healthy  # not disk trouble: the card stays in


def test_a_write_failing_after_the_start_never_refuses_a_running_job(env, tmp_path, monkeypatch):
    _settings, ledger, runner, _ = env
    marker = tmp_path / "ran"
    job, token = placed(ledger, f"touch {marker}; echo out", tmp_path)
    monkeypatch.setattr("workers.log_space.logspace.overwrite", _enospc)  # the pid file
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = ledger.store.get(job.id)
    assert marker.exists() and done.attempt == 1 and done.exit_code == 0


def test_a_cut_log_says_so_in_the_record_and_keeps_the_exit_status(env, tmp_path):
    _settings, ledger, runner, _ = env
    # The job writes the note its keeper would leave on a full disk (the keeper's side is
    # tests/unit/test_logspace.py).
    note = json.dumps({"lost": 3 << 20, "error": "ENOSPC", "strerror": "No space left on device",
                       "at": 0, "log_bytes": 1 << 20})
    job, token = placed(ledger, f"printf '%s' '{note}' > \"${{RIG_EXIT_FILE%.exit}}.note\"", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = ledger.store.get(job.id)
    assert done.exit_code == 0 and "log incomplete: disk full (ENOSPC)" in done.reason
    assert "3.0 MiB of output lost" in done.attempts[-1]["summary"]


def test_prepared_files_are_allocated_and_read_as_empty(tmp_path):
    from workers.card_runner import _read_exit_file, read_pid_file
    from workers.log_space import prepare_attempt

    files = AttemptFiles(tmp_path / "7-x", 1)
    fd = prepare_attempt(files)
    try:
        assert files.exit.stat().st_size > 0 and files.pid.stat().st_size > 0
        assert _read_exit_file(files.exit) is None and read_pid_file(files.pid) is None
        assert logspace.read_note(files.note) == {}
        os.write(fd, b"0\n")  # as the wrapper does through its stdin
    finally:
        os.close(fd)
    assert _read_exit_file(files.exit) == 0


def test_start_error_retry_success_one_numbering(env, tmp_path, monkeypatch):
    """Item 11.7: after a start_error and `rig retry`, the record, `rig show` and `rig log
    --attempt N` agree; the SUCCEEDED job keeps no failure class (the history keeps it)."""
    import io

    from rig.cli.logview import show_log
    from rig.client import Client

    settings, ledger, runner, _ = env
    job, token = placed(ledger, "echo second", tmp_path)
    monkeypatch.setattr("workers.log_space.logspace.preallocate",
                        lambda *a: (_ for _ in ()).throw(OSError(errno.EACCES, "Permission denied")))
    assert runner.run_job(job.id, token) == "failed-to-start"
    monkeypatch.undo()
    client = Client(settings)
    client.retry(job.id)
    ok, token = ledger.reserve(job.id, "n1", [0], job.gpu_memory)
    assert ok
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = client.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.failure is None and done.evidence == []
    assert done.attempt == 2 and [a["attempt"] for a in done.attempts] == [1, 2]
    assert done.attempts[0]["outcome"] == "start_error" and done.attempts[0]["started"] is False
    out, said = io.BytesIO(), []
    show_log(lambda: client.get(job.id), attempt=2, follow=False, out=out, say=said.append)
    assert out.getvalue() == b"second\n" and said[0].startswith(f"--- job {job.id}, attempt 2 of 2")
    show_log(lambda: client.get(job.id), attempt=1, follow=False, out=out, say=said.append)
    assert "attempt 1 never started, so it has no log" in said[-1]


def test_a_worker_dying_between_the_files_and_the_start_leaves_a_job_that_runs_once(env, tmp_path):
    """The attempt's files exist, its process never started: adoption requeues it and removes
    them, so the next start runs it instead of concluding it as an attempt that ran."""
    from workers.log_space import prepare_attempt

    settings, ledger, runner, _ = env
    marker = tmp_path / "ran"
    job, token = placed(ledger, f"touch {marker}", tmp_path)
    ok, _ = ledger.claim(job.id, token, "card0@n1")
    assert ok
    job = ledger.store.get(job.id)
    files = AttemptFiles(job_folder(settings.job_log_dir, job.id, job.instance), 1)
    os.close(prepare_attempt(files))  # ...and then the worker died
    runner.adopt()
    back = ledger.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempt == 0 and not files.log.exists()
    ok, token = ledger.reserve(job.id, "n1", [0], job.gpu_memory)
    assert ok and runner.run_job(job.id, token) == "SUCCEEDED"
    assert marker.exists() and ledger.store.get(job.id).attempt == 1
