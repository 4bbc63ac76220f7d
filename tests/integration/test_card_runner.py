"""The card runner without Celery: real Redis, real subprocesses, adoption after a worker died."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from rig.cli.render import job_reason
from rig.client import Client, current_identity
from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.logs import job_folder
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.conftest import REDIS_URL
from workers.card_runner import CardRunner
from workers.process_tree import find_by_environ, proc_start_time, wrapper_argv

pytestmark = pytest.mark.redis


@pytest.fixture
def env(card_runner_env):
    return card_runner_env  # tests/integration/conftest.py


def placed(ledger: Ledger, command: str, tmp_path) -> tuple[Job, str]:
    job = ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["/bin/sh", "-c", command], shell=True, gpu_memory=GIB,
        gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(tmp_path),
        created_at=time.time(),
    ))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    return job, token


def test_run_job_success_and_log(env, tmp_path):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "echo hi; echo $CUDA_VISIBLE_DEVICES $RIG_JOB_ID $RIG_ATTEMPT", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    done = ledger.store.get(job.id)
    assert done.exit_code == 0 and done.attempt == 1
    assert open(done.log_paths[0]).read().split() == ["hi", "0", str(job.id), "1"]
    assert ledger.card("n1", 0).reserved == 0
    assert runner.run_job(job.id, token).startswith("ignored")  # a redelivery does nothing


def test_bad_workdir_fails_cleanly(env, tmp_path):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    ledger.store.update(job.id, workdir=str(tmp_path / "gone"))
    assert runner.run_job(job.id, token) == "failed-to-start"
    done = ledger.store.get(job.id)
    assert done.state is JobState.FAILED and "could not start" in done.reason
    assert "could not start" in open(done.log_paths[0]).read()
    assert ledger.card("n1", 0).reserved == 0


def test_adopt_requeues_a_claimed_job_that_never_started(env, tmp_path):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    ok, _ = ledger.claim(job.id, token, "card0@n1")  # ...and then the worker died
    assert ok
    runner.adopt()
    back = ledger.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempt == 0
    assert ledger.card("n1", 0).reserved == 0
    assert ledger.store.pending_head(5) == [job.id]


def test_adopt_pushes_again_a_lost_start(env, tmp_path):
    settings, ledger, runner, listed = env
    job, token = placed(ledger, "true", tmp_path)
    assert listed() == [(job.id, token)]  # pushed with the reservation
    runner.adopt()
    assert listed() == [(job.id, token)]  # still there: not pushed twice
    ledger.r.delete(runner.starts.starts)  # lost (e.g. Redis rolled back past the push)
    runner.adopt(resend_after=3600.0)
    assert listed() == []  # placed just now: not yet taken for lost
    runner.adopt()
    assert listed() == [(job.id, token)]


def test_adopt_reads_only_the_jobs_placed_on_its_own_card(env, tmp_path):
    """Issue 15: every card worker read every placed job of the cluster every check interval."""
    settings, ledger, runner, listed = env
    ledger.register_card("n1", GpuReading(index=1, uuid="u1", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    mine, token = placed(ledger, "true", tmp_path)
    other = ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(tmp_path), created_at=time.time()))
    assert ledger.reserve(other.id, "n1", [1], GIB)[0]
    read: list[int] = []
    get_many = runner.store.get_many
    runner.store.get_many = lambda ids: read.extend(ids) or get_many(ids)  # type: ignore[method-assign]
    ledger.r.delete(runner.starts.starts)
    runner.adopt()
    assert listed() == [(mine.id, token)] and read == [mine.id]


def _start_orphan(settings, job: Job, attempt: int, command: str, node: str | None = None) -> subprocess.Popen:
    job_dir = job_folder(settings.job_log_dir, job.id, job.instance)
    job_dir.mkdir(parents=True, exist_ok=True)
    exit_file = job_dir / f"attempt-{attempt}.exit"
    return subprocess.Popen(wrapper_argv(["/bin/sh", "-c", command]), start_new_session=True,
                            env={**os.environ, "RIG_EXIT_FILE": str(exit_file), "RIG_JOB_ID": str(job.id),
                                 "RIG_JOB_INSTANCE": job.instance or "", "RIG_ATTEMPT": str(attempt),
                                 "RIG_KEY_PREFIX": settings.key_prefix, **({"RIG_NODE_NAME": node} if node else {})})


def test_adopt_finds_unrecorded_pid_and_supervises_it(env, tmp_path):
    settings, ledger, runner, _ = env
    go = tmp_path / "go"
    job, token = placed(ledger, "unused", tmp_path)
    ledger.claim(job.id, token, "old-worker")
    # The old worker started the process but died before recording its pid.
    proc = _start_orphan(settings, job, 1, f"while [ ! -f {go} ]; do sleep 0.02; done; exit 4")
    exit_file = str(job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.exit")
    deadline = time.monotonic() + 5
    while find_by_environ("RIG_EXIT_FILE", exit_file) is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the orphan has exec'd
    runner.adopt()
    assert ledger.store.get(job.id).pid == proc.pid
    go.touch()
    proc.wait(10)
    done = Client(settings).wait(job.id, timeout=10)  # wakes on the job's state event
    assert done.state is JobState.FAILED and done.exit_code == 4
    assert ledger.card("n1", 0).reserved == 0


def test_adopt_finishes_a_job_that_ended_unwatched(env, tmp_path):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "unused", tmp_path)
    ledger.claim(job.id, token, "old-worker")
    proc = _start_orphan(settings, job, 1, "exit 0")
    proc.wait(10)
    ledger.store.update(job.id, pid=proc.pid, proc_start=12345)
    runner.adopt()
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert ledger.card("n1", 0).reserved == 0


def test_adopt_leaves_a_job_being_started_alone(env, tmp_path):
    """Regression: the periodic audit once requeued a job this worker had just claimed but not
    yet launched, and the job then ran twice."""
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    runner._starting[job.id] = 1  # as run_job does before its claim
    ledger.claim(job.id, token, "card0@n1")
    runner.adopt()
    assert ledger.store.get(job.id).state is JobState.RUNNING
    assert ledger.store.get(job.id).attempt == 1


def test_stale_view_cannot_requeue_a_job_that_moved(env, tmp_path):
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    ledger.claim(job.id, token, "card0@n1")
    stale = ledger.store.get(job.id)
    ledger.transition(job.id, JobState.PENDING, token=token)  # it moved on meanwhile
    runner._requeue_unstarted(stale)
    assert ledger.store.get(job.id).attempt == 1  # not decremented by the stale view


class HotCard:
    """A fake backend whose one card reports the temperature a test sets."""

    kind = "fake"

    def __init__(self) -> None:
        self.temperature = 40

    def read(self, index: int) -> GpuReading:
        return GpuReading(index=index, uuid="u", model="m", total=80 * GIB, used=0, utilization=0,
                          temperature=self.temperature)


def test_hot_or_unreadable_card_takes_no_jobs_until_it_recovers(env):
    from rig.gpus.base import GpuReadError

    settings, ledger, runner, _ = env
    backend = HotCard()
    runner.backend = backend
    backend.temperature = settings.health.max_temperature + 1
    runner._read_card()
    card = ledger.card("n1", 0)
    assert not card.healthy and "temperature" in card.health_reason
    backend.temperature = settings.health.max_temperature - 2  # not yet 5 C below the limit
    runner._read_card()
    assert not ledger.card("n1", 0).healthy
    backend.temperature = settings.health.max_temperature - 10
    runner._read_card()
    assert ledger.card("n1", 0).healthy

    def broken(index):
        raise GpuReadError("GPU 0: NVML cannot read memory info: NVMLError_GpuIsLost")

    backend.read = broken
    runner._read_card()
    card = ledger.card("n1", 0)
    assert not card.healthy and "GpuIsLost" in card.health_reason


def test_log_is_capped_while_the_job_runs(real_redis, key_prefix, tmp_path):
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", log_max_bytes=64 * 1024)
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    job, token = placed(ledger, "seq 1 200000; echo last-line", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    text = open(ledger.store.get(job.id).log_paths[0]).read()
    assert len(text) <= 64 * 1024 + 200
    assert text.startswith("1\n2\n3\n") and text.endswith("last-line\n")
    assert "bytes of output were cut here" in text


def test_log_sweep_keeps_live_and_recent_error_logs(real_redis, key_prefix, tmp_path):
    from workers.log_sweep import sweep_logs

    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", log_retention_days=1, error_log_retention_days=10)
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=10, reserve_fraction=0.0, allowed=True, fake=True)
    old = time.time() - 3 * 86400
    jobs = {}
    for name in ("done", "running", "error", "error-ancient"):
        jobs[name], _ = placed(ledger, "true", tmp_path) if name != "done" else (ledger.store.create(Job(
            id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.LOW,
            state=JobState.PENDING, workdir="/", created_at=time.time())), None)
    ledger.transition(jobs["done"].id, JobState.SUCCEEDED)
    ledger.transition(jobs["error"].id, JobState.FAILED, error_queue=True)
    ledger.transition(jobs["error-ancient"].id, JobState.FAILED, error_queue=True)
    for name, job in jobs.items():
        folder = job_folder(settings.job_log_dir, job.id, ledger.store.get(job.id).instance)
        folder.mkdir(parents=True)
        log = folder / "attempt-1.log"
        log.write_text("x" * 100)
        age = time.time() - 20 * 86400 if name == "error-ancient" else old
        os.utime(log, (age, age))
    report = sweep_logs(settings, real_redis)
    assert sorted(report.deleted) == sorted([jobs["done"].id, jobs["error-ancient"].id])
    assert job_folder(settings.job_log_dir, jobs["running"].id, ledger.store.get(jobs["running"].id).instance).exists()
    assert job_folder(settings.job_log_dir, jobs["error"].id, ledger.store.get(jobs["error"].id).instance).exists()


def _forget_everything(ledger: Ledger, prefix: str) -> None:
    """Redis came back empty: every key of this installation is gone (ids restart at 1)."""
    from rig.testing.harness import delete_prefix

    delete_prefix(ledger.r, prefix)
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=10, reserve_fraction=0.0, allowed=True, fake=True)


def test_a_reused_job_id_runs_its_own_command_not_the_old_files(env, tmp_path, key_prefix):
    """Issue 10.1: after Redis lost its data, job 1 is a new job; the files of the old job 1
    on this node must not conclude it (it used to end SUCCEEDED with the old log, unrun)."""
    settings, ledger, runner, _ = env
    old, token = placed(ledger, "echo old job; exit 0", tmp_path)
    assert runner.run_job(old.id, token) == "SUCCEEDED"
    _forget_everything(ledger, key_prefix)
    marker = tmp_path / "new-ran"
    new, token = placed(ledger, f"echo new job; touch {marker}; exit 3", tmp_path)
    assert new.id == old.id and new.instance != old.instance
    assert runner.run_job(new.id, token) == "FAILED" or ledger.store.get(new.id).state is JobState.PENDING
    done = ledger.store.get(new.id)
    assert marker.exists(), "the new job's command never ran"
    assert done.exit_code == 3 and open(done.log_paths[0]).read() == "new job\n"
    assert job_folder(settings.job_log_dir, old.id, old.instance).is_dir()  # the old log stays


def test_an_old_process_with_a_reused_id_is_not_adopted(env, tmp_path, key_prefix):
    """A live process of an old job 1 (instance A) is not the new job 1's (instance B)."""
    settings, ledger, runner, _ = env
    go = tmp_path / "go"
    old, token = placed(ledger, "unused", tmp_path)
    ledger.claim(old.id, token, "old-worker")
    proc = _start_orphan(settings, old, 1, f"while [ ! -f {go} ]; do sleep 0.02; done")
    try:
        _forget_everything(ledger, key_prefix)
        marker = tmp_path / "new-ran"
        new, token = placed(ledger, f"touch {marker}", tmp_path)
        assert new.id == old.id
        assert runner.run_job(new.id, token) == "SUCCEEDED"
        assert marker.exists() and proc.poll() is None  # ran; the old process untouched
    finally:
        go.touch()
        proc.wait(10)


