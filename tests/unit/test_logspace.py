"""Disk trouble under log_dir (issue 11.3), without a full disk: the probe, the log keeper's
copy through failed writes (OSError(ENOSPC) injected), the note it leaves and the words the
record gets, the alert and the metric."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from rig import logkeeper, logspace
from rig.models import CardState


def _card(node: str, index: int, healthy: bool = True, reason: str = "") -> CardState:
    return CardState(node=node, index=index, total=1, usable=1, reserved=0, jobs=0, max_jobs=1,
                     allowed=True, healthy=healthy, model="m", health_reason=reason)


def test_disk_errors_are_the_four_and_only_them():
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
        assert logspace.is_disk_error(OSError(code, "x"))
    assert not logspace.is_disk_error(OSError(errno.EACCES, "x"))
    assert not logspace.is_disk_error(ValueError("x"))


def test_probe_passes_then_says_low_space_then_a_refused_write(tmp_path, monkeypatch):
    assert logspace.probe([tmp_path / "logs"], 0) is None
    assert not list((tmp_path / "logs").iterdir())  # the probe file is gone
    low = logspace.probe([tmp_path], 1 << 62)
    assert low and low.startswith(logspace.REASON_PREFIX) and "free" in low
    real_open = os.open

    def refuse(path, *args, **kwargs):  # noqa: ANN001
        if ".rig-write-probe" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    said = logspace.probe([tmp_path], 0)
    assert said and "Read-only file system (EROFS)" in said and str(tmp_path) in said


class FailingWrites:
    """os.write that refuses writes to one file with ENOSPC while ``full`` is set."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.full = threading.Event()
        self.real = os.write

    def __call__(self, fd: int, data) -> int:  # noqa: ANN001
        if self.full.is_set() and os.readlink(f"/proc/self/fd/{fd}") == self.path:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


def test_keeper_reads_on_through_a_full_disk_and_notes_what_is_missing(tmp_path, monkeypatch):
    log = tmp_path / "attempt-1.log"
    logspace.preallocate(tmp_path / "attempt-1.note", logspace.NOTE_BYTES)
    writes = FailingWrites(log)
    monkeypatch.setattr(os, "write", writes)
    read_fd, write_fd = os.pipe()
    sizes: list[int] = []
    keeper = threading.Thread(target=logkeeper.keep, args=(read_fd, log, 1 << 20, sizes.append))
    keeper.start()

    def send(data: bytes) -> None:
        n = len(sizes)
        writes.real(write_fd, data)
        while len(sizes) == n:  # the keeper took it (on_write runs after each chunk)
            threading.Event().wait(0.001)

    send(b"before\n")
    writes.full.set()
    send(b"x" * 1000 + b"\n")  # lost: the job is never blocked for it
    writes.full.clear()
    send(b"after\n")
    os.close(write_fd)
    keeper.join(5)
    os.close(read_fd)
    text = log.read_text()
    assert text.startswith("before\n") and text.endswith("after\n")
    assert "before\n[rig: 1001 bytes of output were lost here: could not write the log (No space left on device)" in text
    note = logspace.read_note(tmp_path / "attempt-1.note")
    assert note["lost"] == 1001 and note["error"] == "ENOSPC" and note["log_bytes"] == 7
    said = logspace.describe_note(note)
    assert said.startswith("log incomplete: disk full (ENOSPC) at ") and "after 7 B; 1001 B of output lost" in said


def test_keeper_notes_the_cap_cut(tmp_path):
    log = tmp_path / "attempt-1.log"
    read_fd, write_fd = os.pipe()
    keeper = threading.Thread(target=logkeeper.keep, args=(read_fd, log, 8192))
    keeper.start()
    for _ in range(40):
        os.write(write_fd, b"y" * 1023 + b"\n")
    os.close(write_fd)
    keeper.join(5)
    os.close(read_fd)
    note = logspace.read_note(tmp_path / "attempt-1.note")
    assert note["cap"] == 8192 and note["cap_cut"] > 0
    assert logspace.describe_note(note).startswith("log cut: ")


def test_a_whole_log_has_no_note(tmp_path):
    assert logspace.describe_note(logspace.read_note(tmp_path / "none.note")) == ""
    assert logspace.describe_note({"lost": "many"}) == "log note unreadable"


def test_overwrite_never_leaves_a_longer_old_text(tmp_path):
    path = tmp_path / "f"
    logspace.preallocate(path, 32)
    logspace.overwrite(path, "a long first text", 32)
    logspace.overwrite(path, "short", 32)
    assert path.read_text().strip() == "short" and path.stat().st_size == 32


def test_alert_and_metric_per_node(monkeypatch):
    from rig.alerts import _log_space
    from rig.metrics import _log_space_family

    reason = logspace.reason(Path("/x"), OSError(errno.ENOSPC, "No space left on device"))
    cards = [_card("a", 0, False, reason), _card("a", 1, False, reason), _card("b", 0),
             _card("c", 0, False, "temperature 99 C > 90 C")]
    alerts = _log_space(cards)
    assert [(a.key, a.severity) for a in alerts] == [("log_space:a", "critical")]
    assert "node a takes no new jobs: cannot write logs under /x" in alerts[0].message
    samples = {s.labels["node"]: s.value for s in _log_space_family(cards).samples}
    assert samples == {"a": 0, "b": 1, "c": 1}


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_prepare_attempt_on_a_refusing_disk_leaves_nothing(tmp_path, monkeypatch, code):
    from rig.logs import AttemptFiles
    from workers.log_space import NotStarted, prepare_attempt

    def refuse(*_a, **_k):  # noqa: ANN002, ANN003
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr("workers.log_space.logspace.preallocate", refuse)
    files = AttemptFiles(tmp_path / "3-x", 1)
    with pytest.raises(NotStarted) as caught:
        prepare_attempt(files)
    assert caught.value.error.errno == code
    assert list(files.folder.iterdir()) == []
