"""The installation identity (rig/installation.py): a node knows whether Redis is still the
installation it joined."""

from __future__ import annotations

from rig.installation import EMPTY, FOREIGN, JOIN, NEW, SAME, Installation, local_file, matches
from rig.keys import Keys
from rig.models import JobState
from rig.nodes import NodeRegistry


def test_verdicts(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    a = Installation(redis_client, keys, tmp_path, "a")
    assert a.check().kind == NEW
    first = a.join()
    assert a.check().kind == SAME and matches(redis_client, keys, tmp_path, "a")
    b = Installation(redis_client, keys, tmp_path / "other-home", "b")
    assert b.check().kind == JOIN and b.join() == first
    redis_client.delete(keys.installation)  # Redis came back empty
    verdict = a.check()
    assert verdict.kind == EMPTY and verdict.mismatch and not matches(redis_client, keys, tmp_path, "a")
    redis_client.hset(keys.installation, "id", "inst-other")
    assert a.check().kind == FOREIGN


def test_the_mark_is_shown_and_cleared_by_joining(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    a = Installation(redis_client, keys, tmp_path, "a")
    a.join()
    redis_client.delete(keys.installation)
    line = a.mark(a.check(), [4, 7])
    assert "2 job(s) of another installation still run here (4, 7)" in line and "rig recover --stop" in line
    (node,) = NodeRegistry(redis_client, keys).read()
    assert node.mismatch == line and node.describe.startswith("FROZEN: ")
    a.join()
    (node,) = NodeRegistry(redis_client, keys).read()
    assert node.mismatch is None and a.check().kind == SAME


def test_two_prefixes_keep_two_files(tmp_path):
    assert local_file(tmp_path, "a", "rig:") != local_file(tmp_path, "a", "lab2:")


def test_a_handle_never_reports_another_job_that_reused_its_id(redis_client, key_prefix, tmp_path, monkeypatch):
    """After Redis lost its data, `rig-submit --wait` / Job.wait() of job 9 followed the new
    job 9 and reported its result (a false FAILED or SUCCEEDED)."""
    import pytest

    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import JobGone
    from rig.testing.harness import delete_prefix

    client = Client(load_settings(key_prefix=key_prefix, home=tmp_path), redis_client=redis_client)
    mine = client.submit(["true"], gpu_memory="1G", name="mine")
    delete_prefix(redis_client, key_prefix)  # Redis came back empty
    impostor = client.submit(["false"], gpu_memory="1G", name="impostor")
    assert impostor.id == mine.id
    client.ledger.transition(impostor.id, JobState.FAILED)
    with pytest.raises(JobGone, match=f"job {mine.id} is gone: rig's Redis lost its data"):
        mine.wait(5)
    with pytest.raises(JobGone):
        mine.record  # noqa: B018
    assert impostor.wait(5).state is JobState.FAILED
