"""A bounded map of short lists in Redis: per user, a field (a command's digest, a job name)
-> its last few values (run seconds, peak bytes), newest first, in one hash, with a sorted set
of when each field last got a value. Beyond ``fields_kept`` fields the ones that got a value
longest ago leave both keys (``rig/lua/bounded_runs.lua``: one script, so the two agree).

Why not a list per field: a sweep gives every job its own command, and often its own name; a
list per field is a key per job for as long as the keys live (30 days), about 100 bytes each,
and Redis grows with every job submitted. This keeps at most ``fields_kept`` entries per user.
"""

from __future__ import annotations

import redis

from rig.lua import source as lua_source


def push(pipe: redis.client.Pipeline, values_key: str, seen_key: str, field: str, value: float | int, *,
         keep: int, fields_kept: int, at: float, ttl: int) -> None:
    """Queue on ``pipe``: ``value`` becomes ``field``'s newest (at most ``keep`` kept), ``at``
    (epoch s) its last time; both keys live ``ttl`` s after this."""
    # EVAL, not EVALSHA: a pipeline's registered script costs a SCRIPT EXISTS round trip per
    # execute; Redis compiles the text once and finds it by its digest after that.
    pipe.eval(lua_source("bounded_runs"), 2, values_key, seen_key, field, value, keep, fields_kept, at, ttl)


def split(stored: str | None) -> list[str]:
    """One field's stored values, newest first (nothing for a field not kept)."""
    return (stored or "").split()

