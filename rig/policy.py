"""The rules a node applies to every user's jobs, and its alert check's, recorded so that nodes
can be compared.

One dispatcher leads the cluster (rig.nodes, the leader lock) and places every job by the
settings of its own node: the strategy (``scheduler_type``), the order (``queue_order``,
``fair_share`` and its half-life, ``aging_seconds``, ``hold_after_seconds``,
``backfill_estimate_delay_seconds``) and the users' limits (``max_jobs_per_user``,
``max_gpu_memory_per_user``, ``[user_limits]``); each node's gateway decides who may kill what
by its own ``admins``. Nodes configured differently place, order, limit and let kill by other
rules as the lead moves from one to another (a node stopped, a control worker restarted),
without a word: a user over a limit on node a runs unlimited once node b leads. The alert
check (:data:`ALERT_SETTINGS`) runs beside the leading dispatcher too (workers.alert_check), by
that node's thresholds and webhook: recorded as a digest, since the webhook's URL is its secret.

Templates are compared too (:data:`TEMPLATE_SETTINGS`): submissions use those of the node
started last (rig.cluster_templates), so nodes apart change what ``--template`` means.

Each node's ``rig up`` records these settings in its node record (field ``policy``,
:data:`NODE_FIELD`, JSON; rig.registration), and warns in one line (:func:`differences`) when
a node up recorded others, naming each setting and both values. A warning, not a refusal
(as rig.pools refuses): a node with another half-life still runs every job safely. Pure code:
no Redis (the records are read by rig.nodes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rig.config import Settings
    from rig.nodes import NodeInfo

#: The field of a node's record (``P node:<node>``) holding :func:`encode`'s JSON; absent: a rig
#: from before it was recorded (it tells nothing).
NODE_FIELD = "policy"

#: The settings of the jobs' rules compared, in the order a warning names them.
JOB_SETTINGS = ("scheduler_type", "queue_order", "fair_share", "fair_share_half_life_hours", "aging_seconds",
                "hold_after_seconds", "backfill_estimate_delay_seconds", "max_jobs_per_user",
                "max_gpu_memory_per_user", "user_limits", "admins")
#: The alert check's settings: only the leading dispatcher's control worker checks, by its own
#: node's thresholds and webhook (workers.alert_check), once per change cluster-wide
#: (rig.alerts.AlertManager). Two nodes apart: when the lead moves (a node stopped or gone, a
#: control worker restarted) the thresholds and the webhook move with it: a condition may resolve
#: or fire by the new ones, and changes go to the new node's webhook, or to none. (An older rig's
#: control worker still checks by its own settings whenever beat's message reaches it.)
ALERT_SETTINGS = ("alerts", "alert_webhook")
#: Submissions use the templates recorded by the node started last (rig.cluster_templates),
#: wherever they are made: two nodes apart, a template changes meaning as nodes restart.
TEMPLATE_SETTINGS = ("templates",)
#: Every setting compared, in the order a warning names them.
SETTINGS = JOB_SETTINGS + ALERT_SETTINGS + TEMPLATE_SETTINGS
#: Settings recorded as a digest, never as written: a webhook's URL is its secret (Slack's).
SECRET_SETTINGS = frozenset({"alert_webhook"})


def _plain(value: Any) -> Any:
    """A setting's value as JSON takes it (pydantic models as their fields, unset ones left out)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return sorted(_plain(v) for v in value) if all(isinstance(v, str) for v in value) else [_plain(v) for v in value]
    return value


def _recorded(name: str, value: Any) -> Any:
    """A setting as recorded: a secret one as ``sha256:`` and 12 hex digits of it (None: unset)."""
    if name in SECRET_SETTINGS and value is not None:
        return "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()[:12]
    return _plain(value)


def encode(settings: Settings) -> str:
    """The recorded form of ``settings``' rules (compact, key-sorted JSON)."""
    return json.dumps({name: _recorded(name, getattr(settings, name)) for name in SETTINGS}, sort_keys=True,
                      separators=(",", ":"))


def _decode(raw: str | None) -> dict[str, Any] | None:
    try:
        found = json.loads(raw) if raw else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
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
    apart = [k for k in SETTINGS if k in theirs and theirs[k] != mine[k]]
    which = "; ".join(f"{k} {_shown(mine[k])} here, {_shown(theirs[k])} on {first.name}" for k in apart)
    why = [*(["whichever node's dispatcher leads places, orders and limits every job by its own, and each "
              "node's gateway lets its own admins kill anyone's jobs"] if set(apart) & set(JOB_SETTINGS) else []),
           *(["the leading dispatcher's node checks the alerts by its own thresholds and posts each change "
              "to its own webhook, or to none: when the lead moves, conditions are judged and posted by the "
              "new node's"]
             if set(apart) & set(ALERT_SETTINGS) else []),
           *(["every submission uses the templates of the node started last, so `--template` changes "
              "meaning as nodes restart"] if set(apart) & set(TEMPLATE_SETTINGS) else [])]
    return (f"warning: node(s) {', '.join(n.name for n, _ in others)} run with other rules than this node's "
            f"config ({which}): {'; '.join(why)}; give every node the same "
            f"settings (one config file copied to each)")
