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
