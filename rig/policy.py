"""The rules a node applies to every user's jobs, recorded so that nodes can be compared.

One dispatcher leads the cluster (rig.nodes, the leader lock) and places every job by the
settings of its own node: the strategy (``scheduler_type``), the order (``queue_order``,
``fair_share`` and its half-life, ``aging_seconds``, ``hold_after_seconds``,
``backfill_estimate_delay_seconds``) and the users' limits (``max_jobs_per_user``,
``max_gpu_memory_per_user``, ``[user_limits]``); each node's gateway decides who may kill what
by its own ``admins``. Nodes configured differently place, order, limit and let kill by other
rules as the lead moves from one to another (a node stopped, a control worker restarted),
without a word: a user over a limit on node a runs unlimited once node b leads.

Each node's ``rig up`` records these settings in its node record (field ``policy``,
:data:`NODE_FIELD`, JSON; rig.registration), and warns in one line (:func:`differences`) when
a node up recorded others, naming each setting and both values. A warning, not a refusal
(as rig.pools refuses): a node with another half-life still runs every job safely. Pure code:
no Redis (the records are read by rig.nodes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rig.config import Settings
    from rig.nodes import NodeInfo

#: The field of a node's record (``P node:<node>``) holding :func:`encode`'s JSON; absent: a rig
#: from before it was recorded (it tells nothing).
NODE_FIELD = "policy"

#: The settings compared, in the order a warning names them.
SETTINGS = ("scheduler_type", "queue_order", "fair_share", "fair_share_half_life_hours", "aging_seconds",
            "hold_after_seconds", "backfill_estimate_delay_seconds", "max_jobs_per_user",
            "max_gpu_memory_per_user", "user_limits", "admins")


def _plain(value: Any) -> Any:
    """A setting's value as JSON takes it (pydantic models as their fields, unset ones left out)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return sorted(_plain(v) for v in value) if all(isinstance(v, str) for v in value) else [_plain(v) for v in value]
    return value


def encode(settings: Settings) -> str:
    """The recorded form of ``settings``' rules (compact, key-sorted JSON)."""
    return json.dumps({name: _plain(getattr(settings, name)) for name in SETTINGS}, sort_keys=True,
                      separators=(",", ":"))


def _decode(raw: str | None) -> dict[str, Any] | None:
    try:
        found = json.loads(raw) if raw else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)


def differences(node: str, settings: Settings, nodes: Iterable[NodeInfo]) -> str | None:
    """The one warning line for ``rig up`` of ``node`` with ``settings`` when a node up (or
    silent within its heartbeat's life) recorded other rules, or None. Names the nodes, then
    each setting that differs from the first of them, with both values."""
    mine = json.loads(encode(settings))
    others = sorted(((n, found) for n in nodes
                     if n.name != node and (n.state == "up" or (n.state == "silent" and not n.presumed_down))
                     for found in [_decode(n.policy)] if found is not None
                     and any(found.get(k) != mine[k] for k in SETTINGS if k in found)),
                    key=lambda pair: pair[0].name)
    if not others:
        return None
    first, theirs = others[0]
    which = "; ".join(f"{k} {_shown(mine[k])} here, {_shown(theirs[k])} on {first.name}"
                      for k in SETTINGS if k in theirs and theirs[k] != mine[k])
    return (f"warning: node(s) {', '.join(n.name for n, _ in others)} run with other rules than this node's "
            f"config ({which}): whichever node's dispatcher leads places, orders and limits every job by its "
            f"own, and each node's gateway lets its own admins kill anyone's jobs; give every node the same "
            f"settings (one config file copied to each)")