def test_the_job_environment_is_not_the_workers(env, tmp_path, monkeypatch):
    """Issue 10.4: a variable of the shell that started the worker never reaches a job; the
    submitter's passed-on variables and --env do; rig's own cannot be overridden."""
    settings, ledger, runner, _ = env
    monkeypatch.setenv("ADMIN_SECRET", "operator-only")
    job, token = placed(ledger, "env", tmp_path)
    ledger.store.update(job.id, env={"LD_LIBRARY_PATH": "/opt/lib", "MY_TOKEN": "t0k",
                                     "CUDA_VISIBLE_DEVICES": "3", "PATH": "/usr/bin:/bin"})
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    seen = dict(line.split("=", 1) for line in open(ledger.store.get(job.id).log_paths[0]).read().splitlines()
                if "=" in line)
    assert "ADMIN_SECRET" not in seen
    assert seen["LD_LIBRARY_PATH"] == "/opt/lib" and seen["MY_TOKEN"] == "t0k"
    assert seen["CUDA_VISIBLE_DEVICES"] == "0" and seen["RIG_JOB_INSTANCE"] == job.instance


def test_a_fast_writer_stays_within_the_log_cap(real_redis, key_prefix, tmp_path):
    """Issue 10.11: the cap used to be polled every 5 s (3.3 GB on disk against 256 MiB)."""
    from rig.testing.faults_jobs import LogWatch
    from workers.process_tree import is_alive

    cap = 1 << 20
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", log_max_bytes=cap)
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    job, token = placed(ledger, "yes 'a line of output' | head -c 150000000; echo; echo last-line", tmp_path)
    folder = job_folder(settings.job_log_dir, job.id, job.instance)
    try:
        with LogWatch(folder / "attempt-1.log") as watch:
            assert runner.run_job(job.id, token) == "SUCCEEDED"
    finally:
        runner.stop()
    text = open(ledger.store.get(job.id).log_paths[0]).read()
    assert watch.biggest <= cap + 4096, watch.biggest
    assert text.endswith("last-line\n") and "bytes of output were cut here" in text
    assert watch.keeper is not None, "the job had no log keeper"
    assert not is_alive(*watch.keeper), "the log keeper outlived its job"


