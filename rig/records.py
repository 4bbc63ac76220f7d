"""Checks for every value rig reads back from Redis (and writes there at submit).

Redis is shared: a record may have been damaged by hand, written by an older or newer rig, or
written by someone hostile. Nothing read from it is used before it has passed one of these
checks, so a bad record becomes one clear problem on that record ("field gpus: expected a whole
number from 1 to 256, got 'x'"), never a crashed worker or a command run with other arguments.
``rig.client`` applies the same checks at submit, so a job it accepts always reads back valid.

Each check takes the text stored in Redis (or an already decoded JSON value) and returns the
typed value, or raises :class:`BadField` whose message completes "field NAME: ...".

Limits are in bytes, characters, seconds (durations) or epoch seconds (timestamps), as named.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Job ids and other counters: positive, below 2**53 (exact in JSON and in Lua's doubles).
MAX_ID = 2**53
#: Declared GPU memory per card (bytes): 16 TiB, far above any card made, far below overflow.
MAX_GPU_MEMORY = 16 * 2**40
#: Cards one job may ask for (all on one node).
MAX_GPUS = 256
#: Card indexes on a node.
MAX_CARD_INDEX = 1023
#: Retries a job may be given.
MAX_RETRIES = 100
#: A job's time limit (s): ten years.
MAX_TIME_LIMIT = 10 * 366 * 86400.0
#: Timestamps (epoch seconds): up to the year 5000.
MAX_TIMESTAMP = 95_617_584_000.0
#: Job names (characters, printable).
MAX_NAME_CHARS = 128
#: Login names (characters).
MAX_USER_CHARS = 64
#: Paths (bytes, UTF-8), as PATH_MAX.
MAX_PATH_BYTES = 4096
#: argv: elements, bytes per element (Linux MAX_ARG_STRLEN is 128 KiB), bytes in all.
MAX_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024 - 1
MAX_COMMAND_BYTES = 1024 * 1024
#: Environment: variables, bytes in all (names and values).
MAX_ENV_VARS = 1024
MAX_ENV_BYTES = 1024 * 1024
#: Any other text field (reasons, wait reasons, evidence lines), characters.
MAX_TEXT_CHARS = 64 * 1024
#: A JSON-encoded field is not parsed at all beyond this many characters.
MAX_JSON_CHARS = 16 * 1024 * 1024
#: Process ids (Linux pid_max is at most 2**22).
MAX_PID = 2**22
#: uids and gids (2**32 - 1 is (uid_t)-1, "no user").
MAX_UID = 2**32 - 2

#: Login names: no whitespace, no '/', ':' (passwd's separator) or control characters.
_USER_RE = re.compile(r"[^\s/:\x00-\x1f\x7f]+")
#: Environment variable names as the shell accepts them.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BadField(ValueError):
    """One field's problem; ``str()`` completes "field NAME: ..."."""


def show(value: Any, limit: int = 60) -> str:
    """A bad value for a message: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` made safe to print: control characters as '?', cut to ``limit`` characters."""
    cleaned = "".join(ch if ch.isprintable() and not _is_surrogate(ch) else "?" for ch in text[:limit])
    return cleaned + ("..." if len(text) > limit else "")


def _is_surrogate(ch: str) -> bool:
    # Bytes that are not UTF-8 arrive as lone surrogates (surrogateescape).
    return "\ud800" <= ch <= "\udfff"


