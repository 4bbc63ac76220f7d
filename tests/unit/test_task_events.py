"""What Flower is told about a job (rig.task_events), how the bridge gates and routes it
(workers.flower_bridge), and what rig's workers answer Flower's buttons (workers.remote_control).
No Celery worker, no Flower: the pure rules and their stubs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import fakeredis
import pytest
from celery.worker.control import Panel

from rig.keys import Keys
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.store import JobStore
from rig.task_events import event_for, job_of, same_job, task_id, worker_of
from workers import flower_bridge, remote_control
from workers.flower_bridge import FlowerBridge


def _job(**fields: object) -> Job:
    values: dict = dict(id=12, name="bert", user="ana", command=["true"], gpu_memory=12 * GIB, gpus=1,
                        priority=Priority.HIGH, state=JobState.PENDING, workdir="/", created_at=0.0,
                        instance="3f9a1c2e00112233")
    values.update(fields)
    return Job(**values)


def test_one_task_id_per_job_instance():
    job = _job()
    assert task_id(job) == "rig-job-12-3f9a1c2e"
    assert job_of("rig-job-12-3f9a1c2e") == (12, "3f9a1c2e")
    assert job_of("rig-job-12") == (12, None) and task_id(_job(instance=None)) == "rig-job-12"
    assert job_of("5b1e0f5c-0000-4000-8000-000000000000") is None and job_of("rig-job-x") is None
    # A row of an earlier job whose id Redis reused never names the job that has it now.
    assert same_job(job, "3f9a1c2e") and not same_job(_job(instance="aaaaaaaa00000000"), "3f9a1c2e")


def test_each_move_is_the_celery_event_flower_understands():
    waiting = _job()
    kind, fields = event_for(_job(created_at=50.0), JobState.PENDING)
    assert kind == "task-received" and fields["name"] == "job 12 'bert' by ana: 12.0 GiB x 1, waiting"
    assert fields["timestamp"] == 50.0  # when it was submitted, however late the event goes
    assert "'user': 'ana'" in fields["kwargs"] and worker_of(waiting, JobState.PENDING) is None
    assert event_for(waiting, JobState.ASSIGNED) is None

    running = _job(state=JobState.RUNNING, node="n1", cards=[3], worker="card3@n1", attempt=1, started_at=100.0)
    kind, fields = event_for(running, JobState.RUNNING)
    assert kind == "task-started" and fields["name"].endswith("12.0 GiB x 1, on n1/3")
    assert worker_of(running, JobState.RUNNING) == "card3@n1"

    done = _job(state=JobState.SUCCEEDED, node="n1", cards=[3], worker="card3@n1", exit_code=0,
                started_at=100.0, ended_at=112.5)
    kind, fields = event_for(done, JobState.SUCCEEDED)
    assert kind == "task-succeeded" and fields["runtime"] == 12.5 and "exit code 0" in fields["result"]

    failed = _job(state=JobState.FAILED, node="n1", cards=[3], worker="card3@n1", exit_code=3,
                  failure="nonzero_exit", reason="exit code 3", started_at=1.0, ended_at=2.0)
    kind, fields = event_for(failed, JobState.FAILED)
    assert kind == "task-failed" and fields["exception"] == "nonzero_exit: exit code 3: exit code 3"
    kind, fields = event_for(_job(state=JobState.TIMEOUT, exit_code=124, failure="timeout"), JobState.TIMEOUT)
    assert kind == "task-failed" and fields["exception"].startswith("timeout: exit code 124")

    # A retry: the record lost its worker with the move back to PENDING; its last attempt row
    # says where it ran, so the retry counts for that card worker.
    first = {"attempt": 1, "node": "n1", "cards": [3], "outcome": "nonzero_exit", "summary": "exit code 1"}
    retried = _job(attempt=1, reason="attempt 1 failed: exit code 1; retry 1 of 2", attempts=[first])
    kind, fields = event_for(retried, JobState.PENDING)
    assert kind == "task-retried" and fields["retries"] == 1 and fields["exception"] == "attempt 1 failed: exit code 1"
    assert worker_of(retried, JobState.PENDING) == "card3@n1"
    # Told late, once the job has ended after its second attempt: still the first one's retry.
    late = _job(state=JobState.FAILED, attempt=2, attempts=[first, {**first, "attempt": 2, "summary": "exit code 9"}])
    assert event_for(late, JobState.PENDING)[1]["retries"] == 1
    assert event_for(late, JobState.PENDING)[1]["exception"] == "attempt 1 failed: exit code 1"

    kind, fields = event_for(_job(state=JobState.CANCELLED), JobState.CANCELLED)
    assert kind == "task-revoked" and fields["terminated"] is False
    kind, fields = event_for(_job(state=JobState.CANCELLED, started_at=5.0), JobState.CANCELLED)
    assert fields["terminated"] is True
    # What rig says of a cancelled running job: its exit code, who cancelled it, its runtime.
    killed = _job(state=JobState.CANCELLED, started_at=5.0, ended_at=7.5, exit_code=143,
                  reason="cancelled by Flower (admin login)")
    kind, fields = event_for(killed, JobState.CANCELLED)
    assert (fields["result"], fields["exception"], fields["runtime"]) == (
        "'exit code 143'", "cancelled by Flower (admin login)", 2.5)
    # A retried job that succeeds: its row no longer shows the failed attempt as its exception.
    retried_ok = _job(state=JobState.SUCCEEDED, attempt=2, exit_code=0, attempts=[first])
    assert event_for(retried_ok, JobState.SUCCEEDED)[1]["exception"] == ""


class _Dispatcher:
    sent: list[tuple[str, str, dict]] = []

    def __init__(self, _connection: object, *, hostname: str, **_: object) -> None:
        self.hostname = hostname

    def send(self, kind: str, **fields: object) -> None:
        _Dispatcher.sent.append((self.hostname, kind, fields))

    def close(self) -> None:
        pass


def test_the_bridge_tells_only_when_wanted_and_as_the_card_worker(monkeypatch: pytest.MonkeyPatch):
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    store = JobStore(r, keys)
    job = store.create(_job())
    switches = {"events": False, "leads": True}
    _Dispatcher.sent = []
    bridge = FlowerBridge(r, keys, hostname="control@n1", events_on=lambda: switches["events"],
                          leads=lambda: switches["leads"], connect=object, dispatcher_cls=_Dispatcher)
    assert not bridge.offer(f"{job.id} PENDING")  # no Flower: nothing queued, nothing read
    switches["events"] = True
    assert not bridge.offer("garbage") and bridge.offer(f"{job.id} PENDING")
    switches["leads"] = False
    bridge._leader_seen = (time.monotonic() - 10, True)  # the cached answer has expired
    assert not bridge.offer(f"{job.id} PENDING")  # another control worker's bridge tells it
    assert bridge.tell(*bridge.moves.get_nowait())
    assert _Dispatcher.sent[-1][:2] == ("control@n1", "task-received")
    r.hset(keys.job(job.id), mapping={"state": "RUNNING", "node": "n1", "cards": "[1]", "worker": "card1@n1",
                                      "attempt": "1", "started_at": "5"})
    assert bridge.tell(job.id, JobState.RUNNING)
    assert _Dispatcher.sent[-1][:2] == ("card1@n1", "task-started")
    assert not bridge.tell(999, JobState.RUNNING)  # a job gone: nothing
    assert not bridge.tell(job.id, JobState.RUNNING)  # told once, however often it is queued
    # A bridge that starts to tell queues what is not over yet (the waiting, the running) and
    # what it last told as not over: a job that ended while no bridge listened.
    waiting = store.create(_job(name="later"))
    ended = store.create(_job(name="ended-meanwhile"))
    assert bridge.tell(ended.id, JobState.PENDING)
    r.hset(keys.job(ended.id), mapping={"state": "SUCCEEDED", "exit_code": "0"})
    r.zrem(keys.state_index("PENDING"), job.id, ended.id)
    r.zadd(keys.state_index("RUNNING"), {str(job.id): job.id})
    assert bridge.resync() == 3
    told = [bridge.tell(*bridge.moves.get_nowait()) for _ in range(3)]
    assert told == [False, True, True]  # the running job was told already
    assert [(h, kind) for h, kind, _ in _Dispatcher.sent[-2:]] == [
        ("control@n1", "task-received"), ("control@n1", "task-succeeded")]
    assert sorted(r.hkeys(keys.flower_told)) == sorted([str(job.id), str(waiting.id)])  # ended: forgotten


def test_a_job_whose_record_redis_lost_is_told_revoked_not_left_running_in_flower():
    """Breaker: Redis restarted empty (or an older copy put back) while jobs waited and ran:
    Flower showed them RECEIVED / STARTED for ever, though rig knew nothing of them."""
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    store = JobStore(r, keys)
    r.hset(keys.installation, "id", "inst-a")
    waiting, running, archived = (store.create(_job(name=n, instance=f"{i}" * 16))
                                  for i, n in enumerate(("waits", "runs", "archived")))
    _Dispatcher.sent = []
    bridge = FlowerBridge(r, keys, hostname="control@n1", events_on=lambda: True, leads=lambda: True,
                          connect=object, dispatcher_cls=_Dispatcher)
    for job in (waiting, running, archived):
        assert bridge.tell(job.id, JobState.PENDING)
    told = {job.id: task_id(job) for job in (waiting, running, archived)}
    # The same installation drops a record (archived, forgotten): no loss, nothing told.
    r.delete(keys.job(archived.id))
    assert not bridge.tell(archived.id, None) and archived.id not in bridge.live
    # Redis comes back empty, then a new job takes the running one's id.
    for key in r.keys("t:*"):
        r.delete(key)
    r.hset(keys.installation, "id", "inst-b")
    reused = store.create(_job(name="new", instance="b" * 16))
    assert reused.id == waiting.id and task_id(reused) != told[waiting.id]
    assert bridge.resync() == 2  # both are still remembered, though Redis forgot it told them
    for _ in range(2):
        bridge.tell(*bridge.moves.get_nowait())
    revoked = {f["uuid"]: f for _, kind, f in _Dispatcher.sent if kind == "task-revoked"}
    assert set(revoked) == {told[waiting.id], told[running.id]}
    assert all(f["exception"] == flower_bridge.LOST and not f["terminated"] for f in revoked.values())
    assert [f["uuid"] for _, kind, f in _Dispatcher.sent if kind == "task-received"][-1] == task_id(reused)
    assert bridge.live == {reused.id: bridge.live[reused.id]}
    # A Flower that reconnects after the same Redis restart may have missed that: told again.
    _Dispatcher.sent = []
    assert bridge.resync(again=True) == 2
    for _ in range(2):
        bridge.tell(*bridge.moves.get_nowait())
    again = {f["uuid"] for _, kind, f in _Dispatcher.sent if kind == "task-revoked"}
    assert again == {told[waiting.id], told[running.id]}


def test_a_full_queue_drops_moves_and_never_blocks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(flower_bridge, "QUEUE_MAX", 2)
    r = fakeredis.FakeRedis(decode_responses=True)
    bridge = FlowerBridge(r, Keys("t:"), hostname="c", events_on=lambda: True, leads=lambda: True,
                          connect=object, dispatcher_cls=_Dispatcher)
    assert [bridge.offer(f"{i} PENDING") for i in range(4)] == [True, True, False, False]
    assert bridge.dropped == 2


@pytest.fixture
def panel() -> Iterator[None]:
    """Celery's control registry is global: restored after each test."""
    saved = dict(Panel.data)
    yield
    Panel.data.clear()
    Panel.data.update(saved)


