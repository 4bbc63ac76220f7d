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


def checker(settings: Settings, r: redis.Redis, leading: bool = False) -> AlertChecker:
    """The checker beside a stand-in dispatcher (``leading``: what its last leader check said)."""
    return AlertChecker(SimpleNamespace(settings=settings, r=r, identity=f"{settings.node_name}:1:x",
                                        leading=leading))


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


def test_redis_refusing_writes_is_said_once_by_the_leading_node_and_resolved_by_it(real_redis, key_prefix, tmp_path,
                                                                                   monkeypatch):
    """Every node's control worker checked the Redis-full alert and the first node by name said
    it, to its own webhook: another rule than every other alert's (the leading dispatcher's
    node, by its settings). Now the leader says it, also once the leader lock has lapsed
    (renewing it is a write Redis refuses), and the node that said it resolves it, though
    another leads by then."""
    from rig.redis_writes import FullWatch

    monkeypatch.chdir(tmp_path)
    posted: list[tuple[str, str | None]] = []  # (status, webhook: each node has its own)

    def deliver(alerts, webhook_url, logger=None) -> bool:  # noqa: ANN001
        posted.extend((a.status, webhook_url) for a in alerts)
        return True

    monkeypatch.setattr("workers.alert_check.deliver", deliver)
    refusing = [True]
    monkeypatch.setattr("rig.redis_writes.memory_state", lambda client: object())
    monkeypatch.setattr("rig.redis_writes.refusal_notice",
                        lambda client: "Redis is full (used 3 of maxmemory 1)" if refusing[0] else None)
    hooks = {name: f"https://hooks.example.invalid/{name}" for name in "abc"}
    on = {name: checker(node(name, key_prefix, tmp_path, alert_webhook=hooks[name]), real_redis,
                        leading=name == "b") for name in "abc"}
    for each in on.values():
        monkeypatch.setattr(each.manager, "run", lambda: [])  # the other alerts: not what is tested
        assert isinstance(each.full, FullWatch)
    leader = on["b"].client.keys.sched_leader
    real_redis.set(leader, "b:1:x")
    for _ in range(3):
        for each in on.values():
            each.step()
    assert posted == [("firing", hooks["b"])]  # a, first by name, used to say it
    real_redis.delete(leader)  # the lock lapsed: b's renewals are refused
    for _ in range(3):
        for each in on.values():
            each.step()
    assert posted == [("firing", hooks["b"])]
    refusing[0] = False  # Redis takes writes again and a took the lead first
    real_redis.set(leader, "a:1:x")
    for each in on.values():
        each.step()
    assert posted == [("firing", hooks["b"]), ("resolved", hooks["b"])]
