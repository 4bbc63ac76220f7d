"""Output a long-running command can lose without dying (``rig up | head``, a closed terminal).

``rig up`` runs for days; its stdout and stderr are only for a person. When the reader goes
away (EPIPE) or the terminal does (EIO), the stream is pointed at /dev/null and rig goes on:
losing a line must never stop a node, nor skip marking it stopped when it is stopped.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

import click


def drop(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null, so later writes (and the interpreter's flush
    at exit) succeed silently."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real descriptor (a test's captured stream)
        pass


def say(line: str, *, err: bool = True) -> None:
    """``click.echo`` that never raises: a lost stream is dropped (:func:`drop`)."""
    stream = sys.stderr if err else sys.stdout
    try:
        click.echo(line, err=err)
        stream.flush()
    except (OSError, ValueError):
        drop(stream)
