import dataclasses
import math

from rig.memory import GIB
from rig.models import CardState
from rig.placement import (
    Hold,
    Release,
    Request,
    earliest_fit,
    explain_wait,
    fits,
    keeps_hold,
    may_backfill,
    never_fits,
    only_outside_whitelist,
    place,
    plan_hold,
    room_at,
)


def card(index, free_gib, *, node="n1", total_gib=80, jobs=0, max_jobs=4, allowed=True, healthy=True):
    usable = total_gib * GIB
    return CardState(node=node, index=index, total=total_gib * GIB, usable=usable,
                     reserved=usable - free_gib * GIB, jobs=jobs, max_jobs=max_jobs,
                     allowed=allowed, healthy=healthy)


CARDS = [card(0, 30), card(1, 10), card(2, 60), card(3, 20)]


def test_first_fit_takes_lowest_index_that_fits():
    assert place(CARDS, Request(15 * GIB), "first-fit").cards == (0,)
    assert place(CARDS, Request(5 * GIB), "first-fit").cards == (0,)


def test_least_loaded_takes_most_free():
    assert place(CARDS, Request(5 * GIB), "least-loaded").cards == (2,)


def test_best_fit_takes_tightest():
    assert place(CARDS, Request(15 * GIB), "best-fit").cards == (3,)
    assert place(CARDS, Request(10 * GIB), "best-fit").cards == (1,)
    assert place(CARDS, Request(25 * GIB), "best-fit").cards == (0,)


def test_nothing_fits_returns_none():
    for strategy in ("first-fit", "least-loaded", "best-fit"):
        assert place(CARDS, Request(61 * GIB), strategy) is None


def test_job_cap_blocks_a_card_with_free_memory():
    cards = [card(0, 70, jobs=4), card(1, 5)]
    assert not fits(cards[0], Request(GIB))
    assert place(cards, Request(GIB), "best-fit").cards == (1,)
    assert place([cards[0]], Request(GIB), "first-fit") is None


def test_whitelist_and_health_exclude_cards():
    cards = [card(0, 70, allowed=False), card(1, 70, healthy=False), card(2, 10)]
    assert place(cards, Request(5 * GIB), "least-loaded").cards == (2,)
    assert place(cards, Request(20 * GIB), "least-loaded") is None


def test_multi_gpu_all_or_nothing_on_one_node():
    cards = [card(0, 40, node="a"), card(1, 10, node="a"), card(0, 40, node="b"), card(1, 40, node="b")]
    p = place(cards, Request(30 * GIB, gpus=2), "best-fit")
    assert p.node == "b" and p.cards == (0, 1)
    assert place(cards, Request(30 * GIB, gpus=3), "best-fit") is None


def test_multi_gpu_best_fit_chooses_tight_cards():
    cards = [card(0, 80), card(1, 21), card(2, 22), card(3, 79)]
    assert place(cards, Request(20 * GIB, gpus=2), "best-fit").cards == (1, 2)
    assert place(cards, Request(20 * GIB, gpus=2), "least-loaded").cards == (0, 3)
    assert place(cards, Request(20 * GIB, gpus=2), "first-fit").cards == (0, 1)


def test_never_fits_explains():
    cards = [card(i, 80) for i in range(2)]
    assert never_fits(cards, Request(40 * GIB)) is None
    assert "largest card offers" in never_fits(cards, Request(81 * GIB))
    assert "needs 3 cards" in never_fits(cards, Request(GIB, gpus=3))
    # A card outside gpu_whitelist may be named again (a maintenance narrowing): not "never".
    assert never_fits([card(0, 80, allowed=False)], Request(GIB)) is None
    assert never_fits([card(0, 80), card(1, 80, allowed=False)], Request(GIB, gpus=2)) is None
    assert "at most 2 card(s)" in never_fits([card(0, 80), card(1, 80, allowed=False)], Request(GIB, gpus=3))
    # A card gone from its node is no place to run.
    gone = dataclasses.replace(card(1, 80, allowed=False), gone=True)
    assert "needs 2 cards" in never_fits([card(0, 80), gone], Request(GIB, gpus=2))
    assert "gone from its node" in never_fits([gone], Request(GIB))
    assert "no cards are registered" in never_fits([], Request(GIB))
    # A busy or unhealthy card may free up or recover: not "never".
    assert never_fits([card(0, 0, jobs=4, healthy=False)], Request(GIB)) is None


