"""The log keeper: the one writer of a running job's log, so the log stays within its cap at
any write rate.

A job's stdout and stderr are a pipe; this small process reads it and appends to
``attempt-<n>.log``. Before a write would take the file past ``cap`` bytes it cuts the file in
place (rig.logs.enforce_size_cap: the first ``cap // 4`` bytes stay, then a marker line that
counts what was cut, then the newest output), down to about ``3/4 * cap``, so a cut happens once
per ``cap / 4`` bytes of output. While it cuts it does not read: the job's writes wait on the
pipe (a card's keeper reads none of its card's pipes meanwhile). Disk use of the log is therefore at most ``cap`` + one read (:data:`READ_MAX`, and never
more than ``cap / 4`` for caps above 16 KiB) whatever the job's rate.

It runs in a session of its own, as the card worker's user, so it outlives a worker restart (the
next worker adopts the job; its log goes on) and is not stopped with the job's process tree.
SIGTERM, SIGINT and SIGHUP are ignored: a log ends at end of file, when the last process holding
the job's output has exited, after everything read is written.

A card worker normally hands every job's pipe to one keeper of its own (``logkeeper.py
--serve``, :func:`serve`, :class:`KeeperServer`), which copies all of them from one process; a
job gets a keeper of its own only when that one is unavailable: ``python -I -S logkeeper.py
LOG_PATH CAP_BYTES [OPENING_LINE]`` (no site, no rig package import: it loads rig/logs.py,
which is standard library only, by path). The worker side, which also starts a new keeper when
one dies and hands it the logs again, is workers.card_keeper.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

#: The largest read (bytes).
READ_MAX = 1 << 20
#: The smallest read (bytes), for tiny caps.
READ_MIN = 4096
#: How long after a cut the job's own lock held off the next try waits (s).
CUT_RETRY_S = 2.0
#: How often (at most) a keeper looks whether its log was unlinked under it (s): at the first
#: output after this long since the last look. Output in between goes to the unlinked file.
UNLINK_CHECK_S = 0.2
#: What a keeper writes into a log's "done" pipe once that log is written to its end, before it
#: closes it: end of file without it means the keeper died (its descriptors closed with it).
DONE = b"."
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
         note_path: Path | None = None, opening: str = "") -> int:
    """Copy ``source_fd`` to the end of ``log_path`` until end of file, keeping the file within
    ``cap`` (+ one read). Returns the bytes of output cut in all. ``on_write(size)`` is called
    after each write with the file's size (tests). The rules are :class:`LogCopy`'s; a card's
    keeper (:func:`serve`) applies the same to every log of its card."""
    copy = LogCopy(log_path, cap, on_write=on_write, note_path=note_path, opening=opening)
    try:
        while True:
            try:
                data = os.read(source_fd, copy.chunk)
            except InterruptedError:
                continue
            if not data:
                return copy.cut
            copy.feed(data)
    finally:
        copy.close()


class LogCopy:
    """One log's copy: what a keeper does with each read of a job's output.

    A write that fails (disk full, quota, read-only, I/O error) never stops the copy: the job's
    output is read on (so the job is never blocked or killed by SIGPIPE for it) and counted as
    lost; when writes work again a marker line says how much is missing. Both the loss and the
    cap's cuts are kept in the attempt's note file (``note_path``, default ``attempt-<n>.note``,
    see rig.logspace), which the card worker allocated before the job started, so that the job's
    record can say its log is not whole. Opening the log raises OSError (nothing to copy to).

    ``opening``: a line said in the log as it is opened (a keeper that takes the log over from
    one that died: rig.logkeeper.restart_line); the note file then counts the restart. A cut the
    job's own lock on its log holds off (rig.logs.LogLocked) is skipped, said once in the log,
    and tried again after CUT_RETRY_S. A log unlinked under the keeper (its folder deleted) is
    made again, folder and all, with a line that says so (the note file counts it too), at the
    first output UNLINK_CHECK_S after the last look: what came in between is lost with it."""

    def __init__(self, log_path: Path, cap: int, *, on_write: Callable[[int], None] | None = None,
                 note_path: Path | None = None, opening: str = "") -> None:
        self.log_path = log_path
        self.cap = cap
        self.on_write = on_write
        # A keeper that takes a log over goes on from its note; a new attempt's is blank.
        self.note = _Note(note_path or log_path.with_suffix(".note"), cap, load=bool(opening))
        self.out = os.open(log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)  # read: say()
        self.size = os.fstat(self.out).st_size
        self.low_water = max(1, cap * 3 // 4)
        self.chunk = read_size(cap)
        # Bytes of output cut in all (a keeper that takes a log over goes on from the note's count).
        self.cut = _as_int(self.note.data.get("cap_cut"))
        self._logs: ModuleType | None = None  # loaded at the first cut: most logs never need one
        self._cut_again_at = 0.0  # time.monotonic() before which a cut the job's lock held off waits
        self._check_at = 0.0  # time.monotonic() of the next look whether the log was unlinked
        self._locked_said = False  # the log says the job's lock holds the cut off (once a spell)
        if opening:
            self.note.count("keeper_restarts")
            self.say(opening)

    def feed(self, data: bytes) -> None:
        """Append one read of the job's output, cutting the log first if it would pass the cap."""
        note = self.note
        now = time.monotonic()
        if now >= self._check_at:  # an fstat a read costs as much as the write: a few a second
            self._check_at = now + UNLINK_CHECK_S
            if os.fstat(self.out).st_nlink == 0:
                self._made_again()
        if self.size + len(data) > self.cap and now >= self._cut_again_at:
            self._logs = self._logs or _logs_module()
            try:
                self.cut += self._logs.enforce_size_cap(self.log_path, self.low_water, keep_head=self.cap // 4,
                                                        stated_cap=self.cap)
                self._locked_said = False
            except self._logs.LogLocked:
                # The job (or someone) holds a lock on its log: never wait on it (every log
                # of the card would), go on appending, and try again later.
                self._cut_again_at = time.monotonic() + CUT_RETRY_S
                note.count("cut_skipped")
                if not self._locked_said:
                    self._locked_said = True
                    self.say(f"[rig: this log is over its cap of {self.cap} bytes and was not cut: another "
                             f"process holds a lock on it (flock); trying again every {CUT_RETRY_S:.0f} s]")
            except OSError as exc:
                note.failed(exc, self.size, 0)
            note.cap_cut(self.cut)
            self.size = os.fstat(self.out).st_size
        if note.pending:
            data = note.marker() + data
        written, error = _write_some(self.out, data)
        if written:
            note.line_start = error is None and data.endswith(b"\n")
        if error is not None:
            # What did not reach the file, less the marker (which only repeats a count).
            lost = len(data) - written - (max(0, note.marker_len - written) if note.pending else 0)
            note.failed(error, self.size, lost)
            self.size = os.fstat(self.out).st_size
        else:
            if note.pending:
                note.resumed()
            self.size += len(data)
        if self.on_write is not None:
            self.on_write(os.fstat(self.out).st_size)

    def say(self, line: str) -> None:
        """Append one line of rig's own to the log, on a line of its own. Never raises: a line
        that cannot be written is only a note."""
        try:
            last = os.pread(self.out, 1, self.size - 1) if self.size else b"\n"
            data = (b"" if last == b"\n" else b"\n") + line.encode(errors="replace") + b"\n"
            written, _error = _write_some(self.out, data)
            self.size = os.fstat(self.out).st_size
            if written:
                self.note.line_start = True
        except OSError:
            pass

    def _made_again(self) -> None:
        """The log was unlinked while the job writes (its folder deleted, or the file): make
        the folder and the file again, as the old one was (owner, mode), and go on there with
        a line that says so; the job's output before is gone with the old file. When that
        fails the output goes on into the unlinked file and is counted as lost (the note)."""
        try:
            old = os.fstat(self.out)
            os.makedirs(self.log_path.parent, mode=0o755, exist_ok=True)
            fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self.note.failed(exc, self.size, 0)
            return
        try:
            os.fchmod(fd, old.st_mode & 0o777)
            if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, old.st_uid, old.st_gid)  # a job run as its submitter: theirs again
        except OSError:
            pass  # 0600, the keeper's: nobody else reads it
        os.close(self.out)
        self.out = fd
        self.size = os.fstat(fd).st_size
        self.note.count("log_made_again")
        self.say(f"[rig: this log was deleted (its folder, or the file) at {time.strftime('%H:%M:%S')} while the "
                 "job ran; rig made it again here: the output before this line is gone]")

    def close(self) -> None:
        if self.out >= 0:
            os.close(self.out)
            self.out = -1


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

    def __init__(self, path: Path, cap: int, load: bool = False) -> None:
        self.path = path
        self.data: dict = _read_note(path) if load else {}  # load: the counts so far go on
        self.cap = cap
        self.pending = 0  # bytes lost since the last marker line
        self.marker_len = 0
        self._since = 0.0
        self.line_start = True  # the log ends with a whole line (the marker needs no newline)

    def failed(self, exc: OSError, log_bytes: int, nbytes: int) -> None:
        import errno

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

    def count(self, key: str) -> None:
        """One more of ``key`` (keeper_restarts, cut_skipped, log_made_again)."""
        self.data[key] = _as_int(self.data.get(key)) + 1
        self._save()

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


