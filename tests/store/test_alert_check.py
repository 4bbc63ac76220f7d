"""The alert check runs beside the leading dispatcher only, by its node's rules (workers.alert_check)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from rig.client import Client
from rig.config import Settings, load_settings
from rig.gpus.base import GpuReading
from rig.memory import GIB
from tests.conftest import REDIS_URL
from workers.alert_check import AlertChecker

pytestmark = pytest.mark.redis

SECRET = "https://hooks.example.invalid/services/T000/XXXXSECRET"


def node(name: str, key_prefix: str, tmp_path, **values) -> Settings:
    return load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, node_name=name, home=tmp_path / name, **values)


def checker(settings: Settings, r: redis.Redis) -> AlertChecker:
    return AlertChecker(SimpleNamespace(settings=settings, r=r, identity=f"{settings.node_name}:1:x"))


def test_only_the_leading_dispatchers_node_checks_by_its_own_rules(real_redis, key_prefix, tmp_path, monkeypatch):
    """Two nodes configured apart: beat's check ran on either node's control worker by that
    node's thresholds, so a card at 70 C fired on node a (limit 50 C) and "resolved" on node b
    (limit 100 C) while it stayed at 70 C, and a's webhook saw "firing" twice with no "resolved".
    Now only the leading dispatcher's control worker checks; the check moves with the lead."""
    monkeypatch.chdir(tmp_path)  # no stray rig.toml
    a = node("a", key_prefix, tmp_path, alerts={"max_temperature": 50}, alert_webhook=SECRET)
    b = node("b", key_prefix, tmp_path, alerts={"max_temperature": 100})
    client = Client(a, redis_client=real_redis)
    client.ledger.register_card("a", GpuReading(index=0, uuid="u0", model="A100", total=100 * GIB, temperature=70),
                                max_jobs=2, reserve_fraction=0.2, allowed=True, fake=True)
    on_a, on_b = checker(a, real_redis), checker(b, real_redis)
    on_a.manager.webhook_url = None  # nothing listens; the check itself is what is tested
    real_redis.set(client.keys.sched_leader, "a:1:x")
    for _ in range(3):
        assert on_b.step() is None  # b does not lead: it checks nothing, resolves nothing
        assert on_a.step() in (0, 1)
    assert list(on_a.manager.active()) == ["temperature:a/0"]
    assert on_a.step() == 0  # announced once

    real_redis.set(client.keys.sched_leader, "b:1:x")  # a stopped: b leads, and checks by its rules
    assert on_a.step() is None
    assert on_b.step() == 1 and on_b.manager.active() == {}
    # The webhook's URL, its secret, is nowhere in Redis.
    for key in real_redis.scan_iter(f"{key_prefix}*"):
        kind = real_redis.type(key)
        text = str(real_redis.hgetall(key) if kind == "hash" else real_redis.get(key) if kind == "string" else "")
        assert "XXXXSECRET" not in text, key


def test_a_failing_check_is_logged_not_raised(real_redis, key_prefix, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    on_a = checker(node("a", key_prefix, tmp_path), real_redis)
    real_redis.set(on_a.client.keys.sched_leader, "a:1:x")

    def broken() -> list:
        raise redis.ConnectionError("gone")

    monkeypatch.setattr(on_a.manager, "run", broken)
    assert on_a.step() is None
    assert "alert check skipped (ConnectionError: gone)" in caplog.text