def test_only_outside_whitelist_names_the_cards_that_could_take_it():
    cards = [card(0, 80, total_gib=24), card(1, 80, allowed=False), card(2, 80, allowed=False)]
    assert [c.id for c in only_outside_whitelist(cards, Request(2 * GIB, gpus=2))] == ["n1/1", "n1/2"]
    assert [c.id for c in only_outside_whitelist(cards, Request(40 * GIB))] == ["n1/1", "n1/2"]
    assert only_outside_whitelist(cards, Request(GIB)) == []  # the allowed card can take it


def test_explain_wait_names_the_largest_free_block():
    text = explain_wait(CARDS, Request(70 * GIB))
    assert text.startswith("needs 70.0 GiB on 1 card")
    assert "largest free block 60.0 GiB (n1/2)" in text
    full = [card(0, 70, jobs=4, max_jobs=4)]
    assert "maximum of 4 jobs" in explain_wait(full, Request(GIB))


def test_multi_factor_packs_used_cards_and_keeps_empty_ones_whole():
    cards = [card(0, 80), card(1, 50, jobs=1), card(2, 80), card(3, 80)]
    assert place(cards, Request(10 * GIB), "multi-factor").cards == (1,)
    # A 2-card job then still finds two whole cards.
    assert place(cards, Request(80 * GIB, gpus=2), "multi-factor").cards == (0, 2)


def test_multi_factor_avoids_stranding_memory_nobody_waiting_can_use():
    # Card 0 would keep 3 GiB (too small for the smallest waiting job, 4 GiB): stranded.
    # Card 1 would keep 20 GiB, still useful. Best-fit picks card 0; multi-factor card 1.
    cards = [card(0, 13, jobs=1), card(1, 30, jobs=1)]
    assert place(cards, Request(10 * GIB), "best-fit").cards == (0,)
    assert place(cards, Request(10 * GIB), "multi-factor", smallest_waiting=4 * GIB).cards == (1,)
    # With no small jobs waiting, the tight fit wins.
    assert place(cards, Request(10 * GIB), "multi-factor", smallest_waiting=2 * GIB).cards == (0,)


def test_multi_factor_prefers_cooler_cards_on_a_tie():
    cool, hot = card(0, 80, jobs=1), card(1, 80, jobs=1)
    cool.temperature, hot.temperature = 45, 85
    assert place([hot, cool], Request(GIB), "multi-factor").cards == (0,)


def test_hold_without_known_ends_takes_the_cards_closest_to_fitting():
    cards = [card(0, 10), card(1, 30), card(2, 5), card(3, 25, node="b")]

    def held(request, exclude=frozenset()):
        hold = plan_hold(cards, {}, request, now=100.0, exclude=exclude)
        return hold and (hold.cards, hold.until)

    assert held(Request(40 * GIB)) == (("n1/1",), math.inf)
    assert held(Request(40 * GIB), exclude={"n1/1"}) == (("b/3",), math.inf)
    assert held(Request(40 * GIB, gpus=2)) == (("n1/1", "n1/0"), math.inf)
    assert held(Request(90 * GIB)) is None


def test_hold_takes_the_card_expected_to_free_first():
    # gpu0 is closest to fitting now, but its job runs for an hour; gpu1 frees in 5 s.
    cards = [card(0, 30), card(1, 10)]
    releases = {"n1/0": [Release(3700.0, 50 * GIB)], "n1/1": [Release(105.0, 70 * GIB)]}
    hold = plan_hold(cards, releases, Request(60 * GIB), now=100.0, job_id=7)
    assert hold == Hold(7, ("n1/1",), 60 * GIB, 105.0)
    # Two cards: the shadow time is the later of the two.
    hold = plan_hold(cards, releases, Request(60 * GIB, gpus=2), now=100.0)
    assert hold.cards == ("n1/1", "n1/0") and hold.until == 3700.0


def test_earliest_fit_counts_releases_in_time_order_and_job_slots():
    c = card(0, 10, jobs=4)  # full on slots too
    releases = [Release(130.0, 20 * GIB), Release(110.0, 5 * GIB), Release(math.inf, 40 * GIB)]
    assert earliest_fit(c, releases, Request(12 * GIB), now=100.0) == 110.0
    assert earliest_fit(c, releases, Request(30 * GIB), now=100.0) == 130.0
    assert earliest_fit(c, releases, Request(50 * GIB), now=100.0) == math.inf
    assert earliest_fit(card(1, 80), [], Request(50 * GIB), now=100.0) == 100.0
    assert room_at(c, releases, 120.0) == (15 * GIB, 3)


