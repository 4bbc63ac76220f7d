"""Node liveness on a shared Redis (fakeredis and real Redis, no workers): a silent node is
declared down after a confirming pass, its cards leave placement, its jobs are handled by their
retry policy, and it rejoins cleanly; a node stopped on purpose keeps its running jobs."""

from __future__ import annotations

import json
import os
import time

import pytest

from rig.clock import shared_now
from rig.config import load_settings
from rig.errors import InvalidInput, NodeInUse, PermissionDenied
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NODE_DOWN_REASON, NODE_STOPPED_REASON, NodeRegistry
from rig.pools import NODE_FIELD, encode
from rig.supervision import STARTUP_GRACE_S
from tests.store.conftest import add_cards, ledger_with_cards
from workers.dispatcher import Dispatcher
from workers.health import HealthChecker

TTL = 3.0


@pytest.fixture
def cluster(redis_client, key_prefix):
    """Nodes n1 (2 cards) and n2 (1 card) registered and heartbeating; the checker runs on n2."""
    settings = load_settings(key_prefix=key_prefix, node_name="n2", telemetry_interval=0.5,
                             health={"timeout": TTL, "check_interval": 1.0}, hold_after_seconds=0)
    keys = Keys(key_prefix)
    ledger = Ledger(redis_client, keys)
    nodes = NodeRegistry(redis_client, keys)
    for node, count in (("n1", 2), ("n2", 1)):
        add_cards(ledger, count, 40, node=node, max_jobs=2, uuid="GPU-{node}-{index}")
        nodes.register(node, ttl=TTL, backend="fake", cards=count)
    checker = HealthChecker(settings, redis_client)
    return settings, keys, ledger, nodes, checker


def _job(ledger: Ledger, node: str | None = None, card: int = 0, *, run: bool = False) -> int:
    """A job, placed on ``node``/``card`` (ASSIGNED) and, with ``run``, claimed (RUNNING)."""
    job_id = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=10 * GIB, gpus=1, max_retries=2,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
    )).id
    if node is not None:
        ok, token = ledger.reserve(job_id, node, [card], 10 * GIB)
        assert ok, token
        if run:
            assert ledger.claim(job_id, token, f"card{card}@{node}")[0]
    return job_id


def _silence(redis_client, keys: Keys, node: str) -> None:
    """What a dead node leaves: its heartbeat expired, its workers' too."""
    redis_client.delete(keys.node_alive(node))
    for name in redis_client.smembers(keys.workers):
        if name.endswith(f"@{node}"):
            redis_client.delete(keys.worker(name))


def _worker_beat(redis_client, keys: Keys, name: str) -> None:
    redis_client.set(keys.worker(name), json.dumps({"node": name.split("@")[1]}), ex=10)
    redis_client.sadd(keys.workers, name)


def _state(nodes: NodeRegistry, name: str) -> str:
    return next(n for n in nodes.read() if n.name == name).state


