"""The format of rig's data in Redis, and which rig may run a node on it.

Nodes of one cluster share their records: a rig that wrote or read them differently from its
peers (a key renamed, a field added that an older worker does not know) would misplace or
misread jobs without a word. So the data carries a format number, ``DATA_FORMAT``, bumped with
any change of the key schema (rig.keys) or of a record's fields (rig.models) that an older rig
would misread; ``tests/unit/test_data_format.py`` fails until a change of either is matched by
a bump (or declared compatible there).

Where it lives: the field ``data_format`` of ``P installation`` (the cluster's), and the same
field of each ``P node:<name>`` record (what that node's rig writes; absent: a rig from before
the number existed, counted as format 0, as is a stamp left by an earlier registration:
:data:`STAMPED_AT`; rig.nodes reads it into NodeInfo.data_format).

The rule (:func:`refusal`, called by ``rig up`` before it registers anything):

- the cluster's format is newer than this rig's: refused (upgrade this node);
- older, or absent while live nodes exist: refused while any *other* node still up runs an
  older rig (stop them, upgrade every node, start again); with none up, this rig takes the
  data over (nothing to convert between the formats so far) and stamps its format;
- equal: carry on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import redis

from rig.keys import Keys

if TYPE_CHECKING:  # rig.nodes stamps records with DATA_FORMAT: no import cycle at run time
    from rig.nodes import NodeInfo

#: The format this rig reads and writes. History: 1 = the first stamped format (2026-12).
DATA_FORMAT = 1

#: The field, in the installation hash and in each node record.
FIELD = "data_format"

#: Beside FIELD in a node record: the ``started_at`` of the registration that wrote it. A rig from
#: before the number, started on a node a newer rig had registered (rolled back), rewrites
#: ``started_at`` but leaves FIELD as the newer rig wrote it: a stamp whose moment is not the
#: record's ``started_at`` is stale, and the node counts as format 0 (rig.nodes).
STAMPED_AT = "data_format_at"


def node_format(raw: dict[str, str]) -> int:
    """The data format of the rig that registered a node record last (0: one from before the
    number, or one that left another rig's stamp behind)."""
    stamped_at = raw.get(STAMPED_AT)
    if stamped_at is not None and stamped_at != raw.get("started_at"):
        return 0
    text = raw.get(FIELD) or "0"
    return int(text) if text.isdigit() else 0


def refusal(client: redis.Redis, keys: Keys, node: str, nodes: Iterable[NodeInfo]) -> str | None:
    """Why ``rig up`` of ``node`` must not start on this Redis (one line, what to do), or None
    (and then the cluster's format is this rig's: stamped here). ``nodes``: every registered
    node now (rig.nodes.NodeRegistry.read; NodeInfo.data_format is what its record says)."""
    found = client.hget(keys.installation, FIELD)
    text = found.decode() if isinstance(found, bytes) else found
    cluster = int(text) if text is not None and text.isdigit() else None  # damaged: stamped again
    if cluster is not None and cluster > DATA_FORMAT:
        return (f"this Redis holds rig data of format {cluster}, written by a newer rig; this rig writes format "
                f"{DATA_FORMAT}: upgrade rig on this server to the version the other nodes run, then `rig up`")
    older = sorted((n for n in nodes if n.name != node and _up(n) and n.data_format < DATA_FORMAT),
                   key=lambda n: n.name)
    if older:
        return (f"node(s) {', '.join(n.name for n in older)} still run an older rig (data format "
                f"{min(n.data_format for n in older)}; this rig writes {DATA_FORMAT}) on this Redis: "
                f"nothing was changed; stop them (`rig down` on each), upgrade rig on every node, then `rig up` "
                f"(nodes of one cluster must run the same rig)")
    if cluster != DATA_FORMAT:
        client.hset(keys.installation, FIELD, str(DATA_FORMAT))
    return None


def mixed_note(node: NodeInfo) -> str | None:
    """The line ``rig status`` gives under a node that may still be writing (up, or silent
    within its heartbeat's life) and runs a rig of another data format than this one, else
    None. :func:`refusal` keeps a newer rig from starting beside an older node, but an older
    rig started beside newer nodes cannot know to refuse: only its readers can say it."""
    if not _up(node) or node.data_format == DATA_FORMAT:
        return None
    which = "an older" if node.data_format < DATA_FORMAT else "a newer"
    return (f"node {node.name} runs {which} rig (data format {node.data_format}; this rig: {DATA_FORMAT}): nodes of "
            f"one cluster must run the same rig: `rig down` every node, upgrade rig on each, then `rig up`")


def _up(node: NodeInfo) -> bool:
    """A node that may still be writing: up, or silent within its heartbeat's life."""
    return node.state == "up" or (node.state == "silent" and not node.presumed_down)
