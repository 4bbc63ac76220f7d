"""Durations people type: ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``, ``500ms``, or plain seconds where a
bare number is taken as seconds (``--time-limit``; ``--since`` refuses one: ``unit_required``)."""

from __future__ import annotations

import math
import re

from rig.errors import InvalidInput
from rig.plain_numbers import plain_number

#: "ms" is tried before "m" (a minute): ``5ms`` is 0.005 s, ``1m5s`` is 65 s.
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|[smhd])", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float, *, what: str = "--time-limit", unit_required: bool = False) -> float:
    """Seconds in ``text`` (more than 0); raises InvalidInput (one line naming ``what`` and,
    in the same words each time, the value given, with an example) otherwise. With
    ``unit_required`` a bare number is refused: ``--since 7`` meant 7 days to the person who
    typed it far more often than 7 seconds, and silently reading it as seconds answered "no
    jobs". A number (numpy's too) is seconds."""
    text = plain_number(text)  # type: ignore[assignment]
    number = isinstance(text, int | float) and not isinstance(text, bool)
    raw = str(text).strip().lower()
    if number or re.fullmatch(r"\d+(\.\d+)?", raw):
        if unit_required:
            raise InvalidInput(f"{what} needs a unit: 90s, 30m, 12h, 7d (got {str(text)!r})")
        seconds = float(text)
    else:
        parts = _PART.findall(raw)
        if not parts or _PART.sub("", raw).strip():
            raise InvalidInput(f"{what}: cannot read {text!r}; write it like 90s, 30m, 2h, 7d or 1h30m")
        seconds = sum(float(n) * _UNIT[u.lower()] for n, u in parts)
    if seconds <= 0:
        raise InvalidInput(f"{what} must be more than 0 seconds (got {text!r})")
    if not math.isfinite(seconds):  # 330 digits: float() reads inf (`rig usage --since`: OverflowError)
        raise InvalidInput(f"{what}: {text!r} is too long to be a duration; write it like 90s, 30m, 2h or 7d")
    return seconds


def format_duration(seconds: float | None) -> str:
    """``45s``, ``1m30s``, ``2h00m``, ``1d02h`` (whole seconds, at most two units; "-" for None),
    as every view shows a duration; parse_duration reads it back (a time limit rig suggests)."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"