def _read_note(path: Path) -> dict:
    """The note file's JSON object (rig.logspace.read_note's rules), {} when none."""
    import json

    try:
        with open(path, "rb") as fh:
            text = fh.read(4096).strip()
        data = json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _as_int(value: object) -> int:
    try:
        return max(0, int(value))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def restart_line(dead_pid: int | None) -> str:
    """The line a keeper that takes a log over says in it (one line, no newline)."""
    who = f" (pid {dead_pid})" if dead_pid else ""
    return (f"[rig: the log keeper{who} died at {time.strftime('%H:%M:%S')}; a new one took this log over: "
            "output it had read but not yet written, if any, is missing here]")


def _trace_cpu() -> None:
    """With RIG_TRACE_DIR set (rig.jobtrace, for scripts/profile_job_path.py): one line
    ``- keeper_end <epoch s> <pid> 0 <CPU s>`` with this keeper's own CPU time, as it ends (a
    keeper of one log, or a card's keeper). Never raises: the keeper is ending."""
    folder = os.environ.get("RIG_TRACE_DIR")
    if not folder:
        return
    try:
        cpu = time.process_time()  # this process's own (os.times counts in 10 ms ticks)
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


# -- the card's keeper ------------------------------------------------------------------------
# Each card worker starts one keeper (``serve``) and hands it, over a socketpair, the read end
# of each job's pipe (SCM_RIGHTS). The keeper copies every pipe of its card from this one
# process (a selector over the pipes; each log by :class:`LogCopy`'s rules, the same as a keeper
# of one log), so a job costs neither a fork nor a process of its own (issue 13: ~1.1 ms of the
# server's fork and ~1.65 ms of each forked keeper, a job). It runs in a session of its own,
# independent of the worker: when the worker's end of the socket closes (the worker exited or
# was killed) it takes no new logs and copies the ones it has to their end of file, then exits;
# the next worker starts a keeper of its own for its new jobs.
#
# With each pipe comes the write end of a "done" pipe: DONE is written into it, then it is
# closed, once that log is written to its end (the worker's wait for the last output;
# workers.card_keeper); end of file without DONE means this keeper died. The worker keeps a read
# end of every job's pipe of its own, so a keeper's death (SIGKILL, OOM killer) leaves each job
# writing into a pipe that still has a reader (never SIGPIPE): the worker starts a new keeper at
# once and hands it every pipe again, with an opening line for the log (restart_line). Only what
# the dead keeper had read and not yet written is lost. A worker that adopts a job after
# a restart has no "done" pipe: it waits until the keeper named in the attempt's pid file no
# longer holds the log open (workers.process_tree.holds_file); it takes a read end of the job's
# pipe all the same (/proc/<job>/fd/1), so that keeper's death is survived too.

