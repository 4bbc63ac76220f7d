"""Where a job goes: pure functions from (cards, request) to a decision. No Redis here.

A request is ``gpus`` cards on one node, each with ``nbytes`` of reservable memory and room for
one more job. Strategies differ only in which fitting cards they prefer:

- first-fit:    the lowest-numbered cards that fit (fast, fills card 0 first)
- least-loaded: the cards with the most free memory, then fewest jobs (spreads load)
- best-fit:     the cards the job fills most tightly (keeps big blocks whole for big jobs)
- multi-factor: the default. Fragmentation-aware: a cost in bytes per card = memory the
                placement strands (left free but too small for the smallest waiting job;
                counting memory left behind a card's last job slot as stranded too made the
                mixed trace slower, so it is not) + a penalty for opening an
                empty card while a used one fits (whole cards stay free for big and multi-card
                jobs) + a tenth of the leftover (tightness) + a little per degree of
                temperature. Priority comes first in the order the dispatcher offers jobs.

Each call is O(cards log cards) over the cards it is given; the dispatcher calls it only for
jobs that Capacity's answer says could be placed somewhere, over the cards that take the request
(rig.card_index.RoomIndex: O(log cards) per job, kept up to date through a round's starts).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from rig.closed_cards import closed_cards_text
from rig.memory import format_memory
from rig.models import CardState

STRATEGIES = ("multi-factor", "best-fit", "least-loaded", "first-fit")

#: multi-factor: cost of opening an empty card when a used one would do (bytes).
EMPTY_CARD_PENALTY = 20 * 2**30
#: multi-factor: cost per degree Celsius above 40 (bytes): a tie-breaker, never a veto.
TEMPERATURE_COST = 2**28


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
    """Could this card take the job right now? (the one rule: CardState.refusal)"""
    return card.refusal(request.nbytes) is None


_Key = Callable[[CardState, Request, "int | None", bool], tuple]


def multi_factor_cost(card: CardState, request: Request, smallest_waiting: int | None,
                      used_card_fits: bool) -> float:
    """Bytes-equivalent cost of putting ``request`` on ``card`` (lower is better)."""
    leftover = card.free - request.nbytes
    stranded = leftover > 0 and smallest_waiting is not None and leftover < smallest_waiting
    cost = float(leftover if stranded else 0)
    if used_card_fits and card.jobs == 0 and card.reserved == 0:
        cost += EMPTY_CARD_PENALTY
    cost += 0.1 * leftover
    if card.temperature is not None and card.temperature > 40:
        cost += (card.temperature - 40) * TEMPERATURE_COST
    return cost


_CARD_ORDER: dict[str, _Key] = {
    "first-fit": lambda c, r, s, u: (c.index,),
    "least-loaded": lambda c, r, s, u: (-c.free, c.jobs, c.index),
    "best-fit": lambda c, r, s, u: (c.free - r.nbytes, c.jobs, c.index),
    "multi-factor": lambda c, r, s, u: (multi_factor_cost(c, r, s, u), c.index),
}


def place(
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
    if request.gpus == 1:
        # The rule below for one card, without a list per node: each node's best card is its
        # least key (every key ends with the card's index), and nodes compare by that key, then
        # by name (first-fit: by name, then index), so the choice is the least (key, node) of all.
        fitting = [c for c in cards if fits(c, request)]
        if not fitting:
            return None
        used = {c.node for c in fitting if c.jobs or c.reserved}
        first_fit = strategy == "first-fit"
        _key, node, index = min(
            (() if first_fit else card_key(c, request, smallest_waiting, c.node in used), c.node, c.index)
            for c in fitting)
        return Placement(node, (index,))
    by_node: dict[str, list[CardState]] = defaultdict(list)
    for card in cards:
        if fits(card, request):
            by_node[card.node].append(card)
    options: list[tuple[tuple, Placement]] = []
    for node, fitting in by_node.items():
        if len(fitting) < request.gpus:
            continue
        used_fits = sum(1 for c in fitting if c.jobs or c.reserved) >= request.gpus

        # Each card's key once (every key ends with the card's index: no two alike on a node).
        keyed = [(card_key(c, request, smallest_waiting, used_fits), c.index) for c in fitting]
        chosen = [min(keyed)] if request.gpus == 1 else sorted(keyed)[: request.gpus]
        # Compare nodes by the worst card they would use, then by name for determinism.
        node_key = () if strategy == "first-fit" else chosen[-1][0]
        options.append(((node_key, node), Placement(node, tuple(sorted(index for _key, index in chosen)))))
    if not options:
        return None
    return min(options, key=lambda item: item[0])[1]


def placeable(cards: Sequence[CardState], request: Request) -> bool:
    """Would :func:`place` pick cards for ``request`` among ``cards`` (under any strategy)? Some
    node has ``request.gpus`` of them that fit: place's None rule, without ordering any."""
    if request.gpus == 1:
        return any(fits(c, request) for c in cards)
    counts: dict[str, int] = defaultdict(int)
    for card in cards:
        if fits(card, request):
            counts[card.node] += 1
            if counts[card.node] >= request.gpus:
                return True
    return False