class _State:
    class consumer:  # noqa: N801 - what celery.worker.state exposes
        hostname = "card0@n1"


def test_card_workers_refuse_controls_that_act_behind_rigs_back(panel: None):
    remote_control.install(None, role="card")
    for name in remote_control.REFUSED:
        answer = Panel.data[name](_State(), n=1)
        assert "refused by rig: card0@n1 is a rig worker" in answer["error"], name
    # A card worker leaves a job's revoke to the control worker; other ids are Celery's.
    answer = Panel.data["revoke"](_State(), ["rig-job-12-3f9a1c2e"], terminate=True)
    assert answer == {"ok": "job 12: stopped by the control worker"}


def test_the_control_worker_stops_jobs_and_leaves_other_ids_to_celery(panel: None):
    asked: list[tuple] = []
    celery_revoked: list[object] = []
    Panel.data["revoke"] = lambda state, ids, **kw: celery_revoked.append(ids) or {"ok": "flagged"}
    remote_control.install(lambda j, inst: asked.append((j, inst)) or f"job {j}: stopping", role="control")
    answer = Panel.data["revoke"](_State(), ["rig-job-12-3f9a1c2e", "abc"], terminate=True)
    assert asked == [(12, "3f9a1c2e")] and celery_revoked == [["abc"]]
    assert answer == {"ok": "job 12: stopping; flagged"}
    assert Panel.data["terminate"](_State(), "SIGTERM", "rig-job-7") == {"ok": "job 7: stopping"}


