"""`rig status` and `rig top` show why a card takes no jobs (issue 11, item 2): every
bracketed flag reaches the screen as typed, never eaten as a rich tag."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rig.cli.render import card_flags, render_status
from rig.cli.top import _card_flags
from rig.client import StatusReport, WorkerInfo
from rig.memory import GIB
from rig.models import CardState, Job, JobState, Priority


def _card(index: int, **fields: object) -> CardState:
    return CardState(node="n1", index=index, total=24 * GIB, usable=24 * GIB, **fields)  # type: ignore[arg-type]


#: (card fields, what the screen must show)
CASES = [
    ({"allowed": False}, "[not in whitelist]"),
    ({"allowed": False, "gone": True}, "[not on the node any more]"),
    ({"healthy": False, "health_reason": "temperature 95 C > 90 C"}, "[UNHEALTHY: temperature 95 C > 90 C]"),
    ({"healthy": False, "health_reason": "[bold]node stopped[/]"}, "[UNHEALTHY: [bold]node stopped[/]]"),
    ({"healthy": False}, "[UNHEALTHY]"),
    ({"foreign": 2 * GIB}, "[others use 2.0 GiB]"),
]


def _status(cards: list[CardState], width: int, running: dict | None = None,
            workers: list[WorkerInfo] | None = None) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    render_status(StatusReport(cards=cards, running=running or {}, pending={}, oldest_wait={}, workers=workers or [],
                               counts={}), console)
    return out.getvalue()


@pytest.mark.parametrize(("fields", "shown"), CASES, ids=[c[1] for c in CASES])
def test_each_flag_is_visible_in_rig_status(fields, shown):
    text = _status([_card(0, **fields)], width=220)
    assert shown in text, text
    # rig top builds Text, not markup: the same words show there.
    top = "[others 2.0G]" if "foreign" in fields else shown
    assert top in _card_flags(_card(0, **fields), wide=True).plain


@pytest.mark.parametrize(("fields", "shown"), CASES, ids=[c[1] for c in CASES])
def test_flags_are_escaped_markup(fields, shown):
    out = io.StringIO()
    Console(file=out, width=220, color_system=None).print(card_flags(_card(0, **fields)))
    assert out.getvalue().strip() == shown


def test_a_narrow_screen_still_says_why_each_card_takes_no_jobs():
    """On 80 columns the table's last column is cut: one line per closed card below it."""
    job = Job(id=7, name="train", user="u", command=["x"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
              state=JobState.RUNNING, workdir="/", created_at=0.0, node="n1", cards=[1])
    text = _status([_card(0), _card(1, allowed=False), _card(2, allowed=False, gone=True),
                    _card(3, healthy=False, health_reason="cannot be read: [x]")], width=80,
                   running={"n1/1": [job]}, workers=[WorkerInfo("card1@n1", "card", "n1", 1, 10, 1, 0.0)])
    text = " ".join(text.split())  # a line longer than the screen wraps
    assert "n1/1 takes no new jobs: not in whitelist; its 1 running job(s) are watched until they end" in text
    assert "n1/2 takes no new jobs: not on the node any more" in text
    assert "n1/3 takes no new jobs: unhealthy (cannot be read: [x])" in text
    assert "n1/0 takes" not in text


def test_a_closed_card_whose_jobs_nobody_watches_says_so():
    """Never "watched" when no worker of the card is alive (the state before this fix)."""
    job = Job(id=7, name="train", user="u", command=["x"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
              state=JobState.RUNNING, workdir="/", created_at=0.0, node="n1", cards=[2])
    text = " ".join(_status([_card(2, allowed=False)], width=200, running={"n1/2": [job]}).split())
    assert ("n1/2 takes no new jobs: not in whitelist; its 1 running job(s) have no card worker watching them "
            "now") in text
    assert "watched until" not in text


def test_a_node_without_cards_is_not_called_absent():
    """A node frozen because its Redis came back empty has no cards: rig status says FROZEN,
    never "no rig node is up" beside it."""
    from rig.nodes import NodeInfo

    out = io.StringIO()
    frozen = NodeInfo(name="bwnode2", alive=True, state="up", since=None, workers=3, mismatch="Redis lost its data")
    render_status(StatusReport(cards=[], running={}, pending={}, oldest_wait={}, workers=[], counts={},
                               nodes=[frozen]), Console(file=out, width=200, color_system=None))
    assert "node bwnode2: FROZEN: Redis lost its data" in out.getvalue() and "no rig node is up" not in out.getvalue()


def test_cards_closed_for_the_same_words_are_said_in_one_line():
    """A stopped node's 8 cards gave 8 identical lines under its table."""
    reason = "node n1 is stopped since 12:00:00"
    text = " ".join(_status([_card(i, healthy=False, health_reason=reason) for i in range(3)], width=200).split())
    assert f"all 3 cards of n1 take no new jobs: unhealthy ({reason})" in text
    assert text.count("take no new jobs") + text.count("takes no new jobs") == 1
    mixed = " ".join(_status([_card(0, allowed=False), _card(1), _card(2, allowed=False)], width=200).split())
    assert "n1/0, n1/2 take no new jobs: not in whitelist" in mixed