def test_a_job_killed_before_its_start_never_runs(env, tmp_path):
    settings, ledger, runner, _ = env
    marker = tmp_path / "ran"
    job, token = placed(ledger, f"touch {marker}", tmp_path)
    ledger.store.update(job.id, cancel_requested=True, cancelled_by="ana")  # rig kill raced the placement
    assert runner.run_job(job.id, token) == "CANCELLED"
    done = ledger.store.get(job.id)
    assert not marker.exists() and "ana" in (done.reason or "")
    assert ledger.card("n1", 0).reserved == 0


def test_a_job_that_ended_before_the_kill_reached_it_keeps_its_own_ending(env, tmp_path):
    """Breaker: rig kill raced a placement; the job ran `echo C` to its end (exit 0) and was
    recorded CANCELLED with exit code 0."""
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "echo C", tmp_path)
    real_launch = runner._launch

    def launch_then_kill(*args, **kwargs):  # the kill request lands just after the start
        active = real_launch(*args, **kwargs)
        ledger.store.update(job.id, cancel_requested=True, cancelled_by="ana")
        return active

    runner._launch = launch_then_kill
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    assert ledger.store.get(job.id).exit_code == 0


def test_a_kill_request_weighed_at_the_ending_is_read_with_the_record_not_asked_apart(env, tmp_path):
    """The ending weighs the record's kill request where it reads the record (one round trip
    with the installation): a job stopped by SIGTERM (exit 143) after a kill request this worker
    never acted on is CANCELLED by whoever asked, and the ending asks Redis for the request in
    no command of its own (it used to HMGET cancel_requested and cancelled_by)."""
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "kill -TERM $$", tmp_path)
    real_launch = runner._launch
    asked: list[tuple] = []
    real_hmget = runner.r.hmget

    def launch_then_kill(*args, **kwargs):  # the request lands just after the start
        active = real_launch(*args, **kwargs)
        ledger.store.update(job.id, cancel_requested=True, cancelled_by="ana")
        return active

    def hmget(name, keys, *more):  # noqa: ANN001, ANN202
        asked.append((name, tuple([keys] if isinstance(keys, str) else keys) + more))
        return real_hmget(name, keys, *more)

    runner._launch = launch_then_kill
    runner.r.hmget = hmget
    assert runner.run_job(job.id, token) == "CANCELLED"
    done = ledger.store.get(job.id)
    assert done.exit_code == 143 and "ana" in (done.reason or "")
    assert not [a for a in asked if "cancelled_by" in a[1]]
    assert ledger.card("n1", 0).reserved == 0


