"""Node supervision without Redis: which processes belong to a node's rig (jobs never do), the
per-worker lock, a child's tie to its supervisor, and the safe command line of rig's children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rig.supervision import (
    EXIT_SUPERVISOR_GONE,
    NODE_PROCESS,
    SUPERVISOR_PID,
    leftovers,
    node_mark,
    node_processes,
    safe_python,
    stop_processes,
)
from rig.worker_lock import LockHeld, acquire, lock_path, worker_lock_name

ROOT = Path(__file__).resolve().parents[2]


def env(**values: str) -> list[bytes]:
    return [f"{k}={v}".encode() for k, v in values.items()]


def test_node_processes_are_the_marked_rig_roles_and_never_jobs(tmp_path):
    mark = node_mark("n1", tmp_path)
    procs = [
        (101, env(RIG_NODE_PROCESS=mark, RIG_ROLE="card", RIG_CARD_INDEX="0", RIG_SUPERVISOR_PID="7")),
        (102, env(RIG_NODE_PROCESS=mark, RIG_ROLE="control", RIG_SUPERVISOR_PID="7")),
        # a job (and anything it starts) inherits the marks but carries its own
        (103, env(RIG_NODE_PROCESS=mark, RIG_ROLE="card", RIG_JOB_ID="5")),
        (104, env(RIG_NODE_PROCESS=mark, RIG_ROLE="card", RIG_EXIT_FILE="/x/attempt-1.exit")),
        (105, env(RIG_NODE_PROCESS=mark, RIG_ROLE="card", RIG_LOG_KEEPER="1")),
        (106, env(RIG_NODE_PROCESS=mark)),  # no role: card workers drop RIG_ROLE from jobs
        (107, env(RIG_NODE_PROCESS=node_mark("n2", tmp_path), RIG_ROLE="card")),  # another node
        (108, env(RIG_NODE_PROCESS=node_mark("n1", tmp_path / "other"), RIG_ROLE="card")),  # another home
        (os.getpid(), env(RIG_NODE_PROCESS=mark, RIG_ROLE="control")),  # never ourselves
    ]
    found = node_processes("n1", tmp_path, procs)
    assert [(p.pid, p.label, p.supervisor) for p in found] == [(101, "card0", 7), (102, "control", 7)]


def test_the_mark_names_the_absolute_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert node_mark("n1", Path("home")) == f"n1@{tmp_path / 'home'}"


def test_leftovers_are_stopped_and_running_supervisors_children_are_not(tmp_path):
    """A marked process whose supervisor is gone is a leftover (stopped by SIGTERM); one whose
    supervisor lives is that supervisor's business."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = {**os.environ, NODE_PROCESS: node_mark("n1", tmp_path), "RIG_ROLE": "card", "RIG_CARD_INDEX": "0"}
    orphan = subprocess.Popen(["sleep", "60"], env={**base, SUPERVISOR_PID: str(dead.pid)})
    owned = subprocess.Popen(["sleep", "60"], env={**base, "RIG_CARD_INDEX": "1", SUPERVISOR_PID: str(os.getpid())})
    try:
        deadline = time.monotonic() + 10
        while len(node_processes("n1", tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # /proc/<pid>/environ is the new one once exec is done
        left = leftovers("n1", tmp_path)
        assert [p.pid for p in left] == [orphan.pid]
        assert stop_processes(left, timeout=5) == []
        assert orphan.wait(5) == -signal.SIGTERM
        assert owned.poll() is None
    finally:
        for proc in (orphan, owned):
            proc.kill()
            proc.wait()


def test_a_worker_lock_is_exclusive_and_names_its_holder(tmp_path):
    path = lock_path(tmp_path, "n1", "card0")
    fd = acquire(path)
    try:
        with pytest.raises(LockHeld) as held:
            acquire(path)  # a second open file description conflicts, even in one process
        assert held.value.holder == os.getpid()
    finally:
        os.close(fd)
    os.close(acquire(path))  # released with its descriptor: never stale


def test_which_roles_lock():
    assert worker_lock_name("card", "3") == "card3"
    assert worker_lock_name("control", None) == "control"
    assert worker_lock_name("flower", None) == "flower"
    assert worker_lock_name("beat", None) is None  # celery-redbeat's lock keeps one ticking
    assert worker_lock_name("", None) is None


WATCHED = textwrap.dedent("""
    import os, sys, time
    from rig.supervision import watch_supervisor
    watch_supervisor(interval=0.05, on_gone=lambda: (print("gone", flush=True), os._exit(3)))
    print("watching", flush=True)
    time.sleep(30)
""")


def test_a_child_whose_supervisor_is_already_gone_exits_at_once(tmp_path):
    result = subprocess.run([*safe_python("rig.supervision")[:-2], "-c", WATCHED],
                            env={**os.environ, SUPERVISOR_PID: "1"}, capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == EXIT_SUPERVISOR_GONE
    assert "is gone; exiting" in result.stderr and "watching" not in result.stdout


def test_a_child_notices_its_supervisor_dying(tmp_path):
    """The parent watch (the second line behind PR_SET_PDEATHSIG): a shell stands for rig up,
    starts the watched child and is SIGKILLed."""
    out = tmp_path / "out"
    script = f'{sys.executable} -c "$WATCHED" > {out} 2>&1 & echo $! ; wait'
    shell = subprocess.Popen(["sh", "-c", f"export {SUPERVISOR_PID}=$$; {script}"],
                             env={**os.environ, "WATCHED": WATCHED}, stdout=subprocess.PIPE, text=True)
    child = int(shell.stdout.readline())
    deadline = time.monotonic() + 30
    while "watching" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    shell.kill()
    shell.wait()
    while "gone" not in out.read_text():
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.02)
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_rigs_children_never_import_from_the_working_directory(tmp_path):
    """A folder named rig or workers where the operator stands must not replace rig's own."""
    for package in ("rig", "workers", "celery"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise SystemExit('imported the wrong package')\n")
    (tmp_path / "rig" / "config.py").write_text("raise SystemExit('imported the wrong rig.config')\n")
    argv = safe_python("rig.supervision")
    result = subprocess.run([*argv[:-2], "-c", "import rig.config, workers.process_tree, celery; "
                                               "print(rig.config.__file__)"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert str(tmp_path) not in result.stdout


def test_supervisor_gone_names_a_dead_rig_up_only(monkeypatch):
    from rig.supervision import SUPERVISOR_PID, supervisor_gone

    monkeypatch.delenv(SUPERVISOR_PID, raising=False)
    assert supervisor_gone() is None  # not started by a rig up: nothing to say
    monkeypatch.setenv(SUPERVISOR_PID, str(os.getppid()))
    assert supervisor_gone() is None  # its rig up is still its parent (rig down, Ctrl-C)
    monkeypatch.setenv(SUPERVISOR_PID, "999999999")
    assert supervisor_gone() == 999999999  # reparented: that rig up died
    monkeypatch.setenv(SUPERVISOR_PID, "x1")
    assert supervisor_gone() is None
