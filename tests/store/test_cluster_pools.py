"""Pools are the cluster's, not the submitter's (rig.pools: the nodes' `rig up` record their
[pools]): submit, retry and `rig status --pool` judge --pool by them, and `rig up` refuses a node
whose pools differ from a running node's. A tester's finding: `rig-submit --pool big` was refused
by a submitter without the node's config file, and a RIG_POOLS of the submitter's own was accepted
for jobs that then failed "no longer configured" (fakeredis and real Redis)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput, Unschedulable
from rig.failures import FailureClass
from rig.gpus.fake import FakeGpuBackend
from rig.keys import Keys
from rig.memory import GIB
from rig.models import JobState
from rig.nodes import NodeInfo, NodeRegistry
from rig.pools import NODE_FIELD, cluster_pools, disagreement, encode
from rig.registration import register_node

NODE_POOLS = {"big": ["vm:0-1"]}


@pytest.fixture
def node(redis_client, key_prefix, tmp_path):
    """Node vm (4 fake cards) registered as `rig up` does, its config's [pools] NODE_POOLS."""
    settings = load_settings(key_prefix=key_prefix, node_name="vm", fake_gpus="4x24G", pools=NODE_POOLS,
                             home=tmp_path / "node")
    register_node(settings, redis_client, FakeGpuBackend("4x24G"))
    return settings


def _submitter(redis_client, key_prefix, tmp_path, **settings) -> Client:
    """A client whose own config is not the node's (another user's machine, RIG_POOLS)."""
    return Client(load_settings(key_prefix=key_prefix, node_name="laptop", home=tmp_path / "me", **settings),
                  redis_client=redis_client)


def test_the_node_records_its_pools(node, redis_client, key_prefix):
    assert redis_client.hget(Keys(key_prefix).node("vm"), NODE_FIELD) == encode(NODE_POOLS)


def test_a_pool_of_the_cluster_is_accepted_without_the_nodes_config(node, redis_client, key_prefix, tmp_path):
    client = _submitter(redis_client, key_prefix, tmp_path)
    job = client.submit(["true"], gpu_memory="1G", pool="big").record
    assert job.pool == "big" and job.state is JobState.PENDING
    assert [c.id for c in client.status(pool="big").cards] == ["vm/0", "vm/1"]


def test_a_pool_of_the_submitters_own_config_only_is_refused_naming_the_clusters(
        node, redis_client, key_prefix, tmp_path):
    client = _submitter(redis_client, key_prefix, tmp_path, pools={"x": ["vm:3"]})
    with pytest.raises(InvalidInput, match=r"^pool: unknown pool 'x'; the cluster's pools: big \(node vm's "
                                           r"\[pools\], started last\)$"):
        client.submit(["true"], gpu_memory="1G", pool="x")
    assert client.store.ids_in_state(JobState.PENDING) == []  # nothing was written
    with pytest.raises(InvalidInput, match="unknown pool 'x'"):
        client.status(pool="x")


def test_with_no_node_recorded_a_pool_job_is_refused_saying_so(redis_client, key_prefix, tmp_path):
    client = _submitter(redis_client, key_prefix, tmp_path, pools={"x": ["vm:3"]})
    with pytest.raises(InvalidInput, match="no node has recorded any: `rig up` records a node's"):
        client.submit(["true"], gpu_memory="1G", pool="x")


def test_a_retry_of_a_job_whose_pool_is_gone_is_refused_and_changes_nothing(node, redis_client, key_prefix,
                                                                            tmp_path):
    client = _submitter(redis_client, key_prefix, tmp_path)
    kept = client.submit(["true"], gpu_memory="1G", pool="big").id
    gone = client.submit(["true"], gpu_memory="1G", pool="big").id
    for jid in (kept, gone):
        client.ledger.transition(jid, JobState.FAILED, error_queue=True, expect=JobState.PENDING,
                                 fields={"reason": "unschedulable: test", "failure": FailureClass.UNSCHEDULABLE.value})
    assert client.retry(kept).state is JobState.PENDING
    # The node comes back with other pools: 'big' is gone from the cluster.
    register_node(node.model_copy(update={"pools": {"small": ["vm:2"]}}), redis_client, FakeGpuBackend("4x24G"))
    with pytest.raises(Unschedulable, match=rf"^job {gone} cannot be retried, it could never run: its pool 'big' "
                                            r"is none of the cluster's pools now \(small \(node vm's \[pools\], "
                                            r"started last\)\); resubmit it with another pool \(or none\)$"):
        client.retry(gone)
    assert client.get(gone).state is JobState.FAILED and client.store.in_error_queue(gone)


def _info(name: str, pools: dict | None, started: float, state: str = "up") -> NodeInfo:
    return NodeInfo(name=name, alive=state == "up", state=state, since=started, started_at=started,
                    pools=None if pools is None else encode(pools))


