"""Which processes belong to a node's ``rig up``, and how they die with it.

Every process ``rig up`` starts (workers, beat, Flower) carries in its environment (so in
/proc/<pid>/environ, whoever its parent is now):

- ``RIG_NODE_PROCESS=<node>@<absolute home>``: which node of which rig home it serves;
- ``RIG_ROLE``: card, control, beat or flower;
- ``RIG_SUPERVISOR_PID`` / ``RIG_SUPERVISOR_START``: the ``rig up`` that started it (pid and
  start time in clock ticks, against pid reuse).

The private Redis overwrites its own environ (its process title): it is found through the
pid file rig.redis_server writes next to its data instead, which names its owner the same way.

Three rules follow:

1. A child dies with its supervisor. The Celery processes (workers/app.py calls
   ``watch_supervisor`` at import) ask the kernel for SIGTERM when their parent dies
   (PR_SET_PDEATHSIG, when started from the supervisor's main thread: the kernel ties it to
   the forking thread), exit at once if their parent is already gone, and watch their parent
   pid every second as a second line. SIGTERM is Celery's warm shutdown, as ``rig down``:
   a card worker detaches from its running jobs, which keep running in their own sessions
   and are adopted by the next worker of the card. The private Redis is not tied to the
   supervisor (its data outlives crashes anyway); it is a leftover like any other (rule 2).
2. ``rig up`` finds what a dead supervisor left (``node_processes``: marked processes whose
   supervisor is gone) and stops it before starting its own; ``rig down`` stops those too.
3. Jobs are never among them: a process carrying RIG_JOB_ID or RIG_EXIT_FILE (a job and
   everything it starts) or RIG_LOG_KEEPER=1 (a job's log keeper) is never listed, whatever
   else it inherited, and neither is one without RIG_ROLE (card workers drop it from jobs).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from workers.process_tree import environments, is_alive, proc_start_time

log = logging.getLogger(__name__)

NODE_PROCESS = "RIG_NODE_PROCESS"
SUPERVISOR_PID = "RIG_SUPERVISOR_PID"
SUPERVISOR_START = "RIG_SUPERVISOR_START"
#: "1": the child asks for SIGTERM when its parent dies (set only for main-thread spawns).
PDEATHSIG = "RIG_PDEATHSIG"
#: Roles of the processes ``rig up`` starts (RIG_ROLE), stopped in this order, Redis last.
ROLES = ("control", "card", "beat", "flower", "gateway", "redis")
#: Variables that make a process a job's (or a job's log keeper's): never ours to stop.
JOB_MARKS = (b"RIG_JOB_ID=", b"RIG_EXIT_FILE=", b"RIG_LOG_KEEPER=1")
#: Exit status of a rig process that found its supervisor already gone (EX_UNAVAILABLE).
EXIT_SUPERVISOR_GONE = 69
#: How often a child checks that its supervisor still lives (s).
WATCH_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


#: A worker that has not heartbeated once since it started is starting, not hung, for this long
#: (s; health.timeout if longer): a Celery worker on a loaded 2-core host took more than 6 s to
#: its first heartbeat, and with health.timeout 3 s it was killed as hung over and over, each
#: restart backing off longer (fault-suite runs in CI, by rig up and by the node's health pass).
STARTUP_GRACE_S = 60.0


def hung_after(timeout: float, *, beat_seen: bool) -> float:
    """How long (s) a live worker process may stay without a heartbeat before it is taken for
    hung and killed: ``timeout`` (health.timeout) once it has heartbeated, else at least
    STARTUP_GRACE_S. The one rule for `rig up` (rig.stack) and the node's health pass."""
    return timeout if beat_seen else max(timeout, STARTUP_GRACE_S)


def beat_pid(raw: str | None) -> int | None:
    """The pid a worker's heartbeat (``Keys.worker``, JSON) names; None for no heartbeat or an
    unreadable one. What both hung checks (rig.stack, workers.health) compare with a process."""
    if not raw:
        return None
    try:
        return int(json.loads(raw)["pid"])
    except (ValueError, KeyError, TypeError):
        return None


def beat_supervisor() -> dict[str, int]:
    """What a worker's heartbeat (``Keys.worker``, JSON) says of the ``rig up`` that started it:
    ``up_pid`` and ``up_start`` (its RIG_SUPERVISOR_PID / RIG_SUPERVISOR_START: pid, and start
    time in clock ticks since boot); empty for a worker started otherwise (by hand, a test)."""
    pid, start = os.environ.get(SUPERVISOR_PID, ""), os.environ.get(SUPERVISOR_START, "")
    if not pid.isdigit():
        return {}
    return {"up_pid": int(pid), **({"up_start": int(start)} if start.isdigit() else {})}


