"""rig up's hung-worker check (rig.stack.Stack.check_hung): a worker that has not heartbeated
once since it started is starting, not hung, for STARTUP_GRACE_S; one that heartbeated and then
fell silent for health.timeout is killed as before."""

from __future__ import annotations

import json
import time

import fakeredis
import pytest

from rig.config import load_settings
from rig.keys import card_worker_name
from rig.stack import Child, Stack, UpOptions
from rig.supervision import STARTUP_GRACE_S


@pytest.fixture
def kills(monkeypatch) -> list[int]:
    """The pids check_hung sends SIGKILL (recorded, not sent: a kill lands asynchronously)."""
    sent: list[int] = []
    monkeypatch.setattr("rig.stack.os.kill", lambda pid, _sig: sent.append(pid))
    return sent


@pytest.fixture
def stack_with_worker(tmp_path, kills):
    settings = load_settings(key_prefix="hung-test:", node_name="n1", home=tmp_path,
                             health={"timeout": 3.0, "check_interval": 1.0}, telemetry_interval=1.0)
    stack = Stack(settings, UpOptions(), say=lambda _line: None)
    stack._client = fakeredis.FakeRedis(decode_responses=True)
    child = Child(name="card0", argv=[], env={}, log_file=tmp_path / "card0.log", role="card",
                  proc=_LiveProcess())  # type: ignore[arg-type]
    stack.children.append(child)
    return stack, child


class _LiveProcess:
    """A worker process that lives (what check_hung asks of a Popen)."""

    pid = 4_000_000  # above any pid_max: never a real process

    def poll(self) -> None:
        return None


def _check(stack: Stack, *, after: float) -> None:
    """Two looks ``after`` s apart (the silence must last health.timeout between them)."""
    stack._next_hung_check = 0.0
    stack.check_hung()
    for child in stack.children:
        if child.silent_since is not None:
            child.silent_since -= after
    stack._next_hung_check = 0.0
    stack.check_hung()


def test_a_worker_slow_to_its_first_heartbeat_is_not_killed_as_hung(stack_with_worker, kills):
    stack, child = stack_with_worker
    child.started_at = time.monotonic() - 10  # over 2 x health.timeout, no heartbeat yet
    _check(stack, after=10)
    assert kills == [], "a starting worker was killed as hung"


def test_a_worker_silent_past_the_startup_grace_is_killed(stack_with_worker, kills):
    stack, child = stack_with_worker
    child.started_at = time.monotonic() - STARTUP_GRACE_S - 1
    _check(stack, after=10)
    assert kills == [child.proc.pid]


def test_a_worker_that_heartbeated_then_fell_silent_is_killed(stack_with_worker, kills):
    stack, child = stack_with_worker
    child.started_at = time.monotonic() - 10
    name = card_worker_name("n1", 0)
    stack._client.set(stack.keys.worker(name), json.dumps({"pid": child.proc.pid}))
    stack._next_hung_check = 0.0
    stack.check_hung()  # its heartbeat is seen
    assert child.beat_seen
    stack._client.delete(stack.keys.worker(name))  # then it falls silent
    _check(stack, after=10)
    assert kills == [child.proc.pid]
