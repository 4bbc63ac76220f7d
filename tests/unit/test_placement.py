from rig.memory import GIB
from rig.models import CardState
from rig.placement import Request, explain_wait, fits, never_fits, place


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
    assert never_fits([card(0, 80, allowed=False)], Request(GIB)) == "no card is in gpu_whitelist"
    assert "no cards are registered" in never_fits([], Request(GIB))
    # A busy or unhealthy card may free up or recover: not "never".
    assert never_fits([card(0, 0, jobs=4, healthy=False)], Request(GIB)) is None


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


def test_reservation_holds_the_cards_closest_to_fitting():
    from rig.placement import reservation_for

    cards = [card(0, 10), card(1, 30), card(2, 5), card(3, 25, node="b")]
    assert reservation_for(cards, Request(40 * GIB)) == ("n1/1",)
    assert reservation_for(cards, Request(40 * GIB), exclude={"n1/1"}) == ("b/3",)
    assert reservation_for(cards, Request(40 * GIB, gpus=2)) == ("n1/1", "n1/0")
    assert reservation_for(cards, Request(90 * GIB)) == ()
