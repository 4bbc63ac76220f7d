"""Pools end to end: a real node, real workers, jobs restricted to a pool's cards."""

from __future__ import annotations

import pytest

from rig.errors import InvalidInput, Unschedulable
from rig.models import JobState
from tests.integration.harness import RigHarness

pytestmark = pytest.mark.slow


def test_pool_jobs_run_only_on_the_pools_cards(tmp_path):
    node = RigHarness(tmp_path / "home", fake_gpus="4x40G", max_task_per_gpu=2,
                      pools={"left": ["testnode:0-1"], "right": ["testnode:2,3"]})
    try:
        node.up()
        handles = [node.client.submit(["sleep", "0.3"], gpu_memory="10G", pool="left") for _ in range(6)]
        others = [node.client.submit(["true"], gpu_memory="10G", pool="right") for _ in range(2)]
        for handle in handles + others:
            assert handle.wait(60).state is JobState.SUCCEEDED
        assert {c for h in handles for c in h.record.cards} <= {0, 1}
        assert {c for h in others for c in h.record.cards} <= {2, 3}
        assert handles[0].record.pool == "left"
        with pytest.raises(InvalidInput, match="unknown pool 'gpu'; known pools: left, right"):
            node.client.submit(["true"], gpu_memory="1G", pool="gpu")
        with pytest.raises(Unschedulable, match="in pool 'left'.*3 cards"):
            node.client.submit(["true"], gpu_memory="1G", gpus=3, pool="left")
        assert node.leaked_bytes() == 0
    finally:
        node.cleanup()
