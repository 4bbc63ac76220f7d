"""Resource pools (M26): named sets of nodes and cards that a job may be restricted to.

Configured as ``[pools]`` in the config file, each pool a list of members::

    [pools]
    a100 = ["gpu1", "gpu2"]          # every card of nodes gpu1 and gpu2
    small = ["gpu3:0-3", "gpu3:6"]   # cards 0, 1, 2, 3 and 6 of node gpu3

A member is ``NODE`` (all its cards, ``NODE:*`` too), ``NODE:I``, ``NODE:I-J`` (inclusive) or
``NODE:I,J,...``. A job submitted with ``--pool NAME`` is placed only on the pool's cards; a job
without one may use every card.

**Whose pools count: the cluster's, not the submitter's.** Each node's ``rig up`` records the
``[pools]`` of its config in its node record (field ``pools``, :data:`NODE_FIELD`, JSON;
rig.registration). The cluster's pools (:func:`cluster_pools`) are those recorded by the node
that ``rig up`` registered last; submit, ``rig retry``, ``rig status --pool`` and ``rig
forget-node`` judge a pool by them, wherever they run (a submitter's own ``[pools]`` or
``RIG_POOLS`` counts for nothing: it places no job). Nodes must agree: ``rig up`` refuses to start
a node whose ``[pools]`` differ from those of a node still up (:func:`disagreement`), because the
leading dispatcher places by its own node's config. So while any node is up, the last registered
node's pools are every running node's. Pure code: no Redis (the records are read by rig.nodes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rig.records import MAX_CARD_INDEX

if TYPE_CHECKING:  # rig.nodes reads the records; no import cycle at run time
    from rig.nodes import NodeInfo

#: The field of a node's record (``P node:<node>``) holding its config's ``[pools]`` as JSON
#: (:func:`encode`); absent: a rig from before pools were recorded (it tells nothing).
NODE_FIELD = "pools"

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
    try:
        cards = parse_card_list(cards_text)
    except ValueError as exc:
        raise ValueError(f"pool member {spec!r}: {exc}") from None
    return PoolMember(match.group("node"), frozenset(cards))


_CARD_RANGE = re.compile(r"\s*(?P<first>-?[0-9]+)\s*(?:-\s*(?P<last>[0-9]+)\s*)?")


def parse_card_list(text: str) -> list[int]:
    """``"0-3,6"`` -> [0, 1, 2, 3, 6]: card indexes, ``I-J`` inclusive, in the order written
    (a repeat stays, for the caller to refuse or not). The one card-list rule: a pool member's
    cards and ``gpu_whitelist``. Spaces around a part and an empty part (a stray comma) are
    let through; an index beyond MAX_CARD_INDEX, a negative one or a range that runs backwards
    raises ValueError saying which."""
    cards: list[int] = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _CARD_RANGE.fullmatch(part)
        if not match:
            raise ValueError(f"write card indexes like 0,1,3 or 0-3,6 ({part.strip()!r} is neither an index "
                             f"nor a range I-J)")
        first, last = int(match["first"]), int(match["last"] or match["first"])
        if last < first:
            raise ValueError(f"range {part.strip()} runs backwards; write it like {last}-{first}")
        if first < 0 or last > MAX_CARD_INDEX:
            raise ValueError(f"card index {first if first < 0 else last} is not from 0 to {MAX_CARD_INDEX}")
        cards.extend(range(first, last + 1))
    return cards


@dataclass(frozen=True)
class Pools:
    """Every configured pool: name -> its members."""

    members: Mapping[str, tuple[PoolMember, ...]]
    #: name -> the member specs as configured (for messages).
    specs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, raw: Mapping[str, Iterable[str]]) -> Pools:
        """Parse ``[pools]``; ValueError names the bad pool or member."""
        parsed: dict[str, tuple[PoolMember, ...]] = {}
        texts: dict[str, tuple[str, ...]] = {}
        for name, specs in raw.items():
            if not POOL_NAME.fullmatch(name):
                raise ValueError(f"pool name {name!r}: use letters, digits, '.', '_' or '-'")
            if isinstance(specs, str):
                specs = [specs]
            members = tuple(parse_member(s) for s in specs)
            if not members:
                raise ValueError(f"pool {name!r} has no members")
            parsed[name] = members
            texts[name] = tuple(specs)
        return cls(parsed, texts)

    @property
    def names(self) -> list[str]:
        return sorted(self.members)

    def contains(self, pool: str | None, node: str, index: int) -> bool:
        """Is card (node, index) in ``pool``? Every card is in the pool None; no card is in an
        unknown pool."""
        if pool is None:
            return True
        return any(m.contains(node, index) for m in self.members.get(pool, ()))

    def no_card(self, pool: str) -> str:
        """Why ``pool`` (configured) has no card to place on, with its members, for submit's
        refusal and ``rig status --pool``: the one wording."""
        return f"pool {pool!r} has no registered card (its members: {', '.join(self.specs.get(pool, ()))})"

    def unmatched(self, node: str, indexes: Iterable[int]) -> str | None:
        """One warning line for ``rig up`` of ``node``, whose cards are ``indexes``, naming every
        member of a pool that names cards of this node that it does not have (``n1:1`` on a
        one-card n1), else None. Members naming other nodes are theirs to check."""
        have = set(indexes)
        wrong = [f"{name}: {spec}" for name in self.names
                 for member, spec in zip(self.members[name], self.specs.get(name, ()), strict=False)
                 if member.node == node and member.cards is not None and not member.cards <= have]
        if not wrong:
            return None
        cards = ", ".join(map(str, sorted(have))) or "none"
        return (f"warning: [pools] member(s) {'; '.join(wrong)} name cards node {node} does not have (its "
                f"cards: {cards}): no job runs on them; fix [pools] (config file or RIG_POOLS)")

    def check(self, pool: str | None) -> None:
        """Raise ValueError unless ``pool`` is None or configured."""
        if pool is not None and pool not in self.members:
            known = ", ".join(self.names) or "none are configured ([pools] in the config file)"
            raise ValueError(f"unknown pool {pool!r}; known pools: {known}")


def encode(raw: Mapping[str, Iterable[str]]) -> str:
    """A config's ``[pools]`` as the node record holds them (compact JSON, names sorted), so two
    nodes configured alike record the same text."""
    return json.dumps({name: [raw[name]] if isinstance(raw[name], str) else list(raw[name])
                       for name in sorted(raw)}, separators=(",", ":"))


def _decode(text: str | None) -> Pools | None:
    """A node record's pools, or None when it has none (an older rig) or they are damaged."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        return Pools.from_config(raw) if isinstance(raw, dict) else None
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class ClusterPools:
    """The pools the cluster's nodes serve, and the node whose record they were read from."""

    pools: Pools
    #: The node ``rig up`` registered last among those that recorded pools; None: none did.
    node: str | None

    @property
    def known(self) -> str:
        """The cluster's pools in words, and whose they are (for one-line refusals)."""
        if self.node is None:
            return ("no node has recorded any: `rig up` records a node's [pools] (its own config), "
                    "a submitter's config does not count")
        if not self.pools.members:
            return f"none (node {self.node}, started last, has no [pools] in its config)"
        return f"{', '.join(self.pools.names)} (node {self.node}'s [pools], started last)"

    def check(self, pool: str | None) -> None:
        """Raise ValueError, one line, unless ``pool`` is None or one of the cluster's pools."""
        if pool is not None and pool not in self.pools.members:
            raise ValueError(f"unknown pool {pool!r}; the cluster's pools: {self.known}")