def _utf8_len(text: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise BadField(f"not valid UTF-8: {show(text)}") from None


# -- scalars ----------------------------------------------------------------------------------
def as_int(text: Any, low: int, high: int, what: str = "a whole number") -> int:
    """A base-10 integer in [low, high]. ``12.0`` is accepted (older records wrote floats)."""
    value = _number(text)
    if value is None or value != int(value) or not low <= value <= high:
        raise BadField(f"expected {what} from {low} to {high}, got {show(text)}")
    return int(value)


def as_float(text: Any, low: float, high: float, what: str = "a number") -> float:
    """A finite number in [low, high]."""
    value = _number(text)
    if value is None or not low <= value <= high:
        raise BadField(f"expected {what} from {low:g} to {high:g}, got {show(text)}")
    return float(value)


def _number(text: Any) -> float | int | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        return text if math.isfinite(text) else None
    if not isinstance(text, str) or len(text) > 40:
        return None
    raw = text.strip()
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def as_bool(text: Any) -> bool:
    """'1' or '0', as rig writes flags."""
    if text in ("1", "0"):
        return text == "1"
    raise BadField(f"expected 1 or 0, got {show(text)}")


def as_text(text: Any, limit: int = MAX_TEXT_CHARS, *, empty: bool = True) -> str:
    """A string of at most ``limit`` characters, valid UTF-8, without NUL."""
    if not isinstance(text, str):
        raise BadField(f"expected text, got {show(text)}")
    if not empty and not text.strip():
        raise BadField("must not be empty")
    if len(text) > limit:
        raise BadField(f"longer than {limit} characters ({len(text)})")
    if "\x00" in text:
        raise BadField(f"contains a NUL character: {show(text)}")
    _utf8_len(text)
    return text


def as_name(text: Any) -> str:
    """A job name: 1 to MAX_NAME_CHARS printable characters."""
    value = as_text(text, MAX_NAME_CHARS, empty=False)
    if not value.isprintable():
        raise BadField(f"expected printable text (no control characters), got {show(text)}")
    return value


def as_word(text: Any, limit: int = 255) -> str:
    """One printable word (node names, worker names): no whitespace or control characters."""
    value = as_text(text, limit, empty=False)
    if not value.isprintable() or any(ch.isspace() for ch in value):
        raise BadField(f"expected one printable word, got {show(text)}")
    return value


def as_user(text: Any) -> str:
    """A login name: 1 to MAX_USER_CHARS characters, no whitespace, '/', ':' or control characters."""
    value = as_text(text, MAX_USER_CHARS, empty=False)
    if not _USER_RE.fullmatch(value) or not value.isprintable():
        raise BadField(f"expected a login name, got {show(text)}")
    return value


def as_abs_path(text: Any) -> str:
    """An absolute path of at most MAX_PATH_BYTES bytes, without NUL."""
    value = as_text(text, MAX_PATH_BYTES)
    if not value.startswith("/"):
        raise BadField(f"expected an absolute path, got {show(text)}")
    if _utf8_len(value) > MAX_PATH_BYTES:
        raise BadField(f"longer than {MAX_PATH_BYTES} bytes")
    return value


# -- JSON fields --------------------------------------------------------------------------
def from_json(text: Any, limit: int = MAX_JSON_CHARS) -> Any:
    """Decode a JSON-encoded field (at most ``limit`` characters); nesting bombs are refused."""
    if not isinstance(text, str):
        return text  # already decoded (a value built in Python, e.g. at submit)
    if len(text) > limit:
        raise BadField(f"longer than {limit} characters ({len(text)})")
    try:
        return json.loads(text)
    except RecursionError:
        raise BadField("nested too deeply") from None
    except ValueError as exc:
        raise BadField(f"expected JSON, got {show(text)} ({exc.args[0] if exc.args else exc})") from None


def as_argv(value: Any) -> list[str]:
    """A command as a JSON list of strings: 1..MAX_ARGS elements, the first not empty, none
    containing NUL, each at most MAX_ARG_BYTES and all together at most MAX_COMMAND_BYTES."""
    value = from_json(value, 4 * MAX_COMMAND_BYTES)
    if not isinstance(value, list) or not value:
        raise BadField(f"expected a non-empty JSON list of strings, got {show(value)}")
    if len(value) > MAX_ARGS:
        raise BadField(f"more than {MAX_ARGS} arguments ({len(value)})")
    total = 0
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            raise BadField(f"argument {i}: expected a string, got {show(arg)}")
        if "\x00" in arg:
            raise BadField(f"argument {i} contains a NUL character: {show(arg)}")
        size = _utf8_len(arg)
        if size > MAX_ARG_BYTES:
            raise BadField(f"argument {i} is longer than {MAX_ARG_BYTES} bytes ({size})")
        total += size + 1
    if not value[0].strip():
        raise BadField("the program (argument 0) is empty")
    if total > MAX_COMMAND_BYTES:
        raise BadField(f"longer than {MAX_COMMAND_BYTES} bytes in all ({total})")
    return list(value)


_INSTANCE_RE = re.compile(r"[0-9a-f]{16}")
_JOB_ID_TEXT_RE = re.compile(r"[0-9]{1,18}")


def parse_job_id(value: object) -> int:
    """A job id as a person gives it (12, "12"): a whole number. Anything else is bad input
    (InvalidInput, exit 2), not an unknown job (JobNotFound, exit 4, kept for a well-formed id
    that does not exist, which includes a whole number too long to be any job's id)."""
    from rig.errors import InvalidInput

    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    text = str(value).strip()
    if text.isascii() and text.isdigit() and int(text) >= 10**18:
        # A whole number, but longer than any id rig gives (ids are 18 digits at most): it
        # is well formed, so it is no job (exit 4), not bad input.
        from rig.errors import JobNotFound

        raise JobNotFound(text)
    if not _JOB_ID_TEXT_RE.fullmatch(text) or int(text) == 0:
        raise InvalidInput(f"{str(value)!r} is not a job id: job ids are whole numbers from 1, like 12 (`rig jobs` lists them)")
    return int(text)


def as_job_instance(value: Any) -> str:
    """A job's identity (models.new_job_instance): exactly 16 lower-case hex digits, so it is
    safe in a folder name and an environment value."""
    if not isinstance(value, str) or not _INSTANCE_RE.fullmatch(value):
        raise BadField(f"expected 16 lower-case hex digits, got {show(value)}")
    return value


def as_env(value: Any) -> dict[str, str]:
    """Environment variables as a JSON object of strings: names like the shell's
    ([A-Za-z_][A-Za-z0-9_]*), values without NUL, at most MAX_ENV_VARS and MAX_ENV_BYTES."""
    value = from_json(value, 4 * MAX_ENV_BYTES)
    if not isinstance(value, dict):
        raise BadField(f"expected a JSON object of strings, got {show(value)}")
    if len(value) > MAX_ENV_VARS:
        raise BadField(f"more than {MAX_ENV_VARS} variables ({len(value)})")
    total = 0
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key) or len(key) > 256:
            raise BadField(f"bad variable name {show(key)}: use letters, digits and _")
        if not isinstance(val, str):
            raise BadField(f"variable {key}: expected a string, got {show(val)}")
        if "\x00" in val:
            raise BadField(f"variable {key} contains a NUL character")
        try:
            total += len(key) + _utf8_len(val) + 2
        except BadField as exc:  # which of a hundred variables: the one to unset or leave out
            raise BadField(f"variable {key} is {exc}") from None
    if total > MAX_ENV_BYTES:
        raise BadField(f"longer than {MAX_ENV_BYTES} bytes in all ({total})")
    return dict(value)


