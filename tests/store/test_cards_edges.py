"""Edges of a changed gpu_whitelist / card set (issue 11, item 2, second round): a node that is
up has no "node stopped" card, the whitelist says on the terminal what it leaves, a narrowed
whitelist keeps the queue, a closed card is no free capacity, a reason belongs to its state."""

from __future__ import annotations

import time

import pytest

from rig.config import load_settings
from rig.gpus.fake import FakeGpuBackend
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NODE_STOPPED_REASON
from rig.registration import read_notes, register_node, whitelist_warning, write_notes


def _settings(key_prefix: str, tmp_path, whitelist, spec: str = "1x24G"):
    return load_settings(key_prefix=key_prefix, node_name="lonely", gpu_whitelist=whitelist,
                         fake_gpus=spec, home=tmp_path)


def _job(ledger: Ledger, gib: float = 4, gpus: int = 1, pool: str | None = None) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=gpus, pool=pool,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id


# -- item 4: a node that registers is up: no "node stopped" mark on any of its cards ------------------
def test_registration_clears_node_stopped_on_every_card_even_outside_the_whitelist(redis_client, key_prefix, tmp_path):
    s = _settings(key_prefix, tmp_path, [1])
    ledger = Ledger(redis_client, Keys(key_prefix))
    said: list[str] = []
    register_node(s, redis_client, FakeGpuBackend("1x24G"), said.append)
    ledger.set_healthy("lonely", 0, False, f"{NODE_STOPPED_REASON} at 22:55:14: its running jobs are adopted")
    assert not ledger.card("lonely", 0).healthy
    allowed = register_node(s, redis_client, FakeGpuBackend("1x24G"), said.append)
    card = ledger.card("lonely", 0)
    assert allowed == [] and card.healthy and card.health_reason == ""
    assert not card.allowed  # still takes no job: only the false mark went
    assert "warning: gpu_whitelist [1] names no card of this node (its cards are [0]): it runs no new job " \
        "until gpu_whitelist names one" in said


def test_a_card_that_left_the_whitelist_is_not_said_to_miss_its_worker(redis_client, key_prefix, tmp_path):
    """A tester's finding: cards outside gpu_whitelist showed `[UNHEALTHY: its worker is not
    running]` in rig status for ever: marked while they still had a worker (the last `rig down`),
    then never served again, by design. `rig up` clears that mark on a card that needs no worker."""
    from rig.cli.render import card_flag_words
    from rig.draining import NO_WORKER_REASON

    ledger = Ledger(redis_client, Keys(key_prefix))
    register_node(_settings(key_prefix, tmp_path, None, "2x24G"), redis_client, FakeGpuBackend("2x24G"))
    for index in (0, 1):
        ledger.set_healthy("lonely", index, False, NO_WORKER_REASON)
    register_node(_settings(key_prefix, tmp_path, [0], "2x24G"), redis_client, FakeGpuBackend("2x24G"))
    outside = ledger.card("lonely", 1)
    assert outside.healthy and card_flag_words(outside) == ["not in whitelist"]
    # Card 0 is served: its worker, which rig up starts now, clears it when it heartbeats.
    assert ledger.card("lonely", 0).health_reason == NO_WORKER_REASON


def test_registration_keeps_other_faults(redis_client, key_prefix, tmp_path):
    s = _settings(key_prefix, tmp_path, None)
    ledger = Ledger(redis_client, Keys(key_prefix))
    register_node(s, redis_client, FakeGpuBackend("1x24G"))
    ledger.set_healthy("lonely", 0, False, "temperature 95 C > 90 C")
    register_node(s, redis_client, FakeGpuBackend("1x24G"))
    assert ledger.card("lonely", 0).health_reason == "temperature 95 C > 90 C"


def test_whitelist_warning_lines():
    assert whitelist_warning(None, [0, 1], [0, 1]) is None
    assert whitelist_warning([0], [0, 1], [0]) is None
    line = whitelist_warning([0, 7], [0, 1], [0])
    assert line is not None and "[7] that do not exist" in line and "rig uses [0]" in line
    line = whitelist_warning([5], [0], [])
    assert line is not None and "names no card of this node" in line and "[5]" in line
    assert "\n" not in line
    assert "leaves this node no usable card" in (whitelist_warning([], [0], []) or "")


def test_notes_travel_once(tmp_path):
    write_notes(tmp_path, "a", ["warning: x"])
    assert read_notes(tmp_path, "a") == ["warning: x"]
    assert read_notes(tmp_path, "a") == []
    write_notes(tmp_path, "a", [])
    assert read_notes(tmp_path, "a") == []


