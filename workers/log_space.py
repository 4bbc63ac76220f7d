"""A card worker's side of "can this node write its jobs' logs?" (rig.logspace, issue 11.3).

- :class:`LogSpaceGuard` marks the worker's card unhealthy with a ``cannot write logs ...``
  reason when the probe of ``log_dir`` and ``run_dir`` fails, or at once when a job's start
  met disk trouble (:meth:`LogSpaceGuard.trip`), and marks it healthy again once the probe passes
  (it only ever clears a reason of its own). An unhealthy card takes no new jobs (the ledger's
  reserve refuses it), so the dispatcher stops feeding the node.
- :func:`prepare_attempt` makes every file an attempt needs before its process is started, so
  that a full disk is met while nothing runs (:class:`NotStarted`: the job goes back to the
  queue, never into the error queue) and never after: the exit, pid and note files are allocated
  here and later overwritten in place.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from rig import logspace
from rig.ledger import Ledger
from rig.logs import AttemptFiles

log = logging.getLogger(__name__)

#: Seconds between two probes of a guard (a probe writes and removes one page per folder).
CHECK_INTERVAL_S = 5.0
#: Bytes allocated for the exit file (the wrapper writes "<status>\n" at its start) and for the
#: pid file (``<pid> <start> <attempt> <keeper pid> <keeper start>``).
EXIT_BYTES = 32
PID_BYTES = 128


class NotStarted(Exception):
    """An attempt's files could not be made: its process was never started."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(f"{path}: {error.strerror or error}")
        self.path = path
        self.error = error


def prepare_attempt(files: AttemptFiles) -> int:
    """Make the attempt's folder and files before anything runs: the exit file (allocated,
    returned open for writing: it becomes the wrapper's stdin), the pid and note files
    (allocated), and the empty log. Raises :class:`NotStarted` on any OSError, having removed
    what it made."""
    made: list[Path] = []
    fd = -1
    try:
        files.folder.mkdir(parents=True, exist_ok=True)
        made.append(files.exit)
        fd = os.open(files.exit, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        logspace.pad_fd(fd, EXIT_BYTES)  # the wrapper's status then overwrites, never appends
        for path, size in ((files.pid, PID_BYTES), (files.note, logspace.NOTE_BYTES)):
            made.append(path)
            logspace.preallocate(path, size)
        made.append(files.log)
        with open(files.log, "ab"):
            pass
        return fd
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        remove_attempt_files(files, made)
        raise NotStarted(made[-1] if made else files.folder, exc) from exc


def remove_attempt_files(files: AttemptFiles, paths: list[Path] | None = None) -> None:
    """Remove the files of an attempt that never started (so its number can be used again
    without looking like an attempt that ran)."""
    for path in paths if paths is not None else (files.exit, files.pid, files.note, files.log):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def write_pid_file(files: AttemptFiles, text: str) -> None:
    """Overwrite the allocated pid file; never raises (the job runs: it is supervised whether
    or not its pid could be noted on disk, and adoption finds it by its environment)."""
    try:
        logspace.overwrite(files.pid, text, PID_BYTES)
    except OSError as exc:
        log.warning("could not write %s (%s); the job runs on, supervised", files.pid, exc)


class LogSpaceGuard:
    """Keeps one card out of placement while its node cannot write logs."""

    def __init__(self, ledger: Ledger, node: str, index: int, folders: list[Path], min_free: int,
                 interval: float = CHECK_INTERVAL_S) -> None:
        self.ledger = ledger
        self.node = node
        self.index = index
        self.folders = folders
        self.min_free = min_free
        self.interval = interval
        self._next = 0.0  # time.monotonic() of the next probe

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def check(self) -> str | None:
        """Probe (at most every ``interval`` s); mark or clear the card. Returns the reason the
        node cannot write logs, None when it can (or when it is not time to probe)."""
        if not self.due():
            return None
        self._next = time.monotonic() + self.interval
        problem = logspace.probe(self.folders, self.min_free)
        card = self.ledger.card(self.node, self.index)
        if problem is not None:
            if card.healthy or card.health_reason != problem:
                log.error("card %s/%s takes no new jobs: %s", self.node, self.index, problem)
                self.ledger.set_healthy(self.node, self.index, False, problem)
        elif not card.healthy and logspace.is_log_space_reason(card.health_reason):
            log.info("card %s/%s: logs can be written again; taking jobs", self.node, self.index)
            self.ledger.set_healthy(self.node, self.index, True)
        return problem

    def trip(self, folder: Path, error: OSError) -> str:
        """A start met disk trouble under ``folder``: take the card out now, before the job is
        requeued."""
        problem = logspace.reason(folder, error)
        log.error("card %s/%s takes no new jobs: %s", self.node, self.index, problem)
        self.ledger.set_healthy(self.node, self.index, False, problem)
        self._next = time.monotonic() + self.interval
        return problem
