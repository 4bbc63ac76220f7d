"""The rules of a job request's fields, in one place: the submit path (rig.client) and the
config's templates (rig.config.Template, checked when the settings load) both call these, so
a template is refused when rig starts with the same words a flag is refused with.

Each raises InvalidInput (one line; ``what`` names the flag or the config key).
"""

from __future__ import annotations

import os
from pathlib import Path

from rig.durations import parse_duration
from rig.errors import InvalidInput
from rig.memory import format_memory, parse_memory
from rig.plain_numbers import plain_number
from rig.records import MAX_GPU_MEMORY, MAX_GPUS, MAX_RETRIES, MAX_TIME_LIMIT
from rig.words import typed_word


def check_gpu_memory(nbytes: int, what: str = "--gpu-memory") -> int:
    """``nbytes`` (bytes per card) if some card could hold it: at most MAX_GPU_MEMORY."""
    if nbytes > MAX_GPU_MEMORY:
        raise InvalidInput(f"{what} {format_memory(nbytes)} is more than any card has; "
                           f"give at most {format_memory(MAX_GPU_MEMORY)}")
    return nbytes


def parse_gpu_memory(text: str | int | float, what: str = "--gpu-memory") -> int | None:
    """A declared memory: bytes, or None for ``auto`` (learnt from earlier runs)."""
    if isinstance(text, str) and typed_word(text) == "auto":
        return None
    return check_gpu_memory(parse_memory(text, what=what), what)


#: The time limit that says "no limit" (``--time-limit none``): a template's limit can be
#: lifted for one job, as every other field of a template can be overridden by its flag.
NO_LIMIT = "none"


def parse_time_limit(text: str | int | float | None, what: str = "--time-limit") -> float | None:
    """A time limit in seconds (None for none, or for NO_LIMIT's word): from 1 ms to
    MAX_TIME_LIMIT. An empty text is refused (``--time-limit "$LIMIT"`` with LIMIT unset ran
    the job without any limit, a template's included, in silence)."""
    if text is None:
        return None
    if isinstance(text, str) and not text.strip():
        # Not "leave it out for no limit": left out, a template's limit applies.
        raise InvalidInput(f"{what} is empty (an unset variable?): give a duration like 90s, 30m or 2h, "
                           f"or {NO_LIMIT} for no limit")
    if isinstance(text, str) and typed_word(text) == NO_LIMIT:
        return None
    limit = parse_duration(text, what=what)
    if limit > MAX_TIME_LIMIT:
        raise InvalidInput(f"{what} {text!r} is more than ten years; give a shorter one")
    if not limit >= 0.001:  # also NaN
        raise InvalidInput(f"{what} {text!r}: give at least 1ms, e.g. 90s, 30m or 2h")
    return limit


def resolve_workdir(workdir: object, command_workdir: object) -> Path:
    """A job's working folder, resolved: ``--workdir`` (``workdir=``), else the setting
    ``command_workdir``, else the submitter's current folder. An empty ``--workdir`` is refused
    (``--workdir "$DIR"`` with DIR unset ran the job in another folder in silence), and so is a
    current folder that was deleted; each refusal names where the folder came from."""
    if workdir is not None:
        what, chosen = "--workdir", os.fspath(workdir) if isinstance(workdir, os.PathLike) else str(workdir)
        if not chosen.strip():
            raise InvalidInput("--workdir is empty (an unset variable?): give a folder, or leave --workdir out "
                               "for command_workdir, else the current folder")
    elif command_workdir:
        what, chosen = "command_workdir", str(command_workdir)
    else:
        what = "the current folder"
        try:
            chosen = os.getcwd()
        except FileNotFoundError:
            raise InvalidInput("the current folder no longer exists (deleted?): cd to a folder that exists, "
                               "or give --workdir") from None
    fix = "change command_workdir (`rig config` says where it is set)" if what == "command_workdir" else "pick another"
    try:
        path = Path(chosen).expanduser().resolve()
        ok = path.is_dir()
    except OSError as exc:  # a relative --workdir from a deleted folder, a loop, no permission
        raise InvalidInput(f"{what} {chosen}: {exc.strerror or exc}; {fix}") from None
    if not ok:
        raise InvalidInput(f"{what} {chosen} is not a directory (or not yours to see); create it or {fix}")
    return path


def check_retries(value: object, shown: object = None, what: str = "--retries") -> int:
    """A retry count: a whole number 0..MAX_RETRIES. ``shown`` is what the message quotes (the
    value as the caller gave it; default ``value``); numpy's integers count as whole numbers."""
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        quoted = value if shown is None else shown
        raise InvalidInput(f"{what} must be a whole number from 0 to {MAX_RETRIES}; got {quoted!r}")
    return value


def check_flag(value: object, what: str) -> bool | None:
    """A yes/no option from Python (``oom_retry_grow``, ``shell``): True, False or None (the
    default), as a bool. ``"no"`` or ``0`` is refused, not taken for its truth value; numpy's
    bool (``np.True_``, what ``arr.any()`` gives) is a bool and is taken as one."""
    if value is None or isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"):
        return bool(value)
    raise InvalidInput(f"{what} must be True or False; got {value!r}")


def check_gpus(value: object, what: str = "--gpus") -> int:
    """A number of cards: a whole number 1..MAX_GPUS (numpy's integers too)."""
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
        raise InvalidInput(f"{what} must be a whole number of cards from 1 to {MAX_GPUS}; got {value!r}")
    return value


def check_text_options(options: dict[str, object]) -> None:
    """The options that are words (``--name``, ``--template``, ``--pool``; ``--workdir`` also a
    path object): None, or text (a name not empty: refused as an unset variable). Another type (``template=["test"]``, ``name=3``) is one line,
    not the TypeError or AttributeError it met further on (unhashable, no ``.strip``). Keyed by
    the CLI's option, as every rule here (rig.argnames names the keyword to a Python caller)."""
    for option, value in options.items():
        if option == "--name" and isinstance(value, str) and not value.strip():
            # `--name "$RUN"` with RUN unset named the job after its command in silence, and
            # `--gpu-memory auto` then sized it by that name's runs.
            raise InvalidInput("--name is empty (an unset variable?): give a name, or leave --name out to "
                               "name the job after its command")
        if value is None or isinstance(value, str) or (option == "--workdir" and isinstance(value, os.PathLike)):
            continue
        kind = "a folder (text or a path object)" if option == "--workdir" else "text"
        raise InvalidInput(f"{option} must be {kind}; got {type(value).__name__} {value!r:.60}")


#: The largest ``--limit``: more than Redis could list; 20 digits were a Redis error's traceback.
MAX_LIMIT = 10**9


def check_limit(limit: object, what: str = "jobs") -> int:
    """``--limit N`` (``limit=`` of Client.jobs): a whole number from 1 to MAX_LIMIT (-1 or 0
    once meant "every job", silently; from Python ``"5"`` or ``None`` was a TypeError)."""
    limit = plain_number(limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"--limit must be 1 or more, at most {MAX_LIMIT:,} (how many {what} to list), "
                           f"got {limit!r}")
    return limit
