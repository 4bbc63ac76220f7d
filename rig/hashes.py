"""Many Redis hashes read in one command (rig/lua/read_hashes.lua) instead of one pipelined
command each: what the dispatcher reads every pass (every card, every reservation, the jobs
holding them, the queue heads) costs the client ~6 us per pipelined command in redis-py, which
at 512 cards and 2,048 running jobs was most of an idle pass. The script runs a bounded batch
(at most BATCH keys) so Redis is never blocked for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from rig.lua import source

#: Keys per script call: ~1 ms of Redis time for hashes of a few fields.
BATCH = 2000


def queue_fields(pipe: Any, keys: Sequence[str], fields: Sequence[str]) -> int:
    """Queue on ``pipe`` the reads of ``fields`` of each of ``keys``; returns how many replies
    they take (give them to :func:`fields_of`)."""
    script = pipe.register_script(source("read_hashes"))
    batches = 0
    for start in range(0, len(keys), BATCH):
        script(keys=list(keys[start:start + BATCH]), args=list(fields), client=pipe)
        batches += 1
    return batches


def fields_of(replies: Sequence[Any]) -> list[list[Any]]:
    """The per-key value lists of replies queued by :func:`queue_fields` (None where unset)."""
    return [list(values) for reply in replies for values in reply]


def read_fields(client: redis.Redis, keys: Sequence[str], fields: Sequence[str]) -> list[list[Any]]:
    """For each of ``keys``, the values of ``fields`` (None where unset), in one round trip."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    queue_fields(pipe, keys, fields)
    return fields_of(pipe.execute())


def read_all(client: redis.Redis, keys: Sequence[str]) -> list[dict[Any, Any]]:
    """For each of ``keys``, its whole hash ({} when missing), in one round trip."""
    if not keys:
        return []
    flat = read_fields(client, keys, ())
    return [dict(zip(values[::2], values[1::2], strict=True)) for values in flat]