def beat_of_up(raw: str | None, up_pid: int | None, up_start: int | None) -> bool:
    """Does a worker's heartbeat (JSON, None: none) count for a node whose record names ``rig
    up`` ``up_pid`` started at ``up_start`` (rig.nodes: its ``pid``, ``pid_start``)? Not when it
    names another rig up: the last beats of the workers of a rig up SIGKILLed with them outlive
    them by up to health.timeout, and a rig up started at once read "up, 3 worker(s)" from them.
    One that names none (or a record without a pid, or an unreadable beat) counts while it lives."""
    if not raw:
        return False
    try:
        beat = json.loads(raw)
        named, started = beat.get("up_pid"), beat.get("up_start")
    except (ValueError, AttributeError):
        return True
    if named is None or up_pid is None:
        return True
    return named == up_pid and (started is None or up_start is None or started == up_start)


def node_mark(node: str, home: Path) -> str:
    """The RIG_NODE_PROCESS value of node ``node`` with rig home ``home``."""
    return f"{node}@{Path(home).expanduser().resolve()}"


def child_marks(node: str, home: Path, role: str, *, main_thread: bool) -> dict[str, str]:
    """The variables ``rig up`` (this process) gives a child of role ``role``."""
    me = os.getpid()
    marks = {NODE_PROCESS: node_mark(node, home), "RIG_ROLE": role,
             SUPERVISOR_PID: str(me), SUPERVISOR_START: str(proc_start_time(me) or "")}
    if main_thread:
        marks[PDEATHSIG] = "1"
    return marks


def safe_python(module: str) -> list[str]:
    """argv running ``python -m module`` without the working directory on sys.path (``-P``,
    Python >= 3.11): a folder named ``rig``, ``workers`` or ``celery`` where the operator
    stands must not replace rig's own packages. (On 3.10 the caller's cwd of rig's own run
    folder is the only guard.) Not PYTHONSAFEPATH: jobs inherit the environment."""
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe, "-m", module]


@dataclass(frozen=True)
class NodeProcess:
    """One process of a node's rig, found in /proc."""

    pid: int
    start: int | None  # /proc start time (clock ticks), against pid reuse
    role: str
    card: str  # RIG_CARD_INDEX, "" for other roles
    supervisor: int | None
    supervisor_start: int | None

    @property
    def label(self) -> str:
        return f"card{self.card}" if self.role == "card" else self.role

    def supervisor_alive(self) -> bool:
        return self.supervisor is not None and is_alive(self.supervisor, self.supervisor_start)


