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


def _until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.005)
    return check()


def _done(fd: int, timeout: float = 10.0) -> bool:
    """Has the card's keeper said its "done" (DONE, then end of file)? End of file alone would
    mean it died."""
    import select

    return (bool(select.select([fd], [], [], timeout)[0]) and os.read(fd, 1) == logkeeper.DONE
            and os.read(fd, 1) == b"")


def test_one_keeper_copies_every_log_of_its_card_and_says_when_each_is_done(tmp_path: Path):
    """Issue 13: the card's keeper copies every job's pipe from one process (no fork per job);
    each log's "done" pipe closes once that log is written to its end, the others go on."""
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    try:
        writers, dones, pids = [], [], set()
        for name in ("a", "b", "c"):
            read_fd, write_fd = os.pipe()
            try:
                pid, done = server.start(read_fd, tmp_path / f"{name}.log", 1 << 20)
            finally:
                os.close(read_fd)
            writers.append(write_fd)
            dones.append(done)
            pids.add(pid)
        assert pids == {server.proc.pid}  # no process of its own per log
        for i, fd in enumerate(writers):
            os.write(fd, f"first {i}\n".encode())
        os.close(writers[1])  # b ends first
        assert _done(dones[1])
        assert (tmp_path / "b.log").read_bytes() == b"first 1\n"
        for i in (0, 2):
            os.write(writers[i], f"second {i}\n".encode())
            os.close(writers[i])
            assert _done(dones[i])
            assert (tmp_path / f"{'abc'[i]}.log").read_bytes() == f"first {i}\nsecond {i}\n".encode()
        for fd in dones:
            os.close(fd)
        assert server.alive()  # it serves the next job's log
    finally:
        server.close(5)
    assert server.proc.poll() is not None  # the worker's end closed, nothing left to copy: gone


def test_the_cards_keeper_outlives_its_worker_until_its_logs_end(tmp_path: Path):
    """A worker that exits (or is killed) closes its end: the keeper takes no new log, ignores
    SIGTERM, writes the running jobs' logs to their end, then exits. Until then it holds each
    log open (what a worker that adopts the job waits on: process_tree.holds_file)."""
    from workers.process_tree import holds_file, is_alive

    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    read_fd, write_fd = os.pipe()
    try:
        pid, done = server.start(read_fd, tmp_path / "a.log", 1 << 20)
    finally:
        os.close(read_fd)
    os.close(done)  # the worker is gone: no one waits on it
    os.write(write_fd, b"before\n")
    assert _until(lambda: (tmp_path / "a.log").read_bytes() == b"before\n")
    assert os.getsid(pid) == pid  # a session of its own
    server.close()
    os.kill(pid, 15)  # ignored
    time.sleep(0.2)
    assert is_alive(pid, None) and holds_file(pid, tmp_path / "a.log")
    os.write(write_fd, b"after\n")
    os.close(write_fd)  # end of file: it finishes, and has nothing left
    assert _until(lambda: server.proc.poll() is not None)
    assert not holds_file(pid, tmp_path / "a.log")
    assert (tmp_path / "a.log").read_bytes() == b"before\nafter\n"


