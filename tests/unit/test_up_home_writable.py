"""`rig up` in a home it cannot write (a read-only mount, a file where its logs folder goes):
one line naming the folder and what to do, exit 6, before anything starts (a breaker's finding:
a traceback from the daemon's mkdir)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from click.testing import CliRunner

from rig.cli.main import cli


@pytest.mark.parametrize("daemon", [False, True])
def test_a_file_where_the_logs_folder_goes_is_one_line(tmp_path, monkeypatch, daemon):
    monkeypatch.setenv("RIG_HOME", str(tmp_path))
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:1/0")  # never reached
    (tmp_path / "logs").write_text("not a folder")
    result = CliRunner().invoke(cli, ["up", "--fake-gpus", "1x8G"] + (["--daemon"] if daemon else []))
    assert result.exit_code == 6, result.output
    assert "rig up cannot write in" in result.output and "RIG_HOME" in result.output
    assert "Traceback" not in result.output


def test_a_read_only_home_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_HOME", str(tmp_path))
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:1/0")

    def read_only(self: Path, *_a: object, **_k: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    result = CliRunner().invoke(cli, ["up", "--daemon", "--fake-gpus", "1x8G"])
    assert result.exit_code == 6, result.output
    assert "(Read-only file system)" in result.output