class Release(NamedTuple):
    """A reservation on a card expected to end: ``nbytes`` given back at epoch ``at``
    (an estimate; math.inf when the job's running time is unknown), and surely by ``sure_at``
    (its time limit's end; math.inf without one). ``since``: when its job began (epoch s).
    A named tuple, not a frozen dataclass: the dispatcher makes one per reservation per round
    (8,192 at 512 cards), and a frozen dataclass' __init__ cost ~3x as much."""

    at: float
    nbytes: int
    sure_at: float = math.inf
    since: float = 0.0


@dataclass(frozen=True)
class Hold:
    """Cards kept for a blocked job: ``nbytes`` per card from epoch ``until`` (its shadow time:
    when enough expected releases free them; math.inf when a needed release is unknown)."""

    job_id: int
    cards: tuple[str, ...]
    nbytes: int
    until: float


def room_at(card: CardState, releases: Sequence[Release], at: float, *,
            before: float | None = None) -> tuple[int, int]:
    """(free bytes, jobs) on ``card`` at epoch ``at``, counting the releases expected by then;
    with ``before`` (epoch s), a release of a job that began at or after it only if it surely
    happens by then (its time limit)."""
    gone = [r for r in releases
            if r.sure_at <= at or (r.at <= at and (before is None or r.since < before))]
    return card.free + sum(r.nbytes for r in gone), card.jobs - len(gone)


def earliest_fit(card: CardState, releases: Sequence[Release], request: Request, now: float) -> float:
    """When ``card`` is expected to have room for ``request`` (epoch s): ``now`` if it has now,
    the release that makes room, or math.inf (never with the releases known)."""
    return fit_time(card, release_steps(card, releases), request.nbytes, now)


def release_steps(card: CardState, releases: Sequence[Release]) -> list[tuple[float, int, int]]:
    """(when, free bytes, jobs) on ``card`` after each of its ``releases`` in time order (a
    stable sort by ``at``), up to the first unknown one: what :func:`fit_time` reads, worked out
    once per card for every request size (HoldPlanner asks ~5 sizes of every card a round)."""
    free, jobs = card.free, card.jobs
    steps = []
    for release in sorted(releases, key=_release_at):
        if release.at == math.inf:
            break
        free, jobs = free + release.nbytes, jobs - 1
        steps.append((release.at, free, jobs))
    return steps


def _release_at(release: Release) -> float:
    return release.at


def fit_time(card: CardState, steps: Sequence[tuple[float, int, int]], nbytes: int, now: float,
             free: int | None = None) -> float:
    """earliest_fit of a request of ``nbytes`` on ``card`` from its :func:`release_steps`
    (``free``: ``card.free``, when the caller has it)."""
    if (card.free if free is None else free) >= nbytes and card.jobs < card.max_jobs:
        return now
    max_jobs = card.max_jobs
    for at, free, jobs in steps:
        if free >= nbytes and jobs < max_jobs:
            return max(now, at)
    return math.inf


#: A job that holds cards keeps them while they are expected to have room no later than the
#: best plan's time plus the larger of HOLD_KEEP_S (s) and HOLD_KEEP_FRACTION of the best plan's
#: wait from now (:func:`keeps_hold`): estimates of equal blockers reorder as their ages cross
#: the samples of their kind, and a hold that followed them moved every few seconds.
HOLD_KEEP_S = 10.0
HOLD_KEEP_FRACTION = 0.10


