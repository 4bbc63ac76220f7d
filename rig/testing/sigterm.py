"""SIGTERM as SystemExit, for the benchmarks under scripts/: stopped by `timeout` or `kill`,
Python's default for SIGTERM ends the process at once, so no ``finally`` runs and a run left
its private redis-server running, its keys in a shared Redis and its temporary folders behind
(issue 15). With :func:`exit_on_sigterm` installed, SIGTERM raises SystemExit in the main
thread and the clean-up runs."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

#: The exit status of a process ended by SIGTERM (128 + 15), as a shell reports it.
SIGTERM_STATUS = 128 + signal.SIGTERM


def exit_on_sigterm() -> None:
    """From now on the first SIGTERM raises SystemExit(SIGTERM_STATUS) in the main thread
    (where the script's ``finally`` blocks are); later ones are ignored, so a second SIGTERM
    cannot cut the clean-up short (SIGKILL still ends the process). Call it from the main
    thread, first thing in main()."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("exit_on_sigterm: signal handlers can only be installed from the main thread")

    def handler(_signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stopped by SIGTERM: cleaning up", file=sys.stderr, flush=True)
        raise SystemExit(SIGTERM_STATUS)

    signal.signal(signal.SIGTERM, handler)
