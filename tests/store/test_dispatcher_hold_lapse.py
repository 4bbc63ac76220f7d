"""A hold that ends while its job waits leaves no cards named as held (the record's ``held_cards``
means the cards held as of the last pass): a job that held once kept ``held_cards`` for as
long as it waited, and the idle_cards alert (rig.alerts, which leaves held cards out) stayed
silent about a card nobody held any more."""
from __future__ import annotations

import time

import pytest

from rig.alerts import AlertRules, evaluate
from rig.client import Client
from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.conftest import REDIS_URL
from workers.dispatcher import Dispatcher

pytestmark = pytest.mark.redis


def _job(client: Client, user: str, gib: int, *, gpus: int = 1, age: float = 0.0) -> Job:
    return client.store.create(Job(
        id=0, name="t", user=user, command=["true"], gpu_memory=gib * GIB, gpus=gpus, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time() - age))


@pytest.fixture
def held(real_redis, key_prefix, tmp_path, monkeypatch) -> tuple[Client, Dispatcher, Job]:
    """Cards n1/0 (ann's 70 GiB job on it) and n1/1 (idle), 80 GiB usable each; ann's 80 GiB x 2
    job, past its hold time, holds both after one pass."""
    monkeypatch.chdir(tmp_path)  # no stray rig.toml
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home", node_name="n1",
                             hold_after_seconds=10.0)
    client = Client(settings, redis_client=real_redis)
    for index in range(2):
        client.ledger.register_card(
            "n1", GpuReading(index=index, uuid=f"u{index}", model="A100", total=100 * GIB),
            max_jobs=2, reserve_fraction=0.2, allowed=True, fake=True)
    running = _job(client, "ann", 70)
    ok, token = client.ledger.reserve(running.id, "n1", [0], running.gpu_memory, user="ann")
    assert ok, token
    assert client.ledger.claim(running.id, token, "w")[0]
    big = _job(client, "ann", 80, gpus=2, age=600)
    dispatcher = Dispatcher(settings, client=real_redis)
    assert dispatcher.dispatch_pass() == 0
    record = client.r.hgetall(client.keys.job(big.id))
    assert set(record["held_cards"].split(",")) == {"n1/0", "n1/1"}, record
    return client, dispatcher, big


def test_a_job_whose_hold_ended_reads_no_held_cards_and_its_cards_are_idle_again(held):
    client, dispatcher, big = held
    rules = AlertRules(max_fragmentation=1.0)
    held_at = client.r.hget(client.keys.job(big.id), "held_at")
    # ann is over her limit now (one job placed): the dispatcher holds nothing for the big job.
    dispatcher.settings = dispatcher.settings.model_copy(update={"max_jobs_per_user": 1})
    assert dispatcher.dispatch_pass() == 0
    record = client.r.hgetall(client.keys.job(big.id))
    assert record["state"] == JobState.PENDING.value
    assert not record["held_cards"], record
    assert record["held_at"] == held_at  # its place among holders, kept
    (waiting,) = dispatcher._read_waiting()  # noqa: SLF001 - what the next pass reads of it
    assert waiting.held_cards == ()
    assert set(waiting.last_held_cards) == {"n1/0", "n1/1"}  # what its next hold prefers, kept
    # The dispatcher does not run again (stopped, stuck): bob's job, which fits the idle card
    # n1/1 and has waited 5 minutes, is what the alert is for; the lapsed hold hid the card.
    small = _job(client, "bob", 30, age=300)
    alerts = {a.key: a for a in evaluate(client, rules)}
    assert "idle_cards" in alerts, list(alerts)
    assert "n1/1" in alerts["idle_cards"].message and f"job {small.id}" in alerts["idle_cards"].message


def test_a_hold_that_resumes_on_its_cards_names_them_again(held):
    """The round trip: the limit lifted, the next pass holds the same cards and writes them."""
    client, dispatcher, big = held
    limited = dispatcher.settings
    dispatcher.settings = limited.model_copy(update={"max_jobs_per_user": 1})
    dispatcher.dispatch_pass()
    assert not client.r.hget(client.keys.job(big.id), "held_cards")
    dispatcher.settings = limited
    assert dispatcher.dispatch_pass() == 0
    assert set(client.r.hget(client.keys.job(big.id), "held_cards").split(",")) == {"n1/0", "n1/1"}
