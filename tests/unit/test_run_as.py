"""Which identity a job runs as (workers/run_as.py), with fake password and group databases."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from types import SimpleNamespace

import pytest

from rig.config import load_settings
from rig.models import Job, JobState, Priority
from workers.card_runner import CardRunner
from workers.run_as import RunAs, RunAsRefused, decide


def entry(name: str, uid: int, gid: int, home: str = "/home/x") -> SimpleNamespace:
    # What decide() reads of a pwd.struct_passwd (building real ones upsets CPython at exit).
    return SimpleNamespace(pw_name=name, pw_uid=uid, pw_gid=gid, pw_dir=home, pw_shell="/bin/bash")


USERS = {"alice": entry("alice", 1001, 1001, "/home/alice"), "root": entry("root", 0, 0, "/root"),
         "weird": entry("weird", 1002, 100, "relative-home")}
GROUPS = {"alice": [1001, 27, 44, 27], "root": [0], "weird": [100]}


def getpwnam(name: str) -> SimpleNamespace:
    return USERS[name]  # KeyError, as pwd raises, for anyone else


def getgrouplist(name: str, gid: int) -> list[int]:
    assert gid == USERS[name].pw_gid  # the primary group is passed in
    return GROUPS[name]


def run(user: str, uid: int | None, worker_uid: int = 0, allow_root: bool = True) -> RunAs | None:
    return decide(user, uid, worker_uid=worker_uid, allow_root_jobs=allow_root,
                  getpwnam=getpwnam, getgrouplist=getgrouplist)


def test_a_root_worker_runs_the_job_as_its_submitter_with_all_groups():
    chosen = run("alice", 1001)
    assert chosen == RunAs(user="alice", uid=1001, gid=1001, groups=(27, 44, 1001), home="/home/alice")
    assert chosen.env() == {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice"}
    assert chosen.popen_args() == {"user": 1001, "group": 1001, "extra_groups": [27, 44, 1001]}


def test_a_record_without_a_uid_is_matched_by_name():
    assert run("alice", None).uid == 1001


def test_a_worker_that_is_not_root_runs_every_job_as_itself():
    assert run("alice", 1001, worker_uid=1234) is None
    assert run("nobody-here", None, worker_uid=1234) is None  # it could not switch anyway


def test_an_unknown_user_is_refused_with_a_reason():
    with pytest.raises(RunAsRefused, match="user 'mallory' does not exist on this node"):
        run("mallory", 1005)


def test_a_uid_that_differs_from_the_submitting_host_is_refused():
    with pytest.raises(RunAsRefused, match="uid 1001 on this node but uid 2001 where the job was submitted"):
        run("alice", 2001)


def test_root_jobs_follow_the_setting():
    assert run("root", 0).uid == 0
    with pytest.raises(RunAsRefused, match="allow_root_jobs = false"):
        run("root", 0, allow_root=False)
    # A record claiming to be root's but carrying another uid was not submitted by root.
    with pytest.raises(RunAsRefused, match="uid 0 on this node but uid 1001"):
        run("root", 1001)


def test_a_home_that_is_not_absolute_becomes_root_folder():
    assert run("weird", 1002).home == "/"


def test_the_job_environment_takes_the_identity(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("USER", "root")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/0")
    settings = load_settings(home=tmp_path, redis_url="redis://127.0.0.1:1/0", key_prefix="t:")
    runner = CardRunner(settings, "n1", 0, "card0@n1")  # connects lazily: no Redis needed
    job = Job(id=3, name="t", user="alice", command=["true"], gpu_memory=1, gpus=1,
              priority=Priority.LOW, state=JobState.RUNNING, workdir="/", created_at=0.0,
              cards=[0], node="n1",
              env={"HOME": "/scratch/alice", "USER": "mallory", "RIG_JOB_ID": "99", "CUDA_VISIBLE_DEVICES": "0,1,2"})
    env = runner._job_env(job, 1, tmp_path / "x.exit", run("alice", 1001))
    # HOME may be chosen by the job; who it is may not; nor rig's own variables.
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/scratch/alice", "alice", "alice")
    assert env["RIG_JOB_ID"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "0" and env["RIG_EXIT_FD"] == "0"
    assert "XDG_RUNTIME_DIR" not in env
    plain = runner._job_env(job, 1, tmp_path / "x.exit", None)
    # Without a switch the job is the worker's user: its identity from the passwd entry, never
    # the operator's shell variables nor the record's claim to be someone else.
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert "XDG_RUNTIME_DIR" not in plain and plain["USER"] == me and plain["LOGNAME"] == me


def test_a_job_of_the_workers_own_user_gets_the_password_and_another_not(tmp_path: Path):
    # rig's home need not be the job user's ~/.rig (RIG_HOME elsewhere, a root node whose
    # admin's HOME differs): the password must come with the URL, as the README says.
    settings = load_settings(home=tmp_path, redis_url="redis://:s3cret@127.0.0.1:1/0", key_prefix="t:")
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    job = Job(id=3, name="t", user="alice", command=["true"], gpu_memory=1, gpus=1,
              priority=Priority.LOW, state=JobState.RUNNING, workdir="/", created_at=0.0,
              cards=[0], node="n1")
    me = os.geteuid()
    own = RunAs(user="me", uid=me, gid=os.getegid(), groups=(), home="/elsewhere")
    other = RunAs(user="alice", uid=me + 1001, gid=1001, groups=(), home="/home/alice")
    for run_as in (None, own):
        assert runner._job_env(job, 1, tmp_path / "x.exit", run_as)["RIG_REDIS_URL"] == settings.redis_url
    assert runner._job_env(job, 1, tmp_path / "x.exit", other)["RIG_REDIS_URL"] == "redis://127.0.0.1:1/0"