@pytest.mark.parametrize("loss", ["deleted", "reused"])
def test_an_ending_whose_record_redis_lost_raises_the_unrecorded_alert(real_redis, key_prefix, tmp_path, loss):
    """Issue 15 finding 6: Redis lost the job's record (a double fault without AOF), or the id
    now names another job, while its attempt ran: the ending raises the node's unrecorded-jobs
    alert (rig status, rig.alerts) instead of a JobNotFound traceback, and writes nothing."""
    from workers.outcomes import AttemptEnd

    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home", node_name="n1")
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    job, token = placed(ledger, "true", tmp_path)
    if loss == "deleted":
        real_redis.delete(Keys(key_prefix).job(job.id))
    else:
        real_redis.hset(Keys(key_prefix).job(job.id), "instance", "another-job")
    assert runner._finish(job.id, token, AttemptEnd(exit_code=0), instance=job.instance or "i1") is None
    line = real_redis.hget(Keys(key_prefix).node("n1"), "unrecorded_jobs")
    assert line and line.startswith(f"Redis has no record of job {job.id} whose attempt ended on n1")


def test_an_attempt_redis_forgot_is_concluded_with_its_own_start(env, tmp_path, key_prefix):
    """A tester's finding: Redis rolled back to before an attempt's end (a crash within the fsync
    window), so its start comes again; the worker concludes it from what it left, not re-running
    it, and the record must not say it started after it ended (the claim stamps "now")."""
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "echo once >> ran", tmp_path)
    keys = list(ledger.r.scan_iter(f"{key_prefix}*"))
    saved = {k: ledger.r.dump(k) for k in keys}
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    first = ledger.store.get(job.id)
    for k in list(ledger.r.scan_iter(f"{key_prefix}*")):  # the rollback
        if k not in saved:
            ledger.r.delete(k)
    for k, value in saved.items():
        ledger.r.restore(k, 0, value, replace=True)
    assert ledger.store.get(job.id).state is JobState.ASSIGNED
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    again = ledger.store.get(job.id)
    assert (tmp_path / "ran").read_text() == "once\n"  # not run twice
    assert again.started_at <= again.ended_at
    assert abs(again.started_at - first.started_at) < 1.0


