"""Why a placed job has not started (rig.starting): an ASSIGNED job slow to start says why,
never nothing for the 30 s until its start is pushed again (a tester's finding). fakeredis and
real Redis."""

from __future__ import annotations

import json
import time

import pytest

from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import card_worker_name
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.starting import SLOW_START_S, why_not_started
from workers.start_list import StartList


@pytest.fixture
def placed(redis_client, key_prefix, make_ledger):
    settings = load_settings(key_prefix=key_prefix, node_name="n1", max_task_per_gpu=3)
    ledger = make_ledger(1, 40)
    job_id = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time())).id
    ok, _token = ledger.reserve(job_id, "n1", [0], GIB)
    assert ok
    client = Client(settings, redis_client=redis_client)
    return settings, ledger, client, job_id


def test_a_slow_start_says_why_it_has_not_started(placed):
    settings, ledger, client, job_id = placed
    job = ledger.store.get(job_id)
    assert job.state is JobState.ASSIGNED
    placed_at = job.assigned_at
    assert why_not_started(client, job, now=placed_at + 0.5) is None  # just starting
    later = placed_at + SLOW_START_S + 10
    # No heartbeat from card0@n1: its worker is not running.
    said = why_not_started(client, job, now=later)
    assert "card0@n1 is not running" in said and "12 s ago" in said
    beat = ledger.keys.worker(card_worker_name("n1", 0))

    def heartbeat(at: float, jobs: int = 0) -> None:
        ledger.r.set(beat, json.dumps({"pid": 1, "jobs": jobs, "seen_at": at}))

    # A heartbeat key that lives on while the worker is stopped or hung (a tester's finding:
    # this was called "busy" for the whole health.timeout).
    heartbeat(later - 9)
    assert "card0@n1 has not heartbeated for 9 s" in why_not_started(client, job, now=later)
    heartbeat(later - 0.2)
    said = why_not_started(client, job, now=later)
    assert "waiting for its card worker card0@n1 to take its start" in said and "most" not in said
    heartbeat(later - 0.2, jobs=3)  # as many as it runs at once
    assert "runs 3 jobs, the most it runs at once" in why_not_started(client, job, now=later)
    starts = StartList(ledger.r, ledger.keys, "n1", 0)
    starts.take()
    assert "has taken its start" in why_not_started(client, job, now=later)
    ledger.r.delete(starts.taking)  # lost: the worker pushes it again after assigned_timeout
    said = why_not_started(client, job, now=later)
    assert "not on the card's start list" in said and f"{settings.health.assigned_timeout - 12:.0f} s from now" in said
    overdue = placed_at + settings.health.assigned_timeout + 4
    heartbeat(overdue)
    assert "pushes it again now (due 4 s ago)" in why_not_started(client, job, now=overdue)


def test_show_gives_the_reason_for_a_placed_job_only(placed):
    _settings, ledger, client, job_id = placed
    ledger.r.hset(ledger.keys.job(job_id), "assigned_at", shared_now(ledger.r) - 60)
    assert "not running" in client.why_waiting(ledger.store.get(job_id))
    ledger.transition(job_id, JobState.SUCCEEDED)
    assert client.why_waiting(ledger.store.get(job_id)) is None
