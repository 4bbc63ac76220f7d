"""The node name's owner (rig.node_claim), on fakeredis and real Redis: one live process owns a
name whatever its host or home; a second claimant is refused and changes nothing; a renewal keeps
the owner; a provably dead owner (same host, pid gone) is replaced at once, another host's only
once its claim expired; only the owner marks the node stopped or gives the name up."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rig import node_claim as C
from rig.errors import NodeInUse
from rig.keys import Keys
from rig.nodes import NodeRegistry
from tests.conftest import HIDDEN_PID


def _other(ident: str, **changes: object) -> str:
    fields = json.loads(ident)
    fields.update(changes)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def test_one_owner_per_name_whatever_the_home(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    a = C.identity(tmp_path / "a", tmp_path / "a" / "run")
    b = C.identity(tmp_path / "b", tmp_path / "b" / "run")
    assert a != b
    assert C.claim(redis_client, keys, "n1", a, 30) is None
    first = redis_client.get(keys.node_owner("n1"))
    other = C.claim(redis_client, keys, "n1", b, 30)
    assert other is not None and other.home == str((tmp_path / "a").resolve()) and other.pid is not None
    assert redis_client.get(keys.node_owner("n1")) == first  # the refusal changed nothing
    assert "home " + str((tmp_path / "a").resolve()) in other.describe()
    # A renewal keeps the original "since" and refreshes the expiry.
    redis_client.pexpire(keys.node_owner("n1"), 1500)
    assert C.claim(redis_client, keys, "n1", a, 30) is None
    assert redis_client.get(keys.node_owner("n1")) == first and redis_client.pttl(keys.node_owner("n1")) > 20_000
    # Only the owner gives it up.
    assert not C.release(redis_client, keys, "n1", b)
    assert C.release(redis_client, keys, "n1", a)
    assert C.claim(redis_client, keys, "n1", b, 30) is None


def test_a_dead_owner_on_this_host_is_replaced_another_hosts_must_expire(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = C.identity(tmp_path / "a", tmp_path / "a" / "run", pid=gone.pid)
    dead = _other(dead, start=1)  # its start time: another process if the pid was reused
    redis_client.set(keys.node_owner("n1"), f"{dead}|1.0", px=30_000)
    me = C.identity(tmp_path / "b", tmp_path / "b" / "run")
    assert C.claim(redis_client, keys, "n1", me, 30) is None
    assert C.holder(redis_client, keys, "n1").home == str((tmp_path / "b").resolve())

    remote = _other(dead, host=socket.gethostname() + "-elsewhere")
    redis_client.set(keys.node_owner("n2"), f"{remote}|1.0", px=30_000)
    other = C.claim(redis_client, keys, "n2", me, 30)
    assert other is not None and other.host.endswith("-elsewhere")  # never provably dead from here
    redis_client.delete(keys.node_owner("n2"))  # its claim expired
    assert C.claim(redis_client, keys, "n2", me, 30) is None


def test_simultaneous_claims_have_one_winner(real_redis, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    idents = [C.identity(tmp_path / f"h{i}", tmp_path / f"h{i}" / "run") for i in range(8)]
    results: list[object] = [None] * len(idents)
    go = threading.Barrier(len(idents))

    def take(i: int) -> None:
        go.wait()
        results[i] = C.claim(real_redis, keys, "n1", idents[i], 30)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(idents))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for r in results if r is None) == 1


def test_only_the_owner_marks_the_node_stopped(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    nodes = NodeRegistry(redis_client, keys)
    nodes.register("n1", ttl=30, backend="fake", cards=1)
    a = C.identity(tmp_path / "a", tmp_path / "a" / "run")
    b = C.identity(tmp_path / "b", tmp_path / "b" / "run")
    assert C.claim(redis_client, keys, "n1", a, 30) is None
    assert nodes.mark_stopped("n1", owner=b) is False
    assert not redis_client.hexists(keys.node("n1"), "stopped_at") and redis_client.exists(keys.node_alive("n1"))
    assert nodes.mark_stopped("n1", owner=a) is True
    assert redis_client.hexists(keys.node("n1"), "stopped_at") and not redis_client.exists(keys.node_owner("n1"))


def test_an_owner_proc_hides_on_this_host_is_not_taken_for_dead(redis_client, key_prefix, tmp_path, hidden_by_proc):
    """Under /proc hidepid=2 another user's rig up on this host has no /proc entry: its claim
    was "provably dead", so a rig up of another home took its live node's name at once, and
    rig recover / rig down of another home were not refused. kill(pid, 0) says it runs
    (EPERM): the name stays its own until its claim expires, as another host's does.
    Reviewer (review1): the refusal said "owned by a live rig up", which nobody here can tell
    (another process may have taken a dead rig up's pid): it says both."""
    keys = Keys(key_prefix)
    owner = _other(C.identity(tmp_path / "a", tmp_path / "a" / "run"), pid=HIDDEN_PID, start=4242)
    redis_client.set(keys.node_owner("n1"), f"{owner}|1.0", px=30_000)
    hidden_by_proc(HIDDEN_PID)
    me = C.identity(tmp_path / "b", tmp_path / "b" / "run")
    other = C.claim(redis_client, keys, "n1", me, 30)
    assert other is not None and other.pid == HIDDEN_PID and not other.provably_dead()
    assert C.holder(redis_client, keys, "n1").identity == owner  # nothing taken over
    with pytest.raises(NodeInUse, match=f"pid {HIDDEN_PID}") as refused:
        C.refuse_unless_ours(redis_client, keys, "n1", tmp_path / "b", "recover")
    said = str(refused.value)
    assert "whose pid runs hidden from this user" in said and "a live rig up" not in said, said


def test_commands_of_another_home_are_refused_naming_the_owner(redis_client, key_prefix, tmp_path):
    keys = Keys(key_prefix)
    a = C.identity(tmp_path / "a", tmp_path / "a" / "run")
    assert C.claim(redis_client, keys, "n1", a, 30) is None
    C.refuse_unless_ours(redis_client, keys, "n1", tmp_path / "a", "recover")  # its own home: fine
    with pytest.raises(NodeInUse, match=rf"owned by a live rig up \(host {socket.gethostname()}, home "
                                        rf".*/a, pid .*`RIG_HOME=.*/a rig recover --node n1` on this host"):
        C.refuse_unless_ours(redis_client, keys, "n1", tmp_path / "b", "recover")


def test_a_damaged_value_still_names_a_holder():
    held = C.parse("not json|x")
    assert held is not None and held.pid is None and not held.provably_dead()
    assert "pid ?" in held.describe()
    assert C.parse(None) is None and C.parse("") is None


def test_identity_names_host_pid_start_home_and_installation(tmp_path):
    fields = json.loads(C.identity(tmp_path, tmp_path / "run"))
    assert fields["host"] == socket.gethostname() and fields["start"] and fields["pid"]
    assert fields["home"] == str(tmp_path.resolve()) and Path(fields["install"], "rig").is_dir()


def test_a_rig_up_that_lost_its_name_stops_without_marking_the_node_stopped(real_redis, key_prefix, tmp_path):
    """A rig up cut off for longer than health.timeout finds the name taken when it renews:
    it says so once, stops, and leaves the new owner's node record alone."""
    from rig.config import load_settings
    from rig.stack import Stack, UpOptions

    settings = load_settings(home=tmp_path / "a", key_prefix=key_prefix, node_name="n1", telemetry_interval=0.5)
    said: list[str] = []
    stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=said.append)
    stack._client = real_redis
    stack._claim_name()
    stack._registered = True
    keys = Keys(key_prefix)
    stack.beat_node()
    assert stack.lost_name is None
    other = C.identity(tmp_path / "b", tmp_path / "b" / "run")
    real_redis.delete(keys.node_owner("n1"))  # expired while it was cut off ...
    assert C.claim(real_redis, keys, "n1", other, 30) is None  # ... and another home took it
    stack._next_beat = 0.0
    stack.beat_node()
    assert stack.lost_name and "was taken by another rig up" in stack.lost_name and said == [stack.lost_name]
    stack.down()
    assert not real_redis.hexists(keys.node("n1"), "stopped_at")
    assert C.holder(real_redis, keys, "n1").identity == other


def test_a_second_stack_of_another_home_is_refused_before_writing_anything(real_redis, key_prefix, tmp_path):
    from rig.config import load_settings
    from rig.stack import Stack, UpOptions

    stacks = []
    for home in ("a", "b"):
        settings = load_settings(home=tmp_path / home, key_prefix=key_prefix, node_name="n1")
        stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=lambda _l: None)
        stack._client = real_redis
        stacks.append(stack)
    stacks[0]._claim_name()
    with pytest.raises(NodeInUse, match=r"node name 'n1' is owned by a live rig up \(host .*home .*/a, pid \d+, "
                                        r"since .*\); `rig up --node n1` from RIG_HOME=.*/b refused, nothing was changed"):
        stacks[1]._claim_name()
    assert stacks[1]._owner is None and not real_redis.exists(Keys(key_prefix).node("n1"))
    stacks[0].down()
    assert not real_redis.exists(Keys(key_prefix).node_owner("n1"))
