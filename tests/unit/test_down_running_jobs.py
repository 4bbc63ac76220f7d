"""`rig down` with jobs running: it never stops them (README, Restarts), and says so, naming
them, instead of a bare "rig stopped (pid N)" that read as if everything had stopped."""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner

from rig.cli.main import cli
from rig.config import load_settings
from rig.stack import pid_file, running_jobs_line, stop_node


def _job(settings, job_id: int) -> subprocess.Popen:
    """A process in its own session whose environment says it is job ``job_id`` of the node, as
    a card worker starts one (its exit file under the home's log_dir)."""
    env = dict(os.environ, RIG_KEY_PREFIX=settings.key_prefix, RIG_NODE_NAME=settings.node_name,
               RIG_JOB_ID=str(job_id), RIG_ATTEMPT="1",
               RIG_EXIT_FILE=str(settings.job_log_dir / f"{job_id}-x" / "attempt-1.exit"))
    return subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                            env=env, start_new_session=True, stdout=subprocess.PIPE)


def _supervisor() -> subprocess.Popen:
    """Stands for a live rig up: ends on SIGTERM."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_rig_down_names_the_jobs_that_keep_running(tmp_path, monkeypatch):
    home = tmp_path / "home"
    settings = load_settings(home=home, node_name="brkinstall-down", redis_url="redis://127.0.0.1:1/0",
                             key_prefix="brkinstall-down:")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    jobs = [_job(settings, 6), _job(settings, 9)]
    up = _supervisor()
    try:
        for job in jobs:
            job.stdout.readline()  # running, its environment in place
        pid_file(settings).write_text(f"{up.pid}\n")
        report = stop_node(settings, timeout=10)
        assert report.supervisors == [up.pid] and report.running_jobs == [6, 9]
        assert all(job.poll() is None for job in jobs)  # rig down never stops a job

        up2 = _supervisor()
        pid_file(settings).write_text(f"{up2.pid}\n")
        monkeypatch.setenv("RIG_HOME", str(home))
        for name, value in (("RIG_NODE_NAME", settings.node_name), ("RIG_REDIS_URL", settings.redis_url),
                            ("RIG_KEY_PREFIX", settings.key_prefix)):
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(cli, ["down", "--timeout", "10"])
        up2.wait(10)
        assert result.exit_code == 0, result.output
        assert f"rig stopped (pid {up2.pid})" in result.output
        assert "2 job(s) of this node keep running (6, 9): stopping rig never stops jobs; the next `rig up` " \
               "adopts them" in result.output
    finally:
        for proc in (*jobs, up):
            proc.kill()
            proc.wait(10)


def test_running_jobs_line_lists_ten_then_counts():
    line = running_jobs_line(list(range(1, 15)))
    assert line.startswith("14 job(s) of this node keep running (1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 4 more)")
    assert "\n" not in line
