"""`rig status` and `rig top` with several nodes: cards grouped under their node, each node's
liveness shown (up / DOWN since T / stopped). Hand-made reports; no Redis, no terminal."""

from __future__ import annotations

import io
import json

from rich.console import Console

from rig.cli import as_json
from rig.cli.render import render_status
from rig.cli.top import build_view
from rig.client import StatusReport, WorkerInfo
from rig.models import CardState, JobState, Priority
from rig.nodes import NodeInfo, clock

GIB = 2**30
NOW = 1_700_000_000.0


def _report(n2_state: str = "down") -> StatusReport:
    cards = [CardState(node="n1", index=i, total=80 * GIB, usable=76 * GIB, max_jobs=4, uuid=f"GPU-a{i}")
             for i in range(2)]
    cards += [CardState(node="n2", index=i, total=40 * GIB, usable=38 * GIB, max_jobs=4,
                        healthy=n2_state == "up", health_reason="" if n2_state == "up" else "node down: x")
              for i in range(2)]
    nodes = [
        NodeInfo("n1", True, "up", NOW - 600, last_seen=NOW, started_at=NOW - 600, workers=3),
        NodeInfo("n2", n2_state == "up", n2_state, NOW - 30, last_seen=NOW - 40, down_since=NOW - 30),
    ]
    return StatusReport(
        cards=cards, running={c.id: [] for c in cards},
        pending={p: 0 for p in Priority}, oldest_wait={p: None for p in Priority},
        workers=[WorkerInfo("card0@n1", "card", "n1", 0, 11, 0, NOW)],
        counts={JobState.RUNNING: 0}, nodes=nodes,
    )


def _text(renderable, width: int = 160, height: int | None = None) -> str:
    console = Console(width=width, height=height or 60, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_status_groups_cards_under_their_node_with_its_liveness() -> None:
    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    render_status(_report(), console)
    text = console.export_text()
    n1, n2 = text.index("node n1: up since"), text.index(f"node n2: DOWN since {clock(NOW - 30)}")
    assert n1 < text.index("n1/0") < text.index("n1/1") < n2 < text.index("n2/0")
    assert "3 worker(s)" in text and "takes no jobs" in text


def test_status_json_lists_nodes_and_card_uuids() -> None:
    data = json.loads(as_json.dumps(as_json.status_dict(_report())))
    assert [(n["name"], n["state"]) for n in data["nodes"]] == [("n1", "up"), ("n2", "down")]
    assert data["cards"][0]["uuid"] == "GPU-a0"


def test_top_heads_each_node_and_counts_the_ones_up() -> None:
    for width in (80, 160):
        lines = _text(build_view(_report(), 0, width, 30, NOW), width, 30).splitlines()
        assert all(len(line) <= width for line in lines)
        text = "\n".join(lines)
        assert "nodes 1/2 up" in text
        head1 = next(i for i, line in enumerate(lines) if line.startswith("node n1"))
        head2 = next(i for i, line in enumerate(lines) if line.startswith("node n2"))
        assert "DOWN since" in lines[head2] and "up since" in lines[head1]
        assert head1 < next(i for i, line in enumerate(lines) if "n1/1" in line) < head2


def test_top_single_node_that_is_up_has_no_node_lines() -> None:
    report = _report("up")
    report.cards = [c for c in report.cards if c.node == "n1"]
    report.nodes = report.nodes[:1]
    text = _text(build_view(report, 0, 120, 30, NOW), 120, 30)
    assert "node n1" not in text and "nodes " not in text and "n1/0" in text
