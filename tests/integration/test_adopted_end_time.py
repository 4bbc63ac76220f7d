"""An adopted job's end time (issue 11 follow-up, item 15): a job that ended while no worker
watched it (`rig down` while RUNNING, `rig up` later) is recorded as ended when its process
ended (the exit file's mtime, rig.clock.event_time), not when the new worker adopted it; so
are its attempt row and the duration history backfill reads. Real Redis, real processes, the
card runner's own start path and its adoption by a second runner."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rig import estimates
from rig.client import current_identity
from rig.clock import event_time
from rig.keys import Keys
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.card_runner import CardRunner, _read_exit_file

pytestmark = pytest.mark.redis

RUNS_S = 1.0  # how long the job runs
DOWN_S = 2.5  # how long after its end no worker watches (the node is down)
CLOCKS_S = 0.5  # two processes' readings of the shared clock (rig.clock anchors) may differ by


def _until(what, timeout: float = 10.0):  # noqa: ANN001, ANN202
    """Poll ``what()`` (a file or a record written by another process: nothing to await)."""
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


@pytest.mark.parametrize("code", [7, 0])
def test_a_job_that_ended_while_the_node_was_down_keeps_its_own_end_time(card_runner_env, tmp_path, code):
    settings, ledger, runner, _ = card_runner_env
    name = f"adopted-end-{code}-{time.monotonic_ns()}"
    job = ledger.store.create(Job(
        id=0, name=name, user=current_identity().name, command=["/bin/sh", "-c", f"sleep {RUNS_S}; exit {code}"],
        shell=True, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING,
        workdir=str(tmp_path), created_at=time.time()))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    said: list[str] = []
    thread = threading.Thread(target=lambda: said.append(runner.run_job(job.id, token)), daemon=True)
    thread.start()
    running = _until(lambda: (j := ledger.store.get(job.id)).pid and j.log_paths and j)
    runner.stop()  # `rig down`: the job runs on, unwatched
    thread.join(10)
    assert said == ["detached"]
    exit_file = Path(running.log_paths[-1]).with_suffix(".exit")
    _until(lambda: _read_exit_file(exit_file) is not None)  # the job ended, unwatched
    time.sleep(DOWN_S)  # the node stays down after the job's end (the slip itself, not a wait)
    CardRunner(settings, "n1", 0, "card0@n1-again").adopt()
    done = ledger.store.get(job.id)
    assert done.state is (JobState.SUCCEEDED if code == 0 else JobState.FAILED) and done.exit_code == code
    # Its end is the exit file's mtime (not the adoption, DOWN_S later). Not started_at +
    # RUNS_S: under load the shell may start a second after the start is stamped (CI: 2.07 s).
    ended = event_time(ledger.r, wall=exit_file.stat().st_mtime)
    assert abs(done.ended_at - ended) < CLOCKS_S, f"ended at {done.ended_at:.2f}, exit file at {ended:.2f}"
    ran = done.ended_at - running.started_at
    assert ran >= RUNS_S - 0.2, f"runtime {ran:.2f} s for a {RUNS_S} s job"
    row = done.attempts[-1]
    assert row["ended_at"] == done.ended_at and row["started_at"] == running.started_at
    if code == 0:
        history = estimates.read_own(ledger.r, Keys(settings.key_prefix), user=current_identity().name, name=name,
                                     template=None, command=[])["name"]
        assert len(history) == 1 and history[0] == pytest.approx(ran, abs=0.01), (history, ran)
    assert ledger.card("n1", 0).reserved == 0
