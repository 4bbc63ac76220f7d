"""Pools end to end: a real node, real workers, jobs restricted to a pool's cards."""

from __future__ import annotations

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput, Unschedulable
from rig.models import JobState
from rig.stack import StackError
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
        with pytest.raises(InvalidInput, match=r"unknown pool 'gpu'; the cluster's pools: left, right \(node "
                                               r"testnode's \[pools\], started last\)"):
            node.client.submit(["true"], gpu_memory="1G", pool="gpu")
        # A submitter without the node's config uses its pools; its own [pools] count for nothing.
        outsider = Client(load_settings(key_prefix=node.prefix, node_name="laptop", home=tmp_path / "me",
                                        redis_url=node.settings.redis_url, pools={"x": ["testnode:3"]}))
        assert outsider.submit(["true"], gpu_memory="1G", pool="right").wait(60).state is JobState.SUCCEEDED
        with pytest.raises(InvalidInput, match="unknown pool 'x'; the cluster's pools: left, right"):
            outsider.submit(["true"], gpu_memory="1G", pool="x")
        with pytest.raises(Unschedulable, match="in pool 'left'.*3 cards"):
            node.client.submit(["true"], gpu_memory="1G", gpus=3, pool="left")
        assert node.leaked_bytes() == 0
    finally:
        node.cleanup()


def test_rig_up_of_a_node_with_other_pools_beside_a_running_one_is_refused(tmp_path):
    """Whichever node's dispatcher leads places every job: the nodes' pools must be one."""
    node = RigHarness(tmp_path / "home", fake_gpus="2x40G", pools={"left": ["testnode:0"]})
    other = RigHarness(tmp_path / "other", fake_gpus="2x40G", prefix=node.prefix, node_name="other",
                       pools={"left": ["testnode:0", "other:0"]})
    try:
        node.up()
        with pytest.raises(StackError, match=r"^node\(s\) testnode run with other pools .*nothing was changed"):
            other.up()
        assert "other" not in node.redis.smembers(node.keys.nodes)  # it registered nothing
    finally:
        other.cleanup()
        node.cleanup()