def test_workers_of_no_rig_role_keep_celerys_answers(panel: None):
    before = dict(Panel.data)
    remote_control.install(None, role="")
    assert Panel.data == before


def test_flower_takes_no_option_from_the_operators_shell():
    from rig.stack import flower_environment

    env, ignored = flower_environment({"PATH": "/bin", "FLOWER_UNAUTHENTICATED_API": "true",
                                       "FLOWER_BASIC_AUTH": "old:pw", "RIG_HOME": "/h"})
    assert env == {"PATH": "/bin", "RIG_HOME": "/h"}
    assert ignored == ["FLOWER_BASIC_AUTH", "FLOWER_UNAUTHENTICATED_API"]


def test_controls_that_stall_or_misroute_a_card_are_refused(panel: None):
    """Flower's queue and task controls (issue 14 item 1, findings 1 and 7): a cancelled
    consumer left a card's jobs ASSIGNED, an added one ran another card's jobs, a rate limit
    held a card's starts back."""
    remote_control.install(None, role="card")
    calls = {"add_consumer": ((), {"queue": "rig.card.n1.1"}), "cancel_consumer": (("rig.card.n1.0",), {}),
             "rate_limit": (("rig.start_job", "1/m"), {}), "time_limit": (("rig.start_job",), {"soft": 1})}
    for name, (args, kwargs) in calls.items():
        answer = Panel.data[name](_State(), *args, **kwargs)
        assert "refused by rig: card0@n1 is a rig worker" in answer.get("error", ""), (name, answer)