def test_silent_node_is_declared_down_on_a_confirming_pass(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    running, assigned = _job(ledger, "n1", 0, run=True), _job(ledger, "n1", 1)
    elsewhere = _job(ledger, "n2", 0, run=True)
    _silence(redis_client, keys, "n1")
    now = time.time()

    first = checker.run_cluster(now=now)
    assert first is not None and first.nodes_down == []
    assert _state(nodes, "n1") == "silent"
    assert ledger.store.get(running).state is JobState.RUNNING  # one look is not enough

    second = checker.run_cluster(now=now + 2 * settings.telemetry_interval)
    assert second.nodes_down == ["n1"]
    assert sorted(second.lost) == [running] and second.requeued == [assigned]
    assert _state(nodes, "n1") == "down"
    for card in (c for c in ledger.cards() if c.node == "n1"):
        assert not card.eligible and card.health_reason.startswith(NODE_DOWN_REASON)
        assert card.reserved == 0 and card.jobs == 0 and ledger.holdings("n1", card.index) == {}
    lost = ledger.store.get(running)
    assert lost.state is JobState.PENDING  # retries left: back in its place
    assert lost.attempts[-1]["outcome"] == "lost" and "node n1" in lost.attempts[-1]["summary"]
    assert ledger.store.get(assigned).state is JobState.PENDING
    assert ledger.store.get(elsewhere).state is JobState.RUNNING  # the live node is untouched
    assert next(c for c in ledger.cards() if c.node == "n2").eligible

    # Placement now sees only n2's card (10 GiB used of 40, room for one more job).
    started: list[tuple] = []
    Dispatcher(settings, lambda *a: started.append(a), client=redis_client).dispatch_pass()
    assert started and {s[2] for s in started} == {"n2"}


def test_a_down_nodes_running_job_ends_lost_at_its_last_heartbeat(cluster, redis_client):
    """A job killed with its host 7 s in read 'lost ... 43s': its attempt ended when the node
    was declared down, ~40 s later, and that time was charged as the user's card time."""
    settings, keys, ledger, nodes, checker = cluster
    running = _job(ledger, "n1", 0, run=True)
    now = shared_now(redis_client)
    ledger.store.update(running, started_at=now - 100)
    redis_client.hset(keys.node("n1"), "last_seen", repr(now - 60))  # its last heartbeat
    _silence(redis_client, keys, "n1")
    checker.run_cluster(now=time.time())
    assert checker.run_cluster(now=time.time() + 2 * settings.telemetry_interval).lost == [running]
    attempt = ledger.store.get(running).attempts[-1]
    assert attempt["outcome"] == "lost" and attempt["ended_at"] == pytest.approx(now - 60)
    assert attempt["ended_at"] - attempt["started_at"] == pytest.approx(40)


def test_a_down_nodes_cards_are_closed_before_it_is_said_down(cluster, redis_client, monkeypatch):
    """Whoever reads "down" finds its cards closed: the pass wrote "down" first and closed the
    cards after, and node-lost read a down node with a card still open between the two writes."""
    settings, keys, ledger, nodes, checker = cluster
    _silence(redis_client, keys, "n1")
    now = time.time()
    checker.run_cluster(now=now)
    real_set_down = NodeRegistry.set_down
    open_when_down: list[list[int]] = []

    def set_down(self, node: str, when: float) -> None:
        open_when_down.append([c.index for c in ledger.cards() if c.node == node and c.eligible])
        real_set_down(self, node, when)

    monkeypatch.setattr(NodeRegistry, "set_down", set_down)
    assert checker.run_cluster(now=now + 2 * settings.telemetry_interval).nodes_down == ["n1"]
    assert open_when_down == [[]]


def test_heartbeat_back_within_the_confirmation_clears_the_doubt(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    job = _job(ledger, "n1", 0, run=True)
    _silence(redis_client, keys, "n1")
    now = time.time()
    checker.run_cluster(now=now)
    nodes.beat("n1", ttl=TTL, source="test")  # e.g. Redis restarted; heartbeats resume
    report = checker.run_cluster(now=now + 5)
    assert report.nodes_down == [] and report.lost == []
    assert ledger.store.get(job).state is JobState.RUNNING
    assert _state(nodes, "n1") == "up"
    assert next(n for n in nodes.read() if n.name == "n1").missing_since is None


def test_a_live_worker_keeps_its_node_alive(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    job = _job(ledger, "n1", 0, run=True)
    redis_client.delete(keys.node_alive("n1"))  # rig up gone, its card worker still runs
    _worker_beat(redis_client, keys, "card0@n1")
    now = time.time()
    checker.run_cluster(now=now)
    assert checker.run_cluster(now=now + 5).nodes_down == []
    assert ledger.store.get(job).state is JobState.RUNNING


def test_down_node_rejoins_its_cards_take_jobs_again(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    _silence(redis_client, keys, "n1")
    now = time.time()
    checker.run_cluster(now=now)
    checker.run_cluster(now=now + 2)
    assert not any(c.eligible for c in ledger.cards() if c.node == "n1")

    nodes.register("n1", ttl=TTL, backend="fake", cards=2)  # its `rig up` again
    _worker_beat(redis_client, keys, "card0@n1")
    report = checker.run_cluster(now=now + 3)
    assert report.nodes_back == ["n1"]
    info = next(n for n in nodes.read() if n.name == "n1")
    assert info.state == "up" and info.down_since is None
    card0, card1 = (ledger.card("n1", i) for i in (0, 1))
    assert card0.eligible  # its worker heartbeats
    assert not card1.eligible  # no worker yet: it stays out until its worker restores it


def test_stopped_node_keeps_its_running_jobs_and_requeues_unstarted_ones(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    running, assigned = _job(ledger, "n1", 0, run=True), _job(ledger, "n1", 1)
    nodes.mark_stopped("n1")  # `rig down` on n1: its jobs keep running there
    _silence(redis_client, keys, "n1")
    report = checker.run_cluster()
    assert report.nodes_down == [] and report.lost == [] and report.requeued == [assigned]
    assert _state(nodes, "n1") == "stopped"
    assert ledger.store.get(running).state is JobState.RUNNING
    assert ledger.card("n1", 0).reserved == 10 * GIB  # still held by the job that runs
    assert all(c.health_reason.startswith(NODE_STOPPED_REASON) for c in ledger.cards() if c.node == "n1")
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    assert _state(nodes, "n1") == "up"


def test_node_names_must_be_usable_in_queue_and_key_names():
    from rig.errors import ConfigError

    assert load_settings(node_name="gpu-01.lab").node_name == "gpu-01.lab"
    for bad in ("a/b", "a b", "card@x", "", "-x"):
        with pytest.raises(ConfigError, match="node_name"):
            load_settings(node_name=bad)


# -- forgetting a node that is gone for good ------------------------------------------------------
def _declare_down(checker: HealthChecker, redis_client, keys: Keys, node: str) -> None:
    _silence(redis_client, keys, node)
    now = time.time()
    checker.run_cluster(now=now)
    assert checker.run_cluster(now=now + 2).nodes_down == [node]


def test_forgetting_a_node_gone_for_good_removes_it_and_its_cards(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    lost = _job(ledger, "n1", 0, run=True)
    _worker_beat(redis_client, keys, "card0@n1")
    _declare_down(checker, redis_client, keys, "n1")  # its job was lost and went back to the queue

    assert nodes.forget("n1") == ["n1/0", "n1/1"]
    assert [n.name for n in nodes.read()] == ["n2"]
    assert {c.node for c in ledger.cards()} == {"n2"}
    assert redis_client.smembers(keys.cards) == {"n2/0"}
    assert "card0@n1" not in redis_client.smembers(keys.workers)
    assert list(redis_client.scan_iter(f"{keys.prefix}*n1*")) == []  # no key of it is left
    assert ledger.store.get(lost).state is JobState.PENDING  # jobs are not the node's to forget
    assert checker.run_cluster() is not None and _state(nodes, "n2") == "up"  # the check carries on
    with pytest.raises(InvalidInput, match="no node named 'n1'"):
        nodes.forget("n1")

    # A forgotten node that comes back simply registers again.
    nodes.register("n1", ttl=TTL, backend="fake", cards=1)
    assert _state(nodes, "n1") == "up"


def test_a_node_that_is_up_or_has_work_is_not_forgotten(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    with pytest.raises(NodeInUse, match=r"^node n1 is up; .*rig down --node n1"):
        nodes.forget("n1")

    redis_client.delete(keys.node_alive("n1"))  # rig up gone, a card worker still heartbeats
    _worker_beat(redis_client, keys, "card1@n1")
    with pytest.raises(NodeInUse, match=r"is up \(live workers: card1@n1\)"):
        nodes.forget("n1")

    _silence(redis_client, keys, "n1")  # silent, not yet declared down: its placed job is its own
    assigned = _job(ledger, "n1", 1)
    with pytest.raises(NodeInUse, match=rf"still has work: job\(s\) {assigned} placed or running there; "
                                        rf"card\(s\) n1/1 hold reservations; .*rig kill {assigned}"):
        nodes.forget("n1")

    ledger.transition(assigned, JobState.CANCELLED, mode="cancel")
    running = _job(ledger, "n1", 0, run=True)
    nodes.mark_stopped("n1")  # stopped on purpose: its running job stays its own
    with pytest.raises(NodeInUse, match=rf"job\(s\) {running} .*stopped on purpose .*rig up --node n1"):
        nodes.forget("n1")
    # Nothing was removed: the node, its cards, their reservations, its workers.
    assert "n1" in redis_client.smembers(keys.nodes) and redis_client.exists(keys.node("n1"))
    assert len(ledger.cards()) == 3 and ledger.holdings("n1", 0) == {running: 10 * GIB}
    assert "card1@n1" in redis_client.smembers(keys.workers)


def test_a_reservation_racing_the_forget_is_seen(cluster, redis_client, monkeypatch):
    """The check and the removal are one transaction: a job placed on the node between them
    makes the forget look again, and refuse."""
    settings, keys, ledger, nodes, checker = cluster
    _silence(redis_client, keys, "n1")
    waiting = _job(ledger)
    check = NodeRegistry._refuse_if_in_use
    calls: list[int] = []

    def check_then_place(self, *args):
        check(self, *args)
        if not calls:
            assert ledger.reserve(waiting, "n1", [0], 10 * GIB)[0]  # a dispatcher, meanwhile
        calls.append(1)

    monkeypatch.setattr(NodeRegistry, "_refuse_if_in_use", check_then_place)
    with pytest.raises(NodeInUse, match=rf"job\(s\) {waiting} placed"):
        nodes.forget("n1")
    assert len(calls) == 1 and ledger.card("n1", 0).reserved == 10 * GIB


def test_only_admins_may_forget_a_node(cluster, redis_client, monkeypatch):
    from rig.client import Client, Identity

    settings, keys, ledger, nodes, checker = cluster
    _silence(redis_client, keys, "n1")
    client = Client(settings.model_copy(update={"admins": ["carol"]}), redis_client=redis_client)
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("bob", 1002))
    with pytest.raises(PermissionDenied, match="only an admin may forget a node, and bob is none"):
        client.forget_node("n1")
    assert "n1" in redis_client.smembers(keys.nodes)
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("carol", 1003))
    with pytest.raises(InvalidInput, match="not a node name"):
        client.forget_node("n1/*")
    assert client.forget_node("n1") == ["n1/0", "n1/1"]


def test_forgetting_a_stopped_node_is_refused_unless_forced_and_failed_jobs_get_a_class(
        cluster, redis_client, monkeypatch):
    """A node merely stopped (`rig down`) comes back: forgetting it is refused, saying which
    waiting jobs it would fail and which would wait; --force fails those with a class and a
    reason naming the node (they used to be FAILED with no class, no warning)."""
    from rig.client import Client, Identity
    from rig.failures import FailureClass

    settings, keys, ledger, nodes, checker = cluster
    for node in ("n1", "n2"):  # the cluster's pools, as each node's rig up records them (rig.pools)
        redis_client.hset(keys.node(node), NODE_FIELD, encode({"only1": ["n1"], "both": ["n1", "n2"]}))
    client = Client(settings, redis_client=redis_client)  # its own config has no [pools]
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("root", 0))
    stranded = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=10 * GIB, gpus=1, max_retries=2,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time(), pool="only1")).id
    served = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=10 * GIB, gpus=1, max_retries=2,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time(), pool="both")).id
    nodes.mark_stopped("n1")
    _silence(redis_client, keys, "n1")
    with pytest.raises(NodeInUse, match=rf"node n1 was stopped on purpose .*would FAIL waiting job\(s\) {stranded} "
                                        rf"\(failure class unschedulable.*leave job\(s\) {served} waiting.*"
                                        r"rig forget-node n1 --force"):
        client.forget_node("n1")
    assert "n1" in redis_client.smembers(keys.nodes) and len(ledger.cards()) == 3  # nothing changed
    assert ledger.store.get(stranded).state is JobState.PENDING
    failed: dict[int, str] = {}
    assert client.forget_node("n1", force=True, failed=failed) == ["n1/0", "n1/1"]
    job = ledger.store.get(stranded)
    assert job.state is JobState.FAILED and job.failure == FailureClass.UNSCHEDULABLE.value
    assert job.reason.startswith("unschedulable: node n1 was forgotten by root; no card is left in pool 'only1'")
    assert failed == {stranded: job.reason}
    assert ledger.store.get(served).state is JobState.PENDING


