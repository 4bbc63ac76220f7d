"""Job log housekeeping: a size cap for a running job's log, and age-based retention.

Job logs live in ``<log_dir>/<job_id>-<instance>/attempt-<n>.log`` (plus ``attempt-<n>.exit``
and ``.pid``), see :func:`job_folder`: the instance is the job's random identity, so a job id
reused after Redis lost its data, or by another key prefix sharing ``log_dir``, never meets
another job's files. rig's own system logs
live elsewhere and are not touched here.

Units: sizes and counts of cut output are bytes; ``now`` and file times are seconds since the
epoch (as ``time.time()`` and ``os.stat().st_mtime``); retention ages in
:class:`RetentionPolicy` are days (a day is 86400 seconds).

Pure standard library (Linux/Unix: uses ``fcntl.flock``), no Redis.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SECONDS_PER_DAY = 86400

#: How far (bytes) a cut point may move to land on a line start.
LINE_SEARCH = 4096

_READ_CHUNK = 1 << 20
_PAGE = 4096  # a half-done write shows up to a multiple of this (pages and folios are)
_SETTLE_ROUNDS = 3  # re-reads of a growing tail before dropping its unfinished last line
_HUGE_COUNT = 10**18  # more bytes than any log will ever have had cut: sizes the worst marker

#: How long a cut waits for a lock another process holds on the log (s): a job that flocks its
#: own log must never stall its card's keeper (every log of the card waits while it cuts).
LOCK_WAIT_S = 0.05
_LOCK_TRIES = 5  # non-blocking tries within LOCK_WAIT_S

# One marker line, without the newline that separates it from a head ending mid-line.
_MARKER_LINE = "[rig: {n} bytes of output were cut here to keep this log under {cap}]\n"
_MARKER_RE = re.compile(
    rb"\[rig: (\d+) bytes of output were cut here to keep this log under [^\]\n]{1,32}\]\n"
)


# --------------------------------------------------------------------------------------------
# Size cap
# --------------------------------------------------------------------------------------------


def human_size(size: int) -> str:
    """``67108864`` -> ``64.0 MiB``; below 1 KiB: ``512 B`` (binary units)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def marker_text(removed: int, cap_bytes: int, *, newline_before: bool) -> bytes:
    """The marker put where output was cut; ``newline_before`` when the head ends mid-line."""
    line = _MARKER_LINE.format(n=removed, cap=human_size(cap_bytes))
    return (("\n" if newline_before else "") + line).encode()


def find_marker(data: bytes) -> tuple[int, int, int] | None:
    """The first cut marker in ``data`` (a log's first bytes): (where it starts, where the kept
    newest output starts, the bytes of output it says were cut), or None. A log is only ever cut
    after its head, so the marker's place does not move from one cut to the next."""
    found = _MARKER_RE.search(data)
    return (found.start(), found.end(), int(found.group(1))) if found else None


class LogLocked(BlockingIOError):
    """Another process held a lock on the log for longer than the cut may wait (a job that
    flocks its own log): the log was not cut this time; the caller tries again later."""


@dataclass(frozen=True)
class _Cut:
    """Where the kept head ends and what an earlier marker there already accounted for."""

    head_len: int  # bytes kept from the start of the file
    old_marker_len: int = 0  # an earlier marker starting at head_len: replaced
    old_removed: int = 0  # bytes that earlier marker said were cut


