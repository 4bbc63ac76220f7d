"""`rig log -f` of a real job that fails once and is retried follows it to its end, marking each
attempt (issue 10, item 6). A real node on fake cards, the real `rig` command."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from rig.models import JobState
from tests.integration.harness import RigHarness

pytestmark = pytest.mark.slow


def test_log_follow_goes_through_the_retry_to_the_end(tmp_path):
    node = RigHarness(tmp_path / "home", fake_gpus="1x24G")
    node.up()
    try:
        work = tmp_path / "work"
        work.mkdir()
        # Attempt 1 prints, waits until the follower has shown its line, and fails; attempt 2
        # (the marker exists) succeeds.
        script = ('if [ -e marker ]; then echo second attempt; sleep 0.5; echo all done; exit 0; fi; '
                  'touch marker; echo first attempt; while [ ! -e go ]; do sleep 0.05; done; exit 3')
        handle = node.client.submit(["sh", "-c", script], gpu_memory="1G", workdir=str(work), retries=1)
        node.wait_for_state(handle.id, {JobState.RUNNING}, timeout=60)
        env = {**os.environ, "RIG_KEY_PREFIX": node.prefix, "RIG_REDIS_URL": node.settings.redis_url,
               "RIG_HOME": str(node.settings.home), "RIG_LOG_DIR": str(node.settings.job_log_dir)}
        follow = subprocess.Popen([sys.executable, "-m", "rig.cli.main", "log", "-f", str(handle.id)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        # Let attempt 1 end once the follower has shown its line (at the latest after 60 s, so a
        # follower that never shows it fails the test instead of hanging it).
        let_go = threading.Timer(60, (work / "go").touch)
        let_go.start()
        try:
            first = follow.stdout.readline()
            (work / "go").touch()
            rest, errors = follow.communicate(timeout=90)
        finally:
            let_go.cancel()
            follow.kill()
        assert follow.returncode == 0, errors
        assert first + rest == "first attempt\nsecond attempt\nall done\n", errors
        # Between the attempts the job waits in the queue; a loaded machine may show that line.
        marks = [line for line in errors.splitlines()
                 if line.startswith("---") and " is waiting: " not in line]
        assert marks == [f"--- job {handle.id}, attempt 1 (testnode/0) ---",
                         f"--- job {handle.id}, attempt 2 (testnode/0) ---",
                         f"--- job {handle.id} SUCCEEDED after 2 attempt(s) ---"], errors

        shown = subprocess.run([sys.executable, "-m", "rig.cli.main", "log", str(handle.id), "--attempt", "1"],
                               capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
        assert shown.stdout == "first attempt\n"
        assert f"--- job {handle.id}, attempt 1 of 2 (testnode/0) ---" in shown.stderr
    finally:
        node.cleanup()