def test_a_stopped_node_with_running_jobs_is_refused_for_them_not_offered_force(cluster, redis_client, monkeypatch):
    """`rig forget-node b` of a node stopped with jobs running on it said "forgetting it now
    would fail no job ... To forget it anyway: `rig forget-node b --force`", and --force then
    refused for those jobs: the first answer names them, as --force's does."""
    from rig.client import Client, Identity

    settings, keys, ledger, nodes, checker = cluster
    client = Client(settings, redis_client=redis_client)
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("root", 0))
    running = _job(ledger, "n1", 0, run=True)
    nodes.mark_stopped("n1")
    _silence(redis_client, keys, "n1")
    for force in (False, True):
        with pytest.raises(NodeInUse) as refused:
            client.forget_node("n1", force=force)
        assert f"job(s) {running} placed or running there" in str(refused.value)
        assert "--force" not in str(refused.value) and "fail no job" not in str(refused.value)
    assert "n1" in redis_client.smembers(keys.nodes) and ledger.store.get(running).state is JobState.RUNNING


def test_the_dispatcher_gives_unschedulable_jobs_a_class(cluster, redis_client):
    from rig.failures import FailureClass

    settings, keys, ledger, nodes, checker = cluster
    huge = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=400 * GIB, gpus=1, max_retries=2,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id
    Dispatcher(settings, lambda *a: None, redis_client).dispatch_pass()
    job = ledger.store.get(huge)
    assert job.state is JobState.FAILED and job.failure == FailureClass.UNSCHEDULABLE.value