def enforce_size_cap(path: Path, cap_bytes: int, *, keep_head: int | None = None,
                     stated_cap: int | None = None, lock_wait: float = LOCK_WAIT_S) -> int:
    """Shrink the log at ``path`` in place to at most about ``cap_bytes`` bytes.

    Keeps the first ``keep_head`` bytes (default ``cap_bytes // 4``) and the last bytes, with
    one marker line between them::

        [rig: 123456 bytes of output were cut here to keep this log under 64.0 MiB]

    The marker starts on its own line: it is preceded by a newline only when the kept head does
    not already end with one. Returns the number of bytes of output removed by this call (0
    when the file is within the cap or missing). Cutting again replaces a marker found at the
    head's end with one whose count is the total, so the marker keeps counting everything cut.

    Cut points are moved to line starts: the head ends after the last newline within
    ``LINE_SEARCH`` (4 KiB) before ``keep_head``, and the tail starts after the first newline
    within 4 KiB after its cut; without such a newline the cut is only moved off a UTF-8
    continuation byte, so a multi-byte character is never split. Both moves only shrink what is
    kept, so the result stays within ``cap_bytes`` (plus whatever the job appends meanwhile).

    Safe while the job keeps appending through an O_APPEND descriptor: the tail is read up to
    the end of the file, the file is truncated to the head, and marker plus tail are appended
    with one ``os.write`` on an O_APPEND descriptor. The file never grows a hole (no NUL bytes)
    and the job's later writes land after the tail. A little output can be lost, by design:

    * bytes the job writes between the tail read and the truncate are lost (normally a window
      of microseconds; longer only if this process is descheduled right there);
    * bytes it writes between the truncate and the append land just before the marker;
    * while the job keeps writing, or when the file ends mid-line exactly on a 4 KiB boundary
      (where a half-done write shows), the unfinished last line is dropped rather than kept
      half (see ``_read_settled_tail``); rarely, half a line can still slip through.

    Concurrent callers on the same file are serialised with ``flock``, taken with non-blocking
    tries over at most ``lock_wait`` seconds: a lock held longer (by the job itself, say) raises
    :class:`LogLocked` and nothing is cut; the caller tries again later. The tail (at most
    ``cap_bytes``) is held in memory during the call. ``stated_cap`` is the cap the marker
    names (default ``cap_bytes``): the log keeper cuts below the configured cap, to 3/4 of it.
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes must be positive, got {cap_bytes}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        return 0
    try:
        _lock(fd, path, lock_wait)
        return _cap_open_file(fd, cap_bytes, cap_bytes // 4 if keep_head is None else keep_head,
                              stated_cap or cap_bytes)
    finally:
        os.close(fd)  # also releases the lock


def _lock(fd: int, path: Path, wait: float) -> None:
    """LOCK_EX on ``fd`` within ``wait`` s (a few non-blocking tries), else :class:`LogLocked`."""
    deadline = time.monotonic() + max(wait, 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LogLocked(errno.EWOULDBLOCK, "another process holds a lock on the log", str(path)) from None
            time.sleep(min(left, wait / _LOCK_TRIES))


def _cap_open_file(fd: int, cap: int, keep_head: int, stated: int) -> int:
    size = os.fstat(fd).st_size
    if size <= cap:
        return 0
    # Leave room for a marker even when keep_head asks for (almost) the whole cap.
    max_head = max(cap - len(marker_text(_HUGE_COUNT, stated, newline_before=True)), 0)
    cut = _head_cut(fd, min(max(keep_head, 0), max_head))
    newline_before = cut.head_len > 0 and not _ends_with_newline(fd, cut.head_len)
    # Upper bound on the marker's length: the count can never exceed old count + file size.
    worst_marker = len(marker_text(cut.old_removed + size, stated, newline_before=newline_before))
    tail_budget = max(cap - cut.head_len - worst_marker, 0)
    tail_start = _tail_cut(fd, max(size - tail_budget, cut.head_len + cut.old_marker_len), size)
    tail = _read_settled_tail(fd, tail_start)
    removed = tail_start - cut.head_len - cut.old_marker_len
    marker = marker_text(cut.old_removed + removed, stated, newline_before=newline_before)
    os.ftruncate(fd, cut.head_len)
    _append_all(fd, marker + tail)
    return removed


def _head_cut(fd: int, keep_head: int) -> _Cut:
    """End the head at an earlier marker, else after a newline, else on a UTF-8 boundary."""
    low = max(keep_head - LINE_SEARCH, 0)
    window = os.pread(fd, keep_head - low + 256, low)  # a little past keep_head, for a marker
    marker = _last_marker_starting_before(window, keep_head - low)
    if marker is not None:
        return _Cut(low + marker.start(), len(marker.group()), int(marker.group(1)))
    newline = window.rfind(b"\n", 0, keep_head - low)
    if newline >= 0:
        return _Cut(low + newline + 1)
    return _Cut(_utf8_boundary_back(window, keep_head - low) + low)


def _last_marker_starting_before(window: bytes, limit: int) -> re.Match[bytes] | None:
    """The last marker line in ``window`` that starts at a line start, at or before ``limit``."""
    found = None
    for match in _MARKER_RE.finditer(window):
        if match.start() > limit:
            break
        if match.start() == 0 or window[match.start() - 1 : match.start()] == b"\n":
            found = match
    return found


def _tail_cut(fd: int, start: int, size: int) -> int:
    """Move ``start`` forward to a line start (within 4 KiB) or at least off a UTF-8 middle."""
    if start >= size or start == 0:
        return start
    window = os.pread(fd, LINE_SEARCH + 1, start - 1)  # the byte before start, then 4 KiB
    newline = window.find(b"\n")
    if newline >= 0:
        return start + newline  # the byte after that newline
    return start - 1 + _utf8_boundary_forward(window, 1)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


def _utf8_boundary_back(data: bytes, pos: int) -> int:
    """The nearest position <= ``pos`` that does not split a UTF-8 character (3 bytes at most)."""
    for _ in range(3):
        if pos <= 0 or pos >= len(data) or not _is_continuation(data[pos]):
            break
        pos -= 1
    return pos


def _utf8_boundary_forward(data: bytes, pos: int) -> int:
    """The nearest position >= ``pos`` that does not split a UTF-8 character (3 bytes at most)."""
    for _ in range(3):
        if pos >= len(data) or not _is_continuation(data[pos]):
            break
        pos += 1
    return pos


def _ends_with_newline(fd: int, length: int) -> bool:
    return os.pread(fd, 1, length - 1) == b"\n"


def _read_to_eof(fd: int, offset: int) -> bytes:
    """Everything from ``offset`` to the current end of the file (the job may still append)."""
    chunks = []
    while chunk := os.pread(fd, _READ_CHUNK, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_settled_tail(fd: int, offset: int) -> bytes:
    """The tail up to the end of the file, read again while a write looks unfinished.

    A reader can see a write that crosses a page boundary half done: the file then ends on a
    4 KiB boundary without a newline. The rest of such a write always lands before our
    truncate (the kernel serialises the two), so it would be lost and leave half a line. When
    the file keeps growing or still looks that way after a few re-reads, the unfinished last
    line is dropped instead.
    """
    tail = _read_to_eof(fd, offset)
    for _ in range(_SETTLE_ROUNDS):
        end = offset + len(tail)
        if os.fstat(fd).st_size <= end and not _looks_half_written(tail, end):
            return tail
        os.sched_yield()  # let a writer in the middle of a write finish it
        tail += _read_to_eof(fd, end)
    return tail[: _complete_end(tail)]


def _looks_half_written(tail: bytes, end: int) -> bool:
    return bool(tail) and not tail.endswith(b"\n") and end % _PAGE == 0


def _complete_end(data: bytes) -> int:
    """End of the last whole line within 4 KiB of the end, else of the last whole character."""
    newline = data.rfind(b"\n", max(len(data) - LINE_SEARCH, 0))
    if newline >= 0:
        return newline + 1
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: complete
            return len(data)
        if byte >= 0xC0:  # lead byte of a 2-, 3- or 4-byte character
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= needed else len(data) - back
    return len(data)


def _append_all(fd: int, data: bytes) -> None:
    """One ``os.write`` in practice; loops only if the kernel writes less (huge tails)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# --------------------------------------------------------------------------------------------
