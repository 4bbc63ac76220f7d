"""Why a job waits, end to end (real node, real workers, RIG_GPU_WHITELIST as `rig up` reads
it): the tester's case of a narrowed whitelist, jobs running on the whitelisted cards and
waiting jobs holding them."""

from __future__ import annotations

import time

import pytest

from rig.models import JobState
from tests.integration.harness import RigHarness

pytestmark = pytest.mark.slow


def test_a_job_behind_holds_on_the_whitelisted_cards_is_told_they_are_held(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_GPU_WHITELIST", "0,1")  # as the operator set it: cards 0,1 of 4
    node = RigHarness(tmp_path / "home", fake_gpus="4x24G", hold_after_seconds=0)
    try:
        assert node.settings.gpu_whitelist == [0, 1]
        node.up()
        running = [node.client.submit(["sleep", "60"], gpu_memory="20G") for _ in range(2)]
        for handle in running:
            node.wait_for_state(handle.id, {JobState.RUNNING}, timeout=60)
        waiting = [node.client.submit(["true"], gpu_memory="20G") for _ in range(3)]
        deadline = time.monotonic() + 30
        reason = ""
        while time.monotonic() < deadline:  # the dispatcher words it at its next pass (<= 1 s)
            reason = node.client.get(waiting[2].id).wait_reason or ""
            if f"held for job {waiting[1].id}" in reason:
                break
            time.sleep(0.2)
        assert "no card takes jobs" not in reason, reason
        assert reason.startswith("needs 20.0 GiB on 1 card; every card that takes jobs is held for jobs ahead "
                                 "of it; "), reason
        assert f"held for job {waiting[0].id}" in reason and reason.endswith(
            "the other cards take no jobs (testnode/2: not in whitelist; testnode/3: not in whitelist)"), reason
        for handle in running + waiting:
            node.client.kill(handle.id, wait=False)
    finally:
        node.cleanup()
