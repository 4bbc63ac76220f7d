"""Memory sizes: parse what people type, print what people read.

Internally every size is an integer number of bytes. Units are binary: ``12G`` means
12 GiB (12 * 2**30 bytes), as nvidia-smi's MiB/GiB are.
"""

from __future__ import annotations

import math
import re

from rig.errors import InvalidInput
from rig.plain_numbers import plain_number

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

#: The smallest size rig takes, typed or given as a number: 1 MiB. Below it a size is a slip
#: (``0.0000001G``, or ``4`` meant as GiB), not a card's or a job's memory.
MIN_SIZE = MIB

_UNITS = {
    "k": KIB, "kb": KIB, "kib": KIB,
    "m": MIB, "mb": MIB, "mib": MIB,
    "g": GIB, "gb": GIB, "gib": GIB,
    "t": TIB, "tb": TIB, "tib": TIB,
}
_SIZE = re.compile(r"^\s*(?P<num>[+-]?\d+(?:\.\d+)?|[+-]?\.\d+)\s*(?P<unit>[a-zA-Z]*)\s*$")


def parse_memory(text: str | int | float, *, what: str = "--gpu-memory") -> int:
    """Parse ``12G``, ``512M``, ``1.5GiB``, ``24GB`` into bytes (binary units).

    Raises InvalidInput (one line, with the fix) for a missing or unknown unit, zero or a
    negative size, or a size under MIN_SIZE (1 MiB). A number (numpy's too) is a number of
    bytes.
    """
    text = plain_number(text)  # type: ignore[assignment]
    if isinstance(text, bool):
        raise InvalidInput(f"{what}: expected a size such as 12G, got {text!r}")
    if isinstance(text, int | float):
        if not text > 0:  # also NaN
            raise InvalidInput(f"{what} must be more than 0 bytes, got {text!r}")
        if text == float("inf"):
            raise InvalidInput(f"{what} {text!r} is no number of bytes; give a size such as '12G'")
        if text != int(text) or text < MIN_SIZE:
            # A number is bytes: 4 or 1.5 meant as GiB would declare a few bytes and run.
            raise InvalidInput(f"{what} {text!r} is a number of bytes; give a whole number of at least {MIN_SIZE} "
                               f"(1 MiB), or a size such as '{text:g}G'")
        return int(text)
    match = _SIZE.match(str(text))
    if not match:
        raise InvalidInput(f"{what}: cannot read {text!r} as a size; write it like 12G, 512M or 1.5T")
    number = float(match["num"])
    unit = match["unit"].lower()
    if number <= 0:  # before the unit: "write it like 0G" would be refused in turn
        raise InvalidInput(f"{what} must be more than 0, got {text!r}; write it like 12G or 512M")
    if not unit:
        raise InvalidInput(f"{what}: {text!r} has no unit; write it like {match['num']}G or {match['num']}M")
    if unit not in _UNITS:
        raise InvalidInput(f"{what}: unknown unit {match['unit']!r} in {text!r}; use K, M, G or T (binary: 1G = 1024M)")
    if not math.isfinite(number * _UNITS[unit]):  # 330 digits: float() reads inf (OverflowError below)
        raise InvalidInput(f"{what}: {text!r} is too large to be a size; write it like 12G, 512M or 1.5T")
    value = int(round(number * _UNITS[unit]))
    if value < MIN_SIZE:
        raise InvalidInput(f"{what}: {text!r} is less than 1 MiB, the smallest size rig takes; "
                           f"write it like 12G or 512M")
    return value


def format_memory(size: int | float | None, *, precision: int = 1) -> str:
    """Render bytes for people: ``12.0 GiB``, ``512 MiB``; None renders as ``-``."""
    if size is None:
        return "-"
    size = float(size)
    for unit, factor in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(size) >= factor:
            value = size / factor
            if unit in ("MiB", "KiB"):
                return f"{value:.0f} {unit}"
            return f"{value:.{precision}f} {unit}"
    return f"{size:.0f} B"


def measured(nbytes: int | float | None) -> int | float | None:
    """A measured memory figure (a job's peak or mean, bytes per card), None when nothing was
    measured: None, or 0, what the record keeps while no sample saw memory of the job's
    processes on its card (a job that never touched it, or processes the card's readings do
    not show). The one rule for `rig show`, `rig metrics`, `rig top`, the attempts' records
    (workers.outcomes) and `rig usage`'s GiB-h used (rig.accounting)."""
    return nbytes if nbytes else None


def gib(size: int | float) -> float:
    """Bytes as a float number of GiB."""
    return float(size) / GIB
