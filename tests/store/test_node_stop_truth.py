"""What `rig status` says of a node after `rig down` and after a SIGKILL of `rig up` is true
(fakeredis and real Redis, no workers).

After `rig down`: the stop mark names the rig up that wrote it (``stopped_by``) and from then
on the heartbeats of that rig up's winding-down workers are refused in the same Lua step that
would write them, so the node never reads up again; `confirm_stopped` takes away the name claim
its control worker re-created after the mark. (The interleavings below are the ones seen in
`scripts/down_race.py`: a claim re-created and a heartbeat written 0.004-0.065 s after the mark.)

After a SIGKILL with nobody left to declare it down: a reader presumes the node down from its
heartbeat's age against the life the heartbeat declared.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rig import nodes as N
from rig.cli.render import node_title
from rig.clock import shared_now
from rig.keys import Keys
from rig.node_claim import OWNER_ENV, claim, renew_as
from rig.nodes import NodeRegistry
from rig.stop_mark import confirm_stopped

ME = '{"pid":1,"who":"rig up of this run"}'
OLD = '{"pid":2,"who":"an earlier rig up"}'
TTL = 4.0


@pytest.fixture
def reg(redis_client, key_prefix) -> NodeRegistry:
    """Node a registered by rig up ``ME``, which holds its name."""
    registry = NodeRegistry(redis_client, Keys(key_prefix))
    assert claim(redis_client, registry.keys, "a", ME, TTL) is None
    registry.register("a", ttl=TTL)
    return registry


def _node(reg: NodeRegistry) -> N.NodeInfo:
    return {n.name: n for n in reg.read()}["a"]


def test_a_worker_winding_down_after_the_mark_neither_beats_nor_keeps_the_name(reg, monkeypatch):
    k = reg.keys
    assert reg.mark_stopped("a", owner=ME)
    # The control worker, not yet told to stop: its claim renewal does not re-take the name its
    # rig up gave up (it only extends a claim that is its own), and its heartbeat is refused.
    monkeypatch.setenv(OWNER_ENV, ME)
    assert renew_as(reg.r, k, "a", TTL)
    assert reg.r.get(k.node_owner("a")) is None
    assert reg.beat("a", ttl=TTL, source="control@a", owner=ME) is False
    node = _node(reg)
    assert node.state == "stopped" and not node.alive and not reg.r.exists(k.node_alive("a"))
    # Once the workers are gone, rig up confirms the mark (it would remove a claim of its own).
    claim(reg.r, k, "a", ME, TTL)
    confirm_stopped(reg, "a", ME)
    assert reg.r.get(k.node_owner("a")) is None and _node(reg).state == "stopped"


def test_a_beat_that_began_before_the_mark_and_writes_after_it_is_refused(reg, monkeypatch):
    """The check and the write are one step: a mark landing between the beat's start (its
    timestamp taken) and its write wins."""
    real = N.record_clock_offset

    def mark_meanwhile(*args, **kwargs):  # noqa: ANN002, ANN003
        assert reg.mark_stopped("a", owner=ME)
        return real(*args, **kwargs)

    monkeypatch.setattr(N, "record_clock_offset", mark_meanwhile)
    assert reg.beat("a", ttl=TTL, source="control@a", owner=ME) is False
    assert _node(reg).state == "stopped" and not reg.r.exists(reg.keys.node_alive("a"))


def test_beats_of_another_rig_up_or_of_none_are_not_refused(reg):
    """A mark of an earlier rig up (Redis rolled back to a snapshot taken while the node was
    stopped) must not silence the one that runs now: its node reads up, as before."""
    reg.r.hset(reg.keys.node("a"), mapping={"stopped_at": shared_now(reg.r) - 60, "stopped_by": OLD})
    assert reg.beat("a", ttl=TTL, source="control@a", owner=ME) is True
    assert _node(reg).state == "up"
    assert reg.mark_stopped("a", owner=ME)
    assert reg.beat("a", ttl=TTL, source="a test's worker") is True  # no owner: never refused


def test_a_new_registration_lifts_the_refusal(reg):
    assert reg.mark_stopped("a", owner=ME)
    reg.register("a", ttl=TTL)  # rig up of the same identity cannot happen; any registration clears it
    assert reg.r.hget(reg.keys.node("a"), "stopped_by") is None
    assert reg.beat("a", ttl=TTL, source="control@a", owner=ME) is True
    assert _node(reg).state == "up"


def test_confirm_leaves_the_claim_of_a_rig_up_that_took_the_name_since(reg):
    assert reg.mark_stopped("a", owner=ME)
    assert claim(reg.r, reg.keys, "a", OLD, TTL) is None  # another rig up, between mark and confirm
    confirm_stopped(reg, "a", ME)
    assert reg.r.get(reg.keys.node_owner("a")).startswith(OLD + "|")


def _age(reg: NodeRegistry, seconds: float) -> None:
    """The node's last heartbeat ``seconds`` ago, its key gone (what a SIGKILLed node leaves)."""
    reg.r.hset(reg.keys.node("a"), "last_seen", shared_now(reg.r) - seconds)
    reg.r.delete(reg.keys.node_alive("a"))


