"""What travels over the gateway's socket: length-prefixed JSON frames, and rig's own objects
encoded as tagged JSON.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON. Nothing is ever
unpickled or evaluated: an object comes back only as one of the classes in :data:`CLASSES`
(jobs, cards, nodes, reports, start estimates), field by field, and an unknown tag is an error. Both ends use
this one codec, so what the gateway sends is what the client rebuilds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import struct
import time
from enum import Enum
from pathlib import Path
from typing import Any

#: The largest frame either end accepts (bytes): a submit_many of some thousands of jobs, or
#: a @rig.task payload of up to about 12 MiB pickled (larger ones: pass a file path).
MAX_FRAME = 16 * 2**20
#: Frames above this size are parsed at most two at a time, gateway-wide (bytes): parsing costs
#: many times a frame's size in memory, and many peers must not do it at once. The bytes are
#: read first, outside that limit, so a slow sender holds up nobody else.
LARGE_FRAME = 64 * 2**10

_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A frame that is not rig's (too long, not JSON, an unknown tag) or a cut connection."""


def _classes() -> dict[str, type]:
    from rig.accounting import UsageLine
    from rig.client import StatusReport, UserUsage, WorkerInfo
    from rig.forecast import Forecast, StartEstimate
    from rig.models import CardState, Job, JobState, Priority
    from rig.nodes import NodeInfo

    return {c.__name__: c for c in (Job, CardState, NodeInfo, WorkerInfo, StatusReport, UserUsage,
                                    UsageLine, JobState, Priority, Forecast, StartEstimate)}


_CLASSES: dict[str, type] | None = None


def classes() -> dict[str, type]:
    """Tag -> class of everything the codec rebuilds (imported once, lazily)."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _classes()
    return _CLASSES


def encode(value: Any) -> Any:  # noqa: ANN401 - any of rig's values
    """``value`` as plain JSON data: dataclasses and enums tagged, dicts with non-string keys
    as pairs, tuples and paths as lists and strings."""
    if isinstance(value, Enum):
        return {"__e": type(value).__name__, "v": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__t": type(value).__name__,
                "f": {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):  # a str Enum key is no plain name
            return {"__m": {k: encode(v) for k, v in value.items()}}
        return {"__p": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise WireError(f"cannot send a {type(value).__name__}")


def decode(data: Any) -> Any:  # noqa: ANN401
    """The inverse of :func:`encode`; raises WireError for a tag it does not know."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__m" in data:
        if not isinstance(data["__m"], dict):
            raise WireError("a mapping that is not an object")
        return {str(k): decode(v) for k, v in data["__m"].items()}
    if "__p" in data:
        pairs = data["__p"]
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise WireError("pairs that are not [key, value] lists")
        try:
            return {_hashable(decode(k)): decode(v) for k, v in pairs}
        except TypeError:
            raise WireError("a key that cannot be one") from None
    known = classes()
    if "__e" in data:
        cls = known.get(data["__e"]) if isinstance(data["__e"], str) else None
        if cls is None or not issubclass(cls, Enum):
            raise WireError(f"unknown value type {data['__e']!r}")
        try:
            return cls(data.get("v"))
        except ValueError:
            raise WireError(f"no {data['__e']} {data.get('v')!r}") from None
    if "__t" in data:
        cls = known.get(data["__t"]) if isinstance(data["__t"], str) else None
        if cls is None or not dataclasses.is_dataclass(cls):
            raise WireError(f"unknown object type {data['__t']!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data.get("f"), dict):
            raise WireError(f"a {data['__t']} without fields")
        values = {k: decode(v) for k, v in data["f"].items() if k in names}
        try:
            return cls(**values)
        except TypeError as exc:
            raise WireError(f"a {data['__t']} with wrong fields: {exc}") from None
    raise WireError("an object without a type tag")


def _hashable(value: Any) -> Any:  # noqa: ANN401
    return tuple(value) if isinstance(value, list) else value


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one frame holding ``message`` (already :func:`encode`-d where needed)."""
    sock.sendall(pack(message))


def pack(message: dict[str, Any]) -> bytes:
    """``message`` as one frame; WireError when it is over MAX_FRAME."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"a request of {len(body)} bytes is over the gateway's {MAX_FRAME} bytes: submit fewer jobs "
                        "per submit_many call, or pass large @rig.task arguments as file paths")
    return _HEADER.pack(len(body)) + body


def receive(sock: socket.socket, body_timeout: float | None = None, large: Any = None,  # noqa: ANN401
            on_size: Any = None) -> dict[str, Any] | None:  # noqa: ANN401
    """One frame's message, or None when the peer closed the connection between frames. With
    ``body_timeout``, the rest of a frame must arrive within that many seconds of its first
    byte (a peer trickling bytes holds no connection for long). ``large`` (a semaphore) is
    held while a frame over LARGE_FRAME is parsed; ``on_size(n)`` is told a frame's size before
    its body is read (it may raise WireError: too much in flight)."""
    first = _read(sock, 1, allow_eof=True)
    if first is None:
        return None
    deadline = None if body_timeout is None else time.monotonic() + body_timeout
    head = first + _read(sock, _HEADER.size - 1, allow_eof=False, deadline=deadline)
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is over the gateway's {MAX_FRAME} bytes; for a large "
                        "@rig.task argument pass a file path")
    if on_size is not None:
        on_size(size)
    body = _read(sock, size, allow_eof=False, deadline=deadline)
    guard = large if large is not None and size > LARGE_FRAME else contextlib.nullcontext()
    with guard:
        try:
            message = json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise WireError(f"a frame that is not rig's JSON: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise WireError("a frame that is not a JSON object")
    return message


def _read(sock: socket.socket, size: int, *, allow_eof: bool, deadline: float | None = None) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError("a frame that did not arrive in time")
            sock.settimeout(left)
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            if allow_eof and got == 0:
                return None
            raise WireError("connection closed in the middle of a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