_REQUEST_MAX = 8192


class _Served:
    """One pipe the card's keeper copies: its log, and the "done" pipe told at its end."""

    def __init__(self, source_fd: int, copy: LogCopy | None, done_fd: int) -> None:
        self.source_fd = source_fd
        self.copy = copy  # None once copying failed in a way LogCopy does not handle: read on, drop
        self.done_fd = done_fd

    def take(self, data: bytes) -> None:
        if self.copy is None:
            return
        try:
            self.copy.feed(data)
        except Exception:  # noqa: BLE001 - one log's trouble never stops the card's other logs
            self._drop()

    def end(self) -> None:
        """End of file: everything read is written; the log is closed, then the worker told."""
        self._drop()
        os.close(self.source_fd)
        if self.done_fd >= 0:
            try:
                os.write(self.done_fd, DONE)  # done, not died (a pipe's first byte never blocks)
            except OSError:
                pass  # the worker that waited is gone
            os.close(self.done_fd)

    def _drop(self) -> None:
        if self.copy is not None:
            try:
                self.copy.close()
            except OSError:
                pass
            self.copy = None


def serve(sock_fd: int) -> int:
    """Run the card's keeper on ``sock_fd`` (a SOCK_SEQPACKET socket): take requests until the
    other end closes, and copy every pipe given until its end of file. Each request:
    ``b"<log path>\0<cap>"`` (or ``b"<log path>\0<cap>\0<opening line>"``: a log taken over
    from a keeper that died, LogCopy's ``opening``) with two file descriptors (the read end of
    the job's pipe, then the write end of its "done" pipe) or one (the pipe alone); each
    answer: ``b"<keeper pid>"``
    (this process) or ``b"ERR <why>"``."""
    import selectors
    import socket

    _ignore_stop_signals()
    sock: socket.socket | None = socket.socket(fileno=sock_fd)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    while sock is not None or len(selector.get_map()):
        for key, _events in selector.select():
            if key.data is None:  # the worker: a request, or its end closed
                assert sock is not None
                if not _take_request(sock, selector):
                    selector.unregister(sock)
                    sock.close()
                    sock = None  # no new logs; the ones taken go on to their end
                continue
            _copy_some(key.data, selector)
    _trace_cpu()
    return 0


