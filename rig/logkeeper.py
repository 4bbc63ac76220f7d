"""The log keeper: the one writer of a running job's log, so the log stays within its cap at
any write rate.

A job's stdout and stderr are a pipe; this small process reads it and appends to
``attempt-<n>.log``. Before a write would take the file past ``cap`` bytes it cuts the file in
place (rig.logs.enforce_size_cap: the first ``cap // 4`` bytes stay, then a marker line that
counts what was cut, then the newest output), down to about ``3/4 * cap``, so a cut happens once
per ``cap / 4`` bytes of output. While it cuts it does not read: the job's writes wait on the
pipe. Disk use of the log is therefore at most ``cap`` + one read (:data:`READ_MAX`, and never
more than ``cap / 4`` for caps above 16 KiB) whatever the job's rate.

It is started by the card worker in a session of its own, as the worker's user, so it outlives
a worker restart (the next worker adopts the job; the keeper carries on) and is not stopped
with the job's process tree. SIGTERM, SIGINT and SIGHUP are ignored: it ends at end of file,
when the last process holding the job's output has exited, after writing everything it read.

Run as ``python -I -S logkeeper.py LOG_PATH CAP_BYTES``: no site, no rig package import (it
loads rig/logs.py, which is standard library only, by path). A card worker normally gets its
keepers from a fork server of its own (``logkeeper.py --serve``, :class:`KeeperServer`), which
forks one per job in about a millisecond instead of starting an interpreter (~25 ms of CPU).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

#: The largest read (bytes).
READ_MAX = 1 << 20
#: The smallest read (bytes), for tiny caps.
READ_MIN = 4096
#: Environment variable set on the keeper (value: the log path), so rig's process scans know it
#: for what it is: not a job process, not a rig worker.
MARK = "RIG_LOG_KEEPER"


def _logs_module() -> ModuleType:
    """rig/logs.py, loaded by path (it imports only the standard library)."""
    path = Path(__file__).with_name("logs.py")
    spec = importlib.util.spec_from_file_location("rig_logkeeper_logs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def read_size(cap: int) -> int:
    """How much one read takes (bytes): a quarter of the cap, within [READ_MIN, READ_MAX]."""
    return max(READ_MIN, min(READ_MAX, cap // 4))


def keep(source_fd: int, log_path: Path, cap: int, on_write: Callable[[int], None] | None = None,
         note_path: Path | None = None) -> int:
    """Copy ``source_fd`` to the end of ``log_path`` until end of file, keeping the file within
    ``cap`` (+ one read). Returns the bytes of output cut in all. ``on_write(size)`` is called
    after each write with the file's size (tests).

    A write that fails (disk full, quota, read-only, I/O error) never stops the copy: the job's
    output is read on (so the job is never blocked or killed by SIGPIPE for it) and counted as
    lost; when writes work again a marker line says how much is missing. Both the loss and the
    cap's cuts are kept in the attempt's note file (``note_path``, default ``attempt-<n>.note``,
    see rig.logspace), which the card worker allocated before the job started, so that the job's
    record can say its log is not whole."""
    logs: ModuleType | None = None  # loaded at the first cut: most logs never need one
    note = _Note(note_path or log_path.with_suffix(".note"), cap)
    out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    size = os.fstat(out).st_size
    low_water = max(1, cap * 3 // 4)
    chunk = read_size(cap)
    cut = 0
    try:
        while True:
            try:
                data = os.read(source_fd, chunk)
            except InterruptedError:
                continue
            if not data:
                return cut
            if size + len(data) > cap:
                logs = logs or _logs_module()
                try:
                    cut += logs.enforce_size_cap(log_path, low_water, keep_head=cap // 4, stated_cap=cap)
                except OSError as exc:
                    note.failed(exc, size, 0)
                note.cap_cut(cut)
                size = os.fstat(out).st_size
            if note.pending:
                data = note.marker() + data
            written, error = _write_some(out, data)
            if written:
                note.line_start = error is None and data.endswith(b"\n")
            if error is not None:
                # What did not reach the file, less the marker (which only repeats a count).
                lost = len(data) - written - (max(0, note.marker_len - written) if note.pending else 0)
                note.failed(error, size, lost)
                size = os.fstat(out).st_size
            else:
                if note.pending:
                    note.resumed()
                size += len(data)
            if on_write is not None:
                on_write(os.fstat(out).st_size)
    finally:
        os.close(out)


def _write_some(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Append ``data``: (bytes written, None), or (bytes written, the OSError that stopped it)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError as exc:
            return len(data) - len(view), exc
    return len(data), None


class _Note:
    """What the log lacks: bytes lost to failed writes and cut by the cap, kept in the attempt's
    note file (rig.logspace; overwritten in place, never grown past what the worker allocated
    as long as it stays under NOTE_BYTES)."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.data: dict = {}
        self.cap = cap
        self.pending = 0  # bytes lost since the last marker line
        self.marker_len = 0
        self._since = 0.0
        self.line_start = True  # the log ends with a whole line (the marker needs no newline)

    def failed(self, exc: OSError, log_bytes: int, nbytes: int) -> None:
        import errno
        import time

        if "error" not in self.data:
            self.data.update(error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                             strerror=(exc.strerror or str(exc))[:100], at=round(time.time(), 3),
                             log_bytes=log_bytes)
        if not self.pending:
            self._since = time.time()
        self.data["lost"] = self.data.get("lost", 0) + nbytes
        self.pending += nbytes
        self._save()

    def marker(self) -> bytes:
        import time

        since = time.strftime("%H:%M:%S", time.localtime(self._since))
        text = ("" if self.line_start else "\n") + (
            f"[rig: {self.pending} bytes of output were lost here: could not write the log "
            f"({self.data.get('strerror')}) from {since}]\n")
        data = text.encode()
        self.marker_len = len(data)
        return data

    def resumed(self) -> None:
        self.pending = 0
        self.marker_len = 0

    def cap_cut(self, total: int) -> None:
        if total and total != self.data.get("cap_cut"):
            self.data.update(cap_cut=total, cap=self.cap)
            self._save()

    def _save(self) -> None:
        import json

        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            os.pwrite(fd, json.dumps(self.data, separators=(",", ":")).encode() + b"\n", 0)
        except OSError:
            pass  # no room even for the note: the worker's guard still sees the disk full
        finally:
            os.close(fd)


