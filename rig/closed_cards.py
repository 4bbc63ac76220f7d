"""Why cards take no jobs, in words, grouped per node: the one place for that rule.

Used by every wait explanation (rig.waiting.explain for cards that all take no jobs,
rig.placement.explain_wait for the unhealthy ones beside cards that are merely full), so a
node that cannot write its logs, is stopped, or has hot cards is named with its cause instead
of "no healthy allowed card" / "unhealthy: vm/1".

- a node whose cards were all closed for the node's state: ``node b is stopped since 12:01:05``;
- a node that cannot write logs (a node-wide cause, rig.logspace, whichever of its cards the
  guard has marked so far): ``node vm takes no jobs: cannot write logs under /x: No space left
  on device (ENOSPC); ...``;
- a node whose cards all share one reason: ``node vm takes no jobs: <reason>``;
- else per card: ``vm/1: not in whitelist``, ``vm/2: temperature 95 C ...``.
Plain text, never markup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rig.draining import why_closed
from rig.logspace import is_log_space_reason
from rig.models import CardState
from rig.nodes import NODE_DOWN_REASON, NODE_STOPPED_REASON

_CLOCK = re.compile(r"\d\d:\d\d:\d\d")


def node_closed(reason: str) -> str | None:
    """``stopped since 12:01:05`` for a card closed because its node stopped (rig.nodes'
    NODE_STOPPED_REASON / NODE_DOWN_REASON and the time it carries), else None."""
    for prefix, word in ((NODE_STOPPED_REASON, "stopped"), (NODE_DOWN_REASON, "down")):
        if reason.startswith(prefix):
            found = _CLOCK.search(reason)
            return f"{word} since {found.group(0)}" if found else word
    return None


def card_why(card: CardState) -> str:
    """Why one card takes no job (its configuration first, then its health reason)."""
    state = node_closed(card.health_reason)
    return why_closed(card) or (f"node {card.node} is {state}" if state
                                else card.health_reason or "unhealthy")


def closed_cards_text(cards: Sequence[CardState], *, node_cards: Sequence[CardState] | None = None) -> str:
    """Why each of ``cards`` (cards that take no job) takes none, grouped by node (see the module
    doc). ``node_cards``: all cards of those nodes (default ``cards``), to tell whether a
    reason holds for a whole node."""
    every = node_cards if node_cards is not None else cards
    by_node: dict[str, list[CardState]] = {}
    for card in cards:
        by_node.setdefault(card.node, []).append(card)
    parts: list[str] = []
    for node, mine in sorted(by_node.items()):
        count = sum(1 for c in every if c.node == node) or len(mine)
        state = {node_closed(c.health_reason) for c in mine if not c.healthy and not why_closed(c)}
        if len(state) == 1 and None not in state and all(not c.healthy for c in mine) and len(mine) >= count:
            parts.append(f"node {node} is {state.pop()}")
            continue
        logs = next((c.health_reason for c in mine if not c.healthy and is_log_space_reason(c.health_reason)), None)
        rest = mine
        if logs:
            # The log folder is the node's: every card of it is out, marked yet or not.
            parts.append(f"node {node} takes no jobs: {logs}")
            rest = [c for c in mine if not (not c.healthy and is_log_space_reason(c.health_reason))
                    and why_closed(c)]
        whys = [card_why(c) for c in rest]
        if rest and len(set(whys)) == 1 and len(rest) >= count and len(rest) > 1:
            parts.append(f"node {node} takes no jobs: {whys[0]}")
            continue
        parts.extend(f"{c.id}: {w}" for c, w in zip(rest, whys, strict=True))
    return "; ".join(parts)
