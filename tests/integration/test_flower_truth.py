"""Flower tells the truth about jobs (issue 14, item 1), through Flower's own HTTP API, on one
real node (rig's Stack: control + two card workers, beat, Flower) shared by the whole module:

each job is one task ``rig-job-<id>`` named for its owner, size and card; a failed job is a
FAILURE with its exit code and class, and the Failed filter finds it; the card worker's
counters count it; beat's and rig's own Celery tasks are not in the list; Terminate kills a
running job through rig kill's path; the worker controls that would take a card worker down
are refused; Flower's history survives its restart."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rig.celery_config import TASK_START_JOB, card_queue
from rig.client import current_identity
from rig.keys import card_worker_name
from rig.models import JobState
from rig.stack import flower_credentials, flower_db
from rig.task_events import task_id
from rig.testing.harness import RigHarness
from workers.process_tree import is_alive

pytestmark = [pytest.mark.slow, pytest.mark.redis]

NODE = "fl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlowerApi:
    """Flower's HTTP API with the node's admin login."""

    def __init__(self, port: int, user: str, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, path: str, *, method: str = "GET") -> tuple[int, Any]:
        request = urllib.request.Request(self.base + path, method=method, headers={"Authorization": self.auth},
                                         data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                body = resp.read().decode()
                status = resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read().decode(), exc.code
        except (urllib.error.URLError, OSError) as exc:  # not listening (yet): restarting
            return 0, str(exc)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def task(self, task_id: str) -> dict | None:
        status, body = self.call(f"/api/task/info/{task_id}")
        return body if status == 200 and isinstance(body, dict) else None

    def until(self, what: str, found: Callable[[], Any], timeout: float = 60.0) -> Any:
        """Poll Flower (it learns from events, asynchronously) until ``found()`` is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = found()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"Flower never showed {what}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RigHarness, FlowerApi]]:
    home = tmp_path_factory.mktemp("flower-truth")
    harness = RigHarness(home, fake_gpus="2x24G", node_name=NODE, flower_port=_free_port())
    try:
        harness.up(beat=True, flower=True)
        api = FlowerApi(harness.settings.flower_port, *flower_credentials(harness.settings))
        # Flower watches once its workers page knows the card workers (their heartbeats reached it).
        api.until("the card workers", lambda: card_worker_name(NODE, 1) in str(api.call("/workers?json=1")[1]),
                  timeout=60)
        yield harness, api
    finally:
        harness.cleanup()


def _run(harness: RigHarness, name: str, script: str, state: set[JobState]) -> tuple[int, str]:
    """Submit a job and wait for ``state``: (its id, its task id in Flower)."""
    job = harness.client.submit(["sh", "-c", script], gpu_memory="1G", name=name)
    harness.wait_for_state(job.id, state, timeout=60)
    return job.id, task_id(harness.client.get(job.id))