# -- item 8: a reason belongs to the state it explains ---------------------------------------------------
def test_a_requeue_reason_goes_when_the_job_is_placed_again(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    register_node(load_settings(key_prefix=key_prefix, node_name="n1", fake_gpus="2x24G"), redis_client,
                  FakeGpuBackend("2x24G"))
    jid = _job(ledger)
    redis_client.hset(ledger.keys.job(jid), "reason", "requeued: card n1/3 left gpu_whitelist before the job started")
    assert ledger.store.get(jid).reason
    ok, _token = ledger.reserve(jid, "n1", [0], 4 * GIB)
    assert ok
    assert not ledger.store.get(jid).reason


# -- item 5: a narrowed whitelist keeps the queue --------------------------------------------------------
def test_a_narrowed_whitelist_keeps_jobs_that_fit_only_cards_outside_it(redis_client, key_prefix, tmp_path):
    from rig.client import Client
    from rig.errors import Unschedulable
    from rig.waiting import why_waiting

    s = load_settings(key_prefix=key_prefix, node_name="a", fake_gpus="2x24G", gpu_whitelist=[0], home=tmp_path)
    register_node(s, redis_client, FakeGpuBackend("2x24G"))
    keys = Keys(key_prefix)  # a/0's worker is alive (a node with none runs nothing: rig.nodes)
    redis_client.sadd(keys.workers, "card0@a")
    redis_client.set(keys.worker("card0@a"), "{}", ex=60)
    client = Client(s, redis_client=redis_client)
    job = client.submit(["true"], gpu_memory="4G", gpus=2)  # accepted: a/1 may be named again
    why = why_waiting(client, client.get(job.id))
    assert "only cards outside gpu_whitelist could take it: a/0, a/1" not in why  # a/0 is allowed
    assert "only cards outside gpu_whitelist could take it: a/1" in why, why
    # More than any card has: refused at once, by the same rule (rig.placement.never_fits).
    with pytest.raises(Unschedulable, match="largest card offers"):
        client.submit(["true"], gpu_memory="30G")
    with pytest.raises(Unschedulable, match="needs 3 cards on one node but at most 2"):
        client.submit(["true"], gpu_memory="4G", gpus=3)


# -- item 6: a closed card's worker stops once its last job ended ----------------------------------------
def test_a_closed_card_is_drained_once_its_last_job_ended(redis_client, key_prefix, tmp_path):
    from rig.draining import drained

    s = load_settings(key_prefix=key_prefix, node_name="a", fake_gpus="2x24G", home=tmp_path)
    register_node(s, redis_client, FakeGpuBackend("2x24G"))
    ledger = Ledger(redis_client, Keys(key_prefix))
    jid = _job(ledger)
    ok, token = ledger.reserve(jid, "a", [1], 4 * GIB)
    assert ok and ledger.claim(jid, token, "w")[0]
    narrowed = load_settings(key_prefix=key_prefix, node_name="a", fake_gpus="2x24G", gpu_whitelist=[0], home=tmp_path)
    register_node(narrowed, redis_client, FakeGpuBackend("2x24G"))
    assert not drained(redis_client, ledger.keys, "a", 0)  # allowed: its worker stays
    assert not drained(redis_client, ledger.keys, "a", 1)  # its job runs
    from workers.outcomes import AttemptEnd, conclude

    conclude(ledger, ledger.store.get(jid), token, AttemptEnd(exit_code=0))
    assert ledger.store.get(jid).state is JobState.SUCCEEDED
    assert drained(redis_client, ledger.keys, "a", 1)


def test_a_card_without_a_record_is_never_drained(redis_client, key_prefix):
    """Redis lost its data (or the card is not registered yet): no record proves nothing, so
    rig up must not retire the card's worker (it did: the node's jobs never started again
    after Redis came back empty; fault scenario redis-empty-jobs-running)."""
    from rig.draining import drained

    assert not drained(redis_client, Keys(key_prefix), "a", 0)


class _RealCards:
    """Two cards as NVML names them (by UUID): the same physical cards whoever reads them."""

    kind = "nvml"

    def read_all(self):  # noqa: ANN201
        from rig.gpus import GpuReading

        return [GpuReading(index=i, uuid=f"GPU-5e1f-000{i}", model="A100", total=80 * GIB, used=0) for i in (0, 1)]

    def count(self) -> int:
        return 2


def test_a_second_node_on_the_same_cards_is_refused(redis_client, key_prefix, tmp_path):
    """A second `rig up` on one server under another node name (another RIG_HOME, `--node`)
    registered the same physical cards again: two nodes placed jobs on them, neither counting
    the other's, and the cards were oversubscribed. It is refused (exit 10) before anything of
    it is written."""
    from rig.errors import NodeInUse

    first = load_settings(key_prefix=key_prefix, node_name="gpu1", home=tmp_path / "a", fake_gpus=None)
    register_node(first, redis_client, _RealCards())
    again = first.model_copy(update={"node_name": "gpu1-b"})
    with pytest.raises(NodeInUse) as caught:
        register_node(again, redis_client, _RealCards())
    message = str(caught.value)
    assert caught.value.exit_code == 10 and "\n" not in message
    assert "card 0 of this server (GPU-5e1f-0000) is already card gpu1/0 of node 'gpu1'" in message
    assert "`rig forget-node gpu1`" in message
    ledger = Ledger(redis_client, Keys(key_prefix))
    assert {c.node for c in ledger.cards()} == {"gpu1"}  # nothing of gpu1-b written
    register_node(first, redis_client, _RealCards())  # the node itself registers again, as at every rig up
