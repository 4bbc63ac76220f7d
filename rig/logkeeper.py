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
loads rig/logs.py, which is standard library only, by path), so it starts in a few ms.
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


def keep(source_fd: int, log_path: Path, cap: int, on_write: Callable[[int], None] | None = None) -> int:
    """Copy ``source_fd`` to the end of ``log_path`` until end of file, keeping the file within
    ``cap`` (+ one read). Returns the bytes of output cut in all. ``on_write(size)`` is called
    after each write with the file's size (tests)."""
    logs: ModuleType | None = None  # loaded at the first cut: most logs never need one
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
                cut += logs.enforce_size_cap(log_path, low_water, keep_head=cap // 4)
                size = os.fstat(out).st_size
            view = memoryview(data)
            while view:
                written = os.write(out, view)
                view = view[written:]
            size += len(data)
            if on_write is not None:
                on_write(os.fstat(out).st_size)
    finally:
        os.close(out)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: logkeeper.py LOG_PATH CAP_BYTES", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    keep(0, Path(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