# Where a job's files are
# --------------------------------------------------------------------------------------------

_FOLDER_RE = re.compile(r"(?P<id>[0-9]+)(?:-(?P<instance>[0-9a-f]{16}))?")


def job_folder(log_dir: Path, job_id: int, instance: str | None) -> Path:
    """The one folder of one job's files on this node: ``<log_dir>/<id>-<instance>``.

    Only records written before jobs had an instance get ``<log_dir>/<id>``. Nothing about a
    job may be concluded from a folder that is not its own (issue: job ids restart at 1 when
    Redis loses its data)."""
    return log_dir / (f"{job_id}-{instance}" if instance else str(job_id))


def parse_job_folder(name: str) -> tuple[int, str | None] | None:
    """(job id, instance or None) of a folder name made by job_folder, else None."""
    match = _FOLDER_RE.fullmatch(name) if name.isascii() else None
    if match is None:
        return None
    return int(match["id"]), match["instance"]


@dataclass(frozen=True)
class AttemptFiles:
    """The files of one attempt in its job's folder: the log, the exit status the wrapper
    writes, and the pid file the worker writes first (``<pid> <start> <attempt>``)."""

    folder: Path
    attempt: int

    @property
    def log(self) -> Path:
        return self.folder / f"attempt-{self.attempt}.log"

    @property
    def exit(self) -> Path:
        return self.folder / f"attempt-{self.attempt}.exit"

    @property
    def pid(self) -> Path:
        return self.folder / f"attempt-{self.attempt}.pid"

    @property
    def started(self) -> Path:
        """The pid file once the attempt's ending is recorded (renamed, not rewritten): its
        mtime is when the attempt's process started."""
        return self.folder / f"attempt-{self.attempt}.started"

    @property
    def note(self) -> Path:
        """What the log keeper could not write or cut (rig.logspace)."""
        return self.folder / f"attempt-{self.attempt}.note"


