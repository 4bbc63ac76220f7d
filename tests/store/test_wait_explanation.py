"""Why a job waits: one explanation (rig.waiting), true when no node is up, when no dispatcher
runs, and never contradicting the dispatcher's own (issue 10, item 5). fakeredis and real Redis."""

from __future__ import annotations

import json
import time

import pytest

from rig import forecast_store
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.waiting import FITS_NOW, NO_DISPATCHER, why_waiting
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher

TTL = 30.0


@pytest.fixture
def world(redis_client, key_prefix):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=0)
    keys = Keys(key_prefix)
    ledger = Ledger(redis_client, keys)
    nodes = NodeRegistry(redis_client, keys)
    client = Client(settings, redis_client=redis_client)
    return settings, keys, ledger, nodes, client


def _cards(ledger: Ledger, node: str, count: int = 2, gib: int = 40) -> None:
    add_cards(ledger, count, gib, node=node, uuid="{node}-u{index}")


def _submit(ledger: Ledger, gib: float, priority: Priority = Priority.MEDIUM) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
    )).id


def test_after_rig_down_a_new_job_says_no_node_is_up(world):
    """The slip: `rig down` of the only node, then a submit. Its cards are still registered and
    healthy (nobody is left to run the health check), so the old live view said "it fits now
    and starts as soon as the dispatcher places it"."""
    _, _, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    nodes.mark_stopped("n1")
    job = client.get(_submit(ledger, 4))
    why = why_waiting(client, job)
    assert why.startswith("no rig node is up (node n1: stopped since "), why
    assert "by `rig down`" in why and FITS_NOW not in why and NO_DISPATCHER in why


def test_a_down_node_is_named_with_its_time(world):
    _, keys, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    client.r.delete(keys.node_alive("n1"))  # its heartbeat expired ...
    nodes.set_down("n1", time.time() - 60)  # ... and the cluster check declared it down
    why = why_waiting(client, client.get(_submit(ledger, 4)))
    assert why.startswith("no rig node is up (node n1: DOWN since "), why
    assert "no heartbeat" in why


def test_only_the_nodes_that_are_not_up_have_cards_big_enough(world):
    _, keys, ledger, nodes, client = world
    for name, gib in (("small", 24), ("big", 80)):
        nodes.register(name, ttl=TTL, backend="fake", cards=1)
        _cards(ledger, name, count=1, gib=gib)
    nodes.mark_stopped("big")
    client.r.set(keys.sched_leader, "someone")  # a dispatcher runs (on node small)
    why = why_waiting(client, client.get(_submit(ledger, 60)))
    assert "only cards of nodes that are not up could take it (node big: stopped since" in why, why
    assert NO_DISPATCHER not in why


def test_no_dispatcher_running_is_said_even_when_the_job_fits(world):
    _, _, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    why = why_waiting(client, client.get(_submit(ledger, 4)))
    assert why.startswith(f"{FITS_NOW} (n1/"), why
    assert why.endswith(NO_DISPATCHER)


def test_a_control_worker_alive_without_a_dispatcher_is_not_called_absent(world):
    """A control worker SIGSTOPped (or its dispatcher stuck) while its heartbeat lives: `rig
    status` listed control@n1 seen 1 s ago while `rig show` and the estimated start said "no
    control worker is up: `rig up` starts one", with rig up running. Both name it now."""
    _, keys, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    client.r.set(keys.worker("card0@n1"), json.dumps({"role": "card", "node": "n1"}), ex=30)
    client.r.set(keys.worker("control@n1"), json.dumps({"role": "control", "node": "n1"}), ex=30)
    client.r.sadd(keys.workers, "card0@n1", "control@n1")
    job = client.get(_submit(ledger, 4))
    why = why_waiting(client, job)
    assert NO_DISPATCHER not in why, why
    assert why.endswith("no dispatcher is running: control worker(s) control@n1 have a heartbeat, but none has led "
                        "in the last 5 s (starting, or stuck or stopped: `rig status` shows them, their logs say why)")
    got = forecast_store.read(client.r, keys, [job.id])
    assert got.of(job.id).why_none.startswith("no dispatcher is running: control worker(s) control@n1 have")
    client.r.delete(keys.worker("control@n1"))  # its heartbeat expired: none is up
    assert why_waiting(client, job).endswith(NO_DISPATCHER)
    assert forecast_store.read(client.r, keys, [job.id]).of(job.id).why_none == NO_DISPATCHER