def test_jobs_are_tasks_with_their_truth(node: tuple[RigHarness, FlowerApi]) -> None:
    harness, api = node
    me = current_identity().name
    good, good_task = _run(harness, "good", "exit 0", {JobState.SUCCEEDED})
    bad, bad_task = _run(harness, "bad", "echo nope; exit 3", {JobState.FAILED})
    record = harness.client.get(good)

    shown = api.until("the good job's success", lambda: (t := api.task(good_task)) and
                      t["state"] == "SUCCESS" and t)
    assert shown["name"] == (f"job {good} 'good' by {me}: 1.0 GiB x 1, on {NODE}/{record.cards[0]}")
    assert shown["worker"] == card_worker_name(NODE, record.cards[0])
    assert "exit code 0" in shown["result"] and shown["runtime"] is not None

    failed = api.until("the bad job's failure", lambda: (t := api.task(bad_task)) and
                       t["state"] == "FAILURE" and t)
    assert failed["exception"].startswith("nonzero_exit: exit code 3"), failed["exception"]
    # Its two retries (max_retries = 2 by default) were Celery retries of the same task.
    assert failed["retries"] == 2 and "gave up after 3 attempts" in failed["exception"]
    assert f"job {bad} 'bad' by {me}" in failed["name"]

    # The Failed filter and the search find it.
    _, failures = api.call("/api/tasks?state=FAILURE")
    assert bad_task in failures and good_task not in failures
    _, searched = api.call("/api/tasks?search=" + urllib.parse.quote("'bad'"))
    assert list(searched) == [bad_task]

    # Only jobs are tasks: no rig.start_job / rig.submitted, nor beat's rig.tick / rig.health,
    # which have run by now (the control worker's log says so).
    control_log = harness.settings.rig_log_dir / "control.log"
    api.until("beat's tasks run", lambda: all(f"Task {name}[" in control_log.read_text()
                                                 for name in ("rig.tick", "rig.health")), timeout=30)
    _, tasks = api.call("/api/tasks?limit=1000")
    assert tasks and all(uuid.startswith("rig-job-") for uuid in tasks), sorted(t["name"] for t in tasks.values())

    # The card worker that ran the failing job counts it.
    failed_on = card_worker_name(NODE, harness.client.get(bad).cards[0])
    workers = api.until("the failure in its worker's counters", lambda: {
        w["hostname"]: w for w in api.call("/workers?json=1")[1]["data"]}.get(failed_on, {}).get("task-failed"))
    assert workers >= 1

    # Flower's own /metrics (no login, a series per job) is off: rig's /metrics is the one.
    try:
        urllib.request.urlopen(api.base + "/metrics", timeout=10)
        raise AssertionError("Flower's /metrics answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404 and b"rig's own /metrics" in exc.read()


def test_terminate_kills_the_job_and_worker_controls_are_refused(node: tuple[RigHarness, FlowerApi]) -> None:
    harness, api = node
    victim, victim_task = _run(harness, "sleeper", "sleep 300", {JobState.RUNNING})
    api.until("the running job", lambda: (t := api.task(victim_task)) and t["state"] == "STARTED")
    # RUNNING is set at the claim; the pid once its process exists, a moment later.
    running = api.until("the job's pid in its record", lambda: (j := harness.client.get(victim)).pid and j)
    pid, start = running.pid, running.proc_start
    assert is_alive(pid, start)

    # A job that waits (both cards whole, while the sleeper holds one) is Revoke's (Flower
    # offers it on a RECEIVED row): cancelled, never started.
    big = harness.client.submit(["sh", "-c", "exit 0"], gpu_memory="22G", gpus=2, name="big")
    big_task = task_id(harness.client.get(big.id))
    api.until("the waiting job", lambda: (t := api.task(big_task)) and t["state"] == "RECEIVED")
    status, _ = api.call(f"/api/task/revoke/{big_task}", method="POST")
    assert status == 200 and harness.wait_for_state(big.id, {JobState.CANCELLED}) is JobState.CANCELLED
    assert api.until("the revoked waiting job", lambda: (t := api.task(big_task)) and t["state"] == "REVOKED")

    status, _ = api.call(f"/api/task/revoke/{victim_task}?terminate=true", method="POST")
    assert status == 200
    assert harness.wait_for_state(victim, {JobState.CANCELLED}, timeout=30) is JobState.CANCELLED
    assert not is_alive(pid, start), "the job's process must be gone"
    assert harness.client.get(victim).reason == "cancelled by Flower (admin login)"
    revoked = api.until("the revoked job", lambda: (t := api.task(victim_task)) and t["state"] == "REVOKED" and t)
    ended = harness.client.get(victim)
    assert revoked["exception"] == "cancelled by Flower (admin login)" and revoked["runtime"] is not None
    assert revoked["result"] == repr(f"exit code {ended.exit_code}"), (revoked, ended.exit_code)

    # A card worker's pool and life are rig's: Flower's controls are refused with one line.
    card = card_worker_name(NODE, 0)
    # Flower's list of workers (from a Celery inspect), which its controls check first.
    api.until("the card worker in Flower's inspect", lambda: card in api.call("/api/workers?refresh=1")[1])
    status, body = api.call(f"/api/worker/pool/grow/{card}?n=1", method="POST")
    assert status == 403 and "refused by rig" in str(body), body
    # ... and so are its queue (a cancelled consumer left the card's jobs ASSIGNED, an added one
    # ran another card's jobs) and its task controls (a rate limit held the card's starts back).
    for call in (f"/api/worker/queue/cancel-consumer/{card}?queue={card_queue(NODE, 0)}",
                 f"/api/worker/queue/add-consumer/{card}?queue={card_queue(NODE, 1)}",
                 f"/api/task/rate-limit/{TASK_START_JOB}?workername={card}&ratelimit=1/m",
                 f"/api/task/timeout/{TASK_START_JOB}?workername={card}&soft=1"):
        status, body = api.call(call, method="POST")
        assert status == 403 and "refused by rig" in str(body), (call, body)
    # Flower's Shut Down button says what the worker answered, not "Shutting down!".
    status, body = api.call(f"/api/worker/shutdown/{card}", method="POST")
    assert status == 403 and "refused by rig" in str(body) and "Shutting down" not in str(body), body
    replies = harness.client.celery.control.broadcast("shutdown", destination=[card], reply=True, timeout=5)
    assert replies and "refused by rig" in replies[0][card]["error"], replies
    assert harness.worker_pid(card) == harness.child("card0").proc.pid


def test_history_survives_a_flower_restart(node: tuple[RigHarness, FlowerApi]) -> None:
    harness, api = node
    kept, kept_task = _run(harness, "kept", "exit 0", {JobState.SUCCEEDED})
    api.until("the job to keep", lambda: (t := api.task(kept_task)) and t["state"] == "SUCCESS")
    flower = harness.child("flower")
    old = flower.proc.pid
    os.killpg(old, signal.SIGTERM)  # as rig down stops it: Flower saves its history then
    flower.proc.wait(timeout=30)
    assert list(flower_db(harness.settings).parent.glob(flower_db(harness.settings).name + "*"))
    # The harness restarts it, as rig up does; the job is still there, without a new event.
    api.until("the restarted Flower", lambda: flower.proc is not None and flower.proc.pid != old
              and api.call("/healthcheck")[0] == 200, timeout=60)
    shown = api.until("the kept job after the restart", lambda: api.task(kept_task))
    assert shown["state"] == "SUCCESS" and f"'kept' by {current_identity().name}" in shown["name"]


def test_a_flower_restarted_empty_is_told_what_runs_and_what_ended_meanwhile(
        node: tuple[RigHarness, FlowerApi]) -> None:
    """A Flower killed, its history deleted ("to start afresh"), and a job ending before it is
    back: the running job is STARTED and the ended one ended in the new Flower, told again once
    it listens (workers.flower_bridge), not at the jobs' next move."""
    harness, api = node
    long_id, long_task = _run(harness, "longL", "sleep 300", {JobState.RUNNING})
    gap_id, gap_task = _run(harness, "gap", "sleep 300", {JobState.RUNNING})
    for uuid in (long_task, gap_task):
        api.until("the running job", lambda uuid=uuid: (t := api.task(uuid)) and t["state"] == "STARTED")
    flower = harness.child("flower")
    old = flower.proc.pid
    harness.restart_children = False  # the job ends while no Flower listens
    try:
        os.killpg(old, signal.SIGKILL)
        flower.proc.wait(timeout=30)
        db = flower_db(harness.settings)
        for path in db.parent.glob(db.name + "*"):
            path.unlink()
        harness.client.kill(gap_id)
        harness.wait_for_state(gap_id, {JobState.CANCELLED}, timeout=30)
    finally:
        harness.restart_children = True
    api.until("the restarted Flower", lambda: flower.proc is not None and flower.proc.pid != old
              and api.call("/healthcheck")[0] == 200, timeout=60)
    shown = api.until("the running job in the new Flower", lambda: (t := api.task(long_task))
                      and t["state"] == "STARTED" and t)
    assert f"job {long_id} 'longL'" in shown["name"]
    api.until("the job that ended meanwhile", lambda: (t := api.task(gap_task)) and t["state"] == "REVOKED")
    # Told again, counted once: the card workers' counters are not inflated by the re-telling.
    workers = {w["hostname"]: w for w in api.call("/workers?json=1")[1]["data"]}
    assert sum(w.get("task-started", 0) for w in workers.values()) == 1, workers
    harness.client.kill(long_id)
    harness.wait_for_state(long_id, {JobState.CANCELLED}, timeout=30)
