"""Issue 11.1: a node name taken over by a node of another RIG_HOME (another log_dir) adopts
the jobs the first one started — from the files they were started with — and never runs
them a second time."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from rig.client import current_identity
from rig.config import load_settings
from rig.logs import job_folder
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.conftest import REDIS_URL
from workers.attempt_locate import find_attempt_process
from workers.card_runner import CardRunner
from workers.process_tree import proc_start_time, wrapper_argv

pytestmark = pytest.mark.redis


@pytest.fixture
def homes(card_runner_env, key_prefix, tmp_path):
    """(settings of home A, ledger, the CardRunner of home B for the same node name n1)."""
    settings_a, ledger, _, _ = card_runner_env
    settings_b = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home-b",
                               node_name="n1", kill_grace_seconds=1.0)
    assert settings_b.job_log_dir != settings_a.job_log_dir
    runner_b = CardRunner(settings_b, "n1", 0, "card0@n1-b")
    yield settings_a, ledger, runner_b
    runner_b.stop()


def started_under(settings, ledger, tmp_path, command: str, folder_exists: bool = True, recorded: bool = True):
    """A job started by home A's worker exactly as _launch does (files, env, pid file, record),
    whose worker then died. Returns (job, its wrapper's Popen or None when not on this host)."""
    job = ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["/bin/sh", "-c", command], shell=True,
        gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(tmp_path),
        created_at=time.time()))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    ok, _ = ledger.claim(job.id, token, "card0@n1")
    assert ok
    job = ledger.store.get(job.id)
    folder = job_folder(settings.job_log_dir, job.id, job.instance)
    log = folder / "attempt-1.log"
    if not folder_exists:  # another host's disk
        ledger.store.update(job.id, pid=999999, proc_start=1, log_path=str(log), log_paths=[str(log)])
        return job, None
    folder.mkdir(parents=True, exist_ok=True)
    log.touch()
    proc = subprocess.Popen(wrapper_argv(["/bin/sh", "-c", command]), start_new_session=True, env={
        **os.environ, "RIG_EXIT_FILE": str(folder / "attempt-1.exit"), "RIG_JOB_ID": str(job.id),
        "RIG_JOB_INSTANCE": job.instance or "", "RIG_ATTEMPT": "1", "RIG_KEY_PREFIX": settings.key_prefix})
    deadline = time.monotonic() + 5
    while find_attempt_process(job, 1, settings.key_prefix) is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the wrapper has exec'd
    if not recorded:  # its worker died before writing the pid file or the record
        return job, proc
    start = proc_start_time(proc.pid)
    (folder / "attempt-1.pid").write_text(f"{proc.pid} {start} 1 0 0\n")
    ledger.store.update(job.id, pid=proc.pid, proc_start=start, log_path=str(log), log_paths=[str(log)])
    return job, proc


def wait_state(ledger, job_id: int, timeout: float = 15.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = ledger.store.get(job_id)
        if job.state.terminal:
            return job
        time.sleep(0.05)
    return ledger.store.get(job_id)


def test_a_running_job_of_another_home_is_adopted_not_run_again(homes, tmp_path):
    settings_a, ledger, runner_b = homes
    go, marker = tmp_path / "go", tmp_path / "marker"
    job, proc = started_under(settings_a, ledger, tmp_path,
                              f"echo ran >> {marker}; while [ ! -f {go} ]; do sleep 0.02; done; exit 0")
    try:
        runner_b.adopt()
        now = ledger.store.get(job.id)
        assert now.state is JobState.RUNNING and now.pid == proc.pid and now.attempt == 1
        assert ledger.card("n1", 0).reserved == GIB  # the original still counts on its card
    finally:
        go.touch()
        proc.wait(10)
    done = wait_state(ledger, job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert marker.read_text() == "ran\n"
    assert ledger.card("n1", 0).reserved == 0
    # Concluded where it ran: home A's pid file goes (right after the state is written), so
    # nothing takes it for a live attempt.
    pid_file = job_folder(settings_a.job_log_dir, job.id, job.instance) / "attempt-1.pid"
    deadline = time.monotonic() + 10
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_file.exists()


def test_a_job_that_ended_while_the_node_was_down_keeps_its_exit(homes, tmp_path):
    settings_a, ledger, runner_b = homes
    job, proc = started_under(settings_a, ledger, tmp_path, "exit 0")
    proc.wait(10)
    runner_b.adopt()
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0, done.reason
    assert ledger.card("n1", 0).reserved == 0


def test_a_started_job_whose_files_are_elsewhere_is_never_requeued(homes, tmp_path):
    settings_a, ledger, runner_b = homes
    job, _ = started_under(settings_a, ledger, tmp_path, "true", folder_exists=False)
    runner_b.adopt()
    done = ledger.store.get(job.id)
    assert done.state is not JobState.PENDING and done.state.terminal
    assert "not reachable here" in (done.reason or ""), done.reason
    assert ledger.card("n1", 0).reserved == 0


def test_an_unrecorded_start_of_another_home_is_found_by_its_identity(homes, tmp_path):
    settings_a, ledger, runner_b = homes
    go = tmp_path / "go"
    job, proc = started_under(settings_a, ledger, tmp_path, f"while [ ! -f {go} ]; do sleep 0.02; done; exit 5",
                              recorded=False)
    try:
        runner_b.adopt()
        assert ledger.store.get(job.id).pid == proc.pid
    finally:
        go.touch()
        proc.wait(10)
    done = wait_state(ledger, job.id)
    assert done.state is JobState.FAILED and done.exit_code == 5  # read from home A's exit file
    assert ledger.card("n1", 0).reserved == 0