def test_a_card_outside_the_whitelist_of_a_node_back_up_loses_its_node_stopped_mark(cluster, redis_client):
    """No worker runs for a card outside gpu_whitelist (holding nothing): waiting for one kept
    "[UNHEALTHY: node stopped ...]" on it for ever while its node was up."""
    settings, keys, ledger, nodes, checker = cluster
    redis_client.hset(keys.card("n1", 1), "allowed", "0")
    _worker_beat(redis_client, keys, "card0@n1")
    for i in (0, 1):
        ledger.set_healthy("n1", i, False, f"{NODE_STOPPED_REASON} at 22:55:14: its running jobs are adopted")
    checker.run_once()
    assert ledger.card("n1", 1).healthy and ledger.card("n1", 1).health_reason == ""
    assert ledger.card("n1", 0).healthy  # its worker heartbeats


def test_zombie_reservations_are_given_back_and_live_ones_cost_no_script(cluster, redis_client):
    """Issue 15: the cluster pass ran reclaim.lua once per reservation (2,048 scripts every 5 s
    with 2,048 running jobs); now only for reservations not plainly held by a live job there."""
    settings, keys, ledger, nodes, checker = cluster
    live = _job(ledger, "n1", 0, run=True)
    ended = _job(ledger, "n1", 1, run=True)
    # The end of ``ended`` lost its card's side (as a crash between two writes would leave it).
    redis_client.hset(keys.job(ended), "state", JobState.SUCCEEDED.value)
    ghost = 424242  # a reservation whose job record is gone
    redis_client.hset(keys.card_jobs("n1", 0), str(ghost), 5 * GIB)
    redis_client.hincrby(keys.card("n1", 0), "reserved", 5 * GIB)
    redis_client.hincrby(keys.card("n1", 0), "jobs", 1)
    asked: list[int] = []
    reclaim = checker.ledger.reclaim
    checker.ledger.reclaim = lambda node, index, job_id: asked.append(job_id) or reclaim(node, index, job_id)
    report = checker.run_cluster()
    assert sorted(asked) == sorted([ended, ghost])
    assert sorted(report.reclaimed) == sorted([("n1/0", ghost, 5 * GIB), ("n1/1", ended, 10 * GIB)])
    assert ledger.holdings("n1", 0) == {live: 10 * GIB} and ledger.holdings("n1", 1) == {}
    assert ledger.card("n1", 0).reserved == 10 * GIB and ledger.card("n1", 1).jobs == 0