def test_the_cards_keeper_keeps_each_log_within_its_cap(tmp_path: Path):
    """Two fast writers on one keeper: each log within its own cap (+ one read), ends whole."""
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    caps = {"a": 64 * 1024, "b": 20_000}
    threads, dones = [], {}
    line = b"".join(b"line %07d of output\n" % i for i in range(1000))
    try:
        for name, cap in caps.items():
            read_fd, write_fd = os.pipe()
            try:
                _pid, dones[name] = server.start(read_fd, tmp_path / f"{name}.log", cap)
            finally:
                os.close(read_fd)

            def writer(fd: int = write_fd, total: int = 30 * cap) -> None:
                with os.fdopen(fd, "wb") as out:
                    sent = 0
                    while sent < total:
                        out.write(line[: total - sent])
                        sent += min(len(line), total - sent)
                    out.write(b"the last line\n")

            threads.append(threading.Thread(target=writer))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name, cap in caps.items():
            assert _done(dones[name])
            os.close(dones[name])
            text = (tmp_path / f"{name}.log").read_bytes()
            assert len(text) <= cap + max(0, logkeeper.read_size(cap) - cap // 4)
            assert text.startswith(b"line 0000000 of output\n") and text.endswith(b"the last line\n")
            assert b"bytes of output were cut here" in text
    finally:
        server.close(5)


def test_a_bad_request_is_refused_and_the_server_carries_on(tmp_path: Path):
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    try:
        read_fd, write_fd = os.pipe()
        with pytest.raises(OSError, match="refused"):
            server.start(read_fd, tmp_path / "a.log", 0)
        with pytest.raises(OSError, match="refused"):
            server.start(read_fd, tmp_path / "no-such-folder" / "a.log", 100)  # the log cannot be opened
        pid, done = server.start(read_fd, tmp_path / "b.log", 100)
        os.close(read_fd)
        os.write(write_fd, b"ok\n")
        os.close(write_fd)
        assert pid > 0 and _done(done)
        os.close(done)
        assert (tmp_path / "b.log").read_bytes() == b"ok\n"
    finally:
        server.close(5)


def test_a_traced_keeper_marks_its_own_cpu_time_at_its_end(tmp_path: Path):
    """With RIG_TRACE_DIR in its environment (rig.jobtrace.environ), a keeper (of one log, or a
    card's) writes one ``keeper_end`` line with its own CPU time as it ends
    (scripts/profile_job_path.py adds up those of keepers that end during a run)."""
    traces = tmp_path / "trace"
    traces.mkdir()
    env = {"PATH": "/usr/bin:/bin", "RIG_TRACE_DIR": str(traces)}
    proc = subprocess.Popen([sys.executable, "-I", "-S", logkeeper.__file__, str(tmp_path / "a.log"), "100000"],
                            stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(b"out\n")
    proc.stdin.close()
    assert proc.wait(10) == 0
    server = logkeeper.KeeperServer(sys.executable, env)
    server.close(10)
    for pid in (proc.pid, server.proc.pid):
        (line,) = (traces / f"{pid}.trace").read_text().splitlines()
        job, stage, _when, marked_pid, _thread, cpu = line.split()
        assert (job, stage, int(marked_pid)) == ("-", "keeper_end", pid)
        assert 0 < float(cpu) < 5  # measured finer than a clock tick: a short keeper is not 0
    assert (tmp_path / "a.log").read_bytes() == b"out\n"


def test_a_worker_gone_before_the_answer_leaves_the_keeper_copying(tmp_path: Path):
    """The worker dies between its request and the answer: the keeper's answer fails (EPIPE),
    and it must not stop: it copies the log it took (and any other) to its end, then exits."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-I", "-S", logkeeper.__file__, "--serve"], stdin=theirs.fileno(),
                            start_new_session=True, close_fds=True, env={"PATH": "/usr/bin:/bin"})
    theirs.close()
    read_fd, write_fd = os.pipe()
    request = os.fsencode(str(tmp_path / "a.log")) + b"\0" + b"100000"
    ours.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, read_fd.to_bytes(4, sys.byteorder))])
    ours.close()  # gone before it answers
    os.close(read_fd)
    os.write(write_fd, b"after the worker\n")
    os.close(write_fd)
    assert proc.wait(10) == 0
    assert (tmp_path / "a.log").read_bytes() == b"after the worker\n"


def _hold_lock(path: Path) -> subprocess.Popen:
    """Another process (the job itself, say) holding LOCK_EX on ``path`` until its stdin closes."""
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
    return proc


def test_a_cut_waits_a_bounded_time_for_a_lock_on_the_log(tmp_path: Path):
    from rig.logs import LOCK_WAIT_S, LogLocked, enforce_size_cap

    log = tmp_path / "a.log"
    log.write_bytes(b"x" * 10_000)
    holder = _hold_lock(log)
    try:
        started = time.monotonic()
        with pytest.raises(LogLocked):
            enforce_size_cap(log, 1000)
        assert time.monotonic() - started < LOCK_WAIT_S + 0.5
        assert log.stat().st_size == 10_000  # nothing cut
    finally:
        holder.communicate(b"")
    assert enforce_size_cap(log, 1000) > 0  # once the lock is gone, it cuts


def test_a_job_that_locks_its_own_log_never_stalls_the_cards_other_logs(tmp_path: Path):
    """Issue: enforce_size_cap took a blocking LOCK_EX; a job that flocks its own log stalled its
    card's keeper, and every other log of the card with it. Now the cut is skipped (said once
    in that log, counted in its note) and tried again later; the other logs flow on."""
    cap = 20_000
    server = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    locked, other = tmp_path / "locked.log", tmp_path / "other.log"
    writers, dones = {}, {}
    holder = None
    try:
        for path in (locked, other):
            read_fd, writers[path] = os.pipe()
            try:
                _pid, dones[path] = server.start(read_fd, path, cap)
            finally:
                os.close(read_fd)
        locked.touch()
        holder = _hold_lock(locked)
        line = b"a line of the job that locks its log\n"
        for _ in range(3 * cap // len(line)):  # well past the cap: the keeper must try to cut
            os.write(writers[locked], line)
        assert _until(lambda: locked.stat().st_size > cap)
        os.write(writers[other], b"still flowing\n")
        assert _until(lambda: other.read_bytes() == b"still flowing\n")  # never, with a blocking lock
        text = locked.read_bytes()
        assert text.count(b"was not cut: another process holds a lock on it") == 1
        holder.communicate(b"")  # the job lets go of its lock
        holder = None

        def cut_again() -> bool:  # the next try comes CUT_RETRY_S after the last, with output
            os.write(writers[locked], line)
            return b"bytes of output were cut here" in locked.read_bytes()

        assert _until(cut_again, timeout=10 + logkeeper.CUT_RETRY_S)
        for path in (locked, other):
            os.close(writers.pop(path))
            assert _done(dones[path])
        assert locked.stat().st_size <= cap + logkeeper.read_size(cap)
        assert b"bytes of output were cut here" in locked.read_bytes()
        from rig.logspace import describe_note, read_note

        note = read_note(locked.with_suffix(".note"))
        assert note["cut_skipped"] >= 1 and "lock on it held off" in describe_note(note)
    finally:
        if holder is not None:
            holder.communicate(b"")
        for fd in (*writers.values(), *dones.values()):
            os.close(fd)
        server.close(5)


def test_a_log_deleted_under_its_keeper_is_made_again_with_a_note(tmp_path: Path, monkeypatch):
    import shutil

    monkeypatch.setattr(logkeeper, "UNLINK_CHECK_S", 0.0)  # look at every output
    folder = tmp_path / "7-0123456789abcdef"
    folder.mkdir()
    log = folder / "attempt-1.log"
    copy = logkeeper.LogCopy(log, 1 << 20)
    try:
        copy.feed(b"before\n")
        shutil.rmtree(folder)  # someone deletes the job's folder while it runs
        copy.feed(b"after\n")
    finally:
        copy.close()
    lines = log.read_bytes().splitlines()
    assert lines[0].startswith(b"[rig: this log was deleted") and b"made it again here" in lines[0]
    assert lines[1:] == [b"after"]
    from rig.logspace import describe_note, read_note

    assert "log deleted while it ran (once) and made again" in describe_note(read_note(log.with_suffix(".note")))


def test_a_keeper_that_takes_a_log_over_goes_on_counting_and_says_so(tmp_path: Path):
    log = tmp_path / "attempt-1.log"
    first = logkeeper.LogCopy(log, 1000)
    first.feed(b"x" * 1500 + b"\n")  # cut once
    first.feed(b"half a line")  # it dies here: the log ends mid-line
    first.close()
    cut = first.cut
    second = logkeeper.LogCopy(log, 1000, opening=logkeeper.restart_line(4242))
    second.feed(b"more\n")
    second.close()
    text = log.read_bytes()
    assert b"half a line\n[rig: the log keeper (pid 4242) died at " in text  # a line of its own
    assert text.endswith(b"output it had read but not yet written, if any, is missing here]\nmore\n")
    from rig.logspace import read_note

    note = read_note(log.with_suffix(".note"))
    assert note["keeper_restarts"] == 1 and note["cap_cut"] == cut == second.cut > 0
