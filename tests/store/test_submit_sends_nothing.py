"""A submit call writes its jobs to Redis and sends nothing else: no Celery message (rig.notify),
so submit() needs no broker connection and the control worker consumes nothing per submission.
The stored transaction's wake-up is what starts the dispatcher's pass."""

from __future__ import annotations

import pytest

from rig.client import Client
from rig.config import load_settings
from tests.conftest import REDIS_URL


@pytest.fixture
def client(redis_client, key_prefix, tmp_path, monkeypatch) -> Client:
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home")
    c = Client(settings, redis_client=redis_client)

    def no_celery(_self):  # noqa: ANN001, ANN202
        raise AssertionError("a submit call used Celery")

    monkeypatch.setattr(Client, "celery", property(no_celery))
    return c


def test_submit_and_submit_many_send_no_celery_message_and_wake_the_dispatcher(client, tmp_path):
    wake = client.keys.sched_wake
    client.r.delete(wake)
    one = client.submit(["true"], gpu_memory="1G", workdir=tmp_path)
    many = client.submit_many([{"command": ["true"], "gpu_memory": "1G", "workdir": tmp_path}] * 3)
    assert [h.record.state.value for h in [one, *many]] == ["PENDING"] * 4
    assert client.r.llen(wake) >= 2  # each stored transaction pushed its wake-up
    assert client.flush(0) is True
