"""Why a node went silent, when Redis itself can tell: it refuses the node's password.

A node that still uses an old password (the operator changed ``requirepass`` and did not give
the node the new one) cannot write anything to Redis, so it cannot say so itself. Redis keeps
the refused logins in its ACL LOG (reason ``auth``, with the client's address). A reader with
the right password (``rig status``, the alert check) matches the recent refusals against the
addresses of the nodes that stopped heartbeating, and says which one cannot authenticate.

Only a match by address is reported (two nodes on one host share it: both are named); nothing
is guessed when Redis keeps no ACL LOG (before 6.0) or the reader may not read it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from rig.nodes import NodeInfo, clock

#: Refusals older than this (s since Redis last counted one) are history, not the present.
RECENT_S = 120.0
#: At most this many ACL LOG entries are read.
ENTRIES = 128


@dataclass(frozen=True)
class Refusal:
    ip: str
    user: str
    count: int
    age: float  # s since Redis last counted one


def refusals(client: redis.Redis, recent_s: float = RECENT_S) -> list[Refusal]:
    """Recent refused logins in Redis' ACL LOG ([] when it keeps none or may not be read)."""
    try:
        entries = client.acl_log(ENTRIES)
    except (redis.RedisError, AttributeError, TypeError, ValueError):
        return []
    found = []
    for entry in entries or []:
        try:
            if entry.get("reason") != "auth" or float(entry.get("age-seconds", 1e9)) > recent_s:
                continue
            info = entry.get("client-info") or {}
            addr = info.get("addr", "") if isinstance(info, dict) else ""
            ip = addr.rpartition(":")[0].strip("[]")
            found.append(Refusal(ip, str(entry.get("username", "?")), int(entry.get("count", 1)),
                                 float(entry.get("age-seconds", 0))))
        except (AttributeError, TypeError, ValueError):
            continue
    return found


def addresses(host: str) -> set[str]:
    """The IP addresses ``host`` may connect from (this host: loopback too); empty if unknown."""
    found: set[str] = set()
    if host == socket.gethostname():
        found |= {"127.0.0.1", "::1"}
    if not host:
        return found
    try:
        found |= {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        pass
    return found


def annotate(client: redis.Redis, nodes: Iterable[NodeInfo], recent_s: float = RECENT_S) -> None:
    """Set ``auth_refused`` on each node that says its NEW logins are refused
    (``auth_refused_since``, rig.authgate: its logged-in connections still write), and on each
    node that is not heartbeating while Redis refuses logins from its address. The ACL LOG
    count is per address: nodes sharing a host share it, so it is said once, on the first of
    them, naming them all (read-only; a Redis without ACL LOG adds nothing)."""
    nodes = list(nodes)
    for node in nodes:
        if node.alive and node.auth_refused_since:
            node.auth_refused = (
                f"new connections from node {node.name} to Redis are refused (password changed?) since "
                f"{clock(node.auth_refused_since)}; give it the new password (RIG_REDIS_URL / redis_password / "
                "redis_password_file) and restart its rig up")
    silent = [n for n in nodes if not n.alive and n.state in ("silent", "down")]
    if not silent:
        return
    refused = refusals(client, recent_s)
    if not refused:
        return
    said: dict[frozenset[str], str] = {}  # addresses already counted -> the node that said it
    for node in silent:
        ips = addresses(node.host)
        hits = [r for r in refused if r.ip in ips]
        if not hits:
            continue
        where = frozenset(r.ip for r in hits)
        since = clock(node.auth_refused_since or node.last_seen)
        fix = ("it still uses an old password: give it the new one "
               "(RIG_REDIS_URL / redis_password / redis_password_file) and restart its rig up")
        if where in said:
            node.auth_refused = (f"node {node.name} cannot authenticate to Redis since {since}: "
                                 f"see node {said[where]} for the refused logins from its host; {fix}")
            continue
        said[where] = node.name
        sharing = [n.name for n in silent if addresses(n.host) & where]
        users = ", ".join(sorted({r.user for r in hits}))
        last = min(r.age for r in hits)
        whose = f" (nodes {', '.join(sharing)})" if len(sharing) > 1 else ""
        node.auth_refused = (
            f"node {node.name} cannot authenticate to Redis since {since}: Redis refused "
            f"{sum(r.count for r in hits)} login(s) from {', '.join(sorted(where))}{whose} (user {users}), "
            f"the last {last:.0f} s ago; {fix}")