def keeps_hold(kept_until: float, best_until: float, now: float) -> bool:
    """Does a job keep the cards it holds, expected to have room at epoch ``kept_until``, when
    the best plan's cards are expected to at ``best_until`` (epoch s; math.inf: unknown)? Yes
    while ``kept_until`` is within max(HOLD_KEEP_S, HOLD_KEEP_FRACTION x (best_until - now)) of
    ``best_until``, and always when the best's time is unknown or equal: it moves only to
    cards clearly earlier. THE rule for a hold's stability (the dispatcher's and the forecast's
    holds, both through HoldPlanner.plan)."""
    if kept_until <= best_until:
        return True
    return kept_until <= best_until + max(HOLD_KEEP_S, HOLD_KEEP_FRACTION * max(0.0, best_until - now))


def plan_hold(cards: Sequence[CardState], releases: Mapping[str, Sequence[Release]], request: Request,
              now: float, job_id: int = 0, exclude: Container[str] = frozenset(),
              prefer: Sequence[str] = ()) -> Hold | None:
    """The cards to hold for a job that cannot start now (EASY backfilling's reservation): on one
    node, the ``gpus`` cards big enough for it that are expected to have room first; ties (and
    unknown times) go to the cards closest to fitting now (smallest missing memory, then fewest
    jobs). ``until`` is the latest of the chosen cards' expected times. None when no node has
    enough such cards outside ``exclude``. ``prefer``: the cards the job holds already (card
    ids), kept while they can serve it and :func:`keeps_hold` says so. O(cards x releases per
    card); HoldPlanner answers many requests over the same cards for that cost once per request
    size."""
    return HoldPlanner(cards, releases, now).plan(request, job_id, exclude, prefer)


