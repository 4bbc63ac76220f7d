"""While Redis refuses writes, nodes without a heartbeat are not called silent or dead: their
heartbeats are refused (rig.refused_beats); `rig status` and the metric
rig_redis_refuses_writes say so. A real private redis-server filled with maxmemory 1 (never
CONFIG SET on the shared Redis)."""

from __future__ import annotations

import shutil
import subprocess

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from rig.cli.render import render_status
from rig.client import Client
from rig.config import load_settings
from rig.metrics import RigCollector
from rig.nodes import NodeRegistry
from rig.waiting import node_state_text
from tests.unit.test_redis_writes import _fill, private_redis  # noqa: F401 - the fixture


def _scrape(client: Client) -> str:
    registry = CollectorRegistry()
    registry.register(RigCollector(client))
    return generate_latest(registry).decode()


def _refuses(text: str) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels["reason"]: s.value for s in fams["rig_redis_refuses_writes"].samples}


def test_status_and_metrics_say_heartbeats_are_refused_not_silent(private_redis, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    settings = load_settings(redis_url=private_redis, key_prefix="beats:", home=tmp_path / "home")
    client = Client(settings)
    registry = NodeRegistry(client.r, client.keys)
    registry.register("b", ttl=0.3)
    assert _refuses(_scrape(client)) == {"full": 0.0, "read-only": 0.0, "cannot-persist": 0.0, "refused": 0.0}
    _fill(private_redis, True)
    import time

    time.sleep(1.1)  # the last heartbeat Redis took expires
    report = client.status()
    assert report.beats_refused == "Redis full"
    (node,) = report.nodes
    assert node.state == "silent" and node.writes_refused
    assert "heartbeats refused since" in node.describe and "Redis full" in node.describe
    line = node_state_text(node)
    assert line.startswith("node b: heartbeats refused since") and "silent" not in line
    console = Console(record=True, width=400)
    render_status(report, console)
    shown = console.export_text()
    assert "workers alive: 0" not in shown and "silent" not in shown
    assert "heartbeats are refused" in shown and "heartbeats refused since" in shown

    text = _scrape(client)
    assert _refuses(text)["full"] == 1.0 and sum(_refuses(text).values()) == 1.0
    promtool = shutil.which("promtool")
    if promtool:
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert "rig_redis_refuses_writes" not in done.stdout + done.stderr

    _fill(private_redis, False)
    report = client.status()
    assert report.beats_refused is None and report.nodes[0].writes_refused is None
    assert report.nodes[0].state == "silent"  # a truly silent node is called so again
    assert _refuses(_scrape(client))["full"] == 0.0


def test_no_reading_no_claim():
    """An unreadable Redis is not said to refuse writes (rig.refused_beats reads INFO first)."""
    from rig.refused_beats import refusal_reason

    class _Down:
        def info(self, *_a):
            import redis

            raise redis.ConnectionError("down")

    assert refusal_reason(_Down()) is None
