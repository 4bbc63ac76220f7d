"""A job sent back to the queue loses its placement (rig.models.REQUEUE_CLEARS, the one list
rig/lua/transition.lua is given). A tester's job, placed on a node that went down before it
started, went back to the queue and `rig show` still said `placed 14:02:11` as if it were
placed now. fakeredis and real Redis."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from rig.cli.render import render_job
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import REQUEUE_CLEARS, Job, JobState, Priority, waiting_since


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(1, 40, max_jobs=1)


def test_a_job_sent_back_to_the_queue_keeps_no_field_of_its_placement(ledger):
    jid = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time())).id
    ok, token = ledger.reserve(jid, "n1", [0], GIB)
    assert ok and ledger.store.get(jid).assigned_at
    # Every field of the list present, as an attempt that went further would leave them.
    rest = {f: "1" for f in REQUEUE_CLEARS if f not in ("node", "cards", "assigned_at")}
    ledger.r.hset(ledger.keys.job(jid), mapping=rest)
    code, _ = ledger.transition(jid, JobState.PENDING, token=token, expect=JobState.ASSIGNED)
    assert code == 1
    raw = ledger.r.hgetall(ledger.keys.job(jid))
    assert raw["state"] == "PENDING"
    assert not set(REQUEUE_CLEARS) & set(raw), sorted(set(REQUEUE_CLEARS) & set(raw))
    out = io.StringIO()
    render_job(ledger.store.get(jid), None, Console(file=out, width=200))
    placed = next(line for line in out.getvalue().splitlines() if line.strip().startswith("placed"))
    assert placed.split()[-1] == "-", placed


def test_a_job_sent_back_to_the_queue_waits_from_then(ledger):
    """Its wait counts from its return (queued_at, rig.models.waiting_since), which `rig show`
    says; a job never sent back has none (it waits since its submission)."""
    jid = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time() - 300)).id
    assert ledger.store.get(jid).queued_at is None
    ok, token = ledger.reserve(jid, "n1", [0], GIB)
    assert ok
    back = time.time() - 5
    assert ledger.transition(jid, JobState.PENDING, token=token, expect=JobState.ASSIGNED, now=back)[0] == 1
    job = ledger.store.get(jid)
    assert job.queued_at == pytest.approx(back) and waiting_since(job.created_at, job.queued_at) == job.queued_at
    out = io.StringIO()
    render_job(job, None, Console(file=out, width=200))
    assert any(line.strip().startswith("back in queue") for line in out.getvalue().splitlines()), out.getvalue()
