"""The node's orphan check against a job that ends on its own while the check runs: the check
lists the node's job processes (a scan of /proc), then reads their records; a job that ended
in between reads SUCCEEDED with no process left. That is no orphan: nothing is stopped and
nothing is said (it was a false "stopping orphan process tree" line ~0.1 s after a normal end)."""

from __future__ import annotations

import logging
import signal
import subprocess
import time

import pytest

from tests.integration.test_card_runner import placed
from workers import health
from workers.health import HealthChecker, HealthReport, JobProcess

pytestmark = pytest.mark.redis


def _with_scan(monkeypatch: pytest.MonkeyPatch, found: dict[int, JobProcess]) -> None:
    """The scan of /proc as it was a moment ago (the race, made certain)."""
    monkeypatch.setattr(health, "node_job_processes", lambda *_a, **_k: dict(found))


def test_a_job_that_ended_between_the_scan_and_the_record_read_is_no_orphan(
        card_runner_env, tmp_path, monkeypatch, caplog):
    settings, ledger, runner, _ = card_runner_env
    job, token = placed(ledger, "true", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    ended = subprocess.Popen(["true"], start_new_session=True)
    ended.wait()  # its session is empty now, as the job's is once its ending is recorded
    _with_scan(monkeypatch, {ended.pid: JobProcess(job.id, 1, job.instance)})
    report = HealthReport()
    with caplog.at_level(logging.WARNING, logger="workers.health"):
        HealthChecker(settings, ledger.r)._orphan_processes(report)
    assert report.orphans_stopped == []
    assert "orphan" not in caplog.text


def test_a_live_process_of_an_ended_job_is_still_stopped(card_runner_env, tmp_path, monkeypatch):
    settings, ledger, runner, _ = card_runner_env
    job, token = placed(ledger, "true", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    _with_scan(monkeypatch, {left.pid: JobProcess(job.id, 1, job.instance)})
    _stopped_as_orphan(settings, ledger, left)


def _stopped_as_orphan(settings, ledger, left: subprocess.Popen) -> None:  # noqa: ANN001 - the fixture's
    """The node's orphan check stops ``left`` (and says so in its report)."""
    try:
        report = HealthReport()
        HealthChecker(settings, ledger.r)._orphan_processes(report)
        assert report.orphans_stopped == [left.pid]
        assert left.wait(10) is not None
    finally:
        left.kill()
        left.wait()


def test_an_ended_jobs_process_started_from_the_nodes_former_home_is_still_stopped(card_runner_env, tmp_path):
    """The node name taken over by a rig up of another home on this host (rig.node_claim): the
    jobs its former home's workers started are still this node's (same Redis, prefix and name;
    attempt_locate.job_folders adopts them) though their exit files lie in that home's log_dir."""
    settings, ledger, runner, _ = card_runner_env
    job, token = placed(ledger, "true", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    former = tmp_path / "former-home" / "logs" / "jobs" / f"{job.id}-{job.instance}"
    env = {"PATH": "/usr/bin:/bin", "RIG_KEY_PREFIX": settings.key_prefix, "RIG_NODE_NAME": settings.node_name,
           "RIG_JOB_ID": str(job.id), "RIG_ATTEMPT": "1", "RIG_JOB_INSTANCE": job.instance or "",
           "RIG_REDIS_URL": settings.redis_url, "RIG_EXIT_FILE": str(former / "attempt-1.exit")}
    _stopped_as_orphan(settings, ledger, subprocess.Popen(["sleep", "300"], env=env, start_new_session=True))


class _Clock:
    """workers.health's monotonic clock, moved by hand (s)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_an_orphan_that_ignores_sigterm_does_not_hold_the_pass(card_runner_env, tmp_path, monkeypatch, caplog):
    """A pass SIGTERMs an orphan and goes on (it waited kill_grace_seconds + 2 s per orphan that
    did not die, every pass, holding the control worker); the first pass kill_grace_seconds
    later SIGKILLs it. Each step is said once."""
    settings, ledger, runner, _ = card_runner_env
    job, token = placed(ledger, "true", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    deaf = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 1; done"], start_new_session=True)
    clock = _Clock()
    monkeypatch.setattr(health, "time", clock)
    _with_scan(monkeypatch, {deaf.pid: JobProcess(job.id, 1, job.instance)})
    checker = HealthChecker(settings, ledger.r)
    try:
        with caplog.at_level(logging.WARNING, logger="workers.health"):
            for _ in range(3):  # within the grace: SIGTERM once, then nothing
                started = time.monotonic()
                checker._orphan_processes(HealthReport())
                assert time.monotonic() - started < settings.kill_grace_seconds
            assert deaf.poll() is None
            assert caplog.text.count("stopping orphan") == 1
            clock.now += settings.kill_grace_seconds
            checker._orphan_processes(HealthReport())
            assert deaf.wait(10) == -signal.SIGKILL
        assert caplog.text.count("outlived SIGTERM") == 1
    finally:
        deaf.kill()
        deaf.wait()
