"""Durations people type: ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``, or plain seconds."""

from __future__ import annotations

import re

from rig.errors import InvalidInput

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float, *, what: str = "--time-limit") -> float:
    """Seconds in ``text``; raises InvalidInput (one line, with an example) otherwise."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        raw = str(text).strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", raw):
            seconds = float(raw)
        else:
            parts = _PART.findall(raw)
            if not parts or _PART.sub("", raw).strip():
                raise InvalidInput(f"{what}: cannot read {text!r}; write it like 90s, 30m, 2h, 7d or 1h30m")
            seconds = sum(float(n) * _UNIT[u.lower()] for n, u in parts)
    if seconds <= 0:
        raise InvalidInput(f"{what} must be more than 0 seconds, got {text!r}")
    return seconds
