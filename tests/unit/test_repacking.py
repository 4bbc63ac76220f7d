"""rig.alerts.repacking_makes_room: its answer, and how much work a check at 512 cards takes
(the alert check runs in the leading dispatcher's control worker, beside its passes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rig.alerts import repacking_makes_room
from rig.memory import GIB
from rig.models import CardState

CARDS = 512


@pytest.fixture
def refusals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts CardState.refusal's calls: the unit of a repacking check's work."""
    calls = [0]
    refusal = CardState.refusal

    def counted(card: CardState, nbytes: int) -> str | None:
        calls[0] += 1
        return refusal(card, nbytes)

    monkeypatch.setattr(CardState, "refusal", counted)
    yield calls


def card(index: int, reserved_gib: int, jobs: int, max_jobs: int = 4) -> CardState:
    return CardState(node="n", index=index, total=80 * GIB, usable=76 * GIB, reserved=reserved_gib * GIB,
                     jobs=jobs, max_jobs=max_jobs)


def test_jobs_no_other_card_takes_are_not_tried_on_every_card(refusals: list[int]):
    """512 cards each running three 20 GiB jobs (16 GiB free, room for a fourth job) against a
    70 GiB request: no job fits another card, yet every job of every card was tried on every
    other card (~800,000 refusals, 0.15-0.5 s a check); the largest room another card offers
    says so at once."""
    cards = [card(i, 60, 3) for i in range(CARDS)]
    holdings = {c.id: {3 * c.index + k: 20 * GIB for k in range(3)} for c in cards}
    assert not repacking_makes_room(cards, holdings, 70 * GIB)
    assert refusals[0] < 10 * CARDS


def test_a_card_its_pinned_jobs_keep_full_is_skipped(refusals: list[int]):
    """Each pair of cards shares a 2-card 40 GiB job (never moved) and each card runs two 5 GiB
    jobs: moving both still leaves no 40 GiB block, yet each card's 5 GiB jobs were moved, one
    walk of every card each (~500,000 refusals)."""
    cards = [card(i, 50, 3, max_jobs=8) for i in range(CARDS)]
    holdings = {c.id: {c.index // 2: 40 * GIB, 1000 + 2 * c.index: 5 * GIB, 1001 + 2 * c.index: 5 * GIB}
                for c in cards}
    assert not repacking_makes_room(cards, holdings, 40 * GIB)
    assert refusals[0] < 10 * CARDS


def test_moves_that_make_room_are_still_found():
    """Card 0's two 20 GiB jobs fit cards 1 and 2 (30 GiB free each): a 70 GiB block on card 0."""
    cards = [card(0, 40, 2), card(1, 46, 1), card(2, 46, 1)]
    holdings = {"n/0": {1: 20 * GIB, 2: 20 * GIB}, "n/1": {3: 46 * GIB}, "n/2": {4: 46 * GIB}}
    assert repacking_makes_room(cards, holdings, 70 * GIB)
    # With card 2 at its job cap only one job can move: 56 GiB is no 70 GiB block.
    cards[2] = card(2, 46, 1, max_jobs=1)
    assert not repacking_makes_room(cards, holdings, 70 * GIB)
    # A job of 0 bytes moves too, and with no other card to take it the check says no.
    assert not repacking_makes_room([card(0, 76, 2)], {"n/0": {1: 0, 2: 76 * GIB}}, 70 * GIB)
