"""The rules of a job request's fields, in one place: the submit path (rig.client) and the
config's templates (rig.config.Template, checked when the settings load) both call these, so
a template is refused when rig starts with the same words a flag is refused with.

Each raises InvalidInput (one line; ``what`` names the flag or the config key).
"""

from __future__ import annotations

from rig.durations import parse_duration
from rig.errors import InvalidInput
from rig.memory import format_memory, parse_memory
from rig.records import MAX_GPU_MEMORY, MAX_GPUS, MAX_RETRIES, MAX_TIME_LIMIT


def check_gpu_memory(nbytes: int, what: str = "--gpu-memory") -> int:
    """``nbytes`` (bytes per card) if some card could hold it: at most MAX_GPU_MEMORY."""
    if nbytes > MAX_GPU_MEMORY:
        raise InvalidInput(f"{what} {format_memory(nbytes)} is more than any card has; "
                           f"give at most {format_memory(MAX_GPU_MEMORY)}")
    return nbytes


def parse_gpu_memory(text: str | int | float, what: str = "--gpu-memory") -> int | None:
    """A declared memory: bytes, or None for ``auto`` (learnt from earlier runs)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return None
    return check_gpu_memory(parse_memory(text, what=what), what)


def parse_time_limit(text: str | int | float | None, what: str = "--time-limit") -> float | None:
    """A time limit in seconds (None for none): from 1 ms to MAX_TIME_LIMIT. An empty text is
    refused as any unreadable duration (`--time-limit "$LIMIT"` with LIMIT unset), never read
    as "no limit" in silence: the rule ``--priority ""`` follows."""
    if text is None:
        return None
    limit = parse_duration(text, what=what)
    if limit > MAX_TIME_LIMIT:
        raise InvalidInput(f"{what} {text!r} is more than ten years; give a shorter one")
    if not limit >= 0.001:  # also NaN
        raise InvalidInput(f"{what} {text!r}: give at least 1ms, e.g. 90s, 30m or 2h")
    return limit


def check_retries(value: object, shown: object = None, what: str = "--retries") -> int:
    """A retry count: a whole number 0..MAX_RETRIES. ``shown`` is what the message quotes (the
    value as the caller gave it; default ``value``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        quoted = value if shown is None else shown
        raise InvalidInput(f"{what} must be a whole number from 0 to {MAX_RETRIES}; got {quoted!r}")
    return value


def check_gpus(value: object, what: str = "--gpus") -> int:
    """A number of cards: a whole number 1..MAX_GPUS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
        raise InvalidInput(f"{what} must be a whole number of cards from 1 to {MAX_GPUS}; got {value!r}")
    return value
