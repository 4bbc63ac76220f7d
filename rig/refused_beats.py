"""Heartbeats Redis refuses: while it refuses writes (full, read-only, MISCONF:
rig.redis_writes), every worker's and node's heartbeat is refused at once, so a node without
one is not silent or dead: its workers may well run and supervise their jobs, only unable to
say so. `rig status` and the metrics say that instead (rig.stack's hung check and the health
check judge nothing then either)."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from rig.nodes import NodeInfo, clock
from rig.redis_writes import memory_state, refusal_notice

#: The reason label of rig_redis_refuses_writes and the words `rig status` uses, by the
#: first words of rig.redis_writes.refusal_notice's line.
_REASONS = (("Redis is full", "full", "Redis full"),
            ("Redis is a read-only replica", "read-only", "Redis is a read-only replica"),
            ("Redis refuses writes", "cannot-persist", "Redis cannot save to disk: MISCONF"))
#: Every reason label of rig_redis_refuses_writes (rig.metrics), "refused" for an unknown one.
REASON_LABELS = (*(label for _, label, _ in _REASONS), "refused")


def refusal_reason(client: redis.Redis) -> tuple[str, str] | None:
    """(reason label, words) when Redis answers but refuses writes now; None when it takes
    them or that cannot be read."""
    if memory_state(client) is None:
        return None  # unreadable: not known to refuse
    notice = refusal_notice(client)
    if notice is None:
        return None
    for start, label, words in _REASONS:
        if notice.startswith(start):
            return label, words
    return "refused", "Redis refuses writes"


def annotate(client: redis.Redis, nodes: Iterable[NodeInfo]) -> str | None:
    """Set ``writes_refused`` on each node without a heartbeat (silent or down, not stopped)
    while Redis refuses writes: "heartbeats refused since T (Redis full)", T its last heartbeat
    Redis took. Returns the words for the reason (for the workers' title), or None."""
    reason = refusal_reason(client)
    if reason is None:
        return None
    for node in nodes:
        if not node.alive and node.state in ("silent", "down"):
            node.writes_refused = (f"heartbeats refused since {clock(node.last_seen or node.since)} "
                                   f"({reason[1]}): its workers may be alive, only unable to say so")
    return reason[1]
