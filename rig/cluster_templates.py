"""Whose templates count: the cluster's, as for pools (rig.pools).

Each node's ``rig up`` records the ``[templates]`` of its config (the shipped ones included) in
its node record (field ``templates``, :data:`NODE_FIELD`, JSON; rig.registration). The cluster's
templates (:func:`cluster_templates`) are those recorded by the node that ``rig up`` registered
last, by the rule pools are chosen with (rig.nodes.latest_recorded); submit (``--template``),
``rig templates`` and the gateway's clients use them wherever they run, so a direct client (one
with the Redis password) with another config submits with the node's templates, not its own.
Nodes that differ are warned of by ``rig up`` (rig.policy compares ``templates`` too): a
template is read at submit, never by a dispatcher, so two nodes apart are a surprise, not a
fault. While no node has recorded any (every node an older rig's, or none registered yet), the
client's own config's templates are used, as before, and ``rig templates`` says so. Pure code:
no Redis (the records are read by rig.nodes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rig.nodes reads the records; no import cycle at run time
    from rig.config import Template
    from rig.nodes import NodeInfo

#: The field of a node's record (``P node:<node>``) holding its config's templates as JSON
#: (:func:`encode`); absent: a rig from before templates were recorded (it tells nothing).
NODE_FIELD = "templates"


def encode(templates: Mapping[str, Template]) -> str:
    """A config's templates as the node record holds them (compact JSON, names sorted, each
    template's fields as set: unset ones left out), so two nodes configured alike record the
    same text."""
    return json.dumps({name: templates[name].model_dump(exclude_none=True) for name in sorted(templates)},
                      sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> dict[str, Template] | None:
    """A node record's templates, or None when it has none (an older rig) or they are damaged
    (each is checked by the rules a config's template is: rig.config.Template)."""
    from rig.config import Template

    if not text:
        return None
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            return None
        return {str(name): Template.model_validate(fields) for name, fields in raw.items()}
    except ValueError:  # json's, and pydantic's ValidationError
        return None


@dataclass(frozen=True)
class ClusterTemplates:
    """The templates submissions use, and the node whose record they were read from."""

    templates: dict[str, Template]
    #: The node ``rig up`` registered last among those that recorded templates; None: none did,
    #: and ``templates`` are the client's own config's.
    node: str | None

    @property
    def whose(self) -> str:
        """Whose templates these are, in words (for `rig templates` and refusals)."""
        if self.node is None:
            return "this client's config: no node has recorded its templates (an older rig, or none up yet)"
        return f"node {self.node}'s config, started last"


def cluster_templates(nodes: Iterable[NodeInfo], own: Mapping[str, Template]) -> ClusterTemplates:
    """The cluster's templates from every registered node (rig.nodes.NodeRegistry.read): those
    of the node registered last whose record holds readable ones; else ``own`` (the client's)."""
    from rig.nodes import latest_recorded

    found = latest_recorded(nodes, lambda node: decode(node.templates))
    if found is None:
        return ClusterTemplates(dict(own), None)
    return ClusterTemplates(found[1], found[0])
