"""Wait sentences that must stay true (testers' findings, round "waitwords"): a narrowed
gpu_whitelist behind held cards, a job of a pool. fakeredis and real Redis."""

from __future__ import annotations

from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.pools import NODE_FIELD, encode
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher

TTL = 30.0


def _submit(ledger: Ledger, gib: float, priority: Priority = Priority.MEDIUM, pool: str | None = None) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r), pool=pool,
    )).id


def _whitelisted_world(redis_client, key_prefix, allowed=(0, 1), count=4):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=0)
    keys = Keys(key_prefix)
    ledger = Ledger(redis_client, keys)
    NodeRegistry(redis_client, keys).register("n1", ttl=TTL, backend="fake", cards=count)
    add_cards(ledger, count, 40, uuid="n1-u{index}", allowed=allowed)
    client = Client(settings, redis_client=redis_client)
    return settings, ledger, client


def test_a_job_behind_holds_on_every_whitelisted_card_is_not_told_no_card_takes_jobs(redis_client, key_prefix):
    """A tester's finding: gpu_whitelist 0,1 of 4 cards, both busy; the first two waiting jobs
    hold them, and the third was told "no card takes jobs now (... not in whitelist)", as if
    the whitelist kept it out. The cards that take jobs are held for the jobs ahead of it."""
    settings, ledger, client = _whitelisted_world(redis_client, key_prefix)
    dispatcher = Dispatcher(settings, lambda *a: None, client=client.r)
    running = [_submit(ledger, 30) for _ in range(2)]
    assert dispatcher.dispatch_pass() == 2
    assert sorted(ledger.store.get(j).cards[0] for j in running) == [0, 1]
    waiting = [_submit(ledger, 30) for _ in range(3)]
    assert dispatcher.dispatch_pass() == 0
    first, second, third = (ledger.store.get(j).wait_reason for j in waiting)
    assert "held for it" in first and "held for it" in second, (first, second)
    assert "no card takes jobs" not in third, third
    assert "not in whitelist" not in third.split(";")[1], third  # not the cause: a second fact at most
    assert f"held for job {waiting[0]}" in third and f"held for job {waiting[1]}" in third, third
    assert "every card that takes jobs is held for jobs ahead of it" in third, third


def test_a_job_of_a_pool_says_its_cards_are_the_pools_in_the_dispatchers_and_the_live_sentence(
        redis_client, key_prefix):
    """A tester's finding: a job of pool 'a100' (cards n1/0-1, full) was told "largest free
    block 10.0 GiB (n1/0)" while n1/2-3 stood empty: true only of its pool, which it did not say."""
    from rig.waiting import why_waiting

    _, ledger, client = _whitelisted_world(redis_client, key_prefix, allowed=(0, 1, 2, 3))
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=3600, pools={"a100": ["n1:0-1"]})
    client = Client(settings.model_copy(update={"pools": {}}), redis_client=redis_client)  # not its own
    redis_client.hset(client.keys.node("n1"), NODE_FIELD, encode(settings.pools))  # n1's rig up records them
    dispatcher = Dispatcher(settings, lambda *a: None, client=client.r)
    for _ in range(2):
        _submit(ledger, 30, pool="a100")
    assert dispatcher.dispatch_pass() == 2
    late = _submit(ledger, 30, pool="a100")
    assert dispatcher.dispatch_pass() == 0
    stored = ledger.store.get(late).wait_reason
    assert stored.startswith("in pool 'a100': needs 30.0 GiB on 1 card; largest free block 10.0 GiB"), stored
    live = why_waiting(client, client.get(late))  # no dispatcher leads: worded live
    assert live.startswith("in pool 'a100': needs 30.0 GiB on 1 card; largest free block 10.0 GiB"), live
    fits = why_waiting(client, client.get(_submit(ledger, 5, pool="a100")))
    assert fits.startswith("in pool 'a100': it fits now (n1/"), fits
