"""The console scripts ``rig`` and ``rig-submit``: Ctrl-C while rig is still being imported
(a second or more on a busy machine) ends the command quietly with exit status 130, as it does
once the command runs, instead of a Python traceback. This module imports nothing of rig's
before the handler is in place (rig's package imports its names lazily)."""

from __future__ import annotations

import os
import signal
import sys

#: Exit status of a command interrupted by Ctrl-C (128 + SIGINT), as the shell reports it.
INTERRUPTED_EXIT = 130


def _interrupted(_signum: int, _frame: object) -> None:
    sys.stderr.write("\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED_EXIT)


def _working_folder_last() -> None:
    """Move to the end of sys.path the entries PYTHONPATH gave relative to the working folder
    (Python made them absolute): ``export PYTHONPATH=$PYTHONPATH:/x`` with PYTHONPATH unset
    gives ``:/x``, whose empty entry is the working folder, ahead of site-packages. A
    ``redis.py``, ``celery.py`` or ``click/`` where the operator stood then replaced rig's own
    packages, and rig failed with that file's error. Moved, not dropped: the same folder may
    also be rig's own (an editable install's .pth entry is not added twice)."""
    given = os.environ.get("PYTHONPATH", "")
    if not given:  # nothing to move: never ask for the working folder, which may be deleted
        return
    try:
        relative = {os.path.abspath(entry) for entry in given.split(os.pathsep) if not os.path.isabs(entry)}
    except FileNotFoundError:  # the working folder was deleted: Python dropped its entries
        return
    if relative:
        sys.path[:] = [e for e in sys.path if e not in relative] + [e for e in sys.path if e in relative]


def _quietly_imported(module: str):  # noqa: ANN202 - the module's main
    _working_folder_last()
    previous = signal.signal(signal.SIGINT, _interrupted)
    try:
        return __import__(module, fromlist=["main"]).main
    finally:
        signal.signal(signal.SIGINT, previous)


def rig() -> None:
    _quietly_imported("rig.cli.main")()


def rig_submit() -> None:
    _quietly_imported("rig.cli.submit")()