class HoldPlanner:
    """:func:`plan_hold` for many requests over the same cards, releases and ``now`` (one
    dispatcher round, until a start changes the cards): each card's release steps are worked out
    once (:func:`release_steps`) and its expected time per request size read from them, and each
    node's options sorted once per size; each node's plan for a request (its first ``gpus``
    options outside ``exclude``) is kept in a heap by plan_hold's key, so a plan is the heap's
    top: O(log nodes), not a walk over every node. A node's plan is made again when ``exclude``
    gains one of its cards: a dict that only grows between calls (the dispatcher's held cards in
    a round: its new keys are its last), read from where the heap last left it; any other
    container starts the heaps afresh. A planner after a start (:meth:`after`) takes each heap
    from the planner before it, with the plans of the nodes the start changed made again (not
    one push per node per view). The same answers as plan_hold, by construction
    (tests/unit/test_placement_scale.py)."""

    def __init__(self, cards: Sequence[CardState], releases: Mapping[str, Sequence[Release]], now: float, *,
                 node_of: dict[str, str] | None = None,
                 steps: dict[str, tuple[CardState, Sequence[Release], int, list[tuple[float, int, int]]]] | None = None,
                 memo: dict[int, dict[str, tuple[float, tuple, list]]] | None = None,
                 ) -> None:
        """``memo``: request bytes -> node -> (now, the node's :func:`option_inputs`, its options),
        kept by the caller between planners over other card lists (the dispatcher's next round):
        a node whose inputs and ``now`` are equal takes its options from it (they are a function
        of those alone), the others are worked out and stored in it. Only a round's first planner
        reads and fills it; its planners after starts carry their own."""
        self.cards = cards
        self.releases = releases
        self.now = now
        #: request bytes -> [(node, its options sorted: (when, missing bytes, jobs, index, card id))]
        self._options: dict[int, list[tuple[str, list[tuple[float, int, int, int, str]]]]] = {}
        self._node_of = node_of if node_of is not None else {card.id: card.node for card in cards}
        #: card id -> (its card, its releases list, their number, release_steps): shared along the
        #: starts (a card replaced, or its list grown, is worked out again)
        self._steps = steps if steps is not None else {}
        self._by_node: dict[int, dict[str, list[tuple[float, int, int, int, str]]]] = {}  # options by node
        #: (bytes, gpus) -> [heap of (plan_hold's key (until, missing bytes, node), cards, version),
        #: node -> its current version, how many of ``exclude``'s keys the heap has seen]; an
        #: entry whose version is not its node's current one is out of date.
        self._heaps: dict[tuple[int, int], list] = {}
        self._exclude: object = None  # the exclude the heaps were made with
        #: After a start (after): the planner before it and the nodes whose cards it changed;
        #: this one's options are that one's with those nodes' worked out again.
        self._before: tuple[HoldPlanner, frozenset[str]] | None = None
        self._node_cards: dict[str, list[CardState]] | None = None  # the cards by node, on first use
        self._memo = memo
        self._inputs: dict[str, tuple] = {}  # node -> its option_inputs (with a memo), on first use
        self._input_steps: dict[str, tuple[tuple, list]] = {}  # card id -> (its inputs, their release_steps)

    def after(self, cards: Sequence[CardState], changed: Sequence[CardState]) -> HoldPlanner:
        """The planner of ``cards``: this one's cards with ``changed`` (cards by id) put in place
        of theirs, by a start that took room on them, its releases added to the same mapping.
        Each node's options and plans are this planner's except the changed nodes', worked out
        again on first use (the releases are added after the start): O(nodes + changed) per
        request size (list and dict copies), not O(cards x releases)."""
        planner = HoldPlanner(cards, self.releases, self.now, node_of=self._node_of, steps=self._steps)
        planner._before = (self, frozenset(c.node for c in changed))
        planner._exclude = self._exclude
        planner._node_cards = node_cards = dict(self._cards_by_node())
        new = {c.id: c for c in changed}
        for node in planner._before[1]:
            node_cards[node] = [new.get(c.id, c) for c in node_cards.get(node, ())]
        return planner

    def options(self, nbytes: int) -> list[tuple[str, list[tuple[float, int, int, int, str]]]]:
        found = self._options.get(nbytes)
        if found is None:
            found = self._options[nbytes] = list(self._options_by_node(nbytes).items())
        return found

    def _options_by_node(self, nbytes: int) -> dict[str, list[tuple[float, int, int, int, str]]]:
        """node -> its options for a request of ``nbytes`` (when, missing bytes, jobs, index, card
        id; sorted), for the nodes that have some: from the planners before along the starts
        (each one's changed nodes worked out again), or from every card."""
        chain: list[HoldPlanner] = []
        planner: HoldPlanner | None = self
        while planner is not None and nbytes not in planner._by_node:
            chain.append(planner)
            planner = planner._before[0] if planner._before is not None else None
        for planner in reversed(chain):
            if planner._before is None and planner._memo is not None:
                planner._by_node[nbytes] = planner._remembered(nbytes)
                continue
            if planner._before is None or nbytes not in planner._before[0]._by_node:
                found: dict[str, list[tuple[float, int, int, int, str]]] = defaultdict(list)
                for card in planner.cards:
                    if card.eligible and card.usable >= nbytes:
                        found[card.node].append(planner._option(card, nbytes))
                planner._by_node[nbytes] = {node: sorted(options) for node, options in found.items()}
                continue
            found = dict(planner._before[0]._by_node[nbytes])
            for node in planner._before[1]:
                options = sorted(planner._option(card, nbytes) for card in planner._cards_of(node)
                                 if card.eligible and card.usable >= nbytes)
                if options:
                    found[node] = options
                else:
                    found.pop(node, None)
            planner._by_node[nbytes] = found
        return self._by_node[nbytes]

    def _remembered(self, nbytes: int) -> dict[str, list[tuple[float, int, int, int, str]]]:
        """_options_by_node's answer from every card, each node's options taken from the memo
        when its option_inputs and ``now`` are those they were worked out from, else worked out
        from those inputs and remembered: the same function of the same values, so the same
        options. A node's inputs are taken once per planner, at their first use (its releases as
        they are then; a start's later appends are its changed nodes', which the planner after it
        works out again), and every size is worked out from them. Node order as the cards'."""
        memo = self._memo
        assert memo is not None
        kept = memo.setdefault(nbytes, {})
        found: dict[str, list[tuple[float, int, int, int, str]]] = {}
        for node, cards in self._cards_by_node().items():
            inputs = self._inputs.get(node)
            if inputs is None:
                inputs = self._inputs[node] = tuple(option_inputs(card, self.releases.get(card.id, ()))
                                                    for card in cards)
            was = kept.get(node)
            if was is not None and was[0] == self.now and was[1] == inputs:
                options = was[2]  # never changed in place: shared with the planners that took it
            else:
                options = []
                for card, its in zip(cards, inputs, strict=True):
                    if card.eligible and card.usable >= nbytes:
                        steps = self._input_steps.get(card.id)
                        if steps is None or steps[0] is not its:
                            steps = self._input_steps[card.id] = (its, release_steps(card, its[-1]))
                        free = card.free
                        options.append((fit_time(card, steps[1], nbytes, self.now, free), max(0, nbytes - free),
                                        card.jobs, card.index, card.id))
                options.sort()
                kept[node] = (self.now, inputs, options)
            if options:
                found[node] = options
        return found

    def _option(self, card: CardState, nbytes: int) -> tuple[float, int, int, int, str]:
        releases = self.releases.get(card.id, ())
        kept = self._steps.get(card.id)
        if kept is None or kept[0] is not card or kept[1] is not releases or kept[2] != len(releases):
            kept = self._steps[card.id] = (card, releases, len(releases), release_steps(card, releases))
        free = card.free
        return (fit_time(card, kept[3], nbytes, self.now, free), max(0, nbytes - free), card.jobs, card.index,
                card.id)

    def _cards_of(self, node: str) -> list[CardState]:
        return self._cards_by_node().get(node, [])

    def _cards_by_node(self) -> dict[str, list[CardState]]:
        """node -> its cards (worked out once for a round's first planner, then carried)."""
        if self._node_cards is None:
            found: dict[str, list[CardState]] = defaultdict(list)
            for card in self.cards:
                found[card.node].append(card)
            self._node_cards = dict(found)
        return self._node_cards

    def plan(self, request: Request, job_id: int = 0, exclude: Container[str] = frozenset(),
             prefer: Sequence[str] = ()) -> Hold | None:
        """plan_hold's answer: the best plan, or ``prefer`` (the cards the job holds already)
        where it can still serve the job and keeps_hold says it is about as good."""
        best = self._best(request, job_id, exclude)
        if not prefer or best is None or best.cards == tuple(prefer):
            return best
        kept = self._kept(request, prefer, exclude)
        if kept is None or not keeps_hold(kept, best.until, self.now):
            return best
        return Hold(job_id, tuple(prefer), request.nbytes, kept)

    def _kept(self, request: Request, prefer: Sequence[str], exclude: Container[str]) -> float | None:
        """When the cards ``prefer`` are expected to have room for ``request`` (epoch s; the latest
        of theirs, math.inf when unknown), or None when they cannot serve it: not ``request.gpus``
        distinct cards of one node of these cards, one held for another job (in ``exclude``),
        closed, or too small."""
        if len(set(prefer)) != request.gpus:
            return None
        nodes = {self._node_of.get(cid) for cid in prefer}
        if len(nodes) != 1 or None in nodes:
            return None
        by_id = {card.id: card for card in self._cards_of(next(iter(nodes)))}  # type: ignore[arg-type]
        until = -math.inf
        for cid in prefer:
            card = by_id.get(cid)
            if card is None or cid in exclude or not card.eligible or card.usable < request.nbytes:
                return None
            until = max(until, self._option(card, request.nbytes)[0])
        return until

    def _best(self, request: Request, job_id: int, exclude: Container[str]) -> Hold | None:
        if exclude is not self._exclude or not isinstance(exclude, dict):
            self._heaps.clear()  # another container: nothing kept says what it holds
            self._exclude = exclude
        size = (request.nbytes, request.gpus)
        state = self._heaps.get(size) or self._carried(size, exclude)
        if isinstance(exclude, dict) and len(exclude) < state[2]:  # (it only grows in a round)
            state = self._made(size, exclude)
        heap, versions, seen = state
        if isinstance(exclude, dict) and len(exclude) != seen:
            # The nodes whose cards ``exclude`` gained since this heap last looked: plans made again.
            nodes = {self._node_of.get(cid) for cid in itertools.islice(exclude, seen, None)}
            state[2] = len(exclude)
            by_node = self._options_by_node(request.nbytes)
            for node in nodes & by_node.keys():
                self._push(heap, versions, size, node, by_node[node], exclude)
        while heap:
            key, chosen, version = heap[0]
            if version == versions[key[2]]:
                return Hold(job_id, chosen, request.nbytes, key[0])
            heapq.heappop(heap)  # made before its node changed: a newer one follows
        return None

    def _carried(self, size: tuple[int, int], exclude: Container[str]) -> list:
        """This planner's heap state for ``size``: the nearest planner's before it along the
        starts (same ``exclude``) copied, with the plans of the nodes changed since made again;
        else made from every node's options."""
        changed: set[str] = set()
        planner = self
        found = None
        while planner._before is not None and isinstance(exclude, dict):
            changed |= planner._before[1]
            planner = planner._before[0]
            if planner._exclude is not exclude:
                break
            found = planner._heaps.get(size)
            if found is not None:
                break
        if found is None or len(exclude) < found[2]:  # type: ignore[arg-type]
            return self._made(size, exclude)
        state = self._heaps[size] = [list(found[0]), dict(found[1]), found[2]]
        by_node = self._options_by_node(size[0])
        for node in changed:  # (one with no options any more: its old plan goes out of date)
            self._push(state[0], state[1], size, node, by_node.get(node, ()), exclude)
        return state

    def _made(self, size: tuple[int, int], exclude: Container[str]) -> list:
        """A heap state for ``size`` made from every node's options (plan's)."""
        heap: list = []
        versions: dict[str, int] = {}
        state = self._heaps[size] = [heap, versions, len(exclude) if isinstance(exclude, dict) else 0]
        for node, options in self.options(size[0]):
            self._push(heap, versions, size, node, options, exclude)
        return state

    @staticmethod
    def _push(heap: list, versions: dict[str, int], size: tuple[int, int], node: str,
              options: Sequence[tuple[float, int, int, int, str]], exclude: Container[str]) -> None:
        """Push ``node``'s plan for ``size`` (its first options outside ``exclude``), the node's
        earlier one out of date; none when it has too few."""
        version = versions[node] = versions.get(node, -1) + 1
        gpus = size[1]
        chosen = []
        for option in options:
            if option[4] not in exclude:
                chosen.append(option)
                if len(chosen) == gpus:
                    break
        if len(chosen) == gpus:
            if gpus == 1:
                key = (chosen[0][0], chosen[0][1], node)
            else:  # options are sorted by time: the last chosen is the latest
                key = (chosen[-1][0], sum(o[1] for o in chosen), node)
            heapq.heappush(heap, (key, tuple(o[4] for o in chosen), version))


