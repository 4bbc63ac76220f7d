"""The free-capacity index (rig.card_index) against the plain rules it stands for: fits /
place / Capacity over seeded random card sets (whitelists, unhealthy, damaged and gone cards,
foreign memory, per-card job caps, several nodes, multi-card requests, pools through the
dispatcher's view), before and after random starts and other changes."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Sequence

import pytest

from rig.card_index import RoomIndex
from rig.memory import GIB
from rig.models import CardState
from rig.placement import (
    _CARD_ORDER,
    STRATEGIES,
    Capacity,
    Placement,
    Request,
    fits,
    place,
    placeable,
)
from rig.pools import Pools
from workers.dispatcher import _Lazy, _View

REQUESTS = [Request(g * GIB, n) for g in (1, 5, 8, 12, 20, 26, 40, 60, 79, 80, 81) for n in (1, 2, 3, 8, 9)]


def _card(rng: random.Random, node: str, index: int) -> CardState:
    usable = rng.choice([24, 48, 80]) * GIB
    max_jobs = rng.choice([1, 2, 4, 5])
    card = CardState(node=node, index=index, total=usable + GIB, usable=usable,
                     reserved=rng.randint(0, usable // GIB) * GIB, jobs=rng.randint(0, max_jobs), max_jobs=max_jobs,
                     foreign=rng.choice([0, 0, 0, 2 * GIB]), healthy=rng.random() > 0.1,
                     allowed=rng.random() > 0.1, temperature=rng.choice([None, 35, 60, 85]))
    roll = rng.random()
    if roll < 0.03:
        card = dataclasses.replace(card, problems=["field jobs: damaged"], healthy=False)
    elif roll < 0.06:
        card = dataclasses.replace(card, gone=True, allowed=rng.random() < 0.5)
    if rng.random() < 0.1:  # foreign use beyond what is left (reserved + foreign > usable)
        card = dataclasses.replace(card, foreign=usable)
    return card


def _cluster(rng: random.Random) -> list[CardState]:
    return [_card(rng, f"n{n}", i) for n in range(rng.randint(1, 6)) for i in range(rng.choice([1, 2, 4, 8]))]


def _same_answers(index: RoomIndex, cards: list[CardState], rng: random.Random) -> None:
    capacity = Capacity(cards)
    for request in REQUESTS:
        assert index.could_place(request) == capacity.could_place(request), request
        fitting = index.fitting(request.nbytes)
        assert sorted(c.id for c in fitting) == sorted(c.id for c in cards if fits(c, request)), request
        smallest = rng.choice([None, 4 * GIB, 16 * GIB])
        for strategy in STRATEGIES:
            assert place(fitting, request, strategy, smallest_waiting=smallest) == place(
                cards, request, strategy, smallest_waiting=smallest), (request, strategy)


def _start(rng: random.Random, cards: list[CardState]) -> list[tuple[int, CardState]]:
    """A start as the dispatcher makes one (its memory and a job slot on each chosen card), or
    another change (a card turned unhealthy or allowed, a reservation given back)."""
    if rng.random() < 0.7:
        request = rng.choice([r for r in REQUESTS if r.gpus <= 3])
        spot = place(cards, request, rng.choice(STRATEGIES))
        if spot is not None:
            return [(i, dataclasses.replace(c, reserved=c.reserved + request.nbytes, jobs=c.jobs + 1))
                    for i, c in enumerate(cards) if c.node == spot.node and c.index in spot.cards]
    position = rng.randrange(len(cards))
    card = cards[position]
    changed = rng.choice([
        dataclasses.replace(card, healthy=not card.healthy),
        dataclasses.replace(card, allowed=not card.allowed),
        dataclasses.replace(card, reserved=max(0, card.reserved - 10 * GIB), jobs=max(0, card.jobs - 1)),
        dataclasses.replace(card, max_jobs=card.max_jobs + 1),
    ])
    return [(position, changed)]


@pytest.mark.parametrize("seed", range(40))
def test_the_index_answers_as_fits_place_and_capacity_through_changes(seed):
    rng = random.Random(seed)
    cards = _cluster(rng)
    index = RoomIndex(cards)
    _same_answers(index, cards, rng)
    for _step in range(25):
        changes = _start(rng, cards)
        before = list(index.cards)
        new = index.after(changes)
        assert index.cards == before  # the index a start was made from is left as it was
        cards = list(cards)
        for position, card in changes:
            cards[position] = card
        index = new
        _same_answers(index, cards, rng)
    assert _same_answers(RoomIndex(cards), cards, rng) is None


@pytest.mark.parametrize("seed", range(15))
def test_the_views_pools_answer_as_the_plain_rules_after_each_start(seed):
    """The dispatcher's round: each pool's cards, could_place and fitting as a view carries them
    from start to start (_View.after_start) equal what the plain rules say of the pool's cards."""
    rng = random.Random(seed)
    cards = sorted(_cluster(rng), key=lambda c: (c.node, c.index))
    nodes = sorted({c.node for c in cards})
    pools = Pools.from_config({"a": [f"{nodes[0]}:0-1"] + [n for n in nodes[2:3]], "b": [f"{n}:1,3" for n in nodes],
                               "empty": ["nowhere"]})
    view = _View(cards, pools, _Lazy(lambda: ({}, None)), 0.0, lambda token: hash(token))
    names = [None, "a", "b", "empty", "unknown"]
    for _step in range(20):
        for pool in names:
            mine = [c for c in cards if pools.contains(pool, c.node, c.index)]
            if rng.random() < 0.8:  # some pools first asked for after a start
                assert view.mine(pool) == mine
                capacity = Capacity(mine)
                for request in REQUESTS:
                    assert view.could_place(pool, request) == capacity.could_place(request)
                    assert sorted(c.id for c in view.fitting(pool, request.nbytes)) == sorted(
                        c.id for c in mine if fits(c, request))
        request = rng.choice([r for r in REQUESTS if r.gpus <= 2])
        spot = place(cards, request)
        if spot is None:
            continue
        chosen = {f"{spot.node}/{i}" for i in spot.cards}
        cards = [dataclasses.replace(c, reserved=c.reserved + request.nbytes, jobs=c.jobs + 1) if c.id in chosen else c
                 for c in cards]
        view = view.after_start(cards, sorted(chosen))
        assert view.by_id == {c.id: c for c in cards}