def test_fake_usage_folders_of_jobs_that_run_here_no_more_are_removed(redis_client, key_prefix, tmp_path):
    """A card worker that dies mid-job leaves the job's fake-card usage folder (its ending is
    recorded by another process): the node's health pass removes it, but never the folder of a
    job running here, a young one (a new attempt may have just made it), or one a live process
    still writes in while Redis has no record of its job."""
    import os

    from rig.gpus.fake import job_usage_dirs, jobs_dir_for
    from workers.health import STALE_USAGE_DIR_S, HealthReport

    settings = load_settings(key_prefix=key_prefix, node_name="n2", home=tmp_path, fake_gpus="1x40G")
    ledger = ledger_with_cards(redis_client, key_prefix, 1, 40, node="n2", uuid="GPU-{node}-{index}")
    ended = _job(ledger, "n2", run=True)
    assert ledger.transition(ended, JobState.SUCCEEDED)[0] == 1
    running = _job(ledger, "n2", run=True)
    young = _job(ledger)  # PENDING: its folder was made a moment ago
    unrecorded_live, unrecorded_dead = 90001, 90002
    jobs_dir = jobs_dir_for(settings.fake_usage_dir)
    old = time.time() - STALE_USAGE_DIR_S - 5
    for job_id, pid in ((ended, 1), (running, 1), (young, 1), (unrecorded_live, os.getpid()),
                        (unrecorded_dead, 999999)):
        card = jobs_dir / f"job-{job_id}" / "0"
        card.mkdir(parents=True)
        (card / str(pid)).write_text(str(GIB))
        if job_id != young:
            os.utime(card.parent, (old, old))
    try:
        HealthChecker(settings, redis_client)._stale_usage_dirs(HealthReport())
        left = set(job_usage_dirs(jobs_dir))
        assert left == {running, young, unrecorded_live}, left
    finally:
        import shutil

        shutil.rmtree(jobs_dir, ignore_errors=True)


