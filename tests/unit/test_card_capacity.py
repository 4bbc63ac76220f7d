"""A card that takes no job by configuration (outside gpu_whitelist, gone from its node) is no
free capacity in any report (issue 11, item 2 follow-up), and the status/jobs tables stay
readable at 80 columns."""

from __future__ import annotations

import io

from prometheus_client.core import Metric
from rich.console import Console

from rig.cli.as_json import card_dict
from rig.cli.render import render_status
from rig.client import StatusReport
from rig.memory import GIB
from rig.metrics import _card_families
from rig.models import CardState


def _card(index: int, **fields: object) -> CardState:
    return CardState(node="n1", index=index, total=24 * GIB, usable=24 * GIB, **fields)  # type: ignore[arg-type]


CARDS = [_card(0), _card(1, allowed=False), _card(2, allowed=False, gone=True), _card(3, allowed=False, gone=True)]


def _metric(name: str, cards: list[CardState]) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in _card_families(cards):
        assert isinstance(family, Metric)
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels["gpu"] if "gpu" in sample.labels else str(sample.labels)] = sample.value
    return found


def test_closed_cards_are_no_free_capacity():
    assert [c.free for c in CARDS] == [24 * GIB, 0, 0, 0]
    assert [card_dict(c)["free"] for c in CARDS] == [24 * GIB, 0, 0, 0]
    assert [card_dict(c)["healthy"] for c in CARDS] == [True, True, False, False]
    assert [card_dict(c)["takes_jobs"] for c in CARDS] == [True, False, False, False]
    assert sorted(_metric("rig_card_free_bytes", CARDS).values()) == [0, 0, 0, 24 * GIB]
    assert sorted(_metric("rig_card_healthy", CARDS).values()) == [0, 0, 1, 1]


def test_status_counts_only_the_cards_on_the_node():
    out = io.StringIO()
    render_status(StatusReport(cards=CARDS, running={}, pending={}, oldest_wait={}, workers=[], counts={}),
                  Console(file=out, width=200, color_system=None))
    assert "4 card(s)" not in out.getvalue()
    assert "n1: 2 card(s)" in out.getvalue() or "never heartbeated" in out.getvalue(), out.getvalue()
