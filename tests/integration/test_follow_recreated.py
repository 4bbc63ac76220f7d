"""`rig log -f` (rig.cli.logview.show_log, as the CLI calls it) on a real card worker while the
job's log folder is deleted: the card's keeper makes the log again and the follower goes on in
the new file from its start, says so once, ends with the job's last line, and uses next to no
CPU while it waits (it polls every POLL_S)."""

from __future__ import annotations

import io
import shutil
import threading
import time

import pytest

from rig.cli.logview import show_log
from rig.logs import job_folder
from rig.models import JobState
from tests.integration.test_card_runner import placed
from tests.integration.test_keeper_death import _until
from workers.card_runner import read_pid_file

pytestmark = pytest.mark.redis

MADE_AGAIN = "was deleted and made again"


def test_follow_goes_on_in_a_log_made_again(card_runner_env, tmp_path):
    settings, ledger, runner, _ = card_runner_env
    go, end = tmp_path / "go", tmp_path / "end"
    job, token = placed(ledger, f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; i=0; "
                                f"while [ ! -e {end} ]; do echo after $i; i=$((i+1)); sleep 0.02; done; "
                                "echo the-last-line", tmp_path)
    folder = job_folder(settings.job_log_dir, job.id, job.instance)
    log = folder / "attempt-1.log"
    out, said, cpu = io.BytesIO(), [], []

    def follow() -> None:
        began, wall = time.thread_time(), time.monotonic()
        show_log(lambda: ledger.store.get(job.id), attempt=None, follow=True, out=out, say=said.append)
        cpu.append((time.thread_time() - began, time.monotonic() - wall))

    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    worker.start()
    follower = threading.Thread(target=follow)
    try:
        assert _until(lambda: log.exists() and read_pid_file(log.with_suffix(".pid")) is not None)
        follower.start()
        assert _until(lambda: out.getvalue() == b"before\n")
        shutil.rmtree(folder)
        go.touch()
        assert _until(lambda: any(MADE_AGAIN in line for line in said) and out.getvalue().count(b"after") >= 20)
    finally:
        go.touch()
        end.touch()
    worker.join(30)
    follower.join(30)
    assert results == ["SUCCEEDED"] and not follower.is_alive()
    text = out.getvalue()
    # Everything of the new file, from its first line (the keeper's own) to the job's last.
    new = log.read_bytes()
    assert new.startswith(b"[rig: this log was deleted") and text.endswith(new), (text[-300:], new[-300:])
    assert text.startswith(b"before\n") and text.endswith(b"the-last-line\n")
    assert sum(MADE_AGAIN in line for line in said) == 1
    assert said[-1] == f"--- job {job.id} SUCCEEDED after 1 attempt(s) ---"
    assert ledger.store.get(job.id).state is JobState.SUCCEEDED
    used, wall = cpu[0]
    assert used < 0.25 * wall, f"the follower used {used:.2f} s of CPU in {wall:.2f} s"