def test_a_flowers_wakeup_reaches_the_bridge_and_the_worker_still_heartbeats(panel: None):
    beats: list[object] = []
    joined: list[bool] = []
    Panel.data["heartbeat"] = lambda state: beats.append(state)
    remote_control.install(lambda j, inst: "", role="control", listener_joined=lambda: joined.append(True))
    state = _State()
    Panel.data["heartbeat"](state)
    assert beats == [state] and joined == [True]


def test_a_flower_that_restarts_is_told_again_what_runs_and_what_ended(monkeypatch: pytest.MonkeyPatch):
    """Findings 2 and 3: what was told is not what a (re)started Flower heard."""
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    store = JobStore(r, keys)
    _Dispatcher.sent = []
    bridge = FlowerBridge(r, keys, hostname="control@n1", events_on=lambda: True, leads=lambda: True,
                          connect=object, dispatcher_cls=_Dispatcher)
    running = store.create(_job(name="long"))
    r.hset(keys.job(running.id), mapping={"state": "RUNNING", "node": "n1", "cards": "[0]", "worker": "card0@n1",
                                          "attempt": "1", "started_at": "5"})
    r.zrem(keys.state_index("PENDING"), running.id)
    r.zadd(keys.state_index("RUNNING"), {str(running.id): running.id})
    ended = store.create(_job(name="gap"))
    r.hset(keys.job(ended.id), mapping={"state": "SUCCEEDED", "node": "n1", "cards": "[1]", "worker": "card1@n1",
                                        "attempt": "1", "started_at": "5", "ended_at": "9", "exit_code": "0"})
    r.zrem(keys.state_index("PENDING"), ended.id)
    assert bridge.tell(running.id, JobState.RUNNING) and bridge.tell(ended.id, JobState.SUCCEEDED)
    assert bridge.resync() == 1 and not bridge.tell(*bridge.moves.get_nowait())  # told: nothing new
    before = len(_Dispatcher.sent)
    r.delete(keys.job(ended.id))  # archived meanwhile: its end is told as it was told then
    assert bridge.resync(again=True) == 2
    assert all(bridge.tell(*bridge.moves.get_nowait()) for _ in range(2))
    again = _Dispatcher.sent[before:]
    assert sorted((h, kind) for h, kind, _ in again) == [("card0@n1", "task-started"), ("card1@n1", "task-succeeded")]
    assert again == [s for s in _Dispatcher.sent[:before] if s in again]  # the very same events
    # The ends kept are bounded in age and number.
    monkeypatch.setattr(flower_bridge, "ENDED_MAX", 0)
    bridge.forget_old_ends()
    assert not r.exists(keys.flower_ended) and not r.exists(keys.flower_ended_events)


