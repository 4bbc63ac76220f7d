"""Which job processes on this machine are this node's (workers.health.node_job_processes):
real processes with the environment card workers give jobs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workers.health import node_job_processes

URL = "redis://:s3cret@127.0.0.1:6999/0"


@pytest.fixture
def start():
    procs: list[subprocess.Popen] = []

    def _start(job_id: int, url: str, exit_file: str) -> int:
        env = {"PATH": "/usr/bin:/bin", "RIG_KEY_PREFIX": "njp:", "RIG_NODE_NAME": "n1",
               "RIG_JOB_ID": str(job_id), "RIG_ATTEMPT": "1", "RIG_REDIS_URL": url,
               "RIG_EXIT_FILE": exit_file, "RIG_INSTALLATION": f"inst-{job_id}"}
        proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
        procs.append(proc)
        return proc.pid

    yield _start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_job_run_as_another_user_is_found_though_its_url_has_no_password(start, tmp_path: Path):
    # A root worker gives another user's job the URL without the password: the orphan check,
    # which asks with the node's URL (password included), must still see it.
    logs = tmp_path / "logs" / "jobs"
    own = start(1, URL, str(logs / "1-a" / "attempt-1.exit"))
    other_user = start(2, "redis://127.0.0.1:6999/0", str(logs / "2-b" / "attempt-1.exit"))
    other_redis = start(3, "redis://127.0.0.1:7000/0", str(logs / "3-c" / "attempt-1.exit"))
    found = node_job_processes("njp:", "n1", URL, logs)
    assert {sid: p.job_id for sid, p in found.items()} == {own: 1, other_user: 2}
    assert other_redis not in found


def test_another_homes_jobs_of_the_same_node_name_are_not_this_nodes(start, tmp_path: Path):
    # Another rig on this machine (its own Redis and home) with the default node name: its jobs
    # are neither "jobs of another installation still running here" (rig up refused, frozen
    # the node) nor for `rig recover --stop` to kill.
    mine = start(4, URL, str(tmp_path / "home" / "logs" / "jobs" / "4-d" / "attempt-1.exit"))
    theirs = start(5, "redis://127.0.0.1:6471/0", str(tmp_path / "other" / "logs" / "jobs" / "5-e" / "attempt-1.exit"))
    found = node_job_processes("njp:", "n1", log_dir=tmp_path / "home" / "logs" / "jobs")
    assert set(found) == {mine} and theirs not in found
    # the home's own folder name as a prefix of another's is no match either
    assert node_job_processes("njp:", "n1", log_dir=tmp_path / "home" / "logs" / "job") == {}
