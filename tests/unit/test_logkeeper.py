"""The log keeper (rig/logkeeper.py): a log stays within its cap at any write rate."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rig import logkeeper


@pytest.mark.parametrize("cap", [64 * 1024, 1 << 20, 5000])
def test_the_log_never_exceeds_the_cap_plus_one_read(tmp_path: Path, cap: int):
    log = tmp_path / "attempt-1.log"
    read_fd, write_fd = os.pipe()
    total = 30 * cap + 12345

    def writer() -> None:  # as fast as the pipe takes it
        line = b"".join(b"line %07d of output\n" % i for i in range(1000))
        sent = 0
        with os.fdopen(write_fd, "wb") as out:
            while sent < total:
                piece = line[: total - sent]
                out.write(piece)
                sent += len(piece)
            out.write(b"the last line\n")

    sizes: list[int] = []
    thread = threading.Thread(target=writer)
    thread.start()
    cut = logkeeper.keep(read_fd, log, cap, on_write=sizes.append)
    thread.join()
    os.close(read_fd)
    bound = cap + max(0, logkeeper.read_size(cap) - cap // 4)
    assert max(sizes) <= bound, (max(sizes), bound)
    text = log.read_bytes()
    assert text.startswith(b"line 0000000 of output\n") and text.endswith(b"the last line\n")
    assert b"bytes of output were cut here" in text and cut > 0
    from rig.logs import human_size

    assert f"to keep this log under {human_size(cap)}]".encode() in text  # the cap, not 3/4 of it
    assert len(text) + cut >= total  # nothing vanished besides what the marker counts


def test_the_keeper_script_starts_without_rig_and_ignores_sigterm(tmp_path: Path):
    """Run as the card worker runs it: python -I -S, from a folder with a hostile rig/."""
    hostile = tmp_path / "rig"
    hostile.mkdir()
    (hostile / "__init__.py").write_text("raise SystemExit('imported the wrong rig')\n")
    log = tmp_path / "out.log"
    proc = subprocess.Popen([sys.executable, "-I", "-S", logkeeper.__file__, str(log), "100000"],
                            stdin=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdin is not None
    proc.stdin.write(b"before\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 10
    while (not log.exists() or log.read_bytes() != b"before\n") and time.monotonic() < deadline:
        time.sleep(0.005)  # until it runs its loop (its handlers are set before)
    proc.terminate()  # rig kill's SIGTERM reaches the keeper's session only by mistake: ignored
    proc.stdin.write(b"after\n")
    proc.stdin.close()
    assert proc.wait(10) == 0
    assert log.read_bytes() == b"before\nafter\n"


def test_the_fork_server_gives_keepers_that_outlive_it(tmp_path: Path):
    """A keeper forked by the server writes its log to the end even after the server (its
    worker) is gone; the server ends when the worker's end of its socket closes."""
    from workers.process_tree import is_alive

    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    read_fd, write_fd = os.pipe()
    try:
        pid = server.start(read_fd, tmp_path / "a.log", 1 << 20)
    finally:
        os.close(read_fd)
    os.write(write_fd, b"before\n")
    deadline = time.monotonic() + 10
    while not (tmp_path / "a.log").exists() and time.monotonic() < deadline:
        time.sleep(0.005)  # it has forked, set its session and opened the log
    assert os.getsid(pid) == pid  # a session of its own
    server.close()
    assert server.proc.poll() is not None  # the server is gone ...
    os.kill(pid, 15)  # ... the keeper ignores SIGTERM and is still there
    os.write(write_fd, b"after\n")
    os.close(write_fd)  # end of file: it finishes
    deadline = time.monotonic() + 10
    while is_alive(pid, None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not is_alive(pid, None)
    assert (tmp_path / "a.log").read_bytes() == b"before\nafter\n"


def test_a_bad_request_is_refused_and_the_server_carries_on(tmp_path: Path):
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    try:
        read_fd, write_fd = os.pipe()
        with pytest.raises(OSError, match="refused"):
            server.start(read_fd, tmp_path / "a.log", 0)
        pid = server.start(read_fd, tmp_path / "b.log", 100)
        os.close(read_fd)
        os.write(write_fd, b"ok\n")
        os.close(write_fd)
        assert pid > 0
    finally:
        server.close()


def test_a_traced_keeper_marks_its_own_cpu_time_at_its_end(tmp_path: Path):
    """With RIG_TRACE_DIR in the server's environment (rig.jobtrace.environ), each keeper
    writes one ``keeper_end`` line with its own CPU time as it ends (the kernel reaps keepers,
    so no process's children's time holds it: scripts/profile_job_path.py adds it up)."""
    from workers.process_tree import ExitWatcher

    traces = tmp_path / "trace"
    traces.mkdir()
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin", "RIG_TRACE_DIR": str(traces)})
    read_fd, write_fd = os.pipe()
    try:
        pid = server.start(read_fd, tmp_path / "a.log", 1 << 20)
        watcher = ExitWatcher(pid)
    finally:
        os.close(read_fd)
    os.write(write_fd, b"out\n")
    os.close(write_fd)  # end of file: the keeper ends
    try:
        assert watcher.wait(10)
    finally:
        watcher.close()
        server.close()
    (line,) = (traces / f"{pid}.trace").read_text().splitlines()
    job, stage, _when, marked_pid, _thread, cpu = line.split()
    assert (job, stage, int(marked_pid)) == ("-", "keeper_end", pid)
    assert 0 < float(cpu) < 5  # measured finer than a clock tick: a short keeper is not 0
    assert (tmp_path / "a.log").read_bytes() == b"out\n"
