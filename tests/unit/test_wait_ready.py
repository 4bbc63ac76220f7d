"""rig up's wait for its workers' first heartbeats (rig.stack.Stack.wait_ready): a card worker
retired meanwhile (its card left gpu_whitelist or the node and its last job ended: Stack.
retire_drained) is no longer waited for. It never heartbeats again, and `rig up` used to wait
its whole timeout and then report it as "never reported" (seen in the card-leaves-whitelist
fault scenario, when the retirement came before the worker's first heartbeat was read)."""

from __future__ import annotations

import fakeredis

from rig.config import load_settings
from rig.keys import card_worker_name
from rig.stack import Child, Stack, UpOptions


def _card(tmp_path, stack: Stack, index: int) -> Child:
    name = card_worker_name(stack.settings.node_name, index)
    return Child(name=f"card{index}", argv=["celery", "worker", "-n", name], env={},
                 log_file=tmp_path / f"card{index}.log", role="card")


def test_a_worker_retired_before_its_first_heartbeat_is_not_waited_for(tmp_path, monkeypatch):
    settings = load_settings(key_prefix="ready-test:", node_name="n1", home=tmp_path)
    stack = Stack(settings, UpOptions(), say=lambda _line: None)
    redis_client = fakeredis.FakeRedis(decode_responses=True)
    monkeypatch.setattr("rig.stack.connect", lambda _url: redis_client)
    serving, retiring = _card(tmp_path, stack, 0), _card(tmp_path, stack, 2)
    stack.children.extend([serving, retiring])
    redis_client.set(stack.keys.worker(card_worker_name("n1", 0)), "{}")

    def retire_once() -> None:  # what retire_drained does to a drained card's child
        if retiring in stack.children:
            stack.children.remove(retiring)

    monkeypatch.setattr(stack, "supervise_once", retire_once)
    assert stack.wait_ready(timeout=5) == []


def test_a_worker_that_never_heartbeats_is_reported(tmp_path, monkeypatch):
    settings = load_settings(key_prefix="ready-test:", node_name="n1", home=tmp_path)
    stack = Stack(settings, UpOptions(), say=lambda _line: None)
    monkeypatch.setattr("rig.stack.connect", lambda _url: fakeredis.FakeRedis(decode_responses=True))
    stack.children.append(_card(tmp_path, stack, 1))
    monkeypatch.setattr(stack, "supervise_once", lambda: None)
    assert stack.wait_ready(timeout=0.5) == [card_worker_name("n1", 1)]


def test_a_gateway_started_is_waited_for_until_it_answers(tmp_path, monkeypatch):
    """`rig up --only gateway --daemon` returned at once, saying the gateway was "not answering
    yet": nothing waited for it as rig up waits for its workers."""
    import socket

    settings = load_settings(key_prefix="ready-test:", node_name="n1", home=tmp_path)
    stack = Stack(settings, UpOptions(only=("gateway",)), say=lambda _line: None)
    monkeypatch.setattr("rig.stack.connect", lambda _url: fakeredis.FakeRedis(decode_responses=True))
    stack.gateway_path = tmp_path / "gw.sock"
    stack.children.append(Child(name="gateway", argv=["gw"], env={}, log_file=tmp_path / "gateway.out",
                                role="gateway"))
    monkeypatch.setattr(stack, "supervise_once", lambda: None)
    assert stack.wait_ready(timeout=0.5) == ["gateway"]
    assert any("not answering" in line for line in stack.addresses())

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    rounds = []

    def listen_late() -> None:  # the gateway answers on the third look
        rounds.append(1)
        if len(rounds) == 3:
            listener.bind(str(stack.gateway_path))
            listener.listen(4)

    monkeypatch.setattr(stack, "supervise_once", listen_late)
    try:
        assert stack.wait_ready(timeout=30) == []
        assert len(rounds) == 3
        assert not any("not answering" in line for line in stack.addresses())
    finally:
        listener.close()