def test_a_held_cards_remembered_room_is_asked_again_when_the_card_or_its_releases_change():
    """_Holds remembers leaves_room per held card and request size (groups of jobs alike ask it
    of every held card): a start that replaces the card or adds a release to it is seen."""
    from rig.placement import Hold, Release, leaves_room
    from workers.dispatcher import _Holds

    holds = _Holds.__new__(_Holds)
    holds._rooms = {}
    card = CardState(node="n1", index=0, total=80 * GIB, usable=80 * GIB, reserved=20 * GIB, jobs=1, max_jobs=4)
    releases = [Release(200.0, 20 * GIB)]
    hold = Hold(1, ("n1/0",), 60 * GIB, 200.0)
    request = Request(18 * GIB)
    def answer(card, releases):
        return holds._leaves_room(card, releases, hold, request, None)

    assert answer(card, releases) is True and leaves_room(card, releases, hold, request)  # 80 - 18 >= 60
    assert answer(card, releases) is True
    started = dataclasses.replace(card, reserved=card.reserved + 10 * GIB, jobs=card.jobs + 1)
    assert answer(started, releases) is False  # another object: 70 - 18 < 60
    releases.append(Release(150.0, 10 * GIB))
    assert answer(started, releases) is True  # the same list, longer: it ends first, 80 - 18 again
    assert answer(started, list(releases[:1])) is False