def test_a_stale_stored_reason_is_not_shown(world):
    """A reason the dispatcher wrote long ago (or before the node stopped) is not repeated."""
    _, keys, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    jid = _submit(ledger, 4)
    client.r.set(keys.sched_leader, "someone")
    # The clock rig stamps with; never before the node's start, which a re-anchored shared clock
    # could otherwise put a few ms after this stamp on a loaded machine.
    stamp = max(shared_now(client.r), float(client.r.hget(keys.node("n1"), "started_at")))
    client.r.hset(keys.job(jid), mapping={"wait_reason": "n1/0 held for it", "wait_reason_at": stamp})
    assert why_waiting(client, client.get(jid)) == "n1/0 held for it"  # current: shown as written
    time.sleep(0.01)
    nodes.mark_stopped("n1")  # the node changed after the reason was written
    assert why_waiting(client, client.get(jid)).startswith("no rig node is up")
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    client.r.hset(keys.job(jid), "wait_reason_at", time.time() - 3600)  # an hour old: stale
    assert why_waiting(client, client.get(jid)).startswith(FITS_NOW)


def test_a_card_held_for_another_job_is_not_called_a_free_block(world):
    """Seen: 'largest free block 13.8 GiB' for a 12 GiB job that waited minutes behind a held
    card. The held card is named as held (with its free memory), and the live view agrees."""
    settings, keys, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "n1")
    dispatcher = Dispatcher(settings, lambda *a: None, client=client.r)
    first = _submit(ledger, 40 - 13.8)
    second = _submit(ledger, 35)
    assert dispatcher.dispatch_pass() == 2  # n1/0: 13.8 GiB free, n1/1: 5 GiB free (best-fit)
    assert {ledger.store.get(first).cards[0], ledger.store.get(second).cards[0]} == {0, 1}
    big = _submit(ledger, 30, Priority.HIGH)  # blocked: holds a card whose end is unknown
    small = _submit(ledger, 12, Priority.LOW)
    assert dispatcher.dispatch_pass() == 0
    held_card = "n1/0" if ledger.store.get(first).cards[0] == 0 else "n1/1"
    reason = ledger.store.get(small).wait_reason
    assert "largest free block 13.8 GiB" not in reason, reason
    assert f"{held_card} (13.8 GiB free) held for job {big}" in reason, reason
    assert "held for it" in ledger.store.get(big).wait_reason
    # rig show, with the dispatcher leading, says exactly what the dispatcher wrote.
    assert dispatcher._lead()  # what run_forever does before each pass
    assert why_waiting(client, client.get(small)) == reason


def _two_24g_cards(world):
    _, keys, ledger, nodes, client = world
    nodes.register("vm", ttl=TTL, backend="fake", cards=2)
    _cards(ledger, "vm", 2, 24)
    return keys, ledger, client


def test_it_fits_now_is_not_claimed_when_the_jobs_ahead_take_the_room(world):
    """Found from outside: dispatcher stopped, three 20 GiB jobs on two 24 GiB cards; the third
    said 'it fits now (vm/0); 2 job(s) ahead of it', though the two ahead take both cards."""
    _, ledger, client = _two_24g_cards(world)
    ids = [_submit(ledger, 20) for _ in range(3)]
    first, third = (why_waiting(client, client.get(j)) for j in (ids[0], ids[2]))
    assert first.startswith(f"{FITS_NOW} (vm/"), first
    assert FITS_NOW not in third, third
    assert third.startswith("the free memory would hold it now (vm/"), third
    assert "but the 2 job(s) ahead of it take that room first" in third and NO_DISPATCHER in third
    assert third.count("ahead of it") == 1, third
    # The second still fits after the first is placed: it says so, with the card it would get.
    second = why_waiting(client, client.get(ids[1]))
    assert second.startswith(f"{FITS_NOW} (vm/") and "1 job(s) ahead of it" in second, second