def test_backfill_on_a_held_card_only_when_it_cannot_delay_the_held_job():
    c = card(0, 20, jobs=1)  # a 56 GiB job ends at t=200; the held job needs 60 GiB from then
    releases = [Release(200.0, 56 * GIB)]
    hold = Hold(1, ("n1/0",), 60 * GIB, 200.0)
    assert may_backfill(c, releases, hold, Request(8 * GIB), expected_end=150.0)  # ends first
    assert may_backfill(c, releases, hold, Request(8 * GIB), expected_end=None)  # leaves 68 GiB at 200
    assert not may_backfill(c, releases, hold, Request(18 * GIB), expected_end=None)  # 58 < 60
    assert not may_backfill(c, releases, hold, Request(18 * GIB), expected_end=250.0)
    unknown = Hold(1, ("n1/0",), 60 * GIB, math.inf)
    assert not may_backfill(c, releases, unknown, Request(GIB), expected_end=101.0)
    # The job slot counts too: with the held job and this one, 4 slots must suffice.
    roomy = card(1, 70, jobs=2)
    assert may_backfill(roomy, [], hold, Request(GIB), expected_end=None)
    crowded = card(1, 70, jobs=3)
    assert not may_backfill(crowded, [], hold, Request(GIB), expected_end=None)


def test_keeps_hold_within_ten_seconds_or_ten_percent_of_the_best():
    now = 1000.0
    assert keeps_hold(1060.0, 1055.0, now)  # 5 s later: within 10 s
    assert not keeps_hold(1066.0, 1055.0, now)  # 11 s later, 10 % of 55 s is 5.5 s
    assert keeps_hold(1000.0 + 330.0, 1000.0 + 300.0, now)  # 30 s later, 10 % of 300 s
    assert not keeps_hold(1000.0 + 331.0, 1000.0 + 300.0, now)
    assert keeps_hold(math.inf, math.inf, now)  # the best's time unknown: it keeps its cards
    assert not keeps_hold(math.inf, 2000.0, now)  # a known time is clearly earlier than none
    assert keeps_hold(1010.0, 1010.0, now)


def test_a_hold_keeps_its_cards_until_others_are_clearly_earlier_or_it_cannot_use_them():
    cards = [card(i, 20) for i in range(4)]  # 60 GiB jobs on each; card 2 frees first

    def releases(ends):
        return {f"n1/{i}": [Release(at, 60 * GIB)] for i, at in enumerate(ends)}

    request = Request(70 * GIB)
    assert plan_hold(cards, releases([208, 205, 200, 209]), request, 100.0).cards == ("n1/2",)
    kept = plan_hold(cards, releases([208, 205, 200, 209]), request, 100.0, prefer=("n1/0",))
    assert kept.cards == ("n1/0",) and kept.until == 208.0  # 8 s later than the best: kept
    moved = plan_hold(cards, releases([240, 205, 200, 209]), request, 100.0, prefer=("n1/0",))
    assert moved.cards == ("n1/2",)  # 40 s later (10 % of 100 s is 10 s): it moves
    assert plan_hold(cards, releases([208, 205, 200, 209]), request, 100.0, exclude={"n1/0"},
                     prefer=("n1/0",)).cards == ("n1/2",)  # held for a job ahead of it now
    closed = [dataclasses.replace(c, allowed=False) if c.index == 0 else c for c in cards]
    assert plan_hold(closed, releases([208, 205, 200, 209]), request, 100.0,
                     prefer=("n1/0",)).cards == ("n1/2",)  # its card closed
    assert plan_hold(cards, releases([208, 205, 200, 209]), Request(70 * GIB, gpus=2), 100.0,
                     prefer=("n1/0",)).cards != ("n1/0",)  # one card no longer serves a 2-card job
    unknown = {f"n1/{i}": [Release(math.inf, 60 * GIB)] for i in range(4)}
    assert plan_hold(cards, unknown, request, 100.0, prefer=("n1/3",)).cards == ("n1/3",)
