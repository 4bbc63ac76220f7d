"""A free-capacity index over one list of cards (issue 15): which cards could take a request now,
answered without a walk over every card, and kept up to date when a start takes room.

The rule stays where it is: :func:`rig.placement.room_for_one` (CardState.refusal read the other
way) says what each card takes; :func:`rig.placement.place` picks among the cards that take a
request; :class:`rig.placement.Capacity` says whether any node could. This index only sorts the
cards by their room, so that

- :meth:`RoomIndex.fitting` lists the cards that take ``nbytes`` (every card with room >= it),
  O(log cards + answer): ``place(index.fitting(n), request)`` is ``place(cards, request)``, as
  place looks at no card that does not fit and its choice does not depend on the order of its
  input (each strategy's key ends with the card's index; nodes are compared by name);
- :meth:`RoomIndex.could_place` is ``Capacity(cards).could_place`` in O(1);
- :meth:`RoomIndex.after` is the index of the same list with a few cards replaced (a start
  reserved memory and a job slot on them): O(cards) list copies in C and O(changed x log cards)
  Python steps, not O(cards log cards) Python work.

tests/unit/test_card_index.py compares every answer with the plain functions over seeded random
card sets (pools, whitelists, unhealthy and damaged cards, job caps, multi-card requests), before
and after random starts.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from rig.models import CardState
from rig.placement import Request, room_for_one


class RoomIndex:
    """``cards`` (a list whose positions stand for the cards) sorted by room_for_one."""

    __slots__ = ("cards", "_keys", "_node_rooms", "_best")

    def __init__(self, cards: Sequence[CardState]) -> None:
        self.cards: list[CardState] = list(cards)
        #: (room, position) of every card that takes a job now, ascending
        self._keys: list[tuple[int, int]] = []
        #: node -> the rooms of its cards that take a job now, descending
        self._node_rooms: dict[str, list[int]] = {}
        for position, card in enumerate(self.cards):
            room = room_for_one(card)
            if room is not None:
                self._keys.append((room, position))
                self._node_rooms.setdefault(card.node, []).append(room)
        self._keys.sort()
        #: number of cards g -> the g-th largest room of each node that has g such cards, ascending
        #: (Capacity.best[g] is its last)
        self._best: dict[int, list[int]] = {}
        for rooms in self._node_rooms.values():
            rooms.sort(reverse=True)
            for gpus, room in enumerate(rooms, start=1):
                self._best.setdefault(gpus, []).append(room)
        for values in self._best.values():
            values.sort()

    def could_place(self, request: Request) -> bool:
        """Capacity(cards).could_place(request): some node has ``gpus`` cards that each take it."""
        best = self._best.get(request.gpus)
        return request.nbytes <= (best[-1] if best else -1)

    def fitting(self, nbytes: int) -> list[CardState]:
        """The cards that take a job of ``nbytes`` per card now (``fits``), in no set order."""
        start = bisect.bisect_left(self._keys, (nbytes, -1))
        cards = self.cards
        return [cards[position] for _room, position in self._keys[start:]]

    def after(self, changes: Iterable[tuple[int, CardState]]) -> RoomIndex:
        """This index with the card at each position replaced by the one given (a new index;
        this one is left as it was)."""
        new = object.__new__(RoomIndex)
        new.cards = list(self.cards)
        new._keys = list(self._keys)
        new._node_rooms = dict(self._node_rooms)
        new._best = dict(self._best)
        copied: set[int] = set()
        for position, card in changes:
            old = new.cards[position]
            new.cards[position] = card
            before, now = room_for_one(old), room_for_one(card)
            if before == now and old.node == card.node:
                continue
            if before is not None:
                del new._keys[bisect.bisect_left(new._keys, (before, position))]
                new._set_rooms(old.node, before, None, copied)
            if now is not None:
                bisect.insort(new._keys, (now, position))
                new._set_rooms(card.node, None, now, copied)
        return new

    def _set_rooms(self, node: str, gone: int | None, added: int | None, copied: set[int]) -> None:
        """Replace one room of ``node`` (``gone`` out, ``added`` in) and its parts of _best."""
        old = self._node_rooms.get(node, [])
        rooms = list(old)
        if gone is not None:
            rooms.remove(gone)
        if added is not None:
            rooms.append(added)
            rooms.sort(reverse=True)
        self._node_rooms[node] = rooms
        for gpus in range(1, max(len(old), len(rooms)) + 1):
            was = old[gpus - 1] if gpus <= len(old) else None
            becomes = rooms[gpus - 1] if gpus <= len(rooms) else None
            if was == becomes:
                continue
            if gpus not in copied:
                copied.add(gpus)
                self._best[gpus] = list(self._best.get(gpus, ()))
            values = self._best[gpus]
            if was is not None:
                del values[bisect.bisect_left(values, was)]
            if becomes is not None:
                bisect.insort(values, becomes)