# Retention
# --------------------------------------------------------------------------------------------

RUNNING = "running"
ERROR = "error"
UNKNOWN = "unknown"


@dataclass
class RetentionPolicy:
    """How long job log folders are kept after their last write, in days."""

    job_days: float  # finished jobs (and jobs whose record is gone)
    error_days: float  # jobs in the error queue

    def max_age_s(self, status: str | None) -> float:
        """Seconds a folder of a job with this ``protected()`` status may stay."""
        return (self.error_days if status == ERROR else self.job_days) * SECONDS_PER_DAY


@dataclass
class SweepReport:
    """What one sweep did; job ids in the order met (sorted), sizes in bytes."""

    deleted: list[int] = field(default_factory=list)
    kept_running: list[int] = field(default_factory=list)  # old enough, but running/waiting
    kept_error: list[int] = field(default_factory=list)  # old enough, but error retention holds
    bytes_freed: int = 0


@dataclass(frozen=True)
class _Folder:
    path: Path
    job_id: int
    instance: str | None
    newest_mtime: float  # seconds since the epoch
    size: int  # bytes


def sweep_job_logs(
    log_dir: Path,
    policy: RetentionPolicy,
    *,
    now: float,
    protected: Callable[[int, str | None], str | None],
) -> SweepReport:
    """Delete job folders (``job_folder``) whose newest file is older than the policy allows.

    A folder's age is ``now`` minus the newest mtime of any file in it (an empty folder: its
    own mtime). Only folders older than the shorter of the two retention ages are looked up
    with ``protected(job_id, instance)``, which returns:

    * ``None`` or ``"unknown"`` (record missing, or another job's folder): kept for
      ``policy.job_days``;
    * ``"running"`` (running or waiting): never deleted, listed in ``kept_running``;
    * ``"error"`` (in the error queue): kept for ``policy.error_days``, listed in
      ``kept_error`` while that holds it past ``job_days``.

    Any other answer is treated like ``"running"`` (never delete on doubt). Entries whose name
    is not a job folder's, files, and symlinks (even to folders) are skipped; nothing
    outside ``log_dir`` is followed or removed. A folder that vanishes meanwhile is skipped;
    other OS errors propagate.
    """
    report = SweepReport()
    youngest_limit = min(policy.job_days, policy.error_days) * SECONDS_PER_DAY
    for folder in _job_folders(log_dir):
        age = now - folder.newest_mtime
        if age <= youngest_limit:
            continue
        status = protected(folder.job_id, folder.instance)
        if status not in (None, UNKNOWN, ERROR):
            report.kept_running.append(folder.job_id)
        elif age <= policy.max_age_s(status):
            if status == ERROR:
                report.kept_error.append(folder.job_id)
        elif _remove(folder.path):
            report.deleted.append(folder.job_id)
            report.bytes_freed += folder.size
    return report


def _job_folders(log_dir: Path) -> Iterator[_Folder]:
    """Real (not symlinked) job folders (``job_folder``), sorted by id, with age and size."""
    try:
        entries = sorted(
            ((parsed, entry) for entry in os.scandir(log_dir)
             if (parsed := parse_job_folder(entry.name)) is not None),
            key=lambda item: (item[0][0], item[0][1] or ""),
        )
    except FileNotFoundError:
        return
    for (job_id, instance), entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            newest, size = _newest_mtime_and_size(Path(entry.path))
        except FileNotFoundError:
            continue
        yield _Folder(Path(entry.path), job_id, instance, newest, size)


def _newest_mtime_and_size(folder: Path) -> tuple[float, int]:
    """Newest file mtime (seconds) and total file size (bytes) under ``folder``, no symlinks."""
    newest: float | None = None
    size = 0
    for dirpath, _dirs, files in os.walk(folder, followlinks=False, onerror=_raise):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
            size += st.st_size
    if newest is None:
        newest = os.lstat(folder).st_mtime
    return newest, size


