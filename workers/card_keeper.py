"""A card worker's side of its log keepers (rig.logkeeper): it hands each job's output pipe to
the card's keeper, keeps a read end of every pipe of its own, and when a keeper dies (SIGKILL,
the OOM killer, a crash) starts a new one at once and hands it every log the dead one had.

Why read ends are kept: a pipe whose last reader is gone kills its writer with SIGPIPE on its
next write. Two processes besides the keeper hold one, so that no keeper's death ever does:

- the worker (``KeptLog.read_fd``), which it hands to the next keeper when one dies; the job's
  writes never fail, at worst they wait (the pipe's 64 KiB buffer full) until the new keeper
  reads on: one keeper's start, 0.17-0.48 s on a loaded 2-core host
  (scripts/measure_keeper_death.py);
- the job's own wrapper (workers.process_tree.WRAPPER, which outlives every process of the
  job's command): the worker passes it the same read end (:func:`job_fds`). It never reads;
  it only holds. So a keeper that dies while no worker of its card runs at all (the worker
  restarting, or SIGKILLed) leaves the job blocked on a full pipe at worst, never killed: the
  next worker takes a read end through /proc/<job>/fd/1 and hands the log to a new keeper of
  its own (:meth:`CardKeeper.adopt`).

Neither reads from its end. What the dead keeper had read and not yet written is lost (at most
one read: read_size(cap), and never more than the pipe held); the new keeper says so in the log
with one line (rig.logkeeper.restart_line) and the attempt's note file counts the restart
(``keeper_restarts``, rig.logspace.describe_note).

A worker that adopts a running job (its worker stopped) takes a read end of the job's pipe too
(:meth:`CardKeeper.adopt`, through /proc/<job>/fd/1, which opens the pipe itself) and watches
the worker before's keeper (:class:`ForeignKeeper`, a pidfd): if that one dies, the log goes to
this worker's keeper; if it is dead already, the log goes to one at once.

A keeper that cannot be restarted (no process can be started) is replaced by a thread of the
worker that copies the log itself (:class:`ThreadKeeper`), with a line that says so; if even
the log cannot be opened, the output is read and dropped, with that line in the log where it
can be written. The job is never blocked for ever nor killed for it. Jobs started by an older
rig (their wrapper holds no read end) and adopted without a read end of this worker's own keep
the old rule: the SIGPIPE that follows their keeper's death is rig's fault
(rig.failures.FailureClass.INFRASTRUCTURE), retried without spending one of its retries.

Invariants: every :class:`KeptLog` not yet released holds ``read_fd`` open; ``keeper`` is the
process that copies it now (the card's keeper, a keeper of its own, or this worker's
ThreadKeeper), None only when not even a thread could be had; all of a KeptLog's fields change under :attr:`CardKeeper._lock`.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rig import logkeeper
from workers.process_tree import ExitWatcher, is_alive, proc_start_time

log = logging.getLogger(__name__)

#: The log keeper, run as a script with ``python -I -S`` (rig.logkeeper).
LOGKEEPER_SCRIPT = str(Path(logkeeper.__file__))
#: How long a keeper whose "done" pipe ended without DONE is given to be seen dead (s): its
#: descriptors close as it exits, a moment before it can be waited for.
DEATH_SEEN_S = 2.0


def job_fds(kept: KeptLog | None) -> tuple[int, ...]:
    """Descriptors the job's wrapper is to inherit (subprocess.Popen's ``pass_fds``): a read end
    of its own output pipe, held (never read) for the job's whole life, so that no keeper's death
    while no worker runs ends the job with SIGPIPE (see the module's docstring). () without a
    keeper (the job then writes its log directly)."""
    return (kept.read_fd,) if kept is not None and kept.read_fd >= 0 else ()


class ThreadKeeper:
    """The last resort when no keeper process can be started: a thread of this worker copies
    the log (rig.logkeeper.LogCopy, the same rules), from a duplicate of the worker's read end,
    until the pipe's end of file. If the log cannot be opened the output is read and dropped (the
    job is never blocked for ever for it). It ends with the worker: the next worker, which
    adopts the job, finds this worker (named as the log's keeper) gone and hands the log to a
    keeper of its own."""

    def __init__(self, read_fd: int, log_path: Path, cap: int, opening: str) -> None:
        self.pid = os.getpid()  # the pid file names this worker as the log's keeper
        self.returncode: int | None = None
        self._fd = os.dup(read_fd)  # its own: the worker's release closes read_fd meanwhile
        self._thread = threading.Thread(target=self._copy, args=(log_path, cap, opening), daemon=True,
                                        name=f"rig-keeper-thread-{log_path.name}")
        try:
            self._thread.start()
        except RuntimeError:
            os.close(self._fd)
            raise OSError("no thread could be started") from None

    def _copy(self, log_path: Path, cap: int, opening: str) -> None:
        copy: logkeeper.LogCopy | None = None
        try:
            try:
                copy = logkeeper.LogCopy(log_path, cap, opening=opening)
            except OSError as exc:
                log.error("%s: no log keeper and the log cannot be opened (%s): the job's output is dropped",
                          log_path, exc)
            chunk = logkeeper.read_size(cap)
            while data := _read(self._fd, chunk):
                if copy is not None:
                    copy.feed(data)
        finally:
            if copy is not None:
                copy.close()
            os.close(self._fd)
            self.returncode = 0

    def wait(self, timeout: float | None = None) -> int | None:
        """subprocess.Popen.wait's contract: 0 once the log is written to its end."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise subprocess.TimeoutExpired(f"keeper thread {self._thread.name}", timeout or 0.0)
        return self.returncode


def _read(fd: int, size: int) -> bytes:
    """One read of a pipe, b"" at its end (or when it fails: nothing more can come of it)."""
    while True:
        try:
            return os.read(fd, size)
        except InterruptedError:
            continue
        except OSError as exc:
            log.warning("a job's output pipe could not be read (%s); its copy ends", exc)
            return b""


class ForeignKeeper:
    """A keeper this worker did not start (the card's keeper of the worker before, named in an
    adopted attempt's pid file): watched through a pidfd; its exit status cannot be known."""

    returncode = None

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._watch = ExitWatcher(pid)
        self._stopped = threading.Event()

    def wait(self, timeout: float | None = None) -> None:
        """Until it has exited; subprocess.TimeoutExpired after ``timeout`` s, or once
        :meth:`stop` was called (the worker let go of the log: nothing to watch for)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopped.is_set():
            step = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if step <= 0:
                break
            if self._watch.wait(step):
                return
        raise subprocess.TimeoutExpired(f"keeper {self.pid}", timeout or 0.0)

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        """Only by the one thread that waits on it (workers.card_keeper's watch)."""
        self._watch.close()


@dataclass(eq=False)
class KeptLog:
    """One job's output pipe, as the worker holds it."""

    log_path: Path
    cap: int  # bytes
    read_fd: int  # the worker's own read end of the job's pipe; -1 once released
    keeper: subprocess.Popen | ForeignKeeper | ThreadKeeper | None = None  # what copies it now
    keeper_start: int | None = None  # its start time (clock ticks since boot), for the pid file
    done_fd: int | None = None  # the card's keeper's "done" pipe; None with a keeper of its own
    restarts: int = 0  # keepers that died under it and were replaced
    finished: bool = False  # written to its end (DONE seen, or its own keeper exited 0)
    lost_reader: bool = False  # its keeper died and nothing took it over (not even a thread)
    #: An adopted job's process (pid, start time): with a ForeignKeeper, the log is at its end
    #: once the job is gone and its pipe empty.
    job: tuple[int, int | None] | None = None
    #: Called (under the lock) with the log whenever its keeper changes: the pid file follows.
    on_moved: Callable[[KeptLog], None] | None = None
    _stale: list[int] = field(default_factory=list)  # done pipes of dead keepers, closed at release

    @property
    def keeper_pid(self) -> int | None:
        return self.keeper.pid if self.keeper is not None else None


class CardKeeper:
    """The keepers of one card worker: the card's (one process for every log), keepers of
    their own when that one does not answer, and their restarts."""

    def __init__(self, python: str, env_for: Callable[[str], dict[str, str]], what: str = "card") -> None:
        """``env_for(what)``: the environment of a keeper (rig.logkeeper.MARK set to ``what``)."""
        self.python = python
        self.env_for = env_for
        self.what = what
        self._lock = threading.RLock()
        self._server: logkeeper.KeeperServer | None = None
        self._logs: set[KeptLog] = set()
        self._closed = False

    # -- the card's keeper ----------------------------------------------------------------
    def server(self) -> logkeeper.KeeperServer:
        """The card's keeper, started (and watched) if there is none or it has exited.
        Raises OSError when it cannot be started."""
        with self._lock:
            if self._server is not None and self._server.alive():
                return self._server
            dead = self._server
            if dead is not None:
                dead.sock.close()
            self._server = server = logkeeper.KeeperServer(self.python, self.env_for("server"))
            self._watch(server.proc)
            if dead is not None:
                self._keeper_died(dead.proc)  # its logs go to the new one (normally done already)
            return server

    def drop_server(self) -> None:
        """Let go of the card's keeper (it did not answer): it takes no new logs and exits once
        those it copies have ended; the next log starts a new one."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.close(0.0)

    # -- one job's log --------------------------------------------------------------------
    def open(self, log_path: Path, cap: int) -> tuple[KeptLog | None, int]:
        """A pipe for one job's output, kept into ``log_path`` within ``cap`` bytes. Returns
        (its KeptLog, the write end: the job's stdout, the caller's to close), or (None, -1)
        when no keeper can be had (the job then writes its log directly)."""
        for to_keeper in (self._to_server, self._to_own):
            try:
                read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
            except OSError as exc:
                log.warning("no log keeper for %s (%s); the job writes to its log directly", log_path, exc)
                return None, -1
            kept = KeptLog(log_path, cap, read_fd)
            with self._lock:
                if to_keeper(kept, ""):
                    self._logs.add(kept)
                    return kept, write_fd
            # A fresh pipe for a keeper of its own: a card keeper that did not answer in time
            # may still take this one (it then ends at once, at its end of file).
            os.close(read_fd)
            os.close(write_fd)
        log.warning("no log keeper for %s; the job writes to its log directly", log_path)
        return None, -1

    def adopt(self, log_path: Path, cap: int, job_pid: int, job_start: int | None, keeper_pid: int,
              keeper_start: int | None) -> KeptLog | None:
        """An adopted job's output (its worker stopped; the card's keeper of that worker copies
        it on): take a read end of the job's pipe of this worker's own (through
        /proc/<job>/fd/1, which opens the pipe itself), so that keeper's death is survived as
        one of this worker's own would be. A keeper found dead already (it died while no worker
        of the card ran; the job's wrapper held its pipe meanwhile, :func:`job_fds`) is replaced
        at once, with the line that says so. None when that cannot be done (the job's stdout is
        not a pipe, or is gone): the keeper's death then stays rig's fault, watched only."""
        import stat

        try:
            fd = os.open(f"/proc/{job_pid}/fd/1", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        keeper = ForeignKeeper(keeper_pid)  # its pidfd first, then its start time: never a reused pid
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not is_alive(job_pid, job_start):
                raise OSError("not the job's pipe")
            os.set_blocking(fd, True)  # a keeper it is handed to reads it blocking (shared flag)
        except OSError:
            os.close(fd)
            keeper.close()
            return None
        kept = KeptLog(log_path, cap, fd, keeper=keeper, keeper_start=keeper_start, job=(job_pid, job_start))
        with self._lock:
            self._logs.add(kept)
        if is_alive(keeper_pid, keeper_start):
            self._watch(keeper)
        else:  # dead before this worker came: its log goes to a keeper of this worker's now
            self._keeper_died(keeper)
            keeper.close()
        return kept

    def follow(self, kept: KeptLog, on_moved: Callable[[KeptLog], None]) -> None:
        """Call ``on_moved(kept)`` now and whenever its keeper changes (under the lock, so the
        pid file never names a keeper that was replaced meanwhile)."""
        with self._lock:
            kept.on_moved = on_moved
            on_moved(kept)

    def wait_done(self, kept: KeptLog, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the log to be written to its end (the job's last output
        in it), through keeper restarts. False when it is not yet (something still holds the
        job's output). True at once for a log no keeper copies any more (lost_reader)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if kept.finished or kept.keeper is None or kept.read_fd < 0:
                    return True
                keeper, done_fd = kept.keeper, kept.done_fd
            if isinstance(keeper, ForeignKeeper):
                raise ValueError("an adopted log's keeper is waited for through /proc (holds_file)")
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if done_fd is None:  # a keeper of its own: it exits at the log's end
                try:
                    code = keeper.wait(left)
                except subprocess.TimeoutExpired:
                    return False
                if code == 0:
                    with self._lock:
                        kept.finished = kept.finished or kept.keeper is keeper
                    continue
            else:
                ready = select.poll()  # poll, not select: a worker's descriptors may pass 1023
                ready.register(done_fd, select.POLLIN)
                if not ready.poll(int(left * 1000) + 1):
                    return False
                with self._lock:
                    if kept.keeper is keeper and self._read_done(kept):
                        return True
                # End of file without DONE: its keeper died. Seen dead, it is replaced.
                try:
                    keeper.wait(DEATH_SEEN_S)
                except subprocess.TimeoutExpired:
                    log.warning("%s: its keeper (pid %s) closed its done pipe without finishing it and runs on",
                                kept.log_path, keeper.pid)
                    return True
            self._keeper_died(keeper)

    def keeper_exited(self, kept: KeptLog) -> None:
        """An adopted log whose keeper (the worker before's) let go of it or exited: if it
        exited before the log's end, the log goes to a keeper of this worker's now (the watch
        thread may not have got there yet; either does it once)."""
        keeper = kept.keeper
        if isinstance(keeper, ForeignKeeper) and not is_alive(keeper.pid, kept.keeper_start):
            self._keeper_died(keeper)

    def release(self, kept: KeptLog) -> None:
        """The worker is done with this log (its job ended, or the worker detaches from it):
        its read end and done pipes are closed. The keeper copies on to the pipe's end."""
        with self._lock:
            self._logs.discard(kept)
            if isinstance(kept.keeper, ForeignKeeper):
                kept.keeper.stop()  # its watch ends
            for fd in (kept.read_fd, kept.done_fd, *kept._stale):
                if fd is not None and fd >= 0:
                    os.close(fd)
            kept.read_fd, kept.done_fd, kept._stale = -1, None, []
            kept.on_moved = None

    def close(self, wait: float = 0.0) -> None:
        """The worker stops: no keeper is restarted any more; the card's keeper takes no new
        logs and copies on those it has (waits up to ``wait`` s for it to exit). Each job's
        supervisor releases its own log as it detaches (never here: it may be waiting on it)."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.close(wait)

    # -- keepers dying --------------------------------------------------------------------
    def _watch(self, proc: subprocess.Popen | ForeignKeeper) -> None:
        """Notice ``proc``'s death at once: a thread waits for it (the worker is its parent)."""
        thread = threading.Thread(target=self._wait_and_recover, args=(proc,), daemon=True,
                                  name=f"rig-keeper-{proc.pid}")
        thread.start()

    def _wait_and_recover(self, proc: subprocess.Popen | ForeignKeeper) -> None:
        try:
            proc.wait()
        except Exception:  # noqa: BLE001 - a watch thread never raises (a released foreign one ends so)
            return
        else:
            self._keeper_died(proc)
        finally:
            if isinstance(proc, ForeignKeeper):
                proc.close()

    def _keeper_died(self, proc: subprocess.Popen | ForeignKeeper) -> None:
        """``proc`` (a keeper) has exited: every log it copied that is not written to its end
        goes to another keeper, with the opening line. Idempotent (the watch thread and a
        waiter may both get here)."""
        moved: list[KeptLog] = []
        with self._lock:
            if self._server is not None and self._server.proc is proc:
                self._server.sock.close()
                self._server = None
            if self._closed:
                return
            for kept in list(self._logs):
                if kept.keeper is not proc or kept.finished:
                    continue
                if kept.done_fd is not None and self._read_done(kept):
                    continue
                if kept.done_fd is None and proc.returncode == 0:
                    kept.finished = True  # a keeper of its own exits 0 only at its log's end
                    continue
                if isinstance(proc, ForeignKeeper) and kept.job is not None and not is_alive(*kept.job) \
                        and not _unread(kept.read_fd):
                    kept.finished = True  # the job is gone and its pipe empty: it ended, then exited
                    continue
                kept.restarts += 1
                if kept.done_fd is not None:
                    kept._stale.append(kept.done_fd)  # a waiter may still poll it: closed at release
                    kept.done_fd = None
                if self._hand(kept, logkeeper.restart_line(proc.pid)):
                    moved.append(kept)
                elif self._to_thread(kept, proc.pid):
                    log.error("%s: its log keeper (pid %s) died and no other could be started; this worker "
                              "copies the log itself", kept.log_path, proc.pid)
                else:
                    kept.keeper, kept.lost_reader = None, True
                    self._logs.discard(kept)
                    os.close(kept.read_fd)  # nothing to read it: rather SIGPIPE than a job blocked for ever
                    kept.read_fd = -1
                    log.error("%s: its log keeper (pid %s) died and nothing could take it over; the job's "
                              "writes may now fail (rig's fault, not the job's)", kept.log_path, proc.pid)
        if moved:
            log.warning("the %s's log keeper (pid %s) died (exit %s); pid %s took over %d running job log(s): %s",
                        self.what, proc.pid, proc.returncode, moved[0].keeper_pid, len(moved),
                        ", ".join(str(k.log_path) for k in moved))

    def _read_done(self, kept: KeptLog) -> bool:
        """Has the current keeper said DONE on the log's done pipe (without waiting)? Sets
        ``finished``. False when nothing is there yet, or end of file alone (it died)."""
        if kept.finished or kept.done_fd is None:
            return kept.finished
        ready = select.poll()
        ready.register(kept.done_fd, select.POLLIN)
        if ready.poll(0):
            try:
                kept.finished = os.read(kept.done_fd, 1) == logkeeper.DONE
            except OSError:
                kept.finished = False
        return kept.finished

    def _hand(self, kept: KeptLog, opening: str) -> bool:
        """Give the log to the card's keeper, else to a keeper of its own (under the lock).
        False when neither takes it."""
        return self._to_server(kept, opening) or self._to_own(kept, opening)

    def _to_server(self, kept: KeptLog, opening: str) -> bool:
        try:
            server = self.server()
            _pid, done = server.start(kept.read_fd, kept.log_path, kept.cap, opening)
        except OSError as exc:
            log.warning("the %s's log keeper: %s; %s gets a keeper of its own", self.what, exc, kept.log_path)
            self.drop_server()
            return False
        kept.keeper, kept.done_fd = server.proc, done
        self._moved(kept)
        return True

    def _to_own(self, kept: KeptLog, opening: str) -> bool:
        try:
            proc = subprocess.Popen(
                [self.python, "-I", "-S", LOGKEEPER_SCRIPT, str(kept.log_path), str(kept.cap),
                 *([opening] if opening else [])],
                stdin=kept.read_fd, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                env=self.env_for(str(kept.log_path)))
        except OSError as exc:
            log.warning("log keeper for %s could not start (%s)", kept.log_path, exc)
            return False
        self._watch(proc)
        kept.keeper, kept.done_fd = proc, None
        self._moved(kept)
        return True

    def _to_thread(self, kept: KeptLog, dead_pid: int | None) -> bool:
        """The last resort (under the lock): this worker copies the log itself (ThreadKeeper)."""
        try:
            kept.keeper = ThreadKeeper(kept.read_fd, kept.log_path, kept.cap, thread_line(dead_pid))
        except OSError as exc:
            log.warning("%s: no thread to copy its log (%s)", kept.log_path, exc)
            return False
        kept.done_fd = None
        self._moved(kept)
        return True

    def _moved(self, kept: KeptLog) -> None:
        assert kept.keeper is not None
        kept.keeper_start = proc_start_time(kept.keeper.pid)
        if kept.on_moved is not None:
            try:
                kept.on_moved(kept)
            except Exception:  # noqa: BLE001 - the pid file is a hint; the log goes on
                log.exception("%s: could not note its new keeper", kept.log_path)


def thread_line(dead_pid: int | None) -> str:
    """The line a log copied by its worker's ThreadKeeper opens with (one line, no newline)."""
    return logkeeper.restart_line(dead_pid).replace(
        "a new one took this log over", "none other could be started and the card worker copies this log itself")


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` reads (FIONREAD); 0 when that cannot be told."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]