def cluster_pools(nodes: Iterable[NodeInfo]) -> ClusterPools:
    """The cluster's pools from every registered node (rig.nodes.NodeRegistry.read): those of
    the node registered last (rig.nodes.latest_recorded) whose record holds readable pools."""
    from rig.nodes import latest_recorded

    found = latest_recorded(nodes, lambda node: _decode(node.pools))
    if found is None:
        return ClusterPools(Pools({}), None)
    return ClusterPools(found[1], found[0])


def disagreement(node: str, raw: Mapping[str, Iterable[str]], nodes: Iterable[NodeInfo]) -> str | None:
    """Why ``rig up`` of ``node``, configured with ``[pools]`` ``raw``, must not start (one line,
    what to do), or None. Refused when another node still up (or silent within its heartbeat's
    life) recorded different pools: whichever node's dispatcher leads places every job, so the
    nodes' pools must be one. Stopped and down nodes are not asked (they are asked when they come
    back); a record without pools (an older rig) tells nothing."""
    mine = encode(raw)
    others = sorted((n for n in nodes
                     if n.name != node and (n.state == "up" or (n.state == "silent" and not n.presumed_down))
                     and _decode(n.pools) is not None and n.pools != mine), key=lambda n: n.name)
    if not others:
        return None
    return (f"node(s) {', '.join(n.name for n in others)} run with other pools ({others[0].name}: "
            f"{others[0].pools}) than this node's config ({mine}): nothing was changed; give every node the "
            f"same [pools] (config file or RIG_POOLS), or stop those nodes (`rig down` on each) first: "
            f"whichever node's dispatcher leads places the jobs, so the nodes' pools must be one")
