"""Argument types the benchmarks under scripts/ share: a bad value is one argparse line and
exit 2 before anything starts, never a traceback mid-run or a run that measures nothing
(``--jobs 0`` divided by zero, ``--time-limits nan`` declared a limit of nan s)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path


def count_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"give a whole number of at least {low} (got {text!r})")
        return value
    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: seconds, more than 0 and finite."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"give a number of seconds above 0 (got {text!r})")
    return value


def time_limit_factor(text: str) -> float:
    """An argparse type: the factor of a job's planned duration it declares as its time limit,
    finite and >= 0 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"give a factor of 0 (no limits) or more, such as 1.5 (got {text!r})")
    return value


def count_list(text: str) -> list[int]:
    """An argparse type: whole numbers of at least 1, comma-separated, at least one."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"give whole numbers of at least 1 separated by commas, "
                                         f"e.g. 1000,10000 (got {text!r})")
    return values


def writable_file(text: str) -> Path:
    """An argparse type: a file the run's figures can be written to at its end (``--json``),
    checked before the run: a folder that does not exist, or one that cannot be written, ended a
    30-minute run in a traceback with no figures written."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name in it")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist; create it or give another path")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written; give a path you may write")
    return path
