"""A card worker under Sentinel (rig.replication): a claim or an ending that a fail-over lost is
noticed after the replica wait and handled, so a job never starts on a claim the new master
lacks and never runs again because its ending was lost.

The fail-over is simulated where it matters: at a chosen replica wait, every key of the test's
prefix is put back as it was at an earlier moment (DUMP/RESTORE): exactly what a promoted
replica that missed the writes since then would hold."""

from __future__ import annotations

import time

import pytest

from rig.client import current_identity
from rig.memory import GIB
from rig.models import Job, JobState, Priority

pytestmark = pytest.mark.redis


class Promotion:
    """Stands in for ReplicaWait: confirms every write, except that at the ``at``-th wait the
    replica promoted holds the keys as they were at ``snapshot()`` (or at the ``taken``-th wait)."""

    def __init__(self, client, prefix: str, *, at: int, taken: int | None = None) -> None:  # noqa: ANN001
        self.r, self.prefix, self.at, self.taken = client, prefix, at, taken
        self.calls = 0
        self.saved: dict[str, tuple[bytes, int]] = {}

    def snapshot(self) -> None:
        keys = list(self.r.scan_iter(match=f"{self.prefix}*", count=1000))
        pipe = self.r.pipeline(transaction=False)
        for key in keys:
            pipe.dump(key)
            pipe.pttl(key)
        values = pipe.execute()
        self.saved = {key: (values[2 * i], values[2 * i + 1]) for i, key in enumerate(keys)}

    def confirm(self) -> bool:
        self.calls += 1
        if self.calls == self.taken:
            self.snapshot()
        if self.calls == self.at:
            pipe = self.r.pipeline(transaction=True)
            for key in self.r.scan_iter(match=f"{self.prefix}*", count=1000):
                pipe.delete(key)
            for key, (value, ttl) in self.saved.items():
                pipe.restore(key, max(0, ttl), value, replace=True)
            pipe.execute()
        return True

    def unconfirmed_note(self, what: str) -> str:
        return f"warning: {what} unconfirmed"


@pytest.fixture
def env(card_runner_env, real_redis, key_prefix):
    settings, ledger, runner, _ = card_runner_env
    dumping = type(real_redis)(connection_pool=type(real_redis.connection_pool)(
        **{**real_redis.connection_pool.connection_kwargs, "decode_responses": False}))
    yield ledger, runner, dumping, key_prefix
    dumping.close()


def submit(ledger, tmp_path, marker) -> Job:  # noqa: ANN001
    return ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["/bin/sh", "-c", f"echo ran >> {marker}"],
        shell=True, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING,
        workdir=str(tmp_path), created_at=time.time(),
    ))


def test_a_claim_lost_in_a_failover_is_claimed_again_and_the_job_runs_once(env, tmp_path):
    ledger, runner, dumping, prefix = env
    marker = tmp_path / "ran"
    job = submit(ledger, tmp_path, marker)
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    runner.replicas = promotion = Promotion(dumping, prefix, at=1)
    promotion.snapshot()  # the replica has the placement, not the claim to come
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = ledger.store.get(job.id)
    assert done.attempt == 1 and marker.read_text() == "ran\n"
    assert ledger.card("n1", 0).reserved == 0


def test_a_start_whose_placement_was_lost_never_runs(env, tmp_path):
    ledger, runner, dumping, prefix = env
    marker = tmp_path / "ran"
    job = submit(ledger, tmp_path, marker)
    runner.replicas = promotion = Promotion(dumping, prefix, at=1)
    promotion.snapshot()  # the replica has the job waiting, neither placement nor claim
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    assert runner.run_job(job.id, token) == "ignored:PENDING"
    assert not marker.exists()
    assert ledger.store.get(job.id).state is JobState.PENDING and ledger.card("n1", 0).reserved == 0


def test_an_ending_lost_in_a_failover_is_recorded_again_not_run_again(env, tmp_path):
    ledger, runner, dumping, prefix = env
    marker = tmp_path / "ran"
    job = submit(ledger, tmp_path, marker)
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    # The replica has the claim (first wait) but not the ending (the second wait).
    runner.replicas = Promotion(dumping, prefix, taken=1, at=2)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.attempt == 1
    assert marker.read_text() == "ran\n" and ledger.card("n1", 0).reserved == 0
