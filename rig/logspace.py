"""Can this node write its jobs' logs? One rule for "disk trouble", the probe that answers it,
and the note a log keeper leaves when it could not write everything (issue 11.3).

A node whose ``log_dir`` (or ``run_dir``) cannot be written takes no new jobs: every card of
it is marked unhealthy with a reason that starts with :data:`REASON_PREFIX` (the card worker's
guard, workers/log_space.py), which `rig status` shows, rig.alerts raises as a critical alert and
rig.metrics exports as ``rig_node_logs_writable``. The guard probes again periodically and the
cards take jobs again by themselves once the probe passes.

The note file (``attempt-<n>.note``, rig.logs.AttemptFiles.note) is allocated by the card worker
before the job starts (:data:`NOTE_BYTES` of spaces) and overwritten in place by the log keeper,
so writing it never needs new space on a full disk. It holds one JSON object:
``{"lost": bytes, "error": "ENOSPC", "strerror": ..., "at": epoch s, "log_bytes": bytes,
"cap_cut": bytes, "cap": bytes, "keeper_restarts": n, "cut_skipped": n, "log_made_again": n}``
(each key optional; the counts: keepers that took the log over from one that died, cuts a lock
on the log held off, times the log was deleted under its keeper and made again).

Units: bytes, seconds since the epoch. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

#: Errors that mean "this file system cannot take writes now": the node stops taking jobs.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
#: Every health reason this module's guard sets starts with this (one place for the words).
REASON_PREFIX = "cannot write logs"
#: Size of a pre-allocated note file (bytes): one JSON line, padded with spaces.
NOTE_BYTES = 512
#: Size of the probe write (bytes): one page, what the first line of any log needs.
PROBE_BYTES = 4096
#: Name of the probe file (its pid makes two workers of one node never meet).
PROBE_NAME = ".rig-write-probe-{pid}"


def is_disk_error(exc: BaseException) -> bool:
    """True when ``exc`` is an OSError that says the file system takes no writes now."""
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def human(nbytes: int) -> str:
    """``3.1 MiB``; below 1 KiB: ``512 B``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use under ``folder`` (statvfs f_bavail)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def out_of_inodes(folder: Path) -> bool:
    """Does the file system of ``folder`` have no free inode left (statvfs f_favail 0, on a file
    system that counts them: f_files > 0)? Then new files fail with ENOSPC while df shows
    free bytes."""
    for where in (folder, *folder.parents):  # a folder that could not be made: its parent's
        try:
            st = os.statvfs(where)
        except OSError:
            continue
        return st.f_files > 0 and st.f_favail == 0
    return False


def reason(folder: Path, exc: OSError | None = None, free: int | None = None,
           min_free: int | None = None) -> str:
    """The one line `rig status` shows for a node that cannot write logs."""
    if exc is not None and exc.errno == errno.ENOSPC and out_of_inodes(folder):
        what = "no free inodes (ENOSPC, though bytes are free: too many files)"
    elif exc is not None:
        what = f"{exc.strerror or exc} ({errno_name(exc)})"
    else:
        what = f"only {human(free or 0)} free (log_min_free_bytes = {human(min_free or 0)})"
    return f"{REASON_PREFIX} under {folder}: {what}; takes jobs again when it can"


def never_enough(folders: dict[str, Path], min_free: int) -> str | None:
    """One warning line when the file system of one of ``folders`` (setting name -> folder) is
    smaller in all than ``min_free`` bytes (``log_min_free_bytes``): the node could then never
    take a job. None when each is big enough (or cannot be read: the guard says so later)."""
    for name, folder in folders.items():
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        total = st.f_blocks * st.f_frsize
        if total < min_free:
            return (f"warning: the file system of {name} ({folder}) holds {human(total)} in all, less than "
                    f"log_min_free_bytes = {human(min_free)}: this node can never take a job (lower "
                    f"log_min_free_bytes or move {name})")
    return None


def is_log_space_reason(text: str | None) -> bool:
    return bool(text) and str(text).startswith(REASON_PREFIX)


def probe(folders: list[Path], min_free: int) -> str | None:
    """None when every folder has at least ``min_free`` bytes free and takes a
    :data:`PROBE_BYTES` write; else the reason (:func:`reason`) for the first that does not.
    Folders are created if missing. Errors other than disk trouble (a permission problem, ...)
    are not this check's business: such a folder counts as writable here."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            free = free_bytes(folder)
            if free < min_free:
                return reason(folder, free=free, min_free=min_free)
            path = folder / PROBE_NAME.format(pid=os.getpid())
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, b"\0" * PROBE_BYTES)
            finally:
                os.close(fd)
                try:
                    os.unlink(path)
                except OSError:
                    pass
        except OSError as exc:
            if is_disk_error(exc):
                return reason(folder, exc)
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# -- pre-allocated files ------------------------------------------------------------------------
def preallocate(path: Path, size: int) -> None:
    """Create ``path`` holding ``size`` spaces, so that later writes within it (pwrite at 0)
    need no new space. Raises OSError (e.g. ENOSPC) when it cannot: then nothing was started."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        pad_fd(fd, size)
    finally:
        os.close(fd)


def pad_fd(fd: int, size: int) -> None:
    """Fill the first ``size`` bytes of an open file with spaces, without moving its offset."""
    data = b" " * size
    done = 0
    while done < size:
        done += os.pwrite(fd, data[done:], done)


def overwrite(path: Path, text: str, size: int) -> None:
    """Write ``text`` over a file made by :func:`preallocate` (padded to ``size`` with spaces,
    so a shorter text leaves nothing of a longer one). Never needs new space on a file system
    that overwrites in place."""
    data = text.encode()[:size].ljust(size)
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


# -- the note of a cut log ------------------------------------------------------------------------
def read_note(path: Path) -> dict:
    """The note a log keeper left (see the module doc), {} when none or unreadable."""
    try:
        text = path.read_bytes()[:NOTE_BYTES].decode("utf-8", errors="replace").strip()
        data = json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def describe_note(note: dict) -> str:
    """The words the job's record gets for a log that is not whole, "" when it is:
    ``log incomplete: disk full (ENOSPC) at 12:03:04 after 3.1 MiB; 1.2 MiB of output lost``
    and/or ``log cut: 40.0 MiB of output cut to keep it under 64.0 MiB``."""
    parts = []
    try:
        lost = int(note.get("lost") or 0)
        if lost or note.get("error"):
            at = time.strftime("%H:%M:%S", time.localtime(float(note.get("at") or 0)))
            what = "disk full" if note.get("error") in ("ENOSPC", "EDQUOT") else (note.get("strerror") or "write failed")
            parts.append(f"log incomplete: {what} ({note.get('error')}) at {at} after "
                         f"{human(int(note.get('log_bytes') or 0))}; {human(lost)} of output lost")
        cut = int(note.get("cap_cut") or 0)
        if cut:
            parts.append(f"log cut: {human(cut)} of output cut to keep it under {human(int(note.get('cap') or 0))}")
        restarts = int(note.get("keeper_restarts") or 0)
        if restarts:
            parts.append(f"log keeper restarted {_times(restarts)} (it died): output in flight then may be missing")
        skipped = int(note.get("cut_skipped") or 0)
        if skipped:
            parts.append(f"log over its cap at times: another process's lock on it held off {_times(skipped)} "
                         "a cut")
        made = int(note.get("log_made_again") or 0)
        if made:
            parts.append(f"log deleted while it ran ({_times(made)}) and made again: the output before is gone")
    except (TypeError, ValueError):
        return "log note unreadable"
    return "; ".join(parts)