@pytest.mark.parametrize("seed", range(10))
def test_a_views_card_token_made_from_the_last_rounds_is_the_cards_token(seed):
    """The first view of a round takes its token from the last round's last view (the parts of
    the cards that are other objects replaced), as it would have worked it out from its cards."""
    from rig.waiting import cards_token

    rng = random.Random(seed)
    cards = sorted(_cluster(rng), key=lambda c: (c.node, c.index))
    view = _View(cards, Pools.from_config({}), _Lazy(lambda: ({}, None)), 0.0, lambda token: hash(token))
    for _round in range(6):
        for _start in range(rng.randint(0, 3)):
            spot = place(cards, Request(rng.choice([1, 8, 20]) * GIB))
            if spot is None:
                break
            chosen = {f"{spot.node}/{i}" for i in spot.cards}
            cards = [dataclasses.replace(c, jobs=c.jobs + 1) if c.id in chosen else c for c in cards]
            view = view.after_start(cards, sorted(chosen))
        for fits_nowhere in rng.sample([True, False], rng.randint(1, 2)):
            assert view._cards_token(fits_nowhere) == cards_token(cards, fits_nowhere=fits_nowhere)
        last = (view._big, view.cards)
        if rng.random() < 0.5:  # cards read again between rounds: some are new objects
            cards = [dataclasses.replace(c, temperature=rng.choice([None, 50, 90])) if rng.random() < 0.2 else c
                     for c in cards]
        view = _View(cards, Pools.from_config({}), _Lazy(lambda: ({}, None)), 0.0, lambda token: hash(token))
        view._prior = last
    for fits_nowhere in (True, False):
        assert view._cards_token(fits_nowhere) == cards_token(cards, fits_nowhere=fits_nowhere)



# place() as it was written before it worked each card's key out once (a plain reading of the rule).
def _place_plainly(
    cards: Sequence[CardState],
    request: Request,
    strategy: str = "multi-factor",
    *,
    smallest_waiting: int | None = None,
) -> Placement | None:
    """Pick ``request.gpus`` cards on one node that can all take the job now, or None.

    All-or-nothing: a multi-card job gets every card it asks for on one node, or none.
    ``smallest_waiting`` (bytes: the smallest request still waiting) lets multi-factor judge
    which leftovers are still useful.
    """
    try:
        card_key = _CARD_ORDER[strategy]
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
        used_fits = sum(1 for c in fitting if c.jobs or c.reserved) >= request.gpus

        def order(c: CardState, _used: bool = used_fits) -> tuple:
            return card_key(c, request, smallest_waiting, _used)

        chosen = sorted(fitting, key=order)[: request.gpus]
        # Compare nodes by the worst card they would use, then by name for determinism.
        node_key = max(order(c) for c in chosen)
        if strategy == "first-fit":
            node_key = ()
        options.append(((node_key, node), Placement(node, tuple(sorted(c.index for c in chosen)))))
    if not options:
        return None
    return min(options, key=lambda item: item[0])[1]



@pytest.mark.parametrize("seed", range(30))
def test_place_chooses_what_its_plain_reading_chooses(seed):
    rng = random.Random(seed)
    cards = _cluster(rng)
    for request in REQUESTS:
        smallest = rng.choice([None, 4 * GIB, 16 * GIB, 30 * GIB])
        for strategy in STRATEGIES:
            assert place(cards, request, strategy, smallest_waiting=smallest) == _place_plainly(
                cards, request, strategy, smallest_waiting=smallest), (request, strategy)
        # placeable is place's None rule (the dispatcher asks it of jobs it will not start yet)
        assert placeable(cards, request) == (_place_plainly(cards, request) is not None), request
        for part in (cards[: len(cards) // 2], cards[::3], []):
            assert placeable(part, request) == (_place_plainly(part, request) is not None), request
            assert place(part, request, smallest_waiting=smallest) == _place_plainly(
                part, request, smallest_waiting=smallest), request


@pytest.mark.parametrize("seed", range(30))
def test_place_chooses_what_its_plain_reading_chooses_among_empty_and_used_cards(seed):
    """Half the cards empty (multi-factor's empty-card penalty applies on a node only where
    enough used cards fit): the one-card rule weighs each node's cards as the plain reading does."""
    rng = random.Random(seed)
    cards = [dataclasses.replace(c, reserved=0, jobs=0) if rng.random() < 0.5 else c for c in _cluster(rng)]
    for request in REQUESTS:
        smallest = rng.choice([None, 4 * GIB, 16 * GIB, 30 * GIB])
        for strategy in STRATEGIES:
            assert place(cards, request, strategy, smallest_waiting=smallest) == _place_plainly(
                cards, request, strategy, smallest_waiting=smallest), (request, strategy)