def test_a_retry_with_more_memory_than_its_pools_cards_have_is_refused_and_changes_nothing(
        redis_client, key_prefix, tmp_path):
    """`rig retry N --gpu-memory 50G` of a job of a pool of 24 GB cards, on a node with an 80 GB
    card outside the pool: 'job N is waiting again', then at once FAILED unschedulable (the size
    was judged by every card, not the pool's). Judged as a submission is now."""
    settings = load_settings(key_prefix=key_prefix, node_name="vm", fake_gpus="2x24G,1x80G",
                             pools={"small": ["vm:0-1"]}, home=tmp_path / "node")
    register_node(settings, redis_client, FakeGpuBackend("2x24G,1x80G"))
    client = _submitter(redis_client, key_prefix, tmp_path)
    pooled, free = client.submit(["true"], gpu_memory="10G", pool="small").id, client.submit(["true"], gpu_memory="10G").id
    for jid in (pooled, free):
        client.ledger.transition(jid, JobState.FAILED, error_queue=True, expect=JobState.PENDING,
                                 fields={"reason": "exit code 1", "failure": FailureClass.NONZERO_EXIT.value})
    with pytest.raises(Unschedulable, match=r"^job can never run in pool 'small': needs 50\.0 GiB per card but the "
                                            r"largest card offers 22\.8 GiB usable \(vm/0, "):
        client.retry(pooled, gpu_memory="50G")
    job = client.get(pooled)
    assert job.state is JobState.FAILED and job.gpu_memory == 10 * GIB and client.store.in_error_queue(pooled)
    assert client.retry(free, gpu_memory="50G").state is JobState.PENDING  # the 80 GB card has room for it
    with pytest.raises(InvalidInput, match="more than any card has"):
        client.retry(pooled, gpu_memory="100000T")
    # Over its user's limit alone: refused too, not failed by the dispatcher after 'waiting again'.
    client.settings.max_gpu_memory_per_user = "16G"
    with pytest.raises(Unschedulable, match=r"^job can never run: it needs 20\.0 GiB in all but its user may hold "
                                            r"at most 16\.0 GiB"):
        client.retry(pooled, gpu_memory="20G")
    assert client.get(pooled).state is JobState.FAILED


def test_the_clusters_pools_are_the_last_registered_nodes():
    found = cluster_pools([_info("a", {"p": ["a"]}, 10), _info("b", {"q": ["b"]}, 20, "stopped"),
                           _info("c", None, 30)])  # c: an older rig, it records none
    assert found.node == "b" and found.pools.names == ["q"]
    damaged = NodeInfo(name="d", alive=True, state="up", since=40, started_at=40, pools="{not json")
    assert cluster_pools([_info("a", {"p": ["a"]}, 10), damaged]).node == "a"
    assert cluster_pools([_info("a", {}, 10)]).pools.names == []
    with pytest.raises(ValueError, match=r"the cluster's pools: none \(node a, started last, has no \[pools\]"):
        cluster_pools([_info("a", {}, 10)]).check("p")


def test_rig_up_is_refused_beside_a_running_node_with_other_pools():
    nodes = [_info("a", {"p": ["a"]}, 10), _info("b", {"p": ["a", "b"]}, 20, "stopped")]
    line = disagreement("c", {"p": ["a", "c"]}, nodes)
    assert line and line.startswith('node(s) a run with other pools (a: {"p":["a"]}) than this node\'s config')
    assert "nothing was changed" in line and "give every node the same [pools]" in line and "\n" not in line
    assert disagreement("c", {"p": ["a"]}, nodes) is None  # the same as the running node's
    assert disagreement("a", {"q": ["a"]}, nodes) is None  # its own earlier record: a config change
    assert disagreement("c", {}, [_info("a", None, 10)]) is None  # an older rig tells nothing


def test_a_node_started_with_other_pools_is_refused_by_rig_up(node, redis_client, key_prefix):
    from rig.stack import Stack, StackError, UpOptions

    stack = Stack(node.model_copy(update={"node_name": "vm2", "pools": {}}), UpOptions())
    stack._client = redis_client  # only its pools check is called: no process is started
    with pytest.raises(StackError, match=r"node\(s\) vm run with other pools"):
        stack._check_pools()
    NodeRegistry(redis_client, stack.keys).mark_stopped("vm")
    stack._check_pools()  # a stopped node is asked when it comes back


@pytest.mark.redis
def test_rig_submit_from_another_config_uses_the_clusters_pools(cli_env, real_redis, tmp_path, monkeypatch):
    from rig.cli.submit import main as submit_main

    register_node(load_settings(key_prefix=cli_env, node_name="vm", fake_gpus="2x24G", pools=NODE_POOLS,
                                home=tmp_path / "node"), real_redis, FakeGpuBackend("2x24G"))
    ok = CliRunner().invoke(submit_main, ["--pool", "big", "--gpu-memory", "1G", "--", "true"])
    assert ok.exit_code == 0, ok.output
    monkeypatch.setenv("RIG_POOLS", '{"x": ["vm:5"]}')
    refused = CliRunner().invoke(submit_main, ["--pool", "x", "--gpu-memory", "1G", "--", "true"])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        "rig: error: --pool: unknown pool 'x'; the cluster's pools: big (node vm's [pools], started last)"]