def option_inputs(card: CardState, releases: Sequence[Release]) -> tuple:
    """Everything HoldPlanner reads of ``card`` and its ``releases`` to make its option for a
    request (besides the request and ``now``): whether it is eligible, usable and free bytes, jobs
    and their cap, its index and id (release_steps and fit_time read free, jobs and max_jobs; the
    releases every field). Equal inputs, equal options: what a round may take from an earlier
    one's planner (HoldPlanner's ``memo``). Kept beside _option: a field it comes to read goes here."""
    return (card.id, card.index, card.eligible, card.usable, card.free, card.jobs, card.max_jobs, tuple(releases))


def room_for_one(card: CardState) -> int | None:
    """The largest request (bytes per card) ``card`` takes now, or None when it takes none:
    ``fits(card, Request(n))`` holds exactly for ``1 <= n <= room_for_one(card)`` (CardState.refusal,
    the one rule, with its memory test read the other way)."""
    if card.refusal(0) is not None:
        return None
    return card.usable - card.reserved - card.foreign


class Capacity:
    """What ``cards`` could place now, per number of cards: ``place(cards, request)`` is None
    exactly when ``could_place(request)`` is False (a node needs ``gpus`` cards that each fit).
    O(cards log cards) once, then O(1) per request: the dispatcher's round skips place (an
    O(cards) walk) for the many waiting jobs that fit nowhere."""

    def __init__(self, cards: Sequence[CardState]) -> None:
        rooms: dict[str, list[int]] = defaultdict(list)
        for card in cards:
            room = room_for_one(card)
            if room is not None:
                rooms[card.node].append(room)
        #: number of cards -> the largest request of that many cards on one node (bytes each)
        self.best: dict[int, int] = {}
        for node_rooms in rooms.values():
            node_rooms.sort(reverse=True)
            for gpus, room in enumerate(node_rooms, start=1):
                if room > self.best.get(gpus, -1):
                    self.best[gpus] = room

    def could_place(self, request: Request) -> bool:
        return request.nbytes <= self.best.get(request.gpus, -1)


