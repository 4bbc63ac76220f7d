"""The node's health pass kills a card worker that lives but stopped heartbeating (hung) — never
one that is still starting: a restarted worker on a loaded host took longer than health.timeout
to its first heartbeat and was killed as hung over and over (the fault suite's flaky
``sigkill-worker``: traced to this pass); nor one gone to `rig down`. fakeredis and real Redis."""

from __future__ import annotations

import json
import signal

import pytest

from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys, card_worker_name
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.supervision import STARTUP_GRACE_S
from workers import health
from workers.health import HealthChecker, HealthReport

TIMEOUT = 3.0
PID = 424242


@pytest.fixture
def checker(redis_client, key_prefix, make_ledger, monkeypatch):
    settings = load_settings(key_prefix=key_prefix, node_name="n1", telemetry_interval=0.5,
                             health={"timeout": TIMEOUT, "check_interval": 1.0})
    keys = Keys(key_prefix)
    make_ledger(1, 40, max_jobs=2, uuid="GPU-{index}")
    NodeRegistry(redis_client, keys).register("n1", ttl=TIMEOUT, backend="fake", cards=1)
    redis_client.hset(keys.node("n1"), "started_at", shared_now(redis_client) - 600)  # up for long
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(health.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    checker = HealthChecker(settings, redis_client)
    age = {"s": TIMEOUT + 5}  # older than health.timeout, younger than the startup grace
    monkeypatch.setattr(checker, "_card_worker_processes", lambda cards: {0: (PID, age["s"])} if 0 in cards else {})
    return checker, keys, redis_client, killed, age


def test_a_card_worker_still_starting_is_not_taken_for_hung(checker):
    check, _keys, _r, killed, age = checker
    check._dead_workers(HealthReport())
    assert killed == []  # never heartbeated yet: starting
    age["s"] = STARTUP_GRACE_S + 1
    check._dead_workers(HealthReport())
    assert killed == [(PID, signal.SIGKILL)]  # silent for the whole grace: hung after all


def test_a_card_worker_that_heartbeated_then_went_silent_is_killed(checker):
    check, keys, r, killed, _age = checker
    beat = keys.worker(card_worker_name("n1", 0))
    r.set(beat, json.dumps({"pid": PID}))
    check._dead_workers(HealthReport())
    assert killed == []  # it heartbeats
    r.delete(beat)  # its heartbeat expired: silent for health.timeout
    check._dead_workers(HealthReport())
    assert killed == [(PID, signal.SIGKILL)]


def test_a_card_worker_rig_up_has_not_started_yet_loses_no_job(checker, monkeypatch):
    """After `rig down` / `rig up` on a loaded host, the node was up for more than health.timeout
    before rig up had spawned a card's worker: no heartbeat, no process, and its running job
    (to be adopted) was stopped and failed as lost. Given the startup grace instead; a worker of
    this run that beat once and is gone with no process loses its jobs at once, as before."""
    check, keys, r, _killed, _age = checker
    monkeypatch.setattr(check, "_card_worker_processes", lambda cards: {})  # not spawned yet
    jid = _running_job(r, keys)
    r.hset(keys.node("n1"), "started_at", shared_now(r) - TIMEOUT - 5)  # came up a little while ago
    check._dead_workers(report := HealthReport())
    assert report.lost == [] and Ledger(r, keys).store.get(jid).state is JobState.RUNNING

    beat = keys.worker(card_worker_name("n1", 0))
    r.set(beat, json.dumps({"pid": PID}))  # its worker came up and beat...
    check._dead_workers(HealthReport())
    r.delete(beat)  # ... then died, and no process is left: its job is lost at once
    check._dead_workers(report := HealthReport())
    assert report.lost == [jid]


def test_a_card_worker_missing_past_the_startup_grace_loses_its_jobs(checker, monkeypatch):
    check, keys, r, _killed, _age = checker
    monkeypatch.setattr(check, "_card_worker_processes", lambda cards: {})
    jid = _running_job(r, keys)
    r.hset(keys.node("n1"), "started_at", shared_now(r) - STARTUP_GRACE_S - 1)
    check._dead_workers(report := HealthReport())
    assert report.lost == [jid]


def _running_job(r, keys: Keys) -> int:
    """A job RUNNING on n1/0 (claimed by its card worker; no process: nothing to stop)."""
    ledger = Ledger(r, keys)
    job = ledger.store.create(Job(id=0, name="j", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                  created_at=shared_now(r)))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok and ledger.claim(job.id, token, card_worker_name("n1", 0))[0]
    return job.id


def test_a_card_worker_gone_to_rig_down_leaves_its_jobs_running(checker, monkeypatch):
    """rig down marks the node stopped, then its workers stop and delete their heartbeats; a
    pass of the control worker still running then (CI, under load: the card worker stopped
    first) took the card's worker for dead and stopped its job, which should run on and be
    adopted when the node returns."""
    check, keys, r, killed, _age = checker
    monkeypatch.setattr(check, "_card_worker_processes", lambda cards: {})  # the worker exited
    jid = _running_job(r, keys)
    assert NodeRegistry(r, keys).mark_stopped("n1")
    report = HealthReport()
    check._dead_workers(report)
    job = Ledger(r, keys).store.get(jid)
    assert report.lost == [] and job.state is JobState.RUNNING and job.attempt == 1, job.reason
    assert killed == []
    r.hdel(keys.node("n1"), "stopped_at")  # up again and the worker still silent: dead after all
    check._dead_workers(report)
    assert report.lost == [jid]


def _running_job_of_a_dead_worker(check: HealthChecker, keys: Keys, r, monkeypatch) -> int:
    """A RUNNING job (pid PID + 1) whose card's worker is dead, past the node's startup grace."""
    monkeypatch.setattr(check, "_card_worker_processes", lambda cards: {})
    jid = _running_job(r, keys)
    Ledger(r, keys).store.update(jid, pid=PID + 1, proc_start=7)
    r.hset(keys.node("n1"), "started_at", shared_now(r) - STARTUP_GRACE_S - 1)
    return jid


def test_a_job_whose_process_outlives_sigkill_keeps_its_cards_when_its_worker_dies(checker, monkeypatch):
    """Its card's worker is dead: the pass stops the job's processes before failing it as lost,
    but one stuck in the kernel (state D) outlives SIGKILL and may hold the card's memory: the job
    stays RUNNING with its cards (the card's next worker adopts it and waits for the process)
    instead of being retried elsewhere with its cards given back."""
    check, keys, r, _killed, _age = checker
    jid = _running_job_of_a_dead_worker(check, keys, r, monkeypatch)
    stopped: list[int] = []
    monkeypatch.setattr(health, "is_alive", lambda pid, start: pid == PID + 1)
    monkeypatch.setattr(health, "is_job_process", lambda pid, *a, **k: pid == PID + 1)
    monkeypatch.setattr(health, "stop_tree", lambda sid, grace: stopped.append(sid))
    monkeypatch.setattr(health, "session_members", lambda sid: [PID + 2] if sid == PID + 1 else [])
    check._dead_workers(report := HealthReport())
    job = Ledger(r, keys).store.get(jid)
    assert stopped == [PID + 1] and report.lost == []
    assert job.state is JobState.RUNNING and job.stuck == f"pid {PID + 2}"
    assert Ledger(r, keys).card("n1", 0).reserved == GIB
    monkeypatch.setattr(health, "session_members", lambda sid: [])  # it died at last
    check._dead_workers(report := HealthReport())
    assert report.lost == [jid]
    assert Ledger(r, keys).store.get(jid).stuck is None  # ended: nothing of it is stuck any more


def test_a_stuck_note_lands_only_on_the_run_it_is_about(checker):
    """An adoption pass that read a job RUNNING before another thread ended it wrote its note on
    the ended record (seen live: a CANCELLED job still saying `pid N` was stuck)."""
    _check, keys, r, _killed, _age = checker
    jid = _running_job(r, keys)
    store = Ledger(r, keys).store
    run = store.get(jid).assignments
    assert not store.update_while_running(jid, run + 1, stuck="pid 1")  # another run's
    assert store.update_while_running(jid, run, stuck="pid 2")
    assert store.get(jid).stuck == "pid 2"
    code, _ = Ledger(r, keys).transition(jid, JobState.CANCELLED, token=run, mode="end", expect=JobState.RUNNING,
                                         fields={"stuck": None})
    assert code == 1
    assert not store.update_while_running(jid, run, stuck="pid 3")  # it ended meanwhile
    assert store.get(jid).stuck is None


def test_a_job_noted_stuck_keeps_its_cards_once_its_wrapper_is_gone(checker, monkeypatch):
    """The pass that stopped it SIGKILLed its wrapper, which died, while a child of it stuck in
    the kernel lives on in its session: the next pass, its wrapper gone, failed it as lost and
    retried it elsewhere, its cards given back (seen live: 'it keeps its cards until they are
    gone', then 'RUNNING -> PENDING ... worker or node lost' 5 s later, card 0 reserved 0 GiB with
    the process alive). Nor is it stopped again on each pass."""
    check, keys, r, _killed, _age = checker
    jid = _running_job_of_a_dead_worker(check, keys, r, monkeypatch)
    stopped: list[int] = []
    wrapper_alive = [True]
    monkeypatch.setattr(health, "is_alive", lambda pid, start: pid == PID + 1 and wrapper_alive[0])
    monkeypatch.setattr(health, "session_is_ours", lambda sid, start: sid == PID + 1, raising=False)
    monkeypatch.setattr(health, "is_job_process", lambda pid, *a, **k: pid == PID + 1)
    monkeypatch.setattr(health, "stop_tree", lambda sid, grace: stopped.append(sid))
    monkeypatch.setattr(health, "session_members", lambda sid: [PID + 2] if sid == PID + 1 else [])
    check._dead_workers(HealthReport())
    wrapper_alive[0] = False  # SIGKILLed by that pass; its child lives on, stuck
    check._dead_workers(report := HealthReport())
    assert stopped == [PID + 1] and report.lost == []
    assert Ledger(r, keys).store.get(jid).state is JobState.RUNNING
    assert Ledger(r, keys).card("n1", 0).reserved == GIB
    monkeypatch.setattr(health, "session_members", lambda sid: [])  # it died at last
    check._dead_workers(report := HealthReport())
    assert report.lost == [jid]



def test_heartbeats_that_expired_while_no_pass_ran_are_no_hung_worker(checker, monkeypatch):
    """A fail-over without quorum: no master for 70 s, every heartbeat expired, and no local pass
    ran (the control worker's loop failed before it). The first pass after Redis returned killed
    two card workers as hung, a second after; silence counts from that pass."""
    import time
    import types

    check, keys, r, killed, _age = checker
    clock = {"s": time.monotonic()}
    monkeypatch.setattr(health, "time", types.SimpleNamespace(monotonic=lambda: clock["s"], time=time.time))
    beat = keys.worker(card_worker_name("n1", 0))
    r.set(beat, json.dumps({"pid": PID}))
    check.run_local()
    assert killed == []
    r.delete(beat)  # expired in the outage
    clock["s"] += 70  # no pass meanwhile
    check.run_local()
    assert killed == []  # its worker may not have reconnected yet
    for step in range(1, int(TIMEOUT) + 1):  # a pass every check_interval; silent a health.timeout on: hung
        clock["s"] += 1.0
        check.run_local()
        assert killed == ([] if step < TIMEOUT else [(PID, signal.SIGKILL)])
