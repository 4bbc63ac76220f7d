"""rig.jobtrace: one line a mark, carrying the marking thread's CPU time, so a profile can
attribute a card worker's CPU to the steps of a job (scripts/profile_job_path.py)."""

from __future__ import annotations

import importlib
import os
import threading
import time
from pathlib import Path

import pytest

from rig import jobtrace


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RIG_TRACE_DIR", str(tmp_path))
    module = importlib.reload(jobtrace)
    yield module, tmp_path
    monkeypatch.delenv("RIG_TRACE_DIR")
    importlib.reload(jobtrace)


def test_off_without_the_variable_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIG_TRACE_DIR", raising=False)
    module = importlib.reload(jobtrace)
    module.mark(1, "claimed")
    assert not module.enabled()
    assert list(tmp_path.iterdir()) == []


def test_a_mark_carries_its_thread_and_the_threads_cpu_time(traced) -> None:
    module, folder = traced
    lines: list[str] = []

    def job_thread() -> None:
        module.mark(7, "claimed")
        deadline = time.thread_time() + 0.02
        while time.thread_time() < deadline:  # spend 20 ms of this thread's CPU
            pass
        module.mark(7, "concluded")
        lines.append(str(threading.get_ident()))

    thread = threading.Thread(target=job_thread)
    thread.start()
    thread.join()
    module.mark(None, "wake")
    text = (folder / f"{os.getpid()}.trace").read_text().splitlines()
    rows = [line.split() for line in text]
    assert [r[:2] for r in rows] == [["7", "claimed"], ["7", "concluded"], ["-", "wake"]]
    assert all(len(r) == 6 and r[3] == str(os.getpid()) for r in rows)
    assert rows[0][4] == rows[1][4] == lines[0]  # the job's own thread
    assert rows[2][4] != lines[0]
    spent = float(rows[1][5]) - float(rows[0][5])
    assert spent >= 0.02  # the thread's CPU between its marks, not the process's or the wall's
