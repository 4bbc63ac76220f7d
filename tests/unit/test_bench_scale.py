"""scripts/bench_scale.py from outside (issue 15): bad arguments are one argparse line, a
timed-out wake is never printed as a latency, and a run stopped by SIGTERM leaves neither keys
in its Redis nor folders behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_scale.py"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The script with ``args``; by default pointed at a port where nothing listens, so an
    argument it accepts by mistake ends at its Redis check instead of benchmarking the shared
    Redis (the unfixed script ran the full benchmark there for --dispatchers 0)."""
    from rig.testing.sentinel_set import free_port

    env = env or {**os.environ, "RIG_BENCH_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.mark.parametrize("args", [["--waiting", "1k"], ["--cards", "8,"], ["--cards", "12"], ["--users", "0"],
                                  ["--reps", "0"], ["--dispatchers", "0"], ["--dispatchers", "1,0"]])
def test_bad_arguments_are_one_argparse_line_and_exit_2(args):
    done = _run(*args)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"bench_scale.py: error: argument {args[0]}: ")


def test_a_timed_out_wake_is_never_a_latency():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_scale
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert bench_scale.latency_row(0, [], 10) == "| 0 | timed out | timed out | 10 of 10 |"
    row = bench_scale.latency_row(8, [2.0, 3.0, 4.0], 1)
    assert row == "| 8 | 3.0 | 4.0 | 1 of 4 |" and "5000" not in row


def test_help_says_which_redis_is_used():
    done = _run("--help", env={**os.environ, "RIG_BENCH_REDIS_URL": "redis://10.9.9.9:6390/0"})
    assert "$RIG_BENCH_REDIS_URL, else $RIG_REDIS_URL" in done.stdout and "10.9.9.9:6390" in done.stdout


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_deletes_its_keys_and_folders(tmp_path):
    from rig.testing.sentinel_set import free_port
    from rig.testing.throwaway_redis import start_redis

    port = free_port()
    server = start_redis(port, tmp_path / "redis")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "RIG_BENCH_REDIS_URL": f"redis://127.0.0.1:{port}/0", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--cards", "8", "--users", "1", "--waiting", "1000",
                             "--reps", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        r = redis.Redis(port=port, decode_responses=True)
        for line in proc.stdout:  # the cluster is built (its keys written) once its table's title is out
            if line.startswith("## "):
                break
        assert r.keys("rigscale:*"), "the run wrote nothing before it was stopped"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert r.keys("rigscale:*") == []
        assert [p.name for p in tmp.iterdir() if p.name.startswith("rig-scale-")] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.kill()
        server.wait()
