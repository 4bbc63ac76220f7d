"""Ctrl-C while a submission's transaction is on its way to Redis (rig.store.JobStore.create_many):
a large @rig.task payload takes seconds to send, and a Ctrl-C after Redis had it left a queued
job whose id the caller never learnt."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from rig.client import Client
from rig.config import load_settings
from rig.errors import SubmitInterrupted


def _client(tmp_path) -> Client:  # noqa: ANN001
    return Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                  redis_client=fakeredis.FakeRedis(decode_responses=True))


@pytest.mark.parametrize("applied", [True, False])
def test_ctrl_c_during_the_store_says_the_ids_of_jobs_redis_took(tmp_path, monkeypatch, applied):
    """Breaker (brkapi): ``ident.delay(b"x" * 200_000_000)``, Ctrl-C 2.5 s in: a bare
    KeyboardInterrupt, and job 91 ran (rig jobs: RUNNING). Now SubmitInterrupted names it; a
    Ctrl-C before Redis had the transaction stays a plain KeyboardInterrupt, with nothing stored."""
    client = _client(tmp_path)
    real = redis.client.Pipeline.execute

    def interrupted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if not self.explicit_transaction:  # the reads before the store
            return real(self, *args, **kwargs)
        if applied:  # the MULTI transaction reached Redis, its reply did not come back
            real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(redis.client.Pipeline, "execute", interrupted)
    with pytest.raises(KeyboardInterrupt) as err:
        client.submit(["true"], gpu_memory="1G")
    monkeypatch.undo()
    stored = client.store.list()
    if applied:
        assert isinstance(err.value, SubmitInterrupted) and err.value.job_ids == [stored[0].id]
        assert str(err.value) == f"interrupted after submitting job(s) {stored[0].id}"
    else:
        assert not isinstance(err.value, SubmitInterrupted) and stored == []
