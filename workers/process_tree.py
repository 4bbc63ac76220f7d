"""Process groups and sessions of jobs: identify, wait for and stop a whole tree.

A job runs as the leader of its own session (``start_new_session=True``), so its session id =
process group id = the leader's pid. Children that leave the group but stay in the session
(a plain double fork) are still found by their session id. PIDs are recorded with their start
time (clock ticks since boot, /proc/<pid>/stat field 22) so a reused PID is never mistaken for
the job.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

#: Runs the job's argv, then writes its exit status (0-255; 128+n when killed by signal n) to
#: $RIG_EXIT_FILE, so a worker that restarts while the job runs can still learn how it ended.
#: The trap keeps the wrapper alive through SIGTERM long enough to record the status; it is
#: reset to the default in the child, so the job itself sees SIGTERM normally.
#: The job's argv arrives as the wrapper's positional parameters and runs as "$@": it is never
#: part of the script's text, so no value in it is ever parsed by this shell.
#: With RIG_EXIT_FD=0 the card runner has opened the exit file as the wrapper's stdin (the job
#: may run as a user who cannot open that path): the status goes there and the job itself gets
#: /dev/null. Without it (older starts, tests) the status goes to the path, atomically, and
#: never over anything but a regular file (run by hand as root with RIG_EXIT_FILE=/dev/null, the
#: mv replaced the host's /dev/null).
#: A command that cannot start (not found, not an executable file) is found before it is run
#: and said in a line of its own (rig.failures.CANNOT_START_LINE), so a program that runs and
#: exits 126 or 127 itself is never taken for one that could not start. A name not found says
#: the PATH it was looked for in: under `--export NONE` that is rig's minimal base
#: (/usr/local/bin:/usr/bin:/bin), where `python` of a venv or conda env is not, and the line
#: alone said only "command not found: python" for a command that ran from the submitter's shell.
#: The working folder is entered again, by its absolute path ($PWD: the shell sets it from the
#: folder it started in), by the job's own user: a root worker enters it before the switch to
#: that user (Popen's chdir comes first), so a folder the user may not reach (under another
#: user's 0700 home) was the job's folder all the same, and what it holds readable to the job
#: (rig.failures.WORKDIR_REFUSED_LINE).
WRAPPER = r"""
trap ':' TERM INT HUP
rig_cannot=''
if ! cd -- "${PWD:-.}" 2>/dev/null; then
  rig_cannot=cwd