def test_status_of_a_pool_without_cards_says_the_pools_truth_not_that_no_node_is_up(redis_client, key_prefix,
                                                                                    tmp_path):
    """A tester's finding: [pools] b = ["n1:1"] on a one-card n1: `rig status --pool b` said "no
    rig node is up" though n1 was; it says what submit says (Pools.no_card)."""
    from io import StringIO

    from rich.console import Console

    from rig.cli.as_json import status_dict
    from rig.cli.render import render_status

    pools = {"a": ["n1:0"], "b": ["n1:1"]}
    settings = load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="1x80G", pools=pools,
                             home=tmp_path / "node")
    register_node(settings, redis_client, FakeGpuBackend("1x80G"))
    client = _submitter(redis_client, key_prefix, tmp_path)
    report = client.status(pool="b")
    assert report.cards == [] and report.pool_empty == "pool 'b' has no registered card (its members: n1:1)"
    out = StringIO()
    render_status(report, Console(file=out, width=200))
    assert "pool 'b' has no registered card (its members: n1:1)" in out.getvalue()
    assert "no rig node is up" not in out.getvalue()
    assert status_dict(report)["pool_empty"] == report.pool_empty
    assert client.status(pool="a").pool_empty is None
    with pytest.raises(Unschedulable, match=r"^job can never run: pool 'b' has no registered card \(its members: "
                                            r"n1:1\)$"):
        client.submit(["true"], gpu_memory="1G", pool="b")


def test_rig_up_warns_in_one_line_of_a_pool_member_naming_a_card_the_node_lacks():
    from rig.pools import Pools

    pools = Pools.from_config({"a": ["n1:0"], "b": ["n1:1"], "c": ["n1:0-2", "n2:5"], "d": ["n1"]})
    line = pools.unmatched("n1", range(1))
    assert line == ("warning: [pools] member(s) b: n1:1; c: n1:0-2 name cards node n1 does not have (its cards: "
                    "0): no job runs on them; fix [pools] (config file or RIG_POOLS)")
    assert pools.unmatched("n1", range(3)) is None  # n2:5 is n2's to check
    assert pools.unmatched("n2", range(1)) is not None and Pools({}).unmatched("n1", range(1)) is None


def test_two_rig_ups_with_other_pools_at_once_cannot_both_join(redis_client, key_prefix, tmp_path, monkeypatch):
    """Two nodes with different [pools] started at the same moment both read no other node's
    pools before either recorded its own, and both joined. The check and the registration now
    hold the join lock: the second is refused."""
    import threading

    import rig.stack
    from rig.stack import Stack, StackError, UpOptions

    real_register = rig.stack.register_node
    both_checked = threading.Barrier(2, timeout=1.0)  # met only when both passed the check at once

    def register_after_the_other_checked(settings, _client, backend, say=None):
        try:
            both_checked.wait()
        except threading.BrokenBarrierError:  # the other waits on the lock: the fix
            pass
        return real_register(settings, redis_client, backend, say)

    monkeypatch.setattr(rig.stack, "register_node", register_after_the_other_checked)
    outcomes: dict[str, str] = {}

    def up(name: str, pools: dict) -> None:
        settings = load_settings(key_prefix=key_prefix, node_name=name, fake_gpus="2x24G", pools=pools,
                                 home=tmp_path / name)
        stack = Stack(settings, UpOptions(), say=lambda _line: None)
        stack._client = redis_client  # only the registration is called: no process is started
        try:
            stack._register_cards()
            outcomes[name] = "joined"
        except StackError as exc:
            outcomes[name] = str(exc)

    threads = [threading.Thread(target=up, args=("x", {"p": ["x:0"]})),
               threading.Thread(target=up, args=("y", {"p": ["y:1"]}))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["x", "y"]
    joined = [name for name, outcome in outcomes.items() if outcome == "joined"]
    assert len(joined) == 1, outcomes
    refused = outcomes["y" if joined == ["x"] else "x"]
    assert "run with other pools" in refused, refused


def test_a_held_join_lock_refuses_rig_up_in_one_line(redis_client, key_prefix, tmp_path, monkeypatch):
    import rig.stack
    from rig.stack import Stack, StackError, UpOptions

    monkeypatch.setattr(rig.stack, "JOIN_LOCK_S", 0.2)
    settings = load_settings(key_prefix=key_prefix, node_name="x", fake_gpus="1x24G", home=tmp_path / "x")
    stack = Stack(settings, UpOptions(), say=lambda _line: None)
    stack._client = redis_client
    redis_client.set(stack.keys.join_lock, "another-rig-up", px=10_000)
    with pytest.raises(StackError, match=r"^another rig up has been registering its node in this Redis for 0 s"):
        stack._register_cards()
    assert not redis_client.exists(stack.keys.node("x"))  # nothing was registered
