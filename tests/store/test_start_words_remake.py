"""`rig show` and `rig jobs` agree on an estimated start across the leader's remakes of the
stored forecast (rig.forecast_store): a job waiting behind a job that runs past its time limit
was "overdue" in one forecast and "now (waiting for the dispatcher's next pass)" in the next,
which clamped the late job's end to its own now. fakeredis and real Redis."""

from __future__ import annotations

import time

import pytest

from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.forecast import forecast, start_words
from rig.forecast_store import publish, read
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.dispatcher import Dispatcher


@pytest.fixture
def world(redis_client, key_prefix, make_ledger, tmp_path):
    settings = load_settings(key_prefix=key_prefix, scheduler_type="best-fit", node_name="n1",
                             hold_after_seconds=0, home=tmp_path / "home")
    ledger = make_ledger(1, 40)
    return ledger, Client(settings, redis_client=redis_client), Dispatcher(settings, lambda *a: None,
                                                                          client=redis_client)


def _submit(ledger: Ledger, gib: float, time_limit: float | None = None) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=shared_now(ledger.r),
        time_limit=time_limit)).id


def _words(client: Client, job_id: int) -> tuple[str, str]:
    """What `rig jobs` (the cell) and `rig show` (the sentence) print, as they read it."""
    stored = read(client.r, client.keys, [job_id])
    return (stored.of(job_id).short(stored.now, stored.made_at),
            str(stored.row(job_id)["estimated_start_text"]))


def test_a_job_behind_one_past_its_time_limit_is_overdue_in_every_forecast(world):
    ledger, client, dispatcher = world
    running = _submit(ledger, 40, time_limit=60)
    assert dispatcher.dispatch_pass() == 1
    waiting = _submit(ledger, 40)
    client.r.set(client.keys.sched_leader, "someone", px=60_000)  # a dispatcher leads

    # Forecast A, made while the running job is within its limit: a time, its sure end.
    client.r.hset(client.keys.job(running), "started_at", repr(time.time() - 5))
    made = forecast(client)
    first = made.of(waiting)
    assert first.at is not None and first.at > made.now and not first.overrun, first
    # Read after that time passed, the job still waiting: overdue, in both commands' words.
    assert start_words(first, first.at + 1, made.made_at)[0] == "overdue"

    # Forecast B, remade once the running job is past its limit (it still runs: its kill is
    # slow, or its node stopped): its end is "now", but the dispatcher's next pass cannot
    # start the waiting job. Before: "now (waiting for the dispatcher's next pass)".
    client.r.hset(client.keys.job(running), "started_at", repr(time.time() - 3600))
    remade = forecast(client)
    assert remade.of(waiting).at == remade.now and remade.of(waiting).overrun, remade.of(waiting)
    publish(client.r, client.keys, remade)
    short, sentence = _words(client, waiting)
    assert short == "overdue", short
    assert sentence.startswith("overdue: expected ~") and "running longer than expected" in sentence, sentence

    # And the dispatcher indeed does not start it at its next pass.
    assert dispatcher.dispatch_pass() == 0


def test_a_job_that_fits_now_is_still_now(world):
    ledger, client, dispatcher = world
    running = _submit(ledger, 20, time_limit=60)
    assert dispatcher.dispatch_pass() == 1
    client.r.hset(client.keys.job(running), "started_at", repr(time.time() - 3600))  # past its limit
    fits = _submit(ledger, 10)  # fits beside it: it needs nothing freed
    client.r.set(client.keys.sched_leader, "someone", px=60_000)
    publish(client.r, client.keys, forecast(client))
    short, sentence = _words(client, fits)
    assert short == "now" and sentence.startswith("now (waiting for the dispatcher's next pass)"), sentence
    assert dispatcher.dispatch_pass() == 1