def test_rigs_flower_skips_an_event_it_has_applied_and_keeps_no_metrics():
    from celery.events.state import State
    from flower import events
    from flower.views import monitor

    from workers import flower_patches

    state = State()
    received = {"type": "task-received", "uuid": "rig-job-1-3f9a1c2e", "hostname": "control@n1",
                "timestamp": 100.0, "local_received": 100.0, "clock": 1}
    assert not flower_patches.applied_already(state.tasks, received)
    state.event(dict(received))
    assert flower_patches.applied_already(state.tasks, received)
    started = {**received, "type": "task-started", "hostname": "card0@n1", "timestamp": 101.0, "clock": 2}
    assert not flower_patches.applied_already(state.tasks, started)
    state.event(dict(started))
    assert flower_patches.applied_already(state.tasks, started)
    assert not flower_patches.applied_already(state.tasks, {**started, "timestamp": 105.0})  # attempt 2

    saved = (events.PROMETHEUS_METRICS, events.EventsState.event, monitor.Metrics.get)
    try:
        flower_patches.install()
        flower_state = events.EventsState()
        flower_state.event(dict(received))
        flower_state.event(dict(received))  # told again after a restart: counted once
        assert flower_state.counter["control@n1"]["task-received"] == 1
        assert isinstance(events.PROMETHEUS_METRICS, flower_patches._NoMetrics)
    finally:
        events.PROMETHEUS_METRICS, events.EventsState.event, monitor.Metrics.get = saved


def test_a_bridge_that_starts_telling_tells_again_what_an_earlier_one_told():
    """`rig down; rm flower/<node>.db*; rig up` (finding 3): the new control worker's bridge
    cannot know what the new Flower heard (its wake-up may come before the bridge exists), so
    it tells the running job again though ``flower:told`` says it was told."""
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    store = JobStore(r, keys)
    job = store.create(_job(name="longL"))
    r.hset(keys.job(job.id), mapping={"state": "RUNNING", "node": "n1", "cards": "[0]", "worker": "card0@n1",
                                      "attempt": "1", "started_at": "5"})
    r.zrem(keys.state_index("PENDING"), job.id)
    r.zadd(keys.state_index("RUNNING"), {str(job.id): job.id})
    r.hset(keys.flower_told, job.id, "RUNNING:1")  # told by the bridge before `rig down`
    sent = threading.Event()

    class Dispatcher(_Dispatcher):
        def send(self, kind: str, **fields: object) -> None:
            super().send(kind, **fields)
            sent.set()

    _Dispatcher.sent = []
    bridge = FlowerBridge(r, keys, hostname="control@n1", events_on=lambda: True, leads=lambda: True,
                          connect=object, dispatcher_cls=Dispatcher)
    bridge.start()
    try:
        assert sent.wait(10), "the running job was not told again"
        assert _Dispatcher.sent[0][:2] == ("card0@n1", "task-started")
    finally:
        bridge.stop()


def test_every_task_rig_registers_sends_no_task_events(tmp_path):
    """rig's Celery tasks are transport (start a job, tick, health, alerts, archive...): none
    may appear in Flower's task list, where only jobs are tasks. Checked on every task the app
    registers, so a new one cannot slip in (rig.archive once filled 1,440 rows a day). In a
    subprocess: importing workers.app reads the settings and installs patches."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env["RIG_HOME"] = str(tmp_path / "home")
    code = ("import json, workers.app as a; print(json.dumps({n: t.send_events for n, t in a.app.tasks.items() "
            "if not n.startswith('celery.')}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    tasks = json.loads(done.stdout.strip().splitlines()[-1])
    assert "rig.start_job" in tasks and "rig.archive" in tasks, tasks
    assert {name for name, sends in tasks.items() if sends} == set(), tasks
