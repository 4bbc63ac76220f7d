"""A card worker's side of its log keepers (rig.logkeeper): it hands each job's output pipe to
the card's keeper, keeps a read end of every pipe of its own, and when a keeper dies (SIGKILL,
the OOM killer, a crash) starts a new one at once and hands it every log the dead one had.

Why the worker keeps a read end: a pipe whose last reader is gone kills its writer with SIGPIPE
on its next write. With the worker's read end the job's writes never fail; at worst they wait a
few milliseconds (the pipe's 64 KiB buffer full) until the new keeper reads on. The worker never
reads from its ends; it only holds them. What the dead keeper had read and not yet written is
lost (at most one read: read_size(cap), and never more than the pipe held); the new keeper says
so in the log with one line (rig.logkeeper.restart_line) and the attempt's note file counts the
restart (``keeper_restarts``, rig.logspace.describe_note).

A keeper that cannot be restarted (no process can be started) leaves the job's pipe with no
reader once the worker lets go of its end: its next write fails (SIGPIPE) and the attempt is
rig's fault (:attr:`KeptLog.lost_reader`; rig.failures.FailureClass.INFRASTRUCTURE), retried
without spending one of its retries. So is one whose worker had stopped when its keeper died
(a job adopted after a worker restart has no read end here).

Invariants: every :class:`KeptLog` not yet released holds ``read_fd`` open; ``keeper`` is the
process that copies it now (the card's keeper or a keeper of its own), None only when none
could be had; all of a KeptLog's fields change under :attr:`CardKeeper._lock`.
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
from workers.process_tree import proc_start_time

log = logging.getLogger(__name__)

#: The log keeper, run as a script with ``python -I -S`` (rig.logkeeper).
LOGKEEPER_SCRIPT = str(Path(logkeeper.__file__))
#: How long a keeper whose "done" pipe ended without DONE is given to be seen dead (s): its
#: descriptors close as it exits, a moment before it can be waited for.
DEATH_SEEN_S = 2.0


@dataclass(eq=False)
class KeptLog:
    """One job's output pipe, as the worker holds it."""

    log_path: Path
    cap: int  # bytes
    read_fd: int  # the worker's own read end of the job's pipe; -1 once released
    keeper: subprocess.Popen | None = None  # the process that copies it now
    keeper_start: int | None = None  # its start time (clock ticks since boot), for the pid file
    done_fd: int | None = None  # the card's keeper's "done" pipe; None with a keeper of its own
    restarts: int = 0  # keepers that died under it and were replaced
    finished: bool = False  # written to its end (DONE seen, or its own keeper exited 0)
    lost_reader: bool = False  # its keeper died and none took it over: the job's writes fail
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

    def release(self, kept: KeptLog) -> None:
        """The worker is done with this log (its job ended, or the worker detaches from it):
        its read end and done pipes are closed. The keeper copies on to the pipe's end."""
        with self._lock:
            self._logs.discard(kept)
            for fd in (kept.read_fd, kept.done_fd, *kept._stale):
                if fd is not None and fd >= 0:
                    os.close(fd)
            kept.read_fd, kept.done_fd, kept._stale = -1, None, []
            kept.on_moved = None

    def close(self, wait: float = 0.0) -> None:
        """The worker stops: no keeper is restarted any more; the card's keeper takes no new
        logs and copies on those it has (waits up to ``wait`` s for it to exit)."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
            logs = list(self._logs)
        for kept in logs:
            self.release(kept)
        if server is not None:
            server.close(wait)

    # -- keepers dying --------------------------------------------------------------------
    def _watch(self, proc: subprocess.Popen) -> None:
        """Notice ``proc``'s death at once: a thread waits for it (the worker is its parent)."""
        thread = threading.Thread(target=self._wait_and_recover, args=(proc,), daemon=True,
                                  name=f"rig-keeper-{proc.pid}")
        thread.start()

    def _wait_and_recover(self, proc: subprocess.Popen) -> None:
        try:
            proc.wait()
        except Exception:  # noqa: BLE001 - a watch thread never raises
            return
        self._keeper_died(proc)

    def _keeper_died(self, proc: subprocess.Popen) -> None:
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
                kept.restarts += 1
                if kept.done_fd is not None:
                    kept._stale.append(kept.done_fd)  # a waiter may still poll it: closed at release
                    kept.done_fd = None
                if self._hand(kept, logkeeper.restart_line(proc.pid)):
                    moved.append(kept)
                else:
                    kept.keeper, kept.lost_reader = None, True
                    self._logs.discard(kept)
                    os.close(kept.read_fd)  # no keeper: rather SIGPIPE than a job blocked for ever
                    kept.read_fd = -1
                    log.error("%s: its log keeper (pid %s) died and no other could be started; the job's "
                              "writes now fail (rig's fault, not the job's)", kept.log_path, proc.pid)
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

    def _moved(self, kept: KeptLog) -> None:
        assert kept.keeper is not None
        kept.keeper_start = proc_start_time(kept.keeper.pid)
        if kept.on_moved is not None:
            try:
                kept.on_moved(kept)
            except Exception:  # noqa: BLE001 - the pid file is a hint; the log goes on
                log.exception("%s: could not note its new keeper", kept.log_path)