def may_backfill(card: CardState, releases: Sequence[Release], hold: Hold, request: Request,
                 expected_end: float | None, held_since: float | None = None, *,
                 room: Callable[[CardState, Sequence[Release], Hold, Request, float | None], bool] | None = None,
                 ) -> bool:
    """May ``request`` start now on ``card``, which is held for ``hold``, without delaying it?
    Yes if it is taken to end by the hold's shadow time (``expected_end``: its time limit's end,
    or its cautious estimate while the held job's budget lasts), or if the card will still have
    room for the held job at that time with this one on it (:func:`leaves_room`; ``room``: the
    same answer remembered by a caller that asks it for many jobs alike). Never when the shadow
    time is unknown."""
    if hold.until == math.inf:
        return False
    if expected_end is not None and expected_end <= hold.until:
        return True
    return (room or leaves_room)(card, releases, hold, request, held_since)


def leaves_room(card: CardState, releases: Sequence[Release], hold: Hold, request: Request,
                held_since: float | None = None) -> bool:
    """Will ``card`` still have room for ``hold``'s job at its shadow time with ``request`` on it
    (may_backfill's second way)? Counting the expected ends of the jobs that were there when it
    began to hold (``held_since``: what its shadow time waits for), but of jobs that came after
    only their sure ends (a backfill whose estimate proves wrong must not be counted on to leave)."""
    free, jobs = room_at(card, releases, hold.until, before=held_since)
    return free - request.nbytes >= hold.nbytes and jobs + 2 <= card.max_jobs


