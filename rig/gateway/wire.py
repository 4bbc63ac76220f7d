"""What travels over the gateway's socket: length-prefixed JSON frames, and rig's own objects
encoded as tagged JSON.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON. Nothing is ever
unpickled or evaluated: an object comes back only as one of the classes in :data:`CLASSES`
(jobs, cards, nodes, reports), field by field, and an unknown tag is an error. Both ends use
this one codec, so what the gateway sends is what the client rebuilds.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
from enum import Enum
from pathlib import Path
from typing import Any

#: The largest frame either end accepts (bytes): a submit_many of some thousands of jobs, or
#: a @rig.task payload (rig.pytask caps those lower than this).
MAX_FRAME = 64 * 2**20

_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A frame that is not rig's (too long, not JSON, an unknown tag) or a cut connection."""


def _classes() -> dict[str, type]:
    from rig.client import StatusReport, UserUsage, WorkerInfo
    from rig.models import CardState, Job, JobState, Priority
    from rig.nodes import NodeInfo

    return {c.__name__: c for c in (Job, CardState, NodeInfo, WorkerInfo, StatusReport, UserUsage,
                                    JobState, Priority)}


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
        return {str(k): decode(v) for k, v in data["__m"].items()}
    if "__p" in data:
        return {_hashable(decode(k)): decode(v) for k, v in data["__p"]}
    known = classes()
    if "__e" in data:
        cls = known.get(data["__e"])
        if cls is None or not issubclass(cls, Enum):
            raise WireError(f"unknown value type {data['__e']!r}")
        return cls(data["v"])
    if "__t" in data:
        cls = known.get(data["__t"])
        if cls is None or not dataclasses.is_dataclass(cls):
            raise WireError(f"unknown object type {data['__t']!r}")
        names = {f.name for f in dataclasses.fields(cls)}
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
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"message of {len(body)} bytes is over the gateway's {MAX_FRAME} bytes")
    sock.sendall(_HEADER.pack(len(body)) + body)


def receive(sock: socket.socket, body_timeout: float | None = None) -> dict[str, Any] | None:
    """One frame's message, or None when the peer closed the connection between frames. With
    ``body_timeout``, the rest of a frame must arrive within that many seconds once its length
    did (a peer trickling bytes holds no connection for long)."""
    head = _read(sock, _HEADER.size, allow_eof=True)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes is over the gateway's {MAX_FRAME} bytes")
    if body_timeout is not None:
        sock.settimeout(body_timeout)
    body = _read(sock, size, allow_eof=False)
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"a frame that is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("a frame that is not a JSON object")
    return message


def _read(sock: socket.socket, size: int, *, allow_eof: bool) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            if allow_eof and got == 0:
                return None
            raise WireError("connection closed in the middle of a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
