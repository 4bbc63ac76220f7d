"""Packed strings: a JSON value compressed into text Redis keeps as one string (a job's spec
and its environment, rig.models.SPEC_FIELDS). Text, not bytes, because rig's clients decode
every reply as UTF-8.

Format: ``z1:`` then base85 of the zlib of the JSON. Unpacking never trusts the input: a string
that is not one, or would unpack beyond MAX_UNPACKED bytes (a zlib bomb), raises ValueError.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from typing import Any

from rig import records as R

TAG = "z1:"

# base64's base85 tables are built on first use, and b85decode's is published before it is
# filled: two threads decoding at once in a fresh process (a card worker starting two jobs)
# could read a half-built table and take a sound spec for "bad base85 character" (a job failed
# to start so in CI). Built here, once, at import (under the import lock).
base64.b85decode(base64.b85encode(b"rig"))
#: The most a packed string may unpack to (bytes): a command and an environment at their limits.
MAX_UNPACKED = 4 * R.MAX_COMMAND_BYTES + 4 * R.MAX_ENV_BYTES


def pack(value: Any) -> str:  # noqa: ANN401 - any JSON value
    return TAG + base64.b85encode(zlib.compress(json.dumps(value).encode(), 6)).decode()


def unpack(text: Any) -> Any:  # noqa: ANN401
    """The JSON value of a packed string; ValueError if it is none (see the module doc)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not isinstance(text, str) or not text.startswith(TAG) or len(text) > 2 * MAX_UNPACKED:
        raise ValueError("not a packed value")
    unzip = zlib.decompressobj()
    try:
        data = unzip.decompress(base64.b85decode(text[len(TAG):]), MAX_UNPACKED)
    except zlib.error as exc:
        raise ValueError(f"not a packed value: {exc}") from None
    if unzip.unconsumed_tail:
        raise ValueError(f"unpacks beyond {MAX_UNPACKED} bytes")
    return json.loads(data)


def digest(user: str, text: str) -> str:
    """The name of one user's environment blob: 16 hex digits of SHA-256 over the user and the
    environment's stored text. Per user, so no two users' jobs ever share (or free) a blob."""
    return hashlib.sha256(f"{user}\0{text}".encode(errors="surrogateescape")).hexdigest()[:16]
