"""Starts reach the card worker through its start list (workers.start_list), real Redis and
real processes: each placed job runs exactly once, whatever happens between its take and its
claim, and a start that has no reservation behind it any more is refused and removed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rig.client import Client, current_identity
from rig.config import Settings
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.card_runner import CardRunner

pytestmark = pytest.mark.redis


@pytest.fixture
def env(card_runner_env):
    return card_runner_env  # tests/integration/conftest.py


def placed(ledger: Ledger, command: str, tmp_path: Path) -> tuple[Job, str]:
    job = ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["/bin/sh", "-c", command], shell=True,
        gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(tmp_path),
        created_at=time.time()))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    return job, token


def _until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _drained(runner: CardRunner) -> bool:
    return runner.starts.listed() == ([], []) and not runner.consumer.handling()


def test_a_placed_job_runs_from_the_list_once_even_when_pushed_twice(env, tmp_path):
    settings, ledger, runner, _ = env
    mark = tmp_path / "ran"
    job, token = placed(ledger, f'echo x >> "{mark}"', tmp_path)
    runner.starts.push(job.id, token)  # a copy too many (adopt's push racing the take)
    runner.consumer.start()
    done = Client(settings).wait(job.id, timeout=20)
    assert done.state is JobState.SUCCEEDED
    _until(lambda: _drained(runner))
    assert mark.read_text().splitlines() == ["x"]
    assert ledger.card("n1", 0).reserved == 0


def test_a_worker_killed_after_taking_a_start_before_its_claim(env, tmp_path):
    """SIGKILL between BLMOVE and the claim: the start is in the taking list, no thread holds
    it. The card's next worker puts it back and runs the job, once."""
    settings, ledger, dead, _ = env
    mark = tmp_path / "ran"
    job, token = placed(ledger, f'echo x >> "{mark}"', tmp_path)
    assert dead.starts.take() == f"{job.id} {token}"  # ...and the worker dies here
    assert dead.starts.listed() == ([], [f"{job.id} {token}"])
    assert ledger.store.get(job.id).state is JobState.ASSIGNED
    dead.stop()
    runner = _next_worker(settings)
    try:
        runner.start_services()
        done = Client(settings).wait(job.id, timeout=20)
        assert done.state is JobState.SUCCEEDED and done.attempt == 1
        _until(lambda: _drained(runner))
        assert mark.read_text().splitlines() == ["x"]
        assert ledger.card("n1", 0).reserved == 0 and ledger.card("n1", 0).jobs == 0
    finally:
        runner.stop()


def test_a_start_whose_reservation_was_released_is_refused_and_removed(env, tmp_path):
    settings, ledger, runner, _ = env
    mark = tmp_path / "ran"
    job, token = placed(ledger, f'echo x >> "{mark}"', tmp_path)
    # Released before its worker took it (here: sent back to the queue, as a node declared down does).
    code, _ = ledger.transition(job.id, JobState.PENDING, token=token, expect=JobState.ASSIGNED)
    assert code == 1
    assert ledger.card("n1", 0).reserved == 0
    runner.consumer.start()
    _until(lambda: _drained(runner))
    back = ledger.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempt == 0
    assert not mark.exists()
    card = ledger.card("n1", 0)
    assert card.reserved == 0 and card.jobs == 0 and ledger.holdings("n1", 0) == {}


def test_starts_left_to_the_name_owner_stay_on_the_list(env, tmp_path):
    """While the node name is another rig up's, this worker takes no start (that one's does)."""
    settings, ledger, _runner, _ = env
    ours = False
    asked: list[bool] = []

    def may_take() -> bool:
        asked.append(ours)
        return ours

    runner = CardRunner(settings, "n1", 0, "card0@n1-other", may_take=may_take)
    try:
        job, token = placed(ledger, "true", tmp_path)
        runner.consumer.start()
        _until(lambda: len(asked) >= 2)  # asked twice, refused twice: it must not have taken it
        assert runner.starts.listed() == ([f"{job.id} {token}"], [])
        ours = True
        assert Client(settings).wait(job.id, timeout=20).state is JobState.SUCCEEDED
    finally:
        runner.stop()


def _next_worker(settings: Settings) -> CardRunner:
    return CardRunner(settings, "n1", 0, "card0@n1-next")
