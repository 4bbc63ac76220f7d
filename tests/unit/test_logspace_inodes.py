"""A file system out of inodes, and one smaller than log_min_free_bytes (issue 11 follow-up,
item 16): the reason says "no free inodes" (df shows free bytes), and `rig up` warns once."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from rig import logspace


class FakeStat:
    def __init__(self, *, files: int, favail: int, blocks: int = 1 << 20, frsize: int = 4096) -> None:
        self.f_files, self.f_favail, self.f_ffree = files, favail, favail
        self.f_blocks, self.f_frsize, self.f_bavail, self.f_bsize = blocks, frsize, blocks, frsize


def test_enospc_with_no_free_inodes_says_so(tmp_path, monkeypatch):
    enospc = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "statvfs", lambda _p: FakeStat(files=100, favail=0))
    assert "no free inodes (ENOSPC, though bytes are free" in logspace.reason(tmp_path, enospc)
    # Free inodes, or a file system that does not count them (f_files 0): the plain words.
    monkeypatch.setattr(os, "statvfs", lambda _p: FakeStat(files=100, favail=3))
    assert "No space left on device (ENOSPC)" in logspace.reason(tmp_path, enospc)
    monkeypatch.setattr(os, "statvfs", lambda _p: FakeStat(files=0, favail=0))
    assert "No space left on device (ENOSPC)" in logspace.reason(tmp_path, enospc)


def test_a_file_system_smaller_than_log_min_free_is_one_warning(tmp_path, monkeypatch):
    assert logspace.never_enough({"log_dir": tmp_path}, 4096) is None
    monkeypatch.setattr(os, "statvfs", lambda _p: FakeStat(files=10, favail=10, blocks=256))  # 1 MiB
    line = logspace.never_enough({"log_dir": tmp_path, "run_dir": tmp_path}, 32 << 20)
    assert line == (f"warning: the file system of log_dir ({tmp_path}) holds 1.0 MiB in all, less than "
                    "log_min_free_bytes = 32.0 MiB: this node can never take a job (lower "
                    "log_min_free_bytes or move log_dir)")


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs with 4 inodes (root only; skipped where mounting is not allowed)."""
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=4", "tmpfs",
                                            str(where)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_on_a_real_file_system_out_of_inodes(tiny_tmpfs: Path):
    made = 0
    with pytest.raises(OSError):
        for i in range(10):
            (tiny_tmpfs / f"f{i}").touch()
            made += 1
    assert os.statvfs(tiny_tmpfs).f_bavail > 0  # bytes are free
    said = logspace.probe([tiny_tmpfs], 0)
    assert said == (f"cannot write logs under {tiny_tmpfs}: no free inodes (ENOSPC, though bytes are free: "
                    "too many files); takes jobs again when it can"), said
    assert logspace.never_enough({"log_dir": tiny_tmpfs}, 32 << 20).startswith(
        f"warning: the file system of log_dir ({tiny_tmpfs}) holds 1.0 MiB in all")


def test_rig_up_says_it_once_before_starting_anything(tmp_path, monkeypatch, key_prefix):
    """Stack.up's bring-up, cut short once the warnings are said (no children). Its own key
    prefix: the archive check reads (and records) the cluster's archive in the real Redis."""
    from rig.config import load_settings
    from rig.stack import Stack, UpOptions

    class Stop(Exception):
        pass

    settings = load_settings(home=tmp_path / "home", node_name="n1", log_min_free_bytes=1 << 62,
                             key_prefix=key_prefix)
    said: list[str] = []
    stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=said.append)
    for name in ("stop_leftovers", "_ensure_redis", "_claim_name", "_check_installation"):
        monkeypatch.setattr(stack, name, lambda: None)
    # pytest's folders are 0700: a root rig up rightly warns that users cannot reach its gateway there.
    monkeypatch.setattr("rig.gateway.server.reach_problem", lambda path: None)

    def stop() -> None:
        raise Stop

    monkeypatch.setattr(stack, "_child_env", stop)
    with pytest.raises(Stop):
        stack.up()
    small = [line for line in said if "log_min_free_bytes" in line]
    assert len(small) == 1 and small[0].startswith("warning: the file system of log_dir"), said
    # `rig up --daemon` (quickstart's) repeats it on the terminal: it was said in up.log alone,
    # and the operator read "rig is up" of a node that could never take a job
    assert stack.take_notes() == small