def test_more_jobs_ahead_than_are_simulated_never_fit_now(world, monkeypatch):
    import rig.waiting

    _, ledger, client = _two_24g_cards(world)
    monkeypatch.setattr(rig.waiting, "AHEAD_SIMULATED", 1)
    ids = [_submit(ledger, 1) for _ in range(3)]
    why = why_waiting(client, client.get(ids[2]))
    assert why.startswith("the free memory would hold it now (vm/"), why
    assert "but the 2 job(s) ahead of it go first" in why, why


def test_first_look_after_a_dispatcher_stopped_does_not_say_it_starts(world):
    """Seen: right after the dispatcher stopped, its lock lingered (TTL 5 s) and rig-submit said
    nothing for the first jobs: 'it fits now; it starts at the dispatcher's next pass' is not
    worth a line, and no pass ever came. The wake-up nobody takes tells the truth."""
    from rig.waiting import STARTS_NEXT_PASS, first_look, worth_saying

    keys, ledger, client = _two_24g_cards(world)
    client.r.set(keys.sched_leader, "stopped-a-moment-ago", px=5000)
    jid = _submit(ledger, 20)  # the submission pushes the dispatcher's wake-up
    assert client.r.exists(keys.sched_wake)
    why = first_look(client, jid, within=0.3)
    assert worth_saying(why), why
    assert STARTS_NEXT_PASS not in why and "did not answer within" in why, why


def test_first_look_with_a_live_dispatcher_waits_for_its_pass(world):
    """A running dispatcher takes the wake-up and places the job: nothing rig-submit prints.
    first_look may return before the placement (the wake-up taken mid-pass, or read before the
    new dispatcher's lock): then it says the job starts at the next pass, which is not printed."""
    import threading

    from rig.waiting import first_look, worth_saying

    settings, keys, ledger, nodes, client = world
    _two_24g_cards(world)
    dispatcher = Dispatcher(settings, lambda *a: None, client=client.r)
    jid = _submit(ledger, 20)
    thread = threading.Thread(target=dispatcher.run_forever, daemon=True)
    thread.start()
    try:
        why = first_look(client, jid, within=10)
        assert not worth_saying(why), why
        deadline = time.monotonic() + 10
        while client.get(jid).state is JobState.PENDING:
            assert time.monotonic() < deadline, "the dispatcher never placed the job"
            time.sleep(0.02)
    finally:
        dispatcher.stop()
        thread.join(5)


def test_a_frozen_node_is_named_not_no_node_up():
    """Breaker: while the node was frozen (its Redis lost its data) the wait reason said 'no rig
    node is up ... (`rig up`)', and rig up refuses then."""
    from rig.nodes import NodeInfo
    from rig.placement import Request
    from rig.waiting import WaitFacts, explain

    frozen = NodeInfo(name="a", alive=True, state="up", since=1.0,
                      mismatch="node a joined installation inst-1, but this Redis holds no rig installation; "
                               "`rig recover --stop` stops them")
    text = explain(WaitFacts(request=Request(2**30, 1), cards=[], nodes=[frozen]))
    assert text.startswith("no node takes jobs here: a is frozen (node a joined installation inst-1")
    assert "rig recover" in text and "`rig up`" not in text


@pytest.mark.parametrize("closed", ["whitelist", "full"])
def test_a_job_arriving_while_no_card_can_take_anything_gets_the_dispatchers_reason(world, closed):
    """A tester's finding: with gpu_whitelist naming no card of the node, `rig jobs` showed no
    reason for a new job (the dispatcher's pass stopped at "every card is full" before reading
    the queue), while `rig show` worded one live. The same for a job arriving at full cards."""
    settings, _, ledger, nodes, client = world
    nodes.register("n1", ttl=TTL, backend="fake", cards=2)
    add_cards(ledger, 2, 40, max_jobs=1, uuid="n1-u{index}", allowed=closed != "whitelist")
    dispatcher = Dispatcher(settings, lambda *a: None, client=ledger.r)
    if closed == "full":
        for _ in range(2):
            _submit(ledger, 4)
        assert dispatcher.dispatch_pass() == 2
    late = _submit(ledger, 4)
    assert dispatcher.dispatch_pass() == 0
    stored = client.get(late).wait_reason
    assert stored, "no reason stored for a job that cannot start"
    if closed == "whitelist":
        assert "gpu_whitelist" in stored, stored
    assert dispatcher.dispatch_pass() == 0  # and the pass after it stops early again