def could_take(cards: Sequence[CardState]) -> list[CardState]:
    """The cards a job could run on some day: every registered card still on its node, allowed
    by gpu_whitelist or not. A narrowed whitelist is often a maintenance step, undone later: a
    job that fits only cards outside it waits (rig.waiting says so), it is never failed for it."""
    return [c for c in cards if not c.gone]


def never_fits(cards: Sequence[CardState], request: Request) -> str | None:
    """Why the job could not run even on empty cards, or None if it could some day. THE rule of
    "can never run" (submission refusal, the dispatcher's unschedulable end, rig forget-node).

    Counts :func:`could_take` cards: in gpu_whitelist or not (a whitelist may widen again),
    unhealthy ones too (they may recover); not cards gone from their node.
    """
    candidates = could_take(cards)
    if not candidates:
        return "no cards are registered yet (is `rig up` running?)" if not cards else (
            "every card registered is gone from its node"
        )
    big_enough: dict[str, int] = defaultdict(int)
    for card in candidates:
        if card.usable >= request.nbytes:
            big_enough[card.node] += 1
    if not big_enough:
        largest = max(candidates, key=lambda c: c.usable)
        return (
            f"needs {format_memory(request.nbytes)} per card but the largest card offers "
            f"{format_memory(largest.usable)} usable ({largest.id}, {format_memory(largest.total)} "
            f"less the reserve); ask for less memory"
        )
    best = max(big_enough.values())
    if best < request.gpus:
        return (
            f"needs {request.gpus} cards on one node but at most {best} card(s) with "
            f"{format_memory(request.nbytes)} exist on any node; ask for fewer cards"
        )
    return None


def only_outside_whitelist(cards: Sequence[CardState], request: Request, *,
                           all_allowed: bool | None = None) -> list[CardState]:
    """When no node's allowed cards could ever hold the job but cards outside gpu_whitelist
    could (:func:`could_take`): those cards (of the nodes where enough of them are big enough),
    else []. The job then waits for the whitelist to name them. ``all_allowed``: whether every
    card of ``cards`` is allowed, when the caller knows (CardWalk.all_allowed)."""
    def per_node(pick: Sequence[CardState]) -> dict[str, list[CardState]]:
        found: dict[str, list[CardState]] = defaultdict(list)
        for c in pick:
            if c.usable >= request.nbytes:
                found[c.node].append(c)
        return {n: cs for n, cs in found.items() if len(cs) >= request.gpus}

    if all_allowed if all_allowed is not None else all(c.allowed for c in cards):
        return []  # (what follows returns only cards outside the whitelist: none) O(cards), no dicts
    candidates = could_take(cards)
    if per_node([c for c in candidates if c.allowed]):
        return []
    return [c for cs in per_node(candidates).values() for c in cs if not c.allowed]


