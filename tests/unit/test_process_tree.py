"""Process trees of jobs: the wrapper's exit file, stopping double-forked children, lookups."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rig.failures import classify
from workers.process_tree import (
    ExitWatcher,
    find_by_environ,
    is_alive,
    is_stopped,
    job_leftovers,
    pid_window,
    pids_with_environ,
    proc_start_time,
    session_members,
    signal_tree,
    stop_tree,
    wrapper_argv,
)


def start(argv, tmp_path, **env):
    exit_file = tmp_path / "exit"
    proc = subprocess.Popen(wrapper_argv(argv), env={**os.environ, "RIG_EXIT_FILE": str(exit_file), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, exit_file


def test_wrapper_records_exit_status(tmp_path):
    proc, exit_file = start(["sh", "-c", "echo out; exit 3"], tmp_path)
    assert proc.wait(10) == 3
    assert exit_file.read_text().strip() == "3"
    assert proc.stdout.read().decode().strip() == "out"


def test_wrapper_explains_missing_command(tmp_path):
    # The PATH it was looked in: under --export NONE a venv's `python` is not on the job's
    # minimal PATH, and "command not found: python" alone did not say why.
    proc, exit_file = start(["no-such-program-xyz"], tmp_path, PATH="/usr/bin:/bin")
    assert proc.wait(10) == 127
    assert proc.stdout.read().decode() == ("rig: command not found: no-such-program-xyz "
                                           "(looked for in PATH=/usr/bin:/bin) (exit 127)\n")
    assert exit_file.read_text().strip() == "127"


@pytest.mark.parametrize("kind", ["not executable", "a folder", "missing path"])
def test_wrapper_says_what_cannot_start_before_running_it(tmp_path, kind):
    target = tmp_path / "run.sh"
    if kind == "not executable":
        target.write_text("#!/bin/sh\necho ran\n")
    elif kind == "a folder":
        target.mkdir()
    proc, exit_file = start([str(target)], tmp_path)
    code = 127 if kind == "missing path" else 126
    assert proc.wait(10) == code
    said = proc.stdout.read().decode()
    assert said.startswith("rig: ") and str(target) in said and "ran" not in said
    assert exit_file.read_text().strip() == str(code)


@pytest.mark.parametrize("code", [126, 127])
def test_a_program_exiting_126_or_127_is_not_said_to_be_missing(tmp_path, code):
    """The wrapper used to add "rig: permission denied running: python3" after a program that
    ran and exited 126 (the line was false)."""
    proc, exit_file = start(["sh", "-c", f"echo real program ran; exit {code}"], tmp_path)
    assert proc.wait(10) == code
    assert proc.stdout.read().decode() == "real program ran\n"
    assert exit_file.read_text().strip() == str(code)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the wrapper as another user (needs root)")
def test_a_working_folder_its_user_may_not_reach_is_not_entered_for_it(tmp_path):
    """A root worker enters the job's folder before switching to its user (Popen's chdir comes
    first): a folder under another user's 0700 home was the job's all the same, and a file in it
    that its user could not open by path was the job's to read (live: user b submitted through the
    gateway with workdir=/home/a/shared and read a's notes.txt). The wrapper enters it again, as
    the user: the job does not run, and says why."""
    import tempfile

    nobody = 65534
    shut = tmp_path / "home-0700"  # tmp_path's own parents are root's 0700 too
    inner = shut / "shared"
    inner.mkdir(parents=True)
    shut.chmod(0o700)
    inner.chmod(0o755)
    (inner / "notes.txt").write_text("private\n")
    (inner / "notes.txt").chmod(0o644)
    as_nobody = {"user": nobody, "group": nobody, "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin", "USER": "nobody", "RIG_EXIT_FD": ""}
    proc = subprocess.run(wrapper_argv(["cat", "notes.txt"]), cwd=inner, env=env, capture_output=True, text=True,
                          timeout=10, **as_nobody)
    assert proc.returncode == 126 and "private" not in proc.stdout, proc
    line = f"rig: cannot enter the working folder: {inner} is not reachable by user nobody (exit 126)"
    assert proc.stderr.strip() == line
    found = classify(exit_code=126, log_tail=proc.stderr)
    assert found is not None and found.failure.value == "start_failed" and found.evidence == (line,), found
    reachable = Path(tempfile.mkdtemp(dir="/tmp", prefix="rig-test-workdir-"))
    try:
        reachable.chmod(0o755)
        ran = subprocess.run(wrapper_argv(["pwd"]), cwd=reachable, env=env, capture_output=True, text=True,
                             timeout=10, **as_nobody)
        assert ran.returncode == 0 and ran.stdout.strip() == str(reachable), ran
    finally:
        reachable.rmdir()


def test_a_variable_named_like_the_wrappers_own_does_not_skip_the_job(tmp_path):
    proc, _exit_file = start(["sh", "-c", "echo ran"], tmp_path, rig_cannot="127", rc="127")
    assert proc.wait(10) == 0 and proc.stdout.read().decode() == "ran\n"


def test_stop_tree_ends_double_forked_children_and_records_signal(tmp_path):
    marker = "419.5"
    proc, exit_file = start(["sh", "-c", f"(sleep {marker} &); sleep {marker} & wait"], tmp_path)
    deadline = time.monotonic() + 10
    while len(session_members(proc.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(session_members(proc.pid)) >= 4  # wrapper, sh, two sleeps (one re-parented)
    stop_tree(proc.pid, grace=5, reap=proc.poll)
    assert session_members(proc.pid) == []
    proc.wait(5)
    assert exit_file.read_text().strip() == "143"  # 128 + SIGTERM, written by the wrapper
    assert classify(exit_code=143).summary == "killed by signal SIGTERM (exit 143)"


def test_stop_tree_escalates_to_sigkill(tmp_path):
    proc, _ = start(["sh", "-c", "trap '' TERM; echo ready; sleep 30 & wait; sleep 30"], tmp_path)
    assert proc.stdout.readline().strip() == b"ready"  # the trap is in place
    begun = time.monotonic()
    stop_tree(proc.pid, grace=0.5, reap=proc.poll)
    assert session_members(proc.pid) == []
    assert time.monotonic() - begun < 5


def test_exit_watcher_and_identity(tmp_path):
    proc = subprocess.Popen(["sleep", "30"])
    started = proc_start_time(proc.pid)
    assert is_alive(proc.pid, started)
    assert not is_alive(proc.pid, started + 1)  # a reused pid is not the same process
    watcher = ExitWatcher(proc.pid)
    assert not watcher.wait(0.05)
    proc.terminate()
    assert watcher.wait(5)
    watcher.close()
    proc.wait()
    assert not is_alive(proc.pid, started)


def test_find_by_environ(tmp_path):
    proc, exit_file = start(["sleep", "5"], tmp_path)
    try:
        deadline = time.monotonic() + 5
        while find_by_environ("RIG_EXIT_FILE", str(exit_file)) is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has exec'd with its own environment
        assert find_by_environ("RIG_EXIT_FILE", str(exit_file)) == proc.pid
        assert find_by_environ("RIG_EXIT_FILE", str(tmp_path / "other")) is None
    finally:
        stop_tree(proc.pid, 1, reap=proc.poll)


def test_guards_never_signal_own_group_or_kernel():
    assert signal_tree(0, 0) == 0
    assert signal_tree(1, 0) == 0
    assert signal_tree(os.getsid(0), 0) == 0
    assert session_members(0) == []



def test_session_is_ours_refuses_a_reused_pid():
    from workers.process_tree import session_is_ours

    proc = subprocess.Popen(["sleep", "5"], start_new_session=True)
    try:
        start = proc_start_time(proc.pid)
        assert session_is_ours(proc.pid, start)
        assert not session_is_ours(proc.pid, start + 1)  # another process now has this pid
    finally:
        proc.kill()
        proc.wait()
    assert session_is_ours(proc.pid, start)  # leader gone: what is left would be the job's


def test_job_leftovers_finds_session_members_and_daemons_like_the_full_scans(tmp_path):
    """One pass over /proc (reading only the pids handed out since the job's) finds what
    session_members and pids_with_environ find: a child left in the session, and a daemon that
    left it with setsid but kept the job's environment."""
    began = time.monotonic()
    proc, exit_file = start(["sh", "-c", "setsid sleep 418.5 </dev/null >/dev/null 2>&1 & sleep 418.6 & exit 0"],
                            tmp_path)
    try:
        assert proc.wait(10) == 0
        needle = ("RIG_EXIT_FILE", str(exit_file))
        deadline = time.monotonic() + 10
        while len(pids_with_environ(*needle)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        since = None  # the leader is gone: its start time is not known here
        members, daemons = job_leftovers(proc.pid, *needle, since, first_pid=proc.pid,
                                         age=time.monotonic() - began)
        assert members == session_members(proc.pid) and len(members) == 1
        outside = [p for p in pids_with_environ(*needle) if p not in members]
        assert daemons == outside and len(daemons) == 1 and os.getsid(daemons[0]) != proc.pid
        assert job_leftovers(proc.pid, *needle, None) == (members, daemons)  # no window: every pid read
        assert job_leftovers(0, "RIG_EXIT_FILE", str(tmp_path / "other"), None) == ([], [])
    finally:
        for pid in pids_with_environ("RIG_EXIT_FILE", str(exit_file)):
            stop_tree(os.getsid(pid), 1)


def test_pid_window_only_for_a_job_too_young_for_the_pids_to_wrap_round():
    first = os.getpid()
    later = subprocess.Popen(["true"])
    later.wait()
    window = pid_window(first, 0.001)
    assert window is not None and window(first) and window(later.pid)
    assert pid_window(first, 3600.0) is None  # the pid numbers may have wrapped round since
    assert pid_window(None, 0.001) is None and pid_window(first, None) is None


def test_the_wrappers_exit_file_by_path_never_replaces_what_is_not_a_regular_file(tmp_path):
    """Run by hand as root with RIG_EXIT_FILE=/dev/null (no RIG_EXIT_FD), the wrapper's mv
    replaced the host's /dev/null with a file. A FIFO stands for it here."""
    import stat

    from workers.process_tree import wrapper_argv

    special = tmp_path / "fifo"
    os.mkfifo(special)
    regular = tmp_path / "attempt-1.exit"
    for target in (special, regular):
        env = {"PATH": os.environ["PATH"], "RIG_EXIT_FILE": str(target)}
        assert subprocess.run(wrapper_argv(["sh", "-c", "exit 3"]), env=env, timeout=10).returncode == 3
    assert stat.S_ISFIFO(os.lstat(special).st_mode)  # left as it was
    assert regular.read_text() == "3\n"  # a regular file (or none yet) still gets the status


def test_job_leftovers_walks_a_small_window_without_listing_proc_and_never_reports_a_thread(tmp_path, monkeypatch):
    """A young job's pid window is walked pid by pid (no listing of /proc, which costs every
    process on the machine); that walk meets thread ids too, which must not be reported: a
    left-over Python process with a second thread is one member, and a daemon with a thread is
    one daemon, as the full scans say."""
    import sys

    import workers.process_tree as pt

    threaded = f"{sys.executable} -c 'import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)'"
    began = time.monotonic()
    proc, exit_file = start(["sh", "-c", f"setsid {threaded} </dev/null >/dev/null 2>&1 & {threaded} & exit 0"],
                            tmp_path)
    try:
        assert proc.wait(10) == 0
        needle = ("RIG_EXIT_FILE", str(exit_file))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = pids_with_environ(*needle)
            if len(found) == 2 and all(len(os.listdir(f"/proc/{p}/task")) == 2 for p in found):
                break
            time.sleep(0.01)
        members_full = session_members(proc.pid)
        daemons_full = [p for p in pids_with_environ(*needle) if p not in members_full]

        def no_listing(path):
            raise AssertionError(f"listed {path}: a small window is walked")

        # This test's processes take a Python start each (longer than the ~80 ms a window is
        # trusted for at the real rate), and other tenants' pids widen the window: both lifted.
        monkeypatch.setattr(pt, "PID_RATE_PER_CPU", 1)
        monkeypatch.setattr(pt, "WINDOW_WALK_MAX", 1 << 30)
        monkeypatch.setattr(pt.os, "listdir", no_listing)
        members, daemons = job_leftovers(proc.pid, *needle, None, first_pid=proc.pid, age=time.monotonic() - began)
        assert members == members_full and len(members) == 1
        assert daemons == daemons_full and len(daemons) == 1
    finally:
        monkeypatch.undo()
        for pid in pids_with_environ("RIG_EXIT_FILE", str(exit_file)):
            stop_tree(os.getsid(pid), 1)


def test_window_pids_wraps_past_pid_max_and_gives_up_on_a_wide_window(monkeypatch):
    import workers.process_tree as pt

    monkeypatch.setattr(pt, "_PID_MAX", 1000)
    assert pt._window_pids((990, 305)) == [*range(990, 1000), *range(300, 306)]
    assert pt._window_pids((10, 10 + pt.WINDOW_WALK_MAX)) is None
    assert pt._window_pids((10, 9 + pt.WINDOW_WALK_MAX)) == list(range(10, 10 + pt.WINDOW_WALK_MAX))
    assert pt._window_pids((700, 650)) is None  # wrapped: 300 + 351 pids


def _stat_line(pid: int, state: str, start: int) -> str:
    """A /proc/<pid>/stat line: a command name with spaces and parens, ``state`` (field 3) and
    ``start`` (field 22, clock ticks since boot)."""
    return f"{pid} (a (b) c) {state} " + " ".join(["0"] * 18) + f" {start} 0 0\n"


@pytest.mark.parametrize(("stat", "kill_error", "start_time", "runs"), [
    (_stat_line(77, "S", 500), None, 500, True),  # runs, and is that process
    (_stat_line(77, "S", 500), None, None, True),  # runs (any process was asked for)
    (_stat_line(77, "S", 501), PermissionError, 500, False),  # seen: another process took the pid
    (_stat_line(77, "Z", 500), None, 500, False),  # a zombie has ended
    (FileNotFoundError, PermissionError, 500, True),  # hidepid=2: absent, yet the kernel says it runs
    (PermissionError, PermissionError, 500, True),  # hidepid=1: unreadable, yet it runs
    (FileNotFoundError, ProcessLookupError, 500, False),  # gone
    (FileNotFoundError, None, 500, False),  # ours to signal, so /proc would show it: it was gone
], ids=["same", "any", "reused", "zombie", "hidepid2", "hidepid1", "gone", "gone-then-reused"])
def test_may_run_counts_a_process_proc_hides_and_no_other(monkeypatch, stat, kill_error, start_time, runs):
    """may_run(pid, start) = is_alive or runs_unseen, with /proc/77/stat and kill(77, 0) mocked."""
    import io

    import workers.process_tree as pt

    def proc_open(path, mode="r"):  # noqa: ANN001, ANN202
        assert path == "/proc/77/stat", path
        if isinstance(stat, type):
            raise stat(2, "mocked", path)
        return io.BytesIO(stat.encode())

    def kill(pid: int, sig: int) -> None:
        assert (pid, sig) == (77, 0)  # only asked, never signalled
        if kill_error is not None:
            raise kill_error(1, "mocked")

    monkeypatch.setattr(pt, "open", proc_open, raising=False)
    monkeypatch.setattr(pt.os, "kill", kill)
    assert pt.may_run(77, start_time) is runs
    assert pt.is_alive(77, start_time) is (runs and not isinstance(stat, type))  # never a hidden one


def test_stop_tree_lets_a_stopped_job_handle_its_sigterm(tmp_path):
    # A job paused with kill -STOP got no SIGTERM it could act on (it waits until continued)
    # and was SIGKILLed after the grace: its handler, which saves a checkpoint, never ran.
    # A loop of builtins: no child of its own, whose SIGTERM the shell would report.
    proc, exit_file = start(["sh", "-c", "trap 'echo saved; exit 3' TERM; echo ready; while :; do :; done"],
                            tmp_path)
    assert proc.stdout.readline().strip() == b"ready"  # the trap is in place
    os.killpg(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not all(is_stopped(pid) for pid in session_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop_tree(proc.pid, grace=10, reap=proc.poll)
    assert session_members(proc.pid) == []
    proc.wait(5)
    assert proc.stdout.read().decode().strip() == "saved"
    assert exit_file.read_text().strip() == "3"  # its own exit, not SIGKILL's 137


def test_a_session_is_stopped_when_every_process_but_its_waiting_leader_is() -> None:
    from workers.process_tree import is_stopped, session_members, stopped_sessions

    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(session_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # a grandchild: its fork and stop cannot be awaited from here
        child = next(p for p in session_members(leader.pid) if p != leader.pid)
        os.kill(child, signal.SIGSTOP)
        while not is_stopped(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Its leader (rig's wrapper, waiting for the command) runs, but the command is stopped.
        assert stopped_sessions({leader.pid}) == {leader.pid}
        os.kill(child, signal.SIGCONT)
        while is_stopped(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(leader.pid, signal.SIGSTOP)
        _, status = os.waitpid(leader.pid, os.WUNTRACED)  # our child: its stop can be awaited
        assert os.WIFSTOPPED(status)
        assert stopped_sessions({leader.pid}) == set()  # the wrapper stopped, the command runs
        os.kill(child, signal.SIGSTOP)
        while not is_stopped(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopped_sessions({leader.pid, 1}) == {leader.pid}
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_session_of_its_leader_alone_is_stopped_when_the_leader_is() -> None:
    from workers.process_tree import stopped_sessions

    leader = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert stopped_sessions({leader.pid}) == set()
        os.kill(leader.pid, signal.SIGSTOP)
        _, status = os.waitpid(leader.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        assert stopped_sessions({leader.pid}) == {leader.pid}
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
