"""`rig down` marks the node stopped first, retrying while Redis refuses writes, and refuses to
stop when it still cannot (rig.stop_mark): a node stopped unmarked would be declared DOWN and
its running jobs run twice. The end-to-end case is the fault scenario redis-full-down."""

from __future__ import annotations

import redis

from rig import stop_mark as S
from rig.keys import Keys
from rig.nodes import NodeRegistry

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


class _Refusing:
    """A registry whose mark_stopped is refused ``times`` times, then written."""

    def __init__(self, times: int) -> None:
        self.times, self.calls = times, 0

    def mark_stopped(self, node: str, *, owner: str | None = None) -> bool:
        self.calls += 1
        if self.calls <= self.times:
            raise OOM
        return True


def test_mark_is_retried_while_redis_refuses_and_the_node_is_looked_after_meanwhile():
    reg, between = _Refusing(2), []
    assert S.mark_stopped_retrying(reg, "a", owner=None, timeout=5, between=lambda: between.append(1), pause=0)
    assert reg.calls == 3 and len(between) == 2


def test_mark_still_refused_at_the_deadline_says_one_line_what_to_do():
    reg = _Refusing(10**6)
    try:
        S.mark_stopped_retrying(reg, "lonely", owner=None, timeout=0.05, pause=0.01)
    except S.MarkRefused as refused:
        line = refused.line
    else:
        raise AssertionError("a refused mark was not reported")
    assert reg.calls >= 2 and "\n" not in line
    assert line.startswith("Redis is full: the node lonely cannot be marked stopped")
    assert "free memory" in line and "rig down again" in line


def test_other_errors_are_not_retried():
    class _Broken:
        def mark_stopped(self, node: str, *, owner: str | None = None) -> bool:
            raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    try:
        S.mark_stopped_retrying(_Broken(), "a", owner=None, timeout=5, pause=0)
    except redis.ResponseError:
        return
    raise AssertionError("not raised")


def test_refusal_file_is_read_only_for_the_pid_that_wrote_it(tmp_path, monkeypatch):
    monkeypatch.setattr(S.os, "getpid", lambda: 4242)
    S.write_refusal(tmp_path, "a", "Redis is full: ...")
    assert S.read_refusal(tmp_path, "a", 4242) == "Redis is full: ..."
    assert S.read_refusal(tmp_path, "a", 1) is None
    assert S.read_refusal(tmp_path, "b", 4242) is None


def test_confirm_drops_a_heartbeat_renewed_while_winding_down_by_a_worker_naming_no_owner(redis_client, key_prefix):
    """Heartbeats naming their rig up are refused by the mark (tests/store/test_node_stop_truth.py);
    one that names none (a worker of an older rig) is taken away once the workers stopped."""
    keys = Keys(key_prefix)
    reg = NodeRegistry(redis_client, keys)
    reg.register("a", ttl=30)
    assert reg.mark_stopped("a")
    assert reg.beat("a", ttl=30, source="card0")  # a worker still winding down
    assert [n.state for n in reg.read()] == ["up"]
    S.confirm_stopped(reg, "a", None)
    assert [n.state for n in reg.read()] == ["stopped"]


def test_confirm_leaves_a_node_that_was_claimed_again_alone(redis_client, key_prefix):
    keys = Keys(key_prefix)
    reg = NodeRegistry(redis_client, keys)
    reg.register("a", ttl=30)
    assert reg.mark_stopped("a")
    reg.register("a", ttl=30)  # a new rig up of the name: no stop mark any more
    S.confirm_stopped(reg, "a", None)
    assert [n.state for n in reg.read()] == ["up"]


def test_an_unreachable_redis_is_not_retried_here():
    """rig down while Redis is unreachable stops as before (the mark is said not written)."""
    class _Gone:
        def mark_stopped(self, node: str, *, owner: str | None = None) -> bool:
            raise redis.ConnectionError("refused")

    try:
        S.mark_stopped_retrying(_Gone(), "a", owner=None, timeout=5, pause=0)
    except redis.ConnectionError:
        return
    raise AssertionError("not raised")


def test_stack_down_marks_the_node_stopped_before_it_stops_a_worker(tmp_path, monkeypatch):
    """Not only rig down's signal path (mark_stopped_first): Stack.down called by itself (rig up
    ending otherwise; the test harness) marked the node only after its workers stopped, and the
    control worker's health pass, still running, took a stopped card worker for dead and
    stopped its job (fault scenario kill-on-closed-card, under load)."""
    import fakeredis

    from rig.config import load_settings
    from rig.stack import Child, Stack, UpOptions

    client = fakeredis.FakeRedis(decode_responses=True)
    settings = load_settings(key_prefix="down-test:", node_name="n1", home=tmp_path)
    keys = Keys(settings.key_prefix)
    NodeRegistry(client, keys).register("n1", ttl=30)
    stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=lambda _line: None)
    stack._client, stack._registered = client, True
    marked_at_signal: list[bool] = []
    monkeypatch.setattr("rig.stack._signal_group", lambda proc, sig: marked_at_signal.append(
        client.hexists(keys.node("n1"), "stopped_at")))

    class _Worker:
        pid = 4_000_000  # above any pid_max: never a real process

        def poll(self) -> None:
            return None

        def wait(self, timeout: float) -> int:
            return 0

    stack.children.append(Child(name="card0", argv=[], env={}, log_file=tmp_path / "card0.log", role="card",
                                proc=_Worker()))  # type: ignore[arg-type]
    stack.down()
    assert marked_at_signal == [True]
    assert [n.state for n in NodeRegistry(client, keys).read()] == ["stopped"]