def test_a_node_up_with_no_live_worker_takes_no_new_jobs_and_gives_back_its_placed_ones(cluster, redis_client):
    """A node whose rig up heartbeats while none of its workers does (they keep failing to
    start) runs nothing: its own local pass runs in the missing control worker, so the cluster
    pass closes its cards and requeues what was placed there; a running job is left alone."""
    settings, keys, ledger, nodes, checker = cluster
    nodes.register("n1", ttl=TTL, backend="fake", cards=2, pid=os.getpid())  # a rig up that runs (its record has its pid)
    running, assigned = _job(ledger, "n1", 0, run=True), _job(ledger, "n1", 1)
    now = time.time()

    assert checker.run_cluster(now=now).requeued == []  # just started: its workers may be starting
    assert all(c.eligible for c in ledger.cards() if c.node == "n1")

    nodes.beat("n1", ttl=TTL, source="test")  # its rig up goes on heartbeating (a slow host: TTL is short)
    report = checker.run_cluster(now=now + STARTUP_GRACE_S + 1)  # past a starting worker's grace
    assert report.requeued == [assigned] and report.lost == []
    assert ledger.store.get(assigned).state is JobState.PENDING
    assert "no worker alive" in ledger.store.get(assigned).reason
    assert ledger.store.get(running).state is JobState.RUNNING
    assert not any(c.eligible for c in ledger.cards() if c.node == "n1")
    started: list[tuple] = []
    Dispatcher(settings, lambda *a: started.append(a), client=redis_client).dispatch_pass()
    assert {s[2] for s in started} <= {"n2"}  # nothing placed on n1 again

    _worker_beat(redis_client, keys, "card0@n1")  # a worker is back: the node is left to it
    ledger.set_healthy("n1", 0, True)  # as that card worker's first reading does
    nodes.beat("n1", ttl=TTL, source="test")
    assert checker.run_cluster(now=now + STARTUP_GRACE_S + 2).requeued == []
    assert ledger.card("n1", 0).eligible


