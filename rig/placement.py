"""Where a job goes: pure functions from (cards, request) to a decision. No Redis here.

A request is ``gpus`` cards on one node, each with ``nbytes`` of reservable memory and room for
one more job. Strategies differ only in which fitting cards they prefer:

- first-fit:    the lowest-numbered cards that fit (fast, fills card 0 first)
- least-loaded: the cards with the most free memory, then fewest jobs (spreads load)
- best-fit:     the cards the job fills most tightly (keeps big blocks whole for big jobs)

Each call is O(cards log cards); the dispatcher calls it once per job it considers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rig.memory import format_memory
from rig.models import CardState

STRATEGIES = ("first-fit", "least-loaded", "best-fit")


@dataclass(frozen=True)
class Request:
    """What one job needs: ``gpus`` cards with ``nbytes`` each (bytes)."""

    nbytes: int
    gpus: int = 1


@dataclass(frozen=True)
class Placement:
    node: str
    cards: tuple[int, ...]


def fits(card: CardState, request: Request) -> bool:
    """Could this card take the job right now?"""
    return card.eligible and card.free >= request.nbytes and card.jobs < card.max_jobs


_Key = Callable[[CardState, Request], tuple]

_CARD_ORDER: dict[str, _Key] = {
    "first-fit": lambda c, r: (c.index,),
    "least-loaded": lambda c, r: (-c.free, c.jobs, c.index),
    "best-fit": lambda c, r: (c.free - r.nbytes, c.jobs, c.index),
}


def place(cards: Sequence[CardState], request: Request, strategy: str = "best-fit") -> Placement | None:
    """Pick ``request.gpus`` cards on one node that can all take the job now, or None.

    All-or-nothing: a multi-card job gets every card it asks for on one node, or none.
    """
    try:
        order = _CARD_ORDER[strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}") from None
    by_node: dict[str, list[CardState]] = defaultdict(list)
    for card in cards:
        if fits(card, request):
            by_node[card.node].append(card)
    options: list[tuple[tuple, Placement]] = []
    for node, fitting in by_node.items():
        if len(fitting) < request.gpus:
            continue
        chosen = sorted(fitting, key=lambda c: order(c, request))[: request.gpus]
        # Compare nodes by the worst card they would use, then by name for determinism.
        node_key = max(order(c, request) for c in chosen)
        if strategy == "first-fit":
            node_key = ()
        options.append(((node_key, node), Placement(node, tuple(sorted(c.index for c in chosen)))))
    if not options:
        return None
    return min(options, key=lambda item: item[0])[1]


def never_fits(cards: Sequence[CardState], request: Request) -> str | None:
    """Why the job could not run even on empty cards, or None if it could some day.

    Only cards in the whitelist count; unhealthy cards count (they may recover).
    """
    allowed = [c for c in cards if c.allowed]
    if not allowed:
        return "no cards are registered yet (is `rig up` running?)" if not cards else (
            "no card is in gpu_whitelist"
        )
    big_enough: dict[str, int] = defaultdict(int)
    for card in allowed:
        if card.usable >= request.nbytes:
            big_enough[card.node] += 1
    if not big_enough:
        largest = max(allowed, key=lambda c: c.usable)
        return (
            f"needs {format_memory(request.nbytes)} per card but the largest card offers "
            f"{format_memory(largest.usable)} usable ({largest.id}, {format_memory(largest.total)} "
            f"less the reserve); ask for less memory"
        )
    best = max(big_enough.values())
    if best < request.gpus:
        most_cards = max(sum(1 for c in allowed if c.node == n) for n in {c.node for c in allowed})
        return (
            f"needs {request.gpus} cards on one node but at most {min(best, most_cards)} "
            f"allowed card(s) with {format_memory(request.nbytes)} exist on any node; ask for fewer cards"
        )
    return None


def explain_wait(cards: Sequence[CardState], request: Request) -> str:
    """A person-readable reason why ``request`` cannot be placed now (assumes it can't)."""
    eligible = [c for c in cards if c.eligible]
    need = f"needs {format_memory(request.nbytes)}"
    need += " on 1 card" if request.gpus == 1 else f" on each of {request.gpus} cards of one node"
    if not eligible:
        return f"{need}; no healthy allowed card is available"
    largest = max(eligible, key=lambda c: (c.free, -c.index))
    parts = [need, f"largest free block {format_memory(largest.free)} ({largest.id})"]
    roomy = [c for c in eligible if c.free >= request.nbytes]
    if roomy and all(c.jobs >= c.max_jobs for c in roomy):
        parts.append(f"cards with that much free already run their maximum of {roomy[0].max_jobs} jobs")
    elif request.gpus > 1 and roomy:
        per_node: dict[str, int] = defaultdict(int)
        for c in roomy:
            if c.jobs < c.max_jobs:
                per_node[c.node] += 1
        best = max(per_node.values(), default=0)
        parts.append(f"only {best} such card(s) free on one node")
    unhealthy = [c.id for c in cards if c.allowed and not c.healthy]
    if unhealthy:
        parts.append(f"unhealthy: {', '.join(unhealthy)}")
    return "; ".join(parts)
