"""`rig up --daemon` says on the terminal (not only in up.log) when gpu_whitelist names no card
of the node, and `rig status` then shows the card closed for that reason only (issue 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_bring_up import free_port, rig

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def test_up_daemon_says_the_whitelist_names_no_card(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(RIG_HOME=str(tmp_path / "home"), RIG_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
               RIG_FAKE_GPUS="1x24G", RIG_NODE_NAME="lonely", RIG_GPU_WHITELIST="[1]")
    up = rig(env, "up", "--daemon", "--no-flower", "--no-metrics", "--no-beat")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert ("warning: gpu_whitelist [1] names no card of this node (its cards are [0]): it runs no new job "
                "until gpu_whitelist names one") in up.stderr, up.stderr
        status = rig({**env, "COLUMNS": "80"}, "status")
        assert status.returncode == 0
        assert "lonely/0 takes no new jobs: not in whitelist" in status.stdout, status.stdout
        assert "UNHEALTHY" not in status.stdout and "…" not in status.stdout
    finally:
        subprocess.run([str(BIN / "rig"), "down"], env=env, capture_output=True, timeout=120)
