"""Resource pools (M26): named sets of nodes and cards that a job may be restricted to.

Configured as ``[pools]`` in the config file, each pool a list of members::

    [pools]
    a100 = ["gpu1", "gpu2"]          # every card of nodes gpu1 and gpu2
    small = ["gpu3:0-3", "gpu3:6"]   # cards 0, 1, 2, 3 and 6 of node gpu3

A member is ``NODE`` (all its cards, ``NODE:*`` too), ``NODE:I``, ``NODE:I-J`` (inclusive) or
``NODE:I,J,...``. A job submitted with ``--pool NAME`` is placed only on the pool's cards; a job
without one may use every card. Pure code: no Redis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rig.records import MAX_CARD_INDEX

#: What a pool name may be (it appears in job records, metrics labels and CLI flags).
POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_NODE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
_MEMBER = re.compile(rf"(?P<node>{_NODE})(?::(?P<cards>\*|[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*))?")


@dataclass(frozen=True)
class PoolMember:
    """One node, and the card indexes of it in the pool (None: all of them)."""

    node: str
    cards: frozenset[int] | None = None

    def contains(self, node: str, index: int) -> bool:
        return node == self.node and (self.cards is None or index in self.cards)


def parse_member(spec: str) -> PoolMember:
    """``"gpu3:0-3,6"`` -> PoolMember("gpu3", {0, 1, 2, 3, 6}). Raises ValueError on bad text."""
    match = _MEMBER.fullmatch(spec.strip())
    if not match:
        raise ValueError(f"pool member {spec!r}: use NODE, NODE:I, NODE:I-J or NODE:I,J")
    cards_text = match.group("cards")
    if cards_text in (None, "*"):
        return PoolMember(match.group("node"))
    cards: set[int] = set()
    for part in cards_text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"pool member {spec!r}: range {part} runs backwards")
        if last > MAX_CARD_INDEX:
            raise ValueError(f"pool member {spec!r}: card {last} is beyond the last possible index {MAX_CARD_INDEX}")
        cards.update(range(first, last + 1))
    return PoolMember(match.group("node"), frozenset(cards))


@dataclass(frozen=True)
class Pools:
    """Every configured pool: name -> its members."""

    members: Mapping[str, tuple[PoolMember, ...]]

    @classmethod
    def from_config(cls, raw: Mapping[str, Iterable[str]]) -> Pools:
        """Parse ``[pools]``; ValueError names the bad pool or member."""
        parsed: dict[str, tuple[PoolMember, ...]] = {}
        for name, specs in raw.items():
            if not POOL_NAME.fullmatch(name):
                raise ValueError(f"pool name {name!r}: use letters, digits, '.', '_' or '-'")
            if isinstance(specs, str):
                specs = [specs]
            members = tuple(parse_member(s) for s in specs)
            if not members:
                raise ValueError(f"pool {name!r} has no members")
            parsed[name] = members
        return cls(parsed)

    @property
    def names(self) -> list[str]:
        return sorted(self.members)

    def contains(self, pool: str | None, node: str, index: int) -> bool:
        """Is card (node, index) in ``pool``? Every card is in the pool None; no card is in an
        unknown pool."""
        if pool is None:
            return True
        return any(m.contains(node, index) for m in self.members.get(pool, ()))

    def check(self, pool: str | None) -> None:
        """Raise ValueError unless ``pool`` is None or configured."""
        if pool is not None and pool not in self.members:
            known = ", ".join(self.names) or "none are configured ([pools] in the config file)"
            raise ValueError(f"unknown pool {pool!r}; known pools: {known}")