def test_a_node_silent_past_its_heartbeats_life_is_presumed_down_by_the_reader(reg):
    assert float(reg.r.hget(reg.keys.node("a"), "beat_ttl")) == TTL
    _age(reg, TTL + 5)  # nobody left to declare it down: no down_since will ever come
    node = _node(reg)
    assert node.state == "silent" and node.presumed_down and node.down_since is None
    assert node.describe == f"silent since {N.clock(node.last_seen)}, presumed down"
    console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
    console.print(node_title(node, "a", 1))
    text = console.export_text()
    assert "presumed down" in text and "not yet declared down" not in text and "past its heartbeat's 4 s life" in text
    from rig.waiting import node_state_text  # a waiting job's sentence says the same
    said = node_state_text(node)
    assert "presumed down" in said and "not yet declared down" not in said


def test_a_heartbeat_missing_within_its_life_is_only_silent(reg):
    """A heartbeat key lost early (a Redis restart) is not yet a presumption."""
    _age(reg, TTL - 2)
    node = _node(reg)
    assert node.state == "silent" and not node.presumed_down and node.silent_note == "not yet declared down"


def test_a_record_without_the_heartbeats_life_uses_the_default(reg):
    """Written by an older rig: health.timeout's default life (30 s) is assumed."""
    reg.r.hdel(reg.keys.node("a"), "beat_ttl")
    _age(reg, 20)
    assert not _node(reg).presumed_down
    _age(reg, 40)
    assert _node(reg).presumed_down


def test_a_workers_renewal_extends_its_own_claim_and_leaves_anothers(reg, monkeypatch):
    k = reg.keys
    monkeypatch.setenv(OWNER_ENV, ME)
    assert claim(reg.r, k, "a", ME, TTL) is None
    reg.r.pexpire(k.node_owner("a"), 500)
    assert renew_as(reg.r, k, "a", TTL) and reg.r.pttl(k.node_owner("a")) > 1000
    monkeypatch.setenv(OWNER_ENV, "someone-else")
    assert renew_as(reg.r, k, "a", TTL) is False


def test_a_node_registers_when_redis_refuses_its_first_beat(redis_client, key_prefix, monkeypatch):
    """Redis filled between the node's record and its first beat (a script's OOM reply, seen in
    CI in the redis-full-down scenario): the node is registered, rig up goes on; any other error
    of the beat is still raised."""
    import redis

    registry = NodeRegistry(redis_client, Keys(key_prefix))
    oom = redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: x, on @user_script:5.")

    def refused(*_args, **_kwargs):  # noqa: ANN002, ANN003
        raise oom

    monkeypatch.setattr(NodeRegistry, "beat", refused)
    registry.register("a", ttl=TTL)
    assert redis_client.hget(registry.keys.node("a"), "started_at")
    oom = redis.ResponseError("ERR something else")
    with pytest.raises(redis.ResponseError):
        registry.register("a", ttl=TTL)
