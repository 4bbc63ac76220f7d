"""A real node's connections to Redis, counted by their client names, stay within the
documented bound (rig.connections.node_bound), idle and with every card full; and a node
with every card full never blocks on its own pools: every job ends, none waits out a pool."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from rig.connections import celery_limit, node_bound, rig_pool_limit
from rig.models import JobState
from tests.integration.harness import RigHarness

pytestmark = pytest.mark.slow

CARDS = 8
PER_CARD = 4


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    # A node name of its own: the census counts this node's connections only.
    harness = RigHarness(tmp_path_factory.mktemp("rig-home"), fake_gpus=f"{CARDS}x80G", max_task_per_gpu=PER_CARD,
                         node_name=f"conn{uuid.uuid4().hex[:6]}")
    harness.up(beat=True, gateway=True)
    yield harness
    harness.cleanup()


def census(node: RigHarness) -> Counter:
    """Connections per client name of this node (rig:<node>:card3, celery:<node>:card3, ...)."""
    names = Counter(c["name"] for c in node.redis.client_list())
    return Counter({name: n for name, n in names.items() if name.split(":")[1:2] == [node.name]})


def check(node: RigHarness, counts: Counter) -> None:
    s = node.settings
    for name, n in counts.items():
        kind, _, role = name.split(":", 2)
        role = "card" if role.startswith("card") else role
        if kind == "rig":
            assert n <= rig_pool_limit(role, s), (name, n)
        elif kind == "celery":
            assert n <= celery_limit(PER_CARD if role == "card" else 4), (name, n)
        else:
            assert (kind, n) == ("redbeat", 1), (name, n)
    assert sum(counts.values()) <= node_bound(s, CARDS, flower=False)


def test_idle_node_stays_within_its_bound(node):
    time.sleep(6)  # a health tick, adoption and beat's first ticks have run
    counts = census(node)
    assert {name.split(":")[2] for name in counts} >= {f"card{i}" for i in range(CARDS)} | {"control", "beat"}
    check(node, counts)


def test_every_card_full_stays_within_its_bound_and_never_blocks_on_its_pool(node, tmp_path: Path):
    # Two waves of every card full (4 jobs a card), each job's supervisor polling Redis.
    handles = [node.client.submit("sleep 3", gpu_memory="15G") for _ in range(2 * CARDS * PER_CARD)]
    peak: Counter = Counter()
    deadline = time.monotonic() + 180
    running_seen = 0
    while time.monotonic() < deadline:
        counts = census(node)
        for name, n in counts.items():
            peak[name] = max(peak[name], n)
        check(node, counts)
        states = Counter(j.state for j in node.client.store.get_many([h.id for h in handles]))
        running_seen = max(running_seen, states[JobState.RUNNING])
        if states[JobState.SUCCEEDED] == len(handles):
            break
        time.sleep(0.2)
    assert states[JobState.SUCCEEDED] == len(handles), states
    assert running_seen >= CARDS * PER_CARD // 2  # it was loaded
    logs = "".join(p.read_text(errors="replace") for p in node.settings.rig_log_dir.glob("*.log"))
    assert "stayed busy" not in logs
    print(f"peak connections per process: {dict(sorted(peak.items()))}; total peak sum {sum(peak.values())}, "
          f"bound {node_bound(node.settings, CARDS, flower=False)}")