def _int(value: bytes | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def node_processes(node: str, home: Path,
                   procs: Iterable[tuple[int, list[bytes]]] | None = None) -> list[NodeProcess]:
    """Every live process ``rig up`` started for this node and home (any supervisor, dead or
    alive), jobs and log keepers excluded (module docstring). ``procs``: (pid, environ) pairs,
    default every process in /proc."""
    needle = f"{NODE_PROCESS}={node_mark(node, home)}".encode()
    me = os.getpid()
    found = []
    for pid, env in (environments() if procs is None else procs):
        if pid == me or needle not in env:
            continue
        if any(item.startswith(mark) for item in env for mark in JOB_MARKS):
            continue
        values = dict(item.split(b"=", 1) for item in env if b"=" in item)
        role = values.get(b"RIG_ROLE", b"").decode(errors="replace")
        if role not in ROLES:
            continue
        found.append(NodeProcess(pid, proc_start_time(pid), role,
                                 values.get(b"RIG_CARD_INDEX", b"").decode(errors="replace"),
                                 _int(values.get(SUPERVISOR_PID.encode())),
                                 _int(values.get(SUPERVISOR_START.encode()))))
    return found


def private_redis(home: Path) -> NodeProcess | None:
    """The private Redis of rig home ``home`` while it runs (rig.redis_server.PID_FILE)."""
    from rig.redis_server import private_redis_dir, recorded_server

    found = recorded_server(private_redis_dir(Path(home).expanduser().resolve()))
    if found is None:
        return None
    pid, start, owner, owner_start = found
    return NodeProcess(pid, start, "redis", "", owner, owner_start)


def leftovers(node: str, home: Path) -> list[NodeProcess]:
    """The node's processes whose supervisor is gone (its private Redis included), in
    stopping order (Redis last)."""
    left = [p for p in node_processes(node, home) if not p.supervisor_alive()]
    redis_ = private_redis(home)
    if redis_ is not None and not redis_.supervisor_alive():
        left.append(redis_)
    return sorted(left, key=lambda p: (ROLES.index(p.role), p.card, p.pid))


def live_supervisors(node: str, home: Path) -> set[int]:
    """Pids of live ``rig up`` processes (other than this one) whose children serve this node."""
    me = os.getpid()
    return {p.supervisor for p in node_processes(node, home)
            if p.supervisor_alive() and p.supervisor != me}  # type: ignore[misc]


def describe(processes: list[NodeProcess]) -> str:
    """"control 123, card0 124, redis 99" (for one line to the operator)."""
    return ", ".join(f"{p.label} {p.pid}" for p in processes)


def stop_processes(processes: list[NodeProcess], timeout: float = 20.0,
                   say: Callable[[str], None] | None = None) -> list[NodeProcess]:
    """SIGTERM the rig processes (workers first, the private Redis after they are gone; a
    card worker's SIGTERM leaves its jobs running), SIGKILL what is left after ``timeout``
    seconds. Each pid is checked against its start time before every signal. Returns those
    still alive (only when even SIGKILL did not end them: another user's, say)."""
    workers = [p for p in processes if p.role != "redis"]
    redis_ = [p for p in processes if p.role == "redis"]
    alive: list[NodeProcess] = []
    for group in (workers, redis_):
        _signal(group, signal.SIGTERM)
        left = _wait_gone(group, timeout)
        if left:
            if say:
                say(f"{describe(left)} did not stop in {timeout:.0f} s after SIGTERM; killing")
            _signal(left, signal.SIGKILL)
            left = _wait_gone(left, 5.0)
        alive += left
    return alive


def _signal(processes: list[NodeProcess], sig: int) -> None:
    for p in processes:
        if is_alive(p.pid, p.start):
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _wait_gone(processes: list[NodeProcess], timeout: float) -> list[NodeProcess]:
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes if is_alive(p.pid, p.start)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)  # not our children (no wait()); the kernel reaps them via init


# -- the child's side -----------------------------------------------------------------------------
def watch_supervisor(*, interval: float = WATCH_INTERVAL_S,
                     on_gone: Callable[[], None] | None = None) -> int | None:
    """Tie this process to the ``rig up`` that started it (RIG_SUPERVISOR_PID); no-op for a
    process started otherwise (by hand, by a test). Returns the supervisor's pid or None.

    PR_SET_PDEATHSIG(SIGTERM) when RIG_PDEATHSIG=1, then: a parent already gone means exit
    now (status EXIT_SUPERVISOR_GONE, one line on stderr); else a daemon thread checks the
    parent every ``interval`` s and calls ``on_gone`` (default: SIGTERM to itself, Celery's
    warm shutdown) once, if it changes."""
    raw = os.environ.get(SUPERVISOR_PID)
    if not raw or not raw.isdigit():
        return None
    supervisor = int(raw)
    if os.environ.get(PDEATHSIG) == "1":
        _set_pdeathsig(signal.SIGTERM)
    # After the prctl: a parent that died before it is caught here, one after it by the kernel.
    if os.getppid() != supervisor:
        print(f"rig: the rig up that started this {os.environ.get('RIG_ROLE', 'process')} "
              f"(pid {supervisor}) is gone; exiting", file=sys.stderr, flush=True)
        os._exit(EXIT_SUPERVISOR_GONE)

    def gone() -> None:
        log.warning("rig up (pid %s) is gone; stopping (running jobs keep running)", supervisor)
        os.kill(os.getpid(), signal.SIGTERM)

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(interval)
        (on_gone or gone)()

    threading.Thread(target=watch, name="rig-supervisor-watch", daemon=True).start()
    return supervisor


def supervisor_gone() -> int | None:
    """The pid of the ``rig up`` that started this process (RIG_SUPERVISOR_PID) when that rig up
    is no longer its parent (it died: SIGKILLed, OOM-killed), else None (alive, or this process
    was not started by a rig up). A process ``rig down`` or Ctrl-C stops still has its parent."""
    raw = os.environ.get(SUPERVISOR_PID)
    if not raw or not raw.isdigit():
        return None
    return int(raw) if os.getppid() != int(raw) else None


def _set_pdeathsig(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig); False where unavailable (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
