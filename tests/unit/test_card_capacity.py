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


def test_the_cards_of_a_stopped_or_down_node_take_no_jobs_in_any_report():
    """After `rig down` of a lone node (no other node's health pass closes its cards), `rig
    status --json` said takes_jobs: true of its four cards while the node line said it takes no
    jobs; the web page drew them open. Its cards' own records are left as they were."""
    from rig.cli.as_json import status_dict
    from rig.nodes import NodeInfo
    from rig.web.overview import _cards

    cards = [_card(0), CardState(node="n2", index=0, total=24 * GIB, usable=24 * GIB)]
    for state, takes in (("up", True), ("stopped", False), ("down", False)):
        report = StatusReport(cards=cards, running={}, pending={}, oldest_wait={}, workers=[], counts={},
                              nodes=[NodeInfo(name="n1", alive=state == "up", state=state, since=None)])
        assert [c["takes_jobs"] for c in status_dict(report)["cards"]] == [takes, True], state  # n2: no record
        assert [c["takes_jobs"] for c in _cards(report)] == [takes, True], state
        assert [c["free"] for c in status_dict(report)["cards"]] == [24 * GIB, 24 * GIB]


def test_status_counts_only_the_cards_on_the_node():
    out = io.StringIO()
    render_status(StatusReport(cards=CARDS, running={}, pending={}, oldest_wait={}, workers=[], counts={}),
                  Console(file=out, width=200, color_system=None))
    assert "4 card(s)" not in out.getvalue()
    assert "n1: 2 card(s)" in out.getvalue() or "never heartbeated" in out.getvalue(), out.getvalue()


def _screen(width: int, draw) -> str:  # noqa: ANN001
    out = io.StringIO()
    draw(Console(file=out, width=width, force_terminal=False, color_system=None))
    return out.getvalue()


def test_status_at_80_columns_cuts_no_heading_and_no_flag():
    from rig.models import Job, JobState, Priority

    job = Job(id=7, name="train", user="u", command=["x"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
              state=JobState.RUNNING, workdir="/", created_at=0.0, node="n1", cards=[1])
    cards = [_card(0, model="NVIDIA A100-SXM4-80GB"), _card(1, allowed=False, model="NVIDIA A100-SXM4-80GB")]
    report = StatusReport(cards=cards, running={"n1/1": [job]}, pending={}, oldest_wait={}, workers=[], counts={})
    text = _screen(80, lambda console: render_status(report, console))
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    for heading in ("card", "reserved", "free", "jobs", "running"):
        assert heading in text, text
    assert "[not" not in text  # the flag is said whole, in the line under the table
    assert "n1/1 takes no new jobs: not in whitelist" in " ".join(text.split())
    wide = _screen(220, lambda console: render_status(report, console))
    # Wide: the flags have a column of their own, on the card's line, beside its running jobs.
    assert any("[not in whitelist]" in line and "7:train" in line for line in wide.splitlines()), wide
    assert "model" in wide and "flags" in wide


def test_jobs_at_80_columns_show_whole_states():
    from rig.cli.render import render_jobs
    from rig.models import Job, JobState, Priority

    jobs = [Job(id=100 + i, name="a-rather-long-job-name-for-training", user="someone.long", command=["x"],
                gpu_memory=20 * GIB, gpus=2, priority=Priority.MEDIUM, state=state, workdir="/", created_at=0.0,
                node="node-with-name", cards=[0, 1], exit_code=0 if state is JobState.SUCCEEDED else None)
            for i, state in enumerate(JobState)]
    text = _screen(80, lambda console: render_jobs(jobs, console))
    for state in JobState:
        assert state.value in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    for heading in ("id", "user", "state", "mem/card", "reason"):  # where goes before user (README)
        assert heading in text, text
    wide = _screen(220, lambda console: render_jobs(jobs, console))
    assert "prio" in wide and "age" in wide
