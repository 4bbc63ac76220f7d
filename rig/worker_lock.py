"""At most one worker per card and one control worker per node, across processes.

Each of these processes takes an exclusive ``flock`` on its own file under the node's run folder
(``$RIG_HOME/run/locks/<node>.<name>.lock``) when it starts and holds it for its whole life:
the kernel releases it when the process ends, however it ends, so a stale lock cannot exist.
A second one (a leftover of a crashed ``rig up``, a copy started by hand) finds it held and
exits at once with one line naming the holder's pid, which the holder wrote into the file.

The descriptor is close-on-exec and card workers start jobs with ``close_fds``: a job never
inherits the lock, so a job that outlives its worker never keeps the next worker out.

Two homes using the same node name are not caught here (their run folders differ); see
issue 11.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

#: Exit status of a worker that found its lock held (EX_TEMPFAIL: the supervisor may retry).
EXIT_LOCK_HELD = 75


class LockHeld(Exception):
    """Another live process holds the lock; ``holder`` is its pid as it wrote it (or None)."""

    def __init__(self, path: Path, holder: int | None) -> None:
        super().__init__(f"{path} is held by pid {holder if holder is not None else '?'}")
        self.path = path
        self.holder = holder


def lock_path(run_dir: Path, node: str, name: str) -> Path:
    """The lock file of worker ``name`` (card0, control, flower) of ``node``."""
    return Path(run_dir) / "locks" / f"{node}.{name}.lock"


def acquire(path: Path) -> int:
    """Take the exclusive lock on ``path`` without waiting and write our pid into it; returns
    the descriptor, to be kept open for the life of the process. Raises LockHeld."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            holder = int(text) if text.isdigit() else None
        finally:
            os.close(fd)
        raise LockHeld(path, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def worker_lock_name(role: str, card_index: str | None) -> str | None:
    """The lock a process of ``role`` (RIG_ROLE) takes, or None for roles that need none:
    beat (celery-redbeat's lock already keeps one ticking per cluster) and the rest."""
    if role == "card" and card_index is not None:
        return f"card{card_index}"
    if role in ("control", "flower"):
        return role
    return None