def _until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_a_job_log_goes_on_through_a_worker_restart_with_the_cards_keeper(env, tmp_path):
    """Issue 13: one keeper copies every log of the card. A worker that stops leaves it copying
    the running job's log; the next worker adopts the job, and its log has everything, the
    output after the restart included; then that keeper, with nothing left, is gone."""
    import threading

    from workers.card_runner import read_pid_file
    from workers.process_tree import is_alive

    settings, ledger, runner, _ = env
    go = tmp_path / "go"
    job, token = placed(ledger, f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; echo after", tmp_path)
    try:  # the job waits for the go-file: a failed check must not leave it running for ever
        log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
        results: list[str] = []
        first = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
        first.start()
        # The job may print before its worker has written the pid file (after Popen returns).
        assert _until(lambda: log.exists() and log.read_text() == "before\n"
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        noted = read_pid_file(log.with_suffix(".pid"))
        assert noted is not None and noted[3] == runner._keepers.server().proc.pid  # the card's keeper
        runner.stop()  # the worker goes; the job and its keeper run on
        first.join(10)
        assert results == ["detached"]
        assert is_alive(noted[3], noted[4])
        second = CardRunner(settings, "n1", 0, "card0@n1")
        try:
            second.adopt()
            assert second.active_ids() == [job.id]
            go.touch()
            assert _until(lambda: ledger.store.get(job.id).state is JobState.SUCCEEDED)
            assert log.read_text() == "before\nafter\n"
            assert _until(lambda: not is_alive(noted[3], noted[4]))  # its last log ended: it exited
        finally:
            second.stop()
    finally:
        go.touch()


def test_an_adopted_job_ends_once_its_log_is_written_not_when_the_cards_keeper_exits(env, tmp_path):
    """A worker that adopts a job waits for its log until the keeper named in the pid file no
    longer holds it open; that keeper (the card's, from the worker before) may go on copying
    other jobs' logs for hours."""
    import threading

    from rig import logkeeper
    from workers.card_runner import ActiveJob
    from workers.process_tree import proc_start_time

    settings, ledger, runner, _ = env
    keeper = logkeeper.KeeperServer(sys.executable, {"PATH": "/usr/bin:/bin"})
    ours, other = tmp_path / "attempt-1.log", tmp_path / "other.log"
    writers = {}
    try:
        for path in (ours, other):
            read_fd, writers[path] = os.pipe()
            try:
                pid, done = keeper.start(read_fd, path, 1 << 20)
            finally:
                os.close(read_fd)
            os.close(done)  # the worker that asked is gone
        keeper.close()  # ... and so is its end of the socket
        os.write(writers[ours], b"the last words\n")
        active = ActiveJob(job_id=1, token="1", attempt=1, pid=0, proc_start=None,
                           exit_file=ours.with_suffix(".exit"), log_path=ours, keeper_pid=pid,
                           keeper_start=proc_start_time(pid))
        waiter = threading.Thread(target=runner._wait_for_keeper, args=(active,))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # the log is still open: its job's output may still come
        os.close(writers.pop(ours))
        waiter.join(5)
        assert not waiter.is_alive()  # done with our log, while the keeper runs on for the other
        assert keeper.proc.poll() is None
        assert ours.read_bytes() == b"the last words\n"
    finally:
        for fd in writers.values():
            os.close(fd)
        keeper.proc.wait(10)


def test_a_job_whose_cards_keeper_does_not_answer_gets_a_keeper_of_its_own(env, tmp_path, monkeypatch):
    """The card's keeper refused (or did not answer in time): the job's log is kept all the
    same, by a keeper of its own, on a pipe of its own (the late keeper may hold the first)."""
    settings, ledger, runner, _ = env
    asked: list[int] = []

    class Silent:
        def start(self, read_fd: int, log_path, cap: int, opening: str = ""):  # noqa: ANN001, ANN201
            asked.append(read_fd)
            raise OSError("timed out")

        def close(self, wait: float = 0.0) -> None:
            pass

    monkeypatch.setattr(runner._keepers, "server", lambda: Silent())
    job, token = placed(ledger, "echo one; echo two", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    assert asked
    assert open(ledger.store.get(job.id).log_paths[0]).read() == "one\ntwo\n"


def test_what_a_short_job_leaves_running_is_stopped_at_its_end(env, tmp_path):
    """A job that exits at once, leaving a child in its session and a daemon that left it with
    setsid: both are stopped before its cards are released (its end walks the few pids handed
    out since the job's own, workers.process_tree.job_leftovers)."""
    settings, ledger, runner, _ = env
    marker = "419.731"
    job, token = placed(ledger, f"sleep {marker} & setsid sleep {marker} </dev/null >/dev/null 2>&1 & exit 0", tmp_path)
    assert runner.run_job(job.id, token) == "SUCCEEDED"
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(f"sleep\0{marker}\0")]
    assert left == []
    assert ledger.card("n1", 0).reserved == 0
    # Said, not silent: the log's last line and the reason name how many were stopped, and why.
    done = ledger.store.get(job.id)
    last = open(done.log_paths[0]).read().splitlines()[-1]
    assert last.startswith("[rig: rig stopped 2 process(es) the job left running when it ended, pid ")
    assert last.endswith(": a job's processes end with it (its session, and daemons that left it)]")
    assert done.reason.startswith("exit code 0 (rig stopped 2 process(es) the job left running")


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            return fh.read()
    except OSError:
        return ""


def test_a_retry_claimed_here_while_the_last_attempts_thread_ends_is_not_sent_back(env, tmp_path, monkeypatch):
    """CI, under load (random-failures: "duplicated 1"): attempt 2 of a job ran twice. Its
    claim came on a second thread of this worker while the thread of attempt 1 was still
    ending; that ending took the job id out of the worker's "starting" set, so adoption found
    a RUNNING job of this card with no process and no files yet, sent it back as never
    started (its attempt uncounted), and it ran again. The starting count is per thread."""
    import threading

    _, ledger, runner, _ = env
    job, token = placed(ledger, "true", tmp_path)
    ok, attempt = ledger.claim(job.id, token, "card0@n1")  # the retry's claim, on the second thread
    assert ok and attempt == "1"
    inside, release = threading.Event(), threading.Event()

    def run(job_id, tok, _release):  # noqa: ANN001, ANN202 - the second thread: between claim and start
        if tok == "second":
            inside.set()
            release.wait(30)
        return "done"

    monkeypatch.setattr(runner, "_run_job", run)
    second = threading.Thread(target=runner.run_job, args=(job.id, "second"))
    second.start()
    try:
        assert inside.wait(30)
        runner.run_job(job.id, "first")  # the last attempt's thread ends meanwhile
        runner.adopt()
        after = ledger.store.get(job.id)
        assert after.state is JobState.RUNNING and after.attempt == 1, (after.state, after.attempt, after.reason)
    finally:
        release.set()
        second.join(30)
    assert job.id not in runner._starting  # both threads done


def test_an_attempt_concluded_lost_that_still_runs_here_is_stopped_not_adopted(env, tmp_path):
    """A node silent long enough is declared down and its running jobs' attempts concluded lost
    (workers.health), while on a host that lived on (all of its rig processes SIGKILLed, the
    jobs not) attempt 1 still runs. When the node returns, the dispatcher may place the job
    here again before the node's orphan check stops that copy. The claim of the new start is
    attempt 2: attempt 1 is no lost record of it. It was adopted as the new attempt
    (`a copy already runs ... adopting it`): the record went back to attempt 1, both attempts
    read 'attempt 1', and the copy kept running on the card it started on while the
    reservation named another one. Seen with two nodes on one host: job 270 ran on b/2,
    was recorded as run on b/0."""
    from workers.outcomes import AttemptEnd, conclude

    settings, ledger, runner, _ = env
    ledger.register_card("n1", GpuReading(index=1, uuid="u1", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    ran = tmp_path / "ran"
    job = ledger.store.create(Job(
        id=0, name="t", user=current_identity().name, command=["/bin/sh", "-c", f"echo $RIG_ATTEMPT >> {ran}"],
        shell=True, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING,
        workdir=str(tmp_path), created_at=time.time(), max_retries=2))
    ok, token = ledger.reserve(job.id, "n1", [1], GIB)
    assert ok and ledger.claim(job.id, token, "card1@n1")[0]
    stale = _start_orphan(settings, job, 1, "sleep 20", node="n1")  # attempt 1, on card 1
    try:
        job_dir = job_folder(settings.job_log_dir, job.id, job.instance)
        assert _until(lambda: find_by_environ("RIG_EXIT_FILE", str(job_dir / "attempt-1.exit")) is not None)
        start = proc_start_time(stale.pid)
        (job_dir / "attempt-1.pid").write_text(f"{stale.pid} {start} 1\n")
        lost = ledger.store.get(job.id)
        conclude(ledger, lost, str(lost.assignments),
                 AttemptEnd(exit_code=None, lost=True, note="node n1 stopped heartbeating"), expect=JobState.RUNNING)
        assert ledger.store.get(job.id).state is JobState.PENDING
        ok, token = ledger.reserve(job.id, "n1", [0], GIB)  # placed again, on card 0
        assert ok
        assert runner.run_job(job.id, token) == "SUCCEEDED"
        done = ledger.store.get(job.id)
        assert ran.read_text().split() == ["2"], "attempt 2 never ran: the stale copy was taken for it"
        assert done.attempt == 2 and done.cards == [0]
        assert stale.wait(10) is not None  # stopped, not left running beside attempt 2
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait(10)


FREEZER = "/sys/fs/cgroup/freezer"  # cgroup v1: a frozen task outlives SIGKILL until thawed, as one in state D
needs_freezer = pytest.mark.skipif(not os.access(FREEZER, os.W_OK), reason="needs the cgroup v1 freezer (root)")


@contextlib.contextmanager
def frozen(pid: int, name: str) -> Iterator[None]:
    """``pid`` frozen (state D, SIGKILL pending until thawed) inside the block; thawed after it,
    where a pending SIGKILL takes it at once."""
    group = f"{FREEZER}/rig-test-{os.getpid()}-{name}"
    os.mkdir(group)
    try:
        with open(f"{group}/tasks", "w") as fh:
            fh.write(str(pid))
        with open(f"{group}/freezer.state", "w") as fh:
            fh.write("FROZEN")
        assert _until(lambda: open(f"{group}/freezer.state").read().strip() == "FROZEN")
        yield
    finally:
        with open(f"{group}/freezer.state", "w") as fh:
            fh.write("THAWED")
        assert _until(lambda: open(f"{group}/freezer.state").read().strip() == "THAWED")
        _until(lambda: not open(f"{group}/tasks").read().strip())  # a dead task leaves the group
        os.rmdir(group)


def _running_with_child(ledger: Ledger, runner: CardRunner, tmp_path, child: str):
    """A job run by ``runner`` in a thread that starts ``child`` in the background and ends when
    the test touches ``go``: (job, the child's pid, go, the thread, what run_job returned)."""
    child_file, go = tmp_path / "child", tmp_path / "go"
    job, token = placed(ledger, f"{child} & echo $! > {child_file}; "
                                f"while [ ! -e {go} ]; do sleep 0.02; done; exit 0", tmp_path)
    ended: list[str] = []
    runner_thread = threading.Thread(target=lambda: ended.append(runner.run_job(job.id, token)))
    runner_thread.start()
    assert _until(lambda: child_file.exists() and child_file.read_text().strip())
    return job, int(child_file.read_text()), go, runner_thread, ended


def _ended_unwatched_with_child(settings, ledger: Ledger, tmp_path, marker: str) -> tuple[Job, int]:
    """A job whose wrapper ended while no worker watched it, leaving a child (``sleep marker``)
    running: (the job, the child's pid)."""
    child_file = tmp_path / "child"
    job, token = placed(ledger, "unused", tmp_path)
    ledger.claim(job.id, token, "old-worker")
    proc = _start_orphan(settings, job, 1, f"sleep {marker} </dev/null >/dev/null 2>&1 & echo $! > {child_file}; exit 0")
    proc.wait(10)
    ledger.store.update(job.id, pid=proc.pid, proc_start=1)
    return job, int(child_file.read_text())


@needs_freezer
def test_cards_stay_reserved_while_a_process_of_the_job_outlives_sigkill(env, tmp_path):
    """A process stuck in the kernel (state D: a GPU driver, a hung file system) dies only when
    it leaves it, and may hold its card's memory until then: the job's ending, which gives its
    cards back, waits for it (was: released 4 s after the job's end, `rig kill` said "its GPU
    memory is free" and the next job could be placed beside a process still holding it)."""
    settings, ledger, runner, _ = env
    job, child, go, runner_thread, ended = _running_with_child(ledger, runner, tmp_path,
                                                               "sleep 419.733 </dev/null >/dev/null 2>&1")
    try:
        with frozen(child, str(job.id)):
            go.touch()  # the job ends; its child, frozen, outlives the SIGKILL of its leftovers
            # Its leftovers' stop gives up after ~4 s (2 s grace, 2 s after SIGKILL), then notes
            # the survivor: awaited, not a fixed join (under CI's load 8 s was once too short).
            _until(lambda: ledger.store.get(job.id).stuck is not None or not runner_thread.is_alive(), 60)
            assert runner_thread.is_alive() and ended == []
            running = ledger.store.get(job.id)
            assert running.state is JobState.RUNNING and ledger.card("n1", 0).reserved == GIB
            # Said where a person looks (was: RUNNING with no word, and `rig kill` asked whether the node was up).
            assert running.stuck == f"pid {child}"
            assert job_reason(running) == (f"pid {child} outlived SIGKILL (stuck in the kernel: a GPU driver, a hung "
                                           "file system?); its cards stay reserved until it is gone")
    finally:
        runner_thread.join(timeout=20)
    assert ended == ["SUCCEEDED"]
    assert ledger.card("n1", 0).reserved == 0
    assert ledger.store.get(job.id).stuck is None


@needs_freezer
def test_an_adopted_ending_that_waits_for_a_stuck_process_is_waited_for_once(env, tmp_path):
    """Adoption runs again periodically: a job whose ending already waits for a process stuck in
    the kernel is left to that wait (was: each pass stopped it again and started one more wait)."""
    settings, ledger, runner, _ = env
    job, child = _ended_unwatched_with_child(settings, ledger, tmp_path, "419.743")
    with frozen(child, str(job.id)):
        runner.adopt()
        runner.adopt()
        waits = [t for t in threading.enumerate() if t.name == f"rig-survivors-{job.id}"]
        assert len(waits) == 1
        assert ledger.store.get(job.id).state is JobState.RUNNING and ledger.card("n1", 0).reserved == GIB
    waits[0].join(timeout=20)
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert ledger.card("n1", 0).reserved == 0

def test_a_leftover_found_after_its_wrapper_ended_is_stopped_not_adopted_as_the_job(env, tmp_path):
    """The wrapper ended (its exit file written) while no worker watched, leaving a child in its
    session: the adopting worker concludes the job from the exit file and stops the child. It
    took the child, found by the job's identity, for the job and watched it as if it ran (a
    child stuck in the kernel: `rig kill` then looped on a session the child does not lead)."""
    settings, ledger, runner, _ = env
    marker = "419.741"
    job, token = placed(ledger, "unused", tmp_path)
    ledger.claim(job.id, token, "old-worker")
    proc = _start_orphan(settings, job, 1, f"sleep {marker} </dev/null >/dev/null 2>&1 & exit 0")
    proc.wait(10)
    ledger.store.update(job.id, pid=proc.pid, proc_start=proc_start_time(proc.pid) or 1)
    exit_file = str(job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.exit")
    assert _until(lambda: find_by_environ("RIG_EXIT_FILE", exit_file) is not None)  # the child
    runner.adopt()
    done = Client(settings).wait(job.id, timeout=15)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    assert [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(f"sleep\0{marker}\0")] == []
    assert ledger.card("n1", 0).reserved == 0


@needs_freezer
def test_a_stuck_process_holding_the_jobs_output_is_said_before_the_wait_for_its_log(env, tmp_path, monkeypatch):
    """A stuck process that holds the job's output keeps its log keeper from finishing: the note
    comes before that wait (was: after it, past `rig kill`'s own 30 s, which then asked whether
    the node was up)."""
    monkeypatch.setattr("workers.card_runner.KEEPER_WAIT_S", 120.0)
    settings, ledger, runner, _ = env
    job, child, go, runner_thread, ended = _running_with_child(ledger, runner, tmp_path, "sleep 419.747")
    try:
        with frozen(child, str(job.id)):
            go.touch()
            assert _until(lambda: ledger.store.get(job.id).stuck == f"pid {child}", timeout=30)
            assert ended == []
    finally:
        runner_thread.join(timeout=30)
    assert ended == ["SUCCEEDED"] and ledger.card("n1", 0).reserved == 0


def test_a_survivor_whose_pid_another_process_took_is_neither_waited_for_nor_killed(env, tmp_path):
    """The wait for a job's processes that outlived SIGKILL starts after the wait for its log (up
    to KEEPER_WAIT_S): one that died meanwhile may have left its pid to an unrelated process. That
    one is not the job's: the wait ends (its cards go back) and it is never signalled (was: SIGKILLed
    each second by pid number, and waited for forever where the worker may not signal it)."""
    settings, ledger, runner, _ = env
    job, token = placed(ledger, "unused", tmp_path)
    other = subprocess.Popen(["sleep", "419.751"])
    try:
        start = proc_start_time(other.pid)
        assert start is not None
        began = time.monotonic()
        assert runner._await_gone(job.id, token, {other.pid: start - 1}) is True
        assert time.monotonic() - began < 1.0
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait(10)


@needs_freezer
def test_adoption_passes_that_overlap_end_a_job_with_a_stuck_process_once(env, tmp_path):
    """The tick loop's first audit comes health.check_interval (5 s) after start, while the
    startup pass may still be stopping a job's leftovers (4 s and more with one stuck in the
    kernel): the passes overlap. One ends the job and waits for its stuck process; was: both did
    (seen live after rig down/up: 'ended while no worker watched it' twice, two waits SIGKILLing
    it each second, two endings racing)."""
    settings, ledger, runner, _ = env
    job, child = _ended_unwatched_with_child(settings, ledger, tmp_path, "419.753")
    with frozen(child, str(job.id)):
        passes = [threading.Thread(target=runner.adopt) for _ in range(2)]
        for thread in passes:
            thread.start()
        for thread in passes:
            thread.join(timeout=30)
        waits = [t for t in threading.enumerate() if t.name == f"rig-survivors-{job.id}"]
        assert len(waits) == 1
        assert ledger.store.get(job.id).state is JobState.RUNNING and ledger.card("n1", 0).reserved == GIB
    waits[0].join(timeout=20)
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0 and done.stuck is None
    assert ledger.card("n1", 0).reserved == 0


def test_a_job_whose_every_process_is_stopped_is_said_to_be_paused_and_left_alone(env, tmp_path):
    """`kill -STOP` of a job (state T): it read RUNNING holding its cards with nothing saying
    so. Its card worker marks it paused after PAUSED_AFTER_TICKS ticks in a row (said, not
    killed: whoever stopped it may continue it) and clears the mark once it runs again."""
    import signal

    from rich.console import Console

    from rig.cli.render import render_job
    from workers.card_runner import PAUSED_AFTER_TICKS
    from workers.process_tree import is_stopped, session_members, signal_tree

    settings, ledger, runner, _ = env
    go = tmp_path / "go"
    job, token = placed(ledger, f"while [ ! -e {go} ]; do sleep 0.02; done", tmp_path)
    ended: list[str] = []
    runner_thread = threading.Thread(target=lambda: ended.append(runner.run_job(job.id, token)))
    runner_thread.start()
    pid = 0  # signal_tree leaves a session id <= 1 alone
    try:
        assert _until(lambda: ledger.store.get(job.id).pid is not None and runner.active_ids() == [job.id])
        pid = ledger.store.get(job.id).pid or 0
        # Sent again while a member reads not stopped: the job's loop forks a `sleep` every 20 ms,
        # and under CI's load one member once read unstopped for the whole 20 s.
        assert _until(lambda: signal_tree(pid, signal.SIGSTOP) >= 0
                      and all(is_stopped(p) for p in session_members(pid)))
        for _ in range(PAUSED_AFTER_TICKS - 1):
            runner._note_paused()
        assert ledger.store.get(job.id).paused_since is None  # a moment's stop is no pause
        runner._note_paused()
        paused = ledger.store.get(job.id)
        assert paused.state is JobState.RUNNING and paused.paused_since is not None
        assert job_reason(paused).startswith("paused since ")
        assert f"`rig kill {job.id}`" in job_reason(paused)
        shown = Console(record=True, width=400)
        render_job(paused, None, shown)
        assert "paused since " in shown.export_text()
        assert _until(lambda: signal_tree(pid, signal.SIGCONT) >= 0
                      and not any(is_stopped(p) for p in session_members(pid)))
        runner._note_paused()
        assert ledger.store.get(job.id).paused_since is None
        # Adopted from a worker that marked it: the first tick that finds it running clears the mark.
        ledger.store.update(job.id, paused_since=paused.paused_since)
        runner._active[job.id].paused_written = None
        runner._note_paused()
        assert ledger.store.get(job.id).paused_since is None
    finally:
        signal_tree(pid, signal.SIGCONT)
        go.touch()
        runner_thread.join(timeout=20)
    assert ended == ["SUCCEEDED"]