class CardWalk:
    """What a wait explanation reads of one list of cards, worked out once for many
    explanations over it (the dispatcher words hundreds a round over the same cards, each less
    a few held ones): the cards that take jobs (CardState.eligible) from the most free memory
    down (then the lower index, then the earlier in the list: explain_wait's "largest" first),
    the allowed but unhealthy ones, whether every card is allowed, and the cards that take a
    request now (``index``: anything with rig.card_index.RoomIndex's ``fitting``; else a walk).
    An explanation over ``cards`` less a set of held card ids then costs O(held cards met from
    the top + cards with the free memory asked for), not O(cards). Card ids are taken as unique
    among the eligible cards (node/index: a damaged record is never eligible)."""

    def __init__(self, cards: Sequence[CardState], index: object | None = None) -> None:
        self.cards = cards
        self.index = index
        ranked = sorted((-c.free, c.index, position) for position, c in enumerate(cards) if c.allowed and c.healthy)
        self.by_free = [cards[position] for _free, _index, position in ranked]
        self.positions = [position for _free, _index, position in ranked]
        self._less_free = [free for free, _index, _position in ranked]  # -free, ascending
        self.closed = [c for c in cards if c.allowed and not c.healthy]
        self.all_allowed = all(c.allowed for c in cards)

    def roomy(self, nbytes: int) -> int:
        """How many of by_free (its first ones) have at least ``nbytes`` free."""
        return bisect.bisect_right(self._less_free, -nbytes)

    def largest(self, held: Container[str]) -> CardState | None:
        """The eligible card with the largest free block outside ``held`` (explain_wait's)."""
        for card in self.by_free:
            if card.id not in held:
                return card
        return None

    def fitting(self, request: Request) -> list[CardState]:
        """The cards that take ``request`` now (fits), in no set order."""
        if self.index is not None:
            return self.index.fitting(request.nbytes)  # type: ignore[attr-defined]
        return [c for c in self.cards if fits(c, request)]


def explain_wait(cards: Sequence[CardState], request: Request, *, walk: CardWalk | None = None,
                 held: Container[str] = frozenset()) -> str:
    """A person-readable reason why ``request`` cannot be placed now (assumes it can't), over
    ``cards``. With ``walk`` (a CardWalk of some list): over that list less the cards whose ids
    are in ``held`` (``cards`` is then those cards, read only to name closed cards per node)."""
    if walk is None:
        walk = CardWalk(cards)
    need = f"needs {format_memory(request.nbytes)}"
    need += " on 1 card" if request.gpus == 1 else f" on each of {request.gpus} cards of one node"
    closed = [c for c in walk.closed if c.id not in held] if held else walk.closed
    largest = walk.largest(held)
    if largest is None:
        # Name the cause (a node that cannot write logs, a stopped node, a hot card), never
        # only "no healthy card" (rig.closed_cards words it, grouped per node).
        why = closed_cards_text(closed or [c for c in cards if not c.eligible], node_cards=cards)
        return f"{need}; no card takes jobs now ({why})" if why else f"{need}; no card is registered"
    parts = [need, f"largest free block {format_memory(largest.free)} ({largest.id})"]
    count = walk.roomy(request.nbytes)
    roomy = [(position, c) for position, c in zip(walk.positions[:count], walk.by_free[:count], strict=True)
             if c.id not in held]
    if roomy and all(c.jobs >= c.max_jobs for _position, c in roomy):
        first = min(roomy, key=lambda pc: pc[0])[1]  # the first of them in the list, as a walk meets it
        parts.append(f"cards with that much free already run their maximum of {first.max_jobs} jobs")
    elif request.gpus > 1 and roomy:
        per_node: dict[str, int] = defaultdict(int)
        for _position, c in roomy:
            if c.jobs < c.max_jobs:
                per_node[c.node] += 1
        best = max(per_node.values(), default=0)
        parts.append(f"only {best} such card(s) free on one node")
    if closed:
        parts.append(closed_cards_text(closed, node_cards=cards))
    return "; ".join(parts)
