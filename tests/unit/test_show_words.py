"""`rig show` and `rig metrics` agree on a job with no memory measured ("-", never "0 B":
rig.cli.render.measured_memory); `rig config` prints paths as text, a relative RIG_HOME
resolved and said to be relative (rig.config.shown_setting); a high-priority job's estimated
start does not assume "no higher-priority submissions" (rig.forecast.CAVEAT)."""

from __future__ import annotations

import io
import time
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from rig.cli.render import render_job, render_metrics
from rig.memory import GIB
from rig.models import Job, JobState, Priority


def _running_unmeasured() -> Job:
    now = time.time()
    # Sampled, but no sample saw memory of its processes yet: the record's peak is still 0.
    return Job(id=7, name="warmup", user="ann", command=["true"], gpu_memory=4 * GIB, gpus=1,
               priority=Priority.MEDIUM, state=JobState.RUNNING, workdir="/tmp", created_at=now - 30,
               started_at=now - 20, node="n1", cards=[0], attempt=1, vram_peak=0, vram_sum=0, vram_samples=3)


def _text(draw) -> str:  # noqa: ANN001
    console = Console(width=160, record=True, file=io.StringIO())
    draw(console)
    return console.export_text()


def test_show_and_metrics_say_dash_for_memory_nobody_measured():
    job = _running_unmeasured()
    shown = _text(lambda c: render_job(job, None, c))
    metrics = _text(lambda c: render_metrics(job, c))
    assert "peak -, mean -" in shown and "0 B" not in shown, shown
    row = next(line for line in metrics.splitlines() if "running" in line)
    assert "0 B" not in row and row.split().count("-") >= 2, metrics


def test_metrics_of_a_job_that_ended_before_it_started_says_it_never_ran():
    """`rig metrics` of a job cancelled while it waited said "has not run yet (cancelled)"."""
    job = Job(id=9, name="w", user="ann", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.LOW,
              state=JobState.CANCELLED, workdir="/tmp", created_at=time.time() - 60, ended_at=time.time())
    said = _text(lambda c: render_metrics(job, c))
    assert said.strip() == "job 9 ended CANCELLED before it started: nothing was measured", said
    waiting = Job(id=10, name="w", user="ann", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.LOW,
                  state=JobState.PENDING, workdir="/tmp", created_at=time.time())
    assert _text(lambda c: render_metrics(waiting, c)).strip() == "job 10 has not run yet (pending)"


def test_config_refuses_a_relative_home_and_prints_an_absolute_one_as_text(tmp_path, monkeypatch, rig_home):
    """A relative RIG_HOME names another folder wherever a command runs (`rig up` in one,
    `rig down` in another said 'rig is not up'): refused in one line, exit 6."""
    from rig.cli.main import cli

    monkeypatch.setenv("RIG_HOME", "relhome")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 6, result.output
    assert "RIG_HOME: 'relhome' is a relative path" in result.output and "Traceback" not in result.output
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "abs"))
    out = CliRunner().invoke(cli, ["config"]).stdout
    assert f"home = {str(Path(tmp_path / 'abs').resolve())!r}  # RIG_HOME" in out, out
    assert "PosixPath" not in out, out


def test_the_estimate_caveat_holds_for_the_highest_priority_too():
    from rig.forecast import CAVEAT

    assert "higher-priority" not in CAVEAT and "nothing submitted later goes first" in CAVEAT