def _copy_some(pipe: _Served, selector) -> None:  # noqa: ANN001 - selectors.BaseSelector
    """One read of a ready pipe, written to its log; at its end of file, the log's end. Never
    raises: whatever one log meets, the card's other logs go on (a keeper that stopped would
    leave every job of the card writing into a pipe with no reader: SIGPIPE)."""
    try:
        try:
            data = os.read(pipe.source_fd, pipe.copy.chunk if pipe.copy is not None else READ_MAX)
        except InterruptedError:
            return
        except OSError:
            data = b""  # an unreadable pipe ends like one at its end of file
        if data:
            pipe.take(data)
            return
        selector.unregister(pipe.source_fd)
        pipe.end()
    except Exception:  # noqa: BLE001
        try:
            selector.unregister(pipe.source_fd)
        except (KeyError, ValueError, OSError):
            pass
        try:
            pipe.end()
        except OSError:
            pass


def _take_request(sock, selector) -> bool:  # noqa: ANN001 - socket.socket, selectors.BaseSelector
    """Read one request and start copying its pipe; False when the worker's end closed."""
    import selectors
    import socket

    try:
        data, ancillary, _flags, _addr = sock.recvmsg(_REQUEST_MAX, socket.CMSG_SPACE(8))
    except InterruptedError:
        return True
    except OSError:
        return False
    if not data:
        return False
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    try:
        path_bytes, cap_bytes, *opening = data.split(b"\0")
        log_path, cap = Path(os.fsdecode(path_bytes)), int(cap_bytes)
        if len(fds) not in (1, 2) or cap <= 0 or len(opening) > 1:
            raise ValueError(f"bad request: {len(fds)} descriptor(s), cap {cap}")
        copy = LogCopy(log_path, cap, opening=opening[0].decode(errors="replace") if opening else "")
    except (ValueError, OSError) as exc:
        for fd in fds:
            os.close(fd)
        return _answer(sock, f"ERR {exc}")
    pipe = _Served(fds[0], copy, fds[1] if len(fds) == 2 else -1)
    selector.register(pipe.source_fd, selectors.EVENT_READ, pipe)
    return _answer(sock, str(os.getpid()))


def _answer(sock, text: str) -> bool:  # noqa: ANN001 - socket.socket
    """Answer the worker; False when it is gone (its log, if taken, is copied all the same)."""
    try:
        sock.send(text.encode())
    except OSError:
        return False
    return True


class KeeperServer:
    """The worker's side of its card's keeper: ``start`` hands it one job's log."""

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

    def start(self, read_fd: int, log_path: Path, cap: int, opening: str = "") -> tuple[int, int]:
        """Have the keeper copy ``read_fd`` (which stays the caller's to close) into
        ``log_path``. Returns (the keeper's pid, the read end of the "done" pipe: :data:`DONE`
        then end of file once the log is written to its end, end of file alone if the keeper
        died first; the caller's to close). ``opening``: a line said in the log first (LogCopy).
        Raises OSError when the keeper does not take it (then it never reads ``read_fd``: a
        refusal, or no answer)."""
        import socket

        request = os.fsencode(str(log_path)) + b"\0" + str(cap).encode()
        if opening:
            request += b"\0" + opening.replace("\0", " ").encode(errors="replace")
        done_read, done_write = os.pipe2(os.O_CLOEXEC)
        try:
            fds = read_fd.to_bytes(4, sys.byteorder) + done_write.to_bytes(4, sys.byteorder)
            with self._lock:
                self.sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                answer = self.sock.recv(256)
        except BaseException:
            os.close(done_read)
            raise
        finally:
            os.close(done_write)
        if not answer or answer.startswith(b"ERR"):
            os.close(done_read)
            raise OSError(f"the log keeper refused: {answer.decode(errors='replace') or 'it exited'}")
        return int(answer), done_read

    def close(self, wait: float = 0.0) -> None:
        """Close the worker's end: the keeper takes no new logs and exits once those it copies
        have ended; waits up to ``wait`` s for that (a worker with no running job: at once)."""
        self.sock.close()
        try:
            self.proc.wait(wait)
        except Exception:  # noqa: BLE001 - it exits by itself; never block the worker's exit
            pass


def main(argv: list[str]) -> int:
    if argv[1:] == ["--serve"]:
        return serve(0)
    if len(argv) not in (3, 4):
        print("usage: logkeeper.py LOG_PATH CAP_BYTES [OPENING_LINE] | logkeeper.py --serve", file=sys.stderr)
        return 2
    _ignore_stop_signals()
    try:
        keep(0, Path(argv[1]), int(argv[2]), opening=argv[3] if len(argv) == 4 else "")
    finally:
        _trace_cpu()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