def _trace_cpu() -> None:
    """With RIG_TRACE_DIR set (rig.jobtrace, for scripts/profile_job_path.py): one line
    ``- keeper_end <epoch s> <pid> 0 <CPU s>`` with this keeper's own CPU time since its fork.
    Keepers are reaped by the kernel (the server ignores SIGCHLD), so no process's children's
    time holds theirs. Never raises: the keeper is ending."""
    folder = os.environ.get("RIG_TRACE_DIR")
    if not folder:
        return
    import time

    try:
        cpu = time.process_time()  # this process's own, since its fork (os.times counts in 10 ms ticks)
        fd = os.open(os.path.join(folder, f"{os.getpid()}.trace"), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
        try:
            os.write(fd, f"- keeper_end {time.time():.6f} {os.getpid()} 0 {cpu:.6f}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


# -- the fork server ------------------------------------------------------------------------
# Starting a Python interpreter per job costs ~25 ms of CPU; forking this small one costs ~1 ms.
# Each card worker starts one server (``serve``) and asks it, over a socketpair, for a keeper per
# job: the pipe's read end travels as SCM_RIGHTS. A keeper is a forked child in a session of its
# own, independent of the server and of the worker; the server ends when its worker's end of
# the socket closes (the worker exited), and never takes a keeper with it.

_REQUEST_MAX = 8192


def serve(sock_fd: int) -> int:
    """Run the fork server on ``sock_fd`` (a SOCK_SEQPACKET socket) until the other end closes.
    Each request: ``b"<log path>\0<cap>"`` with one file descriptor (the read end of the job's
    pipe); each answer: ``b"<keeper pid>"`` or ``b"ERR <why>"``."""
    import socket

    _ignore_stop_signals()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            data, ancillary, _flags, _addr = sock.recvmsg(_REQUEST_MAX, socket.CMSG_SPACE(4))
        except InterruptedError:
            continue
        if not data:
            return 0
        fds = [int.from_bytes(d[:4], sys.byteorder) for level, kind, d in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS]
        try:
            path_bytes, cap_bytes = data.split(b"\0")
            log_path, cap = Path(os.fsdecode(path_bytes)), int(cap_bytes)
            if len(fds) != 1 or cap <= 0:
                raise ValueError(f"bad request: {len(fds)} descriptor(s), cap {cap}")
            pid = os.fork()
        except (ValueError, OSError) as exc:
            for fd in fds:
                os.close(fd)
            sock.send(f"ERR {exc}".encode())
            continue
        if pid == 0:  # the keeper
            code = 1
            try:
                sock.close()
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                keep(fds[0], log_path, cap)
                code = 0
            finally:
                _trace_cpu()
                os._exit(code)
        os.close(fds[0])
        sock.send(str(pid).encode())


class KeeperServer:
    """The worker's side of the fork server: ``start`` asks it for a keeper of one log."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        import socket
        import subprocess
        import threading

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([python, "-I", "-S", __file__, "--serve"], stdin=theirs.fileno(),
                                         stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                         env=env)
        finally:
            theirs.close()
        self.sock = ours
        self.sock.settimeout(10.0)
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, read_fd: int, log_path: Path, cap: int) -> int:
        """A keeper reading ``read_fd`` (which stays the caller's to close) into ``log_path``;
        returns its pid. Raises OSError when the server cannot give one."""
        import socket

        request = os.fsencode(str(log_path)) + b"\0" + str(cap).encode()
        with self._lock:
            self.sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, read_fd.to_bytes(4, sys.byteorder))])
            answer = self.sock.recv(256)
        if not answer or answer.startswith(b"ERR"):
            raise OSError(f"the log keeper server refused: {answer.decode(errors='replace') or 'it exited'}")
        return int(answer)

    def close(self) -> None:
        self.sock.close()  # the server sees end of file and exits; its keepers run on
        try:
            self.proc.wait(5)
        except Exception:  # noqa: BLE001 - it exits by itself; never block the worker's exit
            pass


def main(argv: list[str]) -> int:
    if argv[1:] == ["--serve"]:
        return serve(0)
    if len(argv) != 3:
        print("usage: logkeeper.py LOG_PATH CAP_BYTES | logkeeper.py --serve", file=sys.stderr)
        return 2
    _ignore_stop_signals()
    keep(0, Path(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
