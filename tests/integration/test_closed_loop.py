"""Closed-loop VRAM accounting on fake cards: measured use, max(declared, used) in the ledger,
memory of others counted as taken, over-declaration (warn / stop), metrics and `auto`."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from rig.client import Client, current_identity
from rig.config import load_settings
from rig.gpus.fake import FakeGpuBackend
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.placement import Request, place
from tests.conftest import REDIS_URL
from workers.card_runner import CardRunner

pytestmark = pytest.mark.redis
PY = sys.executable


def make(real_redis, key_prefix, tmp_path, **overrides):
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", kill_grace_seconds=1.0, **overrides)
    backend = FakeGpuBackend("1x80G", tmp_path / "usage")
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", backend.read(0), max_jobs=4, reserve_fraction=0.05, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1", backend=backend)
    return settings, backend, ledger, runner


def start(ledger: Ledger, runner: CardRunner, command: str, declared: int, name: str, tmp_path):
    job = ledger.store.create(Job(
        id=0, name=name, user=current_identity().name, command=["/bin/sh", "-c", command], shell=True,
        gpu_memory=declared, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING,
        workdir=str(tmp_path), created_at=time.time(), max_retries=0))
    ok, token = ledger.reserve(job.id, "n1", [0], declared)
    assert ok
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(runner.run_job(job.id, token)))
    thread.start()
    return job, thread, result


def _recorded_running(job: Job) -> bool:
    return job.state is JobState.RUNNING and bool(job.pid)


def wait_for_use(backend: FakeGpuBackend, ledger: Ledger, job: Job, timeout: float = 10.0) -> None:
    """Until the job's process reports its memory on the card *and* the job's record names its
    process (RUNNING with a pid): the runner attributes use only to jobs whose pid it wrote, and
    under load the fake use can be reported before that write."""
    deadline = time.monotonic() + timeout
    while not any(backend.read(0).processes.values()) or not _recorded_running(ledger.store.get(job.id)):
        assert time.monotonic() < deadline, "the job never reported its use"
        time.sleep(0.02)


def test_measured_use_counts_in_the_ledger_and_is_flagged(real_redis, key_prefix, tmp_path):
    settings, backend, ledger, runner = make(real_redis, key_prefix, tmp_path)
    go = tmp_path / "go"
    job, thread, result = start(
        ledger, runner, f"{PY} -m rig.fakeuse 12G 30 & while [ ! -f {go} ]; do sleep 0.02; done; kill $!",
        10 * GIB, "bert", tmp_path)
    wait_for_use(backend, ledger, job)
    runner._observe_jobs(backend.read(0))
    assert ledger.holdings("n1", 0)[job.id] == 12 * GIB  # max(declared 10, used 12)
    assert ledger.card("n1", 0).reserved == 12 * GIB
    running = ledger.store.get(job.id)
    assert running.overuse == 12 * GIB and running.vram_peak == 12 * GIB
    go.touch()
    thread.join(30)
    assert result == ["SUCCEEDED"]  # policy "warn": flagged, not stopped
    done = ledger.store.get(job.id)
    assert done.attempts[-1]["vram_peak"] == 12 * GIB and done.attempts[-1]["overuse"] == 12 * GIB
    assert ledger.card("n1", 0).reserved == 0
    # History feeds --gpu-memory auto: 12 GiB x 1.2, rounded up to 256 MiB.
    nbytes, note = Client(settings, redis_client=real_redis).auto_memory("bert")
    assert nbytes == int(14.5 * GIB) and "peak 12.0 GiB" in note


def test_over_declaration_stopped_when_policy_says_so(real_redis, key_prefix, tmp_path):
    settings, backend, ledger, runner = make(real_redis, key_prefix, tmp_path, overuse_policy="stop")
    job, thread, result = start(ledger, runner, f"{PY} -m rig.fakeuse 20G 60", 10 * GIB, "greedy", tmp_path)
    wait_for_use(backend, ledger, job)
    runner._observe_jobs(backend.read(0))
    thread.join(30)
    done = ledger.store.get(job.id)
    assert done.state is JobState.FAILED and done.failure == "over_declaration"
    assert done.suggested_gpu_memory == 25 * GIB  # 20 GiB used x 1.25
    assert job.id in ledger.store.error_ids()
    assert ledger.card("n1", 0).reserved == 0


def test_memory_of_processes_rig_did_not_start_is_taken(real_redis, key_prefix, tmp_path):
    settings, backend, ledger, runner = make(real_redis, key_prefix, tmp_path)
    outsider = subprocess.Popen(["sleep", "30"])
    try:
        usage = tmp_path / "usage" / "0"
        usage.mkdir(parents=True)
        (usage / str(outsider.pid)).write_text(str(50 * GIB))  # someone ran a job by hand
        runner._observe_jobs(backend.read(0))
        card = ledger.card("n1", 0)
        assert card.foreign == 50 * GIB and card.free == card.usable - 50 * GIB
        assert place([card], Request(30 * GIB), "multi-factor") is None
        blocked = ledger.store.create(Job(
            id=0, name="x", user="u", command=["true"], gpu_memory=30 * GIB, gpus=1,
            priority=Priority.HIGH, state=JobState.PENDING, workdir="/", created_at=time.time()))
        ok, reason = ledger.reserve(blocked.id, "n1", [0], 30 * GIB)
        assert not ok and reason.startswith("card-full")
    finally:
        outsider.kill()
        outsider.wait()
    runner._observe_jobs(backend.read(0))  # the outsider is gone: its memory is free again
    assert ledger.card("n1", 0).foreign == 0


def test_metrics_command_shows_declared_vs_peak(real_redis, key_prefix, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rig.cli.main import cli

    settings, backend, ledger, runner = make(real_redis, key_prefix, tmp_path)
    go = tmp_path / "go"
    job, thread, _ = start(ledger, runner,
                           f"{PY} -m rig.fakeuse 6G 30 & while [ ! -f {go} ]; do sleep 0.02; done; kill $!",
                           8 * GIB, "eval", tmp_path)
    wait_for_use(backend, ledger, job)
    for _ in range(3):
        runner._observe_jobs(backend.read(0))
    go.touch()
    thread.join(30)
    monkeypatch.setenv("RIG_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("RIG_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    out = CliRunner().invoke(cli, ["metrics", str(job.id)])
    assert out.exit_code == 0, out.output
    assert "8.0 GiB" in out.output and "6.0 GiB" in out.output and "75%" in out.output
    assert "100%" in out.output  # the fake card reports full utilisation while used