def _raise(error: OSError) -> None:
    raise error


def _remove(folder: Path) -> bool:
    """``rmtree`` the folder; False when it (or part of it) vanished meanwhile."""
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return False
    return True


#: rig's own logs (system_log_dir) that are renamed aside past SYSTEM_LOG_MAX_BYTES: those whose
#: writers reopen the file by its name (Celery's -f is a WatchedFileHandler; Redis opens its
#: logfile for each line). Not flower.log (Tornado rotates it itself, at 100 MB).
SYSTEM_LOG_PATTERNS = ("control.log", "card*.log", "beat.log", "redis.log")
#: rig's own logs whose writers hold a descriptor they inherited, never reopening the name:
#: `rig up --daemon`'s up.log and each process' *.out (opened "ab" by rig.cli.main and
#: rig.stack: O_APPEND). Renamed, the writer would go on in NAME.1 and NAME would stay empty; so
#: they are copied aside and cut to 0 in place, where an O_APPEND writer's next line lands at the
#: new end (logrotate's copytruncate). A line written between the copy and the cut is lost.
SYSTEM_LOG_APPENDED = ("up.log", "*.out")
SYSTEM_LOG_MAX_BYTES = 64 * 1024**2
SYSTEM_LOG_KEEP = 2  # older copies kept: control.log.1 (the newer), control.log.2


def rotate_system_logs(folder: Path, *, max_bytes: int = SYSTEM_LOG_MAX_BYTES,
                       keep: int = SYSTEM_LOG_KEEP) -> list[Path]:
    """Move aside each of rig's own logs in ``folder`` that has grown past ``max_bytes``: NAME
    to NAME.1 (renamed, SYSTEM_LOG_PATTERNS; copied and cut to 0, SYSTEM_LOG_APPENDED), NAME.1
    to NAME.2 and so on, dropping the copy beyond ``keep``: the workers' logs grew by ~10 MB a
    day on an idle node, for as long as the node ran. Its writer goes on in NAME at its next
    line. Symlinks and other non-files are left alone. Returns the logs moved aside."""
    rotated: list[Path] = []
    for pattern in SYSTEM_LOG_PATTERNS:
        for path in sorted(folder.glob(pattern)):
            if _past(path, max_bytes):
                _shift_copies(path, keep)
                os.replace(path, path.with_name(f"{path.name}.1"))
                rotated.append(path)
    for pattern in SYSTEM_LOG_APPENDED:
        for path in sorted(folder.glob(pattern)):
            if _past(path, max_bytes) and _copy_and_cut(path, keep, max_bytes):
                rotated.append(path)
    return rotated


def _past(path: Path, max_bytes: int) -> bool:
    """Is ``path`` a regular file (not a symlink) of more than ``max_bytes``?"""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > max_bytes


def _shift_copies(path: Path, keep: int) -> None:
    """NAME.1 to NAME.2 and so on, dropping the copy beyond ``keep``: room for a new NAME.1."""
    for n in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if n == keep:
            older.unlink(missing_ok=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.replace(older, path.with_name(f"{path.name}.{n + 1}"))


def _copy_and_cut(path: Path, keep: int, max_bytes: int) -> bool:
    """Copy ``path`` aside as NAME.1 (with its mode; the older copies shifted), then cut it to 0
    bytes in place (os.replace's part for a log whose writers hold O_APPEND descriptors). The
    file is opened once, without following a symlink (one swapped in since it was checked), and
    cut through that descriptor. The copy is made under a temporary name first: one that fails
    (a full disk) is removed and the older copies stay as they were. False when ``path`` is
    no longer a regular file past ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):  # gone, or a symlink now: left alone
            return False
        raise
    with open(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes:
            return False
        mode = stat.S_IMODE(st.st_mode)
        partial = path.with_name(f".{path.name}.1.partial")
        partial.unlink(missing_ok=True)
        try:
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), "wb") as dst:
                os.fchmod(dst.fileno(), mode)
                shutil.copyfileobj(src, dst)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        _shift_copies(path, keep)
        os.replace(partial, path.with_name(f"{path.name}.1"))
        os.ftruncate(fd, 0)
    return True
