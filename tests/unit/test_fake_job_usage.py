"""Fake-card usage of jobs run as another user (rig.gpus.fake.job_usage_dir): each job gets a
folder of its own, owned by its uid, in a place other users can reach (a root node's RIG_HOME
may be closed to them), that the backend sums with the shared one, without following the links
a job's user could plant there. No real users needed: chown is recorded, the euid given."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rig.gpus import fake
from rig.gpus.fake import (
    SYSTEM_RUN,
    FakeGpuBackend,
    drop_job_usage_dir,
    job_usage_dir,
    jobs_dir_for,
)
from rig.memory import GIB


@pytest.fixture
def chowned(monkeypatch) -> list[tuple[str, int, int]]:
    calls: list[tuple[str, int, int]] = []
    monkeypatch.setattr(fake.os, "chown", lambda path, uid, gid: calls.append((str(path), uid, gid)))
    return calls


def test_a_root_node_puts_the_jobs_folders_where_every_user_passes(tmp_path: Path):
    root = jobs_dir_for(tmp_path / "home" / "fake-gpus", euid=0)
    assert root.parent == SYSTEM_RUN and root.name.startswith("fake-gpus-")
    assert root != jobs_dir_for(tmp_path / "other" / "fake-gpus", euid=0)  # two installations apart
    assert jobs_dir_for(tmp_path / "fake-gpus", euid=1000) == tmp_path / "fake-gpus" / "jobs"


def test_a_job_of_another_user_gets_a_folder_only_it_can_write(tmp_path: Path, chowned):
    jobs = tmp_path / "run" / "fake-gpus-x"
    folder = job_usage_dir(jobs, 7, uid=4242, gid=4343)
    assert folder == jobs / "job-7"
    assert chowned == [(str(folder), 4242, 4343)]  # the job's uid owns it
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(jobs.stat().st_mode) == 0o711  # passable, not listable
    assert stat.S_IMODE(jobs.parent.stat().st_mode) == 0o755
    (folder / "0").mkdir()
    (folder / "0" / "stale").write_text("1")
    job_usage_dir(jobs, 7, uid=4242, gid=4343)  # a new attempt: afresh
    assert not (folder / "0").exists()
    chowned.clear()
    job_usage_dir(jobs, 8, uid=os.geteuid(), gid=os.getegid())
    assert chowned == []  # the worker's own user: nothing to hand over


def test_the_backend_sums_the_jobs_folders_and_follows_no_link(tmp_path: Path, chowned, monkeypatch):
    usage = tmp_path / "fake-gpus"
    jobs = tmp_path / "run" / "fake-gpus-x"
    monkeypatch.setattr(fake, "jobs_dir_for", lambda usage_dir: jobs)
    backend = FakeGpuBackend("3x24G", usage_dir=usage, node="n")
    (usage / "0").mkdir(parents=True)
    (usage / "0" / str(os.getppid())).write_text(str(1 * GIB))  # the worker's user, shared folder
    mine = job_usage_dir(backend.jobs_dir, 7, uid=4242, gid=4242)
    (mine / "0").mkdir()
    (mine / "0" / str(os.getpid())).write_text(str(5 * GIB))
    assert backend.read(0).used == 6 * GIB and backend.read(0).utilization == 100
    # Links planted by the job's user to root's files: a file, and a whole card folder.
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / str(os.getpid())).write_text(str(9 * GIB))
    (mine / "1").mkdir()
    (mine / "1" / str(os.getpid())).symlink_to(secret / str(os.getpid()))
    (mine / "2").symlink_to(secret)
    assert backend.read(1).used == 0 and backend.read(2).used == 0
    drop_job_usage_dir(jobs, 7)  # its attempt ended: gone, and the link's target is left alone
    assert not mine.exists() and (secret / str(os.getpid())).exists()
    assert not jobs.exists()  # the last job's: nothing left behind
    assert backend.read(0).used == 1 * GIB


def test_fakeuse_never_shows_an_empty_usage_file(tmp_path, monkeypatch):
    """`python -m rig.fakeuse` writes its use aside and renames it in: a backend reading the card
    while it starts sees the full use or nothing, never a 0-byte use (the job looked idle)."""
    from rig import fakeuse

    monkeypatch.setenv("RIG_FAKE_GPU_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    backend = FakeGpuBackend("1x80G", tmp_path)
    seen: list[dict[int, int]] = []
    real_replace = os.replace

    def replace(src, dst):  # noqa: ANN001 - os.replace's shape
        seen.append(backend.read(0).processes)  # just before the use appears
        real_replace(src, dst)
        seen.append(backend.read(0).processes)

    monkeypatch.setattr(fakeuse.os, "replace", replace)
    monkeypatch.setattr(fakeuse.time, "sleep", lambda s: None)
    assert fakeuse.main(["6G", "0"]) == 0
    assert seen == [{}, {os.getpid(): 6 * GIB}]
    assert backend.read(0).processes == {}  # removed at its end