def test_a_node_with_a_live_worker_keeps_its_placed_jobs(cluster, redis_client):
    settings, keys, ledger, nodes, checker = cluster
    nodes.register("n1", ttl=TTL, backend="fake", cards=2, pid=os.getpid())
    _worker_beat(redis_client, keys, "control@n1")
    assigned = _job(ledger, "n1", 1)
    report = checker.run_cluster(now=time.time() + settings.health.timeout + 1)
    assert report.requeued == [] and ledger.store.get(assigned).state is JobState.ASSIGNED
    assert all(c.eligible for c in ledger.cards() if c.node == "n1")


def test_a_node_marked_stopped_because_its_rig_up_died_says_so_until_it_registers(cluster, redis_client):
    from rig.waiting import node_state_text

    settings, keys, ledger, nodes, checker = cluster
    why = "its rig up (pid 4242) died; `rig up` adopts its running jobs"
    assert nodes.mark_stopped("n1", why=why)
    info = next(n for n in nodes.read() if n.name == "n1")
    assert info.state == "stopped" and info.stopped_why == why
    assert info.describe.startswith("stopped since ") and info.describe.endswith(f"({why})")
    assert node_state_text(info).endswith(f"({why})") and "rig down" not in node_state_text(info)
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)  # its rig up again
    info = next(n for n in nodes.read() if n.name == "n1")
    assert info.state == "up" and info.stopped_why is None
    assert nodes.mark_stopped("n1")  # rig down: no reason kept from before
    info = next(n for n in nodes.read() if n.name == "n1")
    assert info.stopped_why is None and "rig down" in node_state_text(info)


def test_a_node_whose_workers_are_still_starting_keeps_its_placed_jobs(cluster, redis_client):
    """Its rig up heartbeats only while a worker process of it lives: none heartbeating yet is a
    worker still starting, which the node's own pass leaves alone for STARTUP_GRACE_S
    (rig.supervision.hung_after). The cluster pass gives it as long before it requeues."""
    settings, keys, ledger, nodes, checker = cluster
    assert settings.health.timeout < STARTUP_GRACE_S
    nodes.register("n1", ttl=TTL, backend="fake", cards=2, pid=os.getpid())
    assigned = _job(ledger, "n1", 1)
    started = next(n for n in nodes.read() if n.name == "n1").started_at
    report = checker.run_cluster(now=started + settings.health.timeout + 1)
    assert report.requeued == [] and ledger.store.get(assigned).state is JobState.ASSIGNED
    assert all(c.eligible for c in ledger.cards() if c.node == "n1")
    nodes.beat("n1", ttl=TTL, source="test")
    assert checker.run_cluster(now=started + STARTUP_GRACE_S + 1).requeued == [assigned]


def test_a_node_whose_workers_were_silent_in_a_redis_outage_keeps_its_placed_jobs(cluster, redis_client):
    """Redis refused every heartbeat for a while: as writes come back, the node's rig up may
    beat before its workers do. That is no node without workers (the node's own pass waits
    health.timeout after an outage too: _dead_workers)."""
    settings, keys, ledger, nodes, checker = cluster
    nodes.register("n1", ttl=TTL, backend="fake", cards=2, pid=os.getpid())
    assigned = _job(ledger, "n1", 1)
    checker._outage_at = time.monotonic()  # this checker's pass was refused by Redis just now
    report = checker.run_cluster(now=time.time() + 120)
    assert report.requeued == [] and ledger.store.get(assigned).state is JobState.ASSIGNED
    assert all(c.eligible for c in ledger.cards() if c.node == "n1")