def as_card_list(value: Any) -> list[int]:
    """Card indexes: a JSON list of distinct integers 0..MAX_CARD_INDEX, at most MAX_GPUS."""
    value = from_json(value, 64 * 1024)
    if not isinstance(value, list) or len(value) > MAX_GPUS:
        raise BadField(f"expected a JSON list of at most {MAX_GPUS} card indexes, got {show(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_CARD_INDEX:
            raise BadField(f"expected card indexes 0..{MAX_CARD_INDEX}, got {show(item)}")
    if len(set(value)) != len(value):
        raise BadField(f"a card is listed twice: {show(value)}")
    return list(value)


def as_text_list(value: Any, *, paths: bool = False, limit: int = 10_000) -> list[str]:
    """A JSON list of strings (absolute paths with ``paths``), at most ``limit`` items."""
    value = from_json(value)
    if not isinstance(value, list) or len(value) > limit:
        raise BadField(f"expected a JSON list of at most {limit} strings, got {show(value)}")
    check = as_abs_path if paths else as_text
    try:
        return [check(item) for item in value]
    except BadField as exc:
        raise BadField(f"an item: {exc}") from None


#: What each ended attempt's entry may hold (other keys are kept as they are).
_ATTEMPT_NUMBERS = ("attempt", "gpu_memory", "started_at", "ended_at", "exit_code", "vram_peak",
                    "vram_mean", "util_mean", "overuse")
_ATTEMPT_TEXTS = ("outcome", "summary", "node", "log")


def as_attempts(value: Any) -> list[dict]:
    """The ended attempts: a JSON list (at most 10,000) of objects whose known keys have the
    types the renderers use (numbers or null; text or null; cards a list of indexes)."""
    value = from_json(value)
    if not isinstance(value, list) or len(value) > 10_000:
        raise BadField(f"expected a JSON list of attempt records, got {show(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise BadField(f"attempt record {i}: expected a JSON object, got {show(item)}")
        for key in _ATTEMPT_NUMBERS:
            v = item.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not math.isfinite(v)):
                raise BadField(f"attempt record {i}: {key}: expected a number, got {show(v)}")
        for key in _ATTEMPT_TEXTS:
            v = item.get(key)
            if v is not None and not isinstance(v, str):
                raise BadField(f"attempt record {i}: {key}: expected text, got {show(v)}")
        if item.get("cards") is not None:
            try:
                as_card_list(item["cards"])
            except BadField as exc:
                raise BadField(f"attempt record {i}: cards: {exc}") from None
        if item.get("evidence") is not None and not (
                isinstance(item["evidence"], list) and all(isinstance(e, str) for e in item["evidence"])):
            raise BadField(f"attempt record {i}: evidence: expected a list of strings")
    return list(value)