else case "$1" in
  */*) if [ ! -e "$1" ]; then rig_cannot=127; elif [ -d "$1" ] || [ ! -x "$1" ]; then rig_cannot=126; fi ;;
  *) command -v -- "$1" >/dev/null 2>&1 || rig_cannot=127 ;;
esac; fi
if [ "$rig_cannot" = cwd ]; then
  echo "rig: cannot enter the working folder: $PWD is not reachable by user ${USER:-$(id -u)} (exit 126)" >&2; rc=126
elif [ "$rig_cannot" = 127 ]; then
  echo "rig: command not found: $1 (looked for in PATH=$PATH) (exit 127)" >&2; rc=127
elif [ "$rig_cannot" = 126 ]; then
  echo "rig: not an executable file: $1 (exit 126)" >&2; rc=126
else
  if [ "${RIG_EXIT_FD:-}" = 0 ]; then "$@" </dev/null; else "$@"; fi
  rc=$?
fi
if [ "${RIG_EXIT_FD:-}" = 0 ]; then
  printf '%s\n' "$rc" >&0
elif [ -n "${RIG_EXIT_FILE:-}" ] && { [ ! -e "$RIG_EXIT_FILE" ] || [ -f "$RIG_EXIT_FILE" ]; }; then
  printf '%s\n' "$rc" > "$RIG_EXIT_FILE.tmp" && mv -f "$RIG_EXIT_FILE.tmp" "$RIG_EXIT_FILE"
fi
exit "$rc"
"""


def wrapper_argv(argv: list[str]) -> list[str]:
    return ["/bin/sh", "-c", WRAPPER, "rig-job", *argv]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parens: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    return rest  # rest[0] is field 3 (state)


def proc_start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22


def boot_host() -> str:
    """This host in this boot and pid namespace, ``hostname/boot-id/pid-namespace``: where it
    matches a record's, a pid and its start time (clock ticks since boot,
    :func:`proc_start_time`) read there can be checked here; another host's, this one's before
    a reboot, or a container's with pids of its own (one sharing the host's name and network,
    ``network_mode: host``) cannot: there the same number is another process, or none."""
    import socket

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{boot or '?'}/{namespace or '?'}"


#: The process states (/proc/PID/stat) of one stopped by a signal (SIGSTOP, SIGTSTP: T) or by
#: a tracer (t): it handles no SIGTERM until it is continued (``kill -CONT``).
STOPPED_STATES = ("T", "t")


def is_stopped(pid: int) -> bool:
    """Is ``pid`` stopped (STOPPED_STATES)?"""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] in STOPPED_STATES


def stopped_sessions(sids: set[int]) -> set[int]:
    """Those of ``sids`` whose job is stopped (STOPPED_STATES): every live process of the
    session but its leader is stopped, or, where the leader is alone, the leader. The leader is
    rig's wrapper (wrapper_argv), which only waits for the command (state S): counted, it hid
    a job whose command alone was stopped (``kill -STOP`` of the pid `ps` shows). One pass over
    /proc (a card worker asks for its jobs every tick: a pass per job cost ~27 ms each on a
    host of 2,000 processes)."""
    stopped = set()
    for sid, members in _sessions(sids).items():
        others = {state for pid, state in members if pid != sid}
        leader = {state for pid, state in members if pid == sid}
        if (others or leader) <= set(STOPPED_STATES):
            stopped.add(sid)
    return stopped


def _sessions(sids: set[int]) -> dict[int, list[tuple[int, str]]]:
    """The live (non-zombie) processes of each of ``sids`` that has any, as (pid, state), in
    one pass over /proc. Never "session 0" (kernel threads) or init's (1)."""
    found: dict[int, list[tuple[int, str]]] = {}
    sids = {sid for sid in sids if sid > 1}
    if not sids:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields and fields[0] != "Z" and (sid := int(fields[3])) in sids:  # field 6 = session
            found.setdefault(sid, []).append((int(entry), fields[0]))
    return found


def is_alive(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` runs and is the same process that started at ``start_time``."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start_time is None or int(fields[19]) == int(start_time)


def runs_unseen(pid: int) -> bool:
    """Does ``pid`` run though this user cannot read its /proc entry? /proc mounted with
    ``hidepid=1`` or ``2`` hides another user's processes (their /proc/PID/stat unreadable, or
    absent), yet the kernel still answers ``kill(pid, 0)`` with EPERM for one that runs: its
    start time cannot be read, so it cannot be told from another process that took the pid."""
    if _stat_fields(pid) is not None:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def may_run(pid: int, start_time: int | None) -> bool:
    """May ``pid`` still be the process that started at ``start_time`` (clock ticks since boot;
    None: any process)? True when it runs and is that process (:func:`is_alive`), and also when
    it runs unseen (:func:`runs_unseen`: /proc ``hidepid`` hides another user's process, whose
    start time then cannot be read). False when it is gone, a zombie, or visibly another process.

    For questions a reader answers or words it says (is a node's rig up there, who holds a
    lock, may a claim be taken over): under hidepid every user but the owner would read root's
    live ``rig up`` as gone and act on that. Never for a decision to signal or stop ``pid``:
    an unseen pid may have been reused by another process, and only :func:`is_alive` proves it
    is the one meant."""
    return is_alive(pid, start_time) or runs_unseen(pid)


def leads_session(pid: int) -> bool:
    """Is ``pid`` the leader of its session, as a job's wrapper is (started with setsid)?"""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


def pids_words(pids: list[int]) -> str:
    """``pid 4242`` / ``pids 4242, 4243``: a job's processes that outlived SIGKILL as its record
    says them (Job.stuck)."""
    return f"pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}"


def describe_survivor(pid: int) -> str:
    """``pid (name, state D)`` for a line about a process that outlived SIGKILL; ``pid`` alone
    when /proc no longer shows it."""
    data = _read_small(f"/proc/{pid}/stat")
    if not data or b"(" not in data:
        return str(pid)
    name = data[data.find(b"(") + 1:data.rfind(b")")].decode(errors="replace")
    state = data[data.rfind(b")") + 2:].split()[:1]
    return f"{pid} ({name}, state {state[0].decode() if state else '?'})"


def session_is_ours(sid: int, start_time: int | None) -> bool:
    """May session ``sid`` be stopped as the job's? Yes while its leader is the job's process
    (same start time) or is gone (what is left in the session is the job's: Linux does not reuse
    a pid still used as a session id). No when another process now has that pid, e.g. after a
    reboot."""
    fields = _stat_fields(sid)
    if fields is None or fields[0] == "Z":
        return True
    return start_time is None or int(fields[19]) == int(start_time)


def session_members(sid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in session ``sid`` (none for 0 or 1: _sessions)."""
    return [pid for pid, _state in _sessions({sid}).get(sid, [])]


def environments():
    """(pid, environment as a list of b"NAME=value") for every live, non-zombie process we
    may read. Iterates /proc once."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        fields = _stat_fields(int(entry))
        if fields and fields[0] != "Z":
            yield int(entry), env


def is_job_process(pid: int, job_id: int, key_prefix: str, instance: str | None = None,
                   node: str | None = None) -> bool:
    """Does ``pid`` carry job ``job_id`` of this rig (same key prefix) in its environment, and,
    when ``instance`` is given, that job instance (ids are reused after Redis loses its data),
    and, when ``node`` is given, was it started by that node (several nodes may share a host)?
    Checked before signalling a pid read from a job record, which could be damaged or forged."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return False
    if instance and f"RIG_JOB_INSTANCE={instance}".encode() not in env:
        return False
    if node is not None and f"RIG_NODE_NAME={node}".encode() not in env:
        return False
    return f"RIG_JOB_ID={job_id}".encode() in env and f"RIG_KEY_PREFIX={key_prefix}".encode() in env


def pids_with_environ(name: str, value: str) -> list[int]:
    """Every live process whose environment has ``name=value`` (e.g. a job's daemonised
    children that left its session with setsid but still carry its RIG_EXIT_FILE)."""
    needle = f"{name}={value}".encode()
    return [pid for pid, env in environments() if needle in env]


def _read_small(path: str, size: int = 4096) -> bytes | None:
    """The first ``size`` bytes of a /proc file (os-level: no file object), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_all(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


#: The most pids (processes and threads together) the kernel is taken to hand out per second,
#: per CPU: 5 us per clone, several times faster than any fork or thread creation on Linux.
#: A job younger than (pid_max - 300) / (this x CPUs) has not seen the pid numbers wrap all
#: the way round: every process it started has a pid from its own up to the last one handed out
#: (cyclically). (The kernel's default pid_max is 1024 per CPU, at least 32768: 80 ms here.)
PID_RATE_PER_CPU = 200_000
#: Pids below this are never handed out again after the numbers wrap (the kernel's RESERVED_PIDS).
_RESERVED_PIDS = 300


def _read_int(path: str) -> int | None:
    data = _read_small(path, 64)
    try:
        return int(data) if data else None
    except ValueError:
        return None


_PID_MAX = _read_int("/proc/sys/kernel/pid_max")


def _window_bounds(first: int | None, age: float | None) -> tuple[int, int] | None:
    """(``first``, the last pid handed out) when every pid handed out since ``first`` was,
    ``age`` seconds ago, lies from one to the other (cyclically: past pid_max the numbers go on
    from _RESERVED_PIDS); None when that cannot be known (see :func:`pid_window`)."""
    rate = PID_RATE_PER_CPU * (os.cpu_count() or 1)
    if not first or age is None or _PID_MAX is None or age * rate >= _PID_MAX - _RESERVED_PIDS:
        return None
    last = _read_int("/proc/sys/kernel/ns_last_pid")
    return None if last is None else (first, last)


def pid_window(first: int | None, age: float | None) -> Callable[[int], bool] | None:
    """A test for "may this pid have been handed out since ``first`` was, ``age`` seconds ago":
    the pids from ``first`` to the last one handed out (/proc/sys/kernel/ns_last_pid),
    cyclically. None (every pid may) when that cannot be known: no ``first`` or ``age``, the
    numbers may have wrapped all the way round since (PID_RATE_PER_CPU), or the kernel does not
    say its last pid."""
    bounds = _window_bounds(first, age)
    return _window_test(bounds) if bounds is not None else None


def _window_test(bounds: tuple[int, int]) -> Callable[[int], bool]:
    """Is a pid in the window ``bounds`` (:func:`_window_bounds`)?"""
    first, last = bounds
    if first <= last:
        return lambda pid: first <= pid <= last
    return lambda pid: pid >= first or pid <= last  # wrapped once, past pid_max


#: A window of at most this many pids is walked pid by pid (a missing /proc/<pid> costs one
#: failed open, ~2 us) instead of listing /proc (every process on the machine, ~0.1-0.3 ms
#: with 200-300 of them); a tiny job's window holds the few dozen pids (processes and threads)
#: the node handed out while it ran.
WINDOW_WALK_MAX = 256


def _window_pids(bounds: tuple[int, int]) -> list[int] | None:
    """Every pid of the window ``bounds`` (cyclic), or None when it holds more than
    WINDOW_WALK_MAX."""
    first, last = bounds
    if first <= last:
        return list(range(first, last + 1)) if last - first < WINDOW_WALK_MAX else None
    if _PID_MAX is None or (_PID_MAX - first) + (last - _RESERVED_PIDS + 1) > WINDOW_WALK_MAX:
        return None
    return [*range(first, _PID_MAX), *range(_RESERVED_PIDS, last + 1)]


def _is_thread(pid: int) -> bool:
    """Is ``pid`` a thread other than its process's main one (its Tgid is another)? A walk of
    pid numbers meets threads too, which a listing of /proc never shows."""
    data = _read_small(f"/proc/{pid}/status", 1024) or b""
    for line in data.splitlines():
        if line.startswith(b"Tgid:"):
            return line.split()[1:2] != [str(pid).encode()]
    return False  # gone, or no Tgid line: taken as the process it was listed as


def job_leftovers(sid: int, name: str, value: str, since: int | None, *, first_pid: int | None = None,
                  age: float | None = None) -> tuple[list[int], list[int]]:
    """What a job that has ended may have left running, in one pass over /proc: (live members of
    its session ``sid``, live processes outside that session whose environment has
    ``name=value`` — daemonised children that left with setsid but kept the job's
    RIG_EXIT_FILE).

    Only a process started after the job's own (pid ``first_pid``, started ``age`` s ago, at
    ``since``: clock ticks since boot, /proc stat field 22) can be the job's. So only the pids
    handed out since the job's (:func:`pid_window`) have their stat read (state, session, start
    time), and only those that started at or after ``since`` their environment; without
    ``first_pid``/``age`` every process's stat is read, and without ``since`` every
    environment. The same answers as :func:`session_members` and :func:`pids_with_environ`, for
    a fraction of the reads (a job's end used to read every process's stat twice and every
    environment once: ~7 ms of CPU with 150 processes on the machine)."""
    needle = f"{name}={value}".encode()
    members: list[int] = []
    daemons: list[int] = []
    bounds = _window_bounds(first_pid, age)  # read before the listing: later pids are not the job's
    walked = _window_pids(bounds) if bounds is not None else None
    if walked is not None:
        entries = [str(pid) for pid in walked]  # a small window: its pids, not the whole listing
    else:
        window = _window_test(bounds) if bounds is not None else None
        entries = [e for e in os.listdir("/proc") if e.isdigit() and (window is None or window(int(e)))]
    for entry in entries:
        data = _read_small(f"/proc/{entry}/stat")
        if not data:
            continue
        # The command name (field 2) may contain spaces and parens: split after the last ')'.
        rest = data[data.rfind(b")") + 2:].split()
        if len(rest) < 20 or rest[0] == b"Z":
            continue
        session, started = int(rest[3]), int(rest[19])
        if sid > 1 and session == sid:
            if walked is None or not _is_thread(int(entry)):
                members.append(int(entry))
            continue
        if since is not None and started < since:
            continue  # older than the job: never one of its processes
        if rest[1] == b"2" or entry == "2":
            continue  # a kernel thread (child of kthreadd): no environment
        env = _read_all(f"/proc/{entry}/environ")
        if env and needle in env.split(b"\0") and (walked is None or not _is_thread(int(entry))):
            daemons.append(int(entry))
    return members, daemons


def find_by_environ(name: str, value: str) -> int | None:
    """The session leader among processes whose environment has ``name=value``, or None.

    Used when a worker died between claiming a job and recording its pid: the job's wrapper
    carries its own exit-file path in its environment, which names the job and attempt.
    """
    found = []
    for pid in pids_with_environ(name, value):
        try:
            found.append((os.getsid(pid) != pid, pid))  # leaders first
        except ProcessLookupError:
            continue
    return min(found)[1] if found else None


def signal_tree(sid: int, sig: int) -> int:
    """Send ``sig`` to the process group ``sid`` and to every process still in session ``sid``.
    Returns how many processes were signalled."""
    if sid <= 1 or sid == os.getpid() or sid == os.getsid(0):
        return 0  # guard: killpg(0) would signal our own group
    count = 0
    try:
        os.killpg(sid, sig)
        count += 1
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_members(sid):
        try:
            os.kill(pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    return count


def begin_stop(sid: int) -> None:
    """The first step of stopping session ``sid``: SIGTERM, then SIGCONT. Whoever calls it
    SIGKILLs the session (``signal_tree``) if it is still there after its grace: ``stop_tree``
    waits for that; the orphan check (workers.health) comes back on a later pass instead.

    SIGCONT because a stopped process (``kill -STOP``, Ctrl-Z, a debugger) acts on no SIGTERM
    until it is continued: without it, a job paused by its owner got no chance to save its work
    at ``rig kill`` or its time limit and was SIGKILLed after the grace. systemd does the same."""
    signal_tree(sid, signal.SIGTERM)
    signal_tree(sid, signal.SIGCONT)  # after SIGTERM: continued, its first act is to handle it


def stop_tree(sid: int, grace: float, *, reap: Callable[[], None] | None = None) -> None:
    """SIGTERM the whole tree, then SIGCONT (``begin_stop``), wait up to ``grace`` seconds for
    it to go, then SIGKILL, and wait up to 2 s more for the kernel to finish. Blocks that long."""
    begin_stop(sid)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap:
            reap()
        if not session_members(sid):
            return
        time.sleep(0.05)
    signal_tree(sid, signal.SIGKILL)
    for _ in range(100):  # SIGKILL is not ignorable; wait briefly for the kernel to finish
        if reap:
            reap()
        if not session_members(sid):
            return
        time.sleep(0.02)


def holds_file(pid: int, path: Path) -> bool:
    """Does process ``pid`` hold ``path`` open (any of its descriptors is that file: same
    device and inode)? False when it is gone, the file is, or its descriptors cannot be read.
    A card's log keeper (rig.logkeeper) holds a job's log open until it has written it to its
    end."""
    try:
        wanted = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if st.st_ino == wanted.st_ino and st.st_dev == wanted.st_dev:
            return True
    return False


class ExitWatcher:
    """Waits for one process to exit, without being its parent (pidfd, Linux >= 5.3).

    Given ``start_time`` (clock ticks since boot, /proc stat field 22, read when the process was
    found), a pid that another process took meanwhile is taken as gone: the pidfd then refers to
    that other process, which must be neither waited for nor signalled."""

    def __init__(self, pid: int, start_time: int | None = None) -> None:
        self.pid = pid
        self._fd: int | None
        try:
            self._fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            self._fd = None  # already gone
        if self._fd is not None and start_time is not None and proc_start_time(pid) != start_time:
            os.close(self._fd)  # the pid is another process's now (or the one meant is reaped)
            self._fd = None
        self._poll = select.poll()
        if self._fd is not None:
            self._poll.register(self._fd, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """True once the process has exited (it may still be an unreaped zombie)."""
        if self._fd is None:
            return True
        return bool(self._poll.poll(max(0, int(timeout * 1000))))

    def kill(self) -> None:
        """SIGKILL the process watched, through its pidfd: never another that took its pid
        after it was reaped. Nothing when it has exited."""
        if self._fd is None:
            return
        try:
            signal.pidfd_send_signal(self._fd, signal.SIGKILL)
        except OSError:
            pass  # exited meanwhile: wait() says so next

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
