"""A job's timeline across rig's processes, for scripts/profile_job_path.py.

Off unless ``RIG_TRACE_DIR`` names a folder in the environment of the process (``rig up``
passes its own environment to the workers): then :func:`mark` appends one line
``<job id> <stage> <epoch s> <pid> <thread id> <thread CPU s>`` to ``<dir>/<pid>.trace`` with one
write(2) (O_APPEND, no buffer, so nothing is lost when a worker is stopped). The thread's CPU
time (``time.thread_time()``: user + system of the calling thread since it began) lets a
profile attribute a process's CPU to the stages of a job exactly: a card worker runs each job
on a thread of its own, so the CPU between two marks of that thread is that step's, all of it.
Off, a mark costs one global lookup.
"""

from __future__ import annotations

import os
import threading
import time

_DIR = os.environ.get("RIG_TRACE_DIR") or None
_fd: int | None = None
_fd_pid = 0


def enabled() -> bool:
    return _DIR is not None


def environ() -> dict[str, str]:
    """What a process started without this one's environment (a log keeper) needs to mark too:
    ``{"RIG_TRACE_DIR": dir}`` while tracing, else nothing."""
    return {"RIG_TRACE_DIR": _DIR} if _DIR is not None else {}


def mark(job_id: int | None, stage: str) -> None:
    """Record that ``job_id`` (None: no job, e.g. a dispatcher wake) reached ``stage`` now."""
    if _DIR is None:
        return
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:  # a forked child writes its own file
        _fd = os.open(os.path.join(_DIR, f"{pid}.trace"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                      0o644)
        _fd_pid = pid
    os.write(_fd, (f"{job_id if job_id is not None else '-'} {stage} {time.time():.6f} {pid} "
                   f"{threading.get_ident()} {time.thread_time():.6f}\n").encode())
