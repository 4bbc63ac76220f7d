"""Damaged and hostile job records on a card worker, injection attempts, and jobs run as their
submitting user: real Redis, real subprocess jobs (the card runner without Celery), and one test
with a real node (Celery workers on a fake card)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rig.client import current_identity
from rig.config import load_settings
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.conftest import REDIS_URL
from tests.integration.harness import RigHarness
from workers.card_runner import CardRunner, _read_exit_file
from workers.process_tree import WRAPPER, proc_start_time, wrapper_argv

pytestmark = pytest.mark.redis

ME = current_identity().name


@pytest.fixture
def env(card_runner_env):
    settings, ledger, runner, _resent = card_runner_env  # tests/integration/conftest.py
    return settings, ledger, runner


def placed(ledger: Ledger, command: list[str], workdir: Path, *, damage: dict | None = None,
           **fields) -> tuple[int, str]:
    """A job reserved on card n1/0 (as the dispatcher leaves it), its record then damaged."""
    values = dict(name="t", user=ME, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
                  state=JobState.PENDING, workdir=str(workdir), created_at=time.time(), max_retries=0)
    values.update(fields)
    job = ledger.store.create(Job(id=0, command=command, **values))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    if damage:
        ledger.r.hset(ledger.keys.job(job.id), mapping=damage)
    return job.id, token


def log_of(ledger: Ledger, job_id: int) -> str:
    return Path(ledger.store.get(job_id).log_paths[-1]).read_text()


@pytest.mark.parametrize("damage", [
    {"command": "not json"},
    {"command": json.dumps(["sh", "-c", "touch {marker}", 5])},
    {"env": json.dumps({"LD_PRELOAD": "/tmp/x.so", "BAD": "a\u0000b"})},
    {"workdir": "relative/../dir"},
    {"shell": "1", "command": json.dumps(["sh", "-c", "touch {marker}", "extra"])},
    {"command": "[" * 50_000, "cards": "{nope"},
    {"name": "x\u001b]0;pwned\u0007"},
], ids=["command-not-json", "command-not-strings", "env-nul", "workdir-relative", "shell-mismatch",
        "nesting-bomb-and-cards", "name-control-chars"])
def test_a_damaged_record_fails_with_its_reason_and_the_worker_runs_the_next_job(env, tmp_path, damage):
    settings, ledger, runner = env
    marker = tmp_path / "marker"
    damage = {k: v.replace("{marker}", str(marker)) for k, v in damage.items()}
    bad, bad_token = placed(ledger, ["sh", "-c", f"touch {marker}"], tmp_path, damage=damage)
    good, good_token = placed(ledger, ["sh", "-c", "echo good"], tmp_path)
    assert runner.run_job(bad, bad_token) == "failed-to-start"
    job = ledger.store.get(bad)
    assert job.state is JobState.FAILED and job.failure == "invalid_record"
    assert job.reason.startswith("invalid record: field "), job.reason
    assert ledger.store.in_error_queue(bad) and not marker.exists()
    assert ledger.holdings("n1", 0) == {good: GIB}  # the bad job's reservation is back
    assert runner.run_job(good, good_token) == "SUCCEEDED"
    assert log_of(ledger, good) == "good\n"
    assert ledger.card("n1", 0).reserved == 0


def test_a_record_the_claim_script_cannot_read_is_ended_not_resent_for_ever(env, tmp_path):
    settings, ledger, runner = env
    jid, token = placed(ledger, ["true"], tmp_path, damage={"attempt": "many"})
    assert runner.run_job(jid, token) == "failed-to-start"
    job = ledger.store.get(jid)
    assert job.state is JobState.FAILED
    assert job.reason.startswith("invalid record: field attempt: expected a whole number"), job.reason
    assert ledger.card("n1", 0).reserved == 0


def test_a_record_naming_another_job_is_refused(env, tmp_path):
    settings, ledger, runner = env
    victim, _ = placed(ledger, ["true"], tmp_path)
    jid, token = placed(ledger, ["true"], tmp_path, damage={})
    ledger.r.hset(ledger.keys.job(jid), "id", str(victim))
    assert runner.run_job(jid, token) == "failed-to-start"
    assert ledger.store.get(jid).reason == f"invalid record: field id: {victim}, not {jid}"
    assert ledger.store.get(victim).log_paths == []  # nothing was written on the other job


def test_adoption_never_takes_a_forged_pid_for_the_job(env, tmp_path):
    settings, ledger, runner = env
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        jid, token = placed(ledger, ["true"], tmp_path)
        ok, _ = ledger.claim(jid, token, "old-worker")
        assert ok
        # The record says the job runs as the bystander (its real start time, as /proc shows).
        ledger.store.update(jid, pid=bystander.pid, proc_start=proc_start_time(bystander.pid))
        runner.adopt()
        assert runner.active_ids() == [] and bystander.poll() is None  # not adopted, not signalled
        job = ledger.store.get(jid)  # it never started here: back to its place in the queue
        assert job.state is JobState.PENDING and ledger.card("n1", 0).reserved == 0
    finally:
        bystander.kill()
        bystander.wait()


# -- commands run exactly as given ------------------------------------------------------------
def test_injection_attempts_in_name_args_workdir_and_env_run_nothing_extra(env, tmp_path):
    settings, ledger, runner = env
    pwned = tmp_path / "pwned"
    evil = f"x; touch {pwned}; $(touch {pwned}) `touch {pwned}` | touch {pwned} && touch {pwned}"
    workdir = tmp_path / "$(touch pwned-by-workdir)"
    workdir.mkdir()
    argv = ["/bin/sh", "-c", 'printf "[%s]\\n" "$@" "$EVIL" "$RIG_JOB_NAME"; pwd', "argv0", evil, "'\"", "$HOME"]
    jid, token = placed(ledger, argv, workdir, name=evil[:120], env={"EVIL": evil})
    assert runner.run_job(jid, token) == "SUCCEEDED"
    out = log_of(ledger, jid).splitlines()
    assert out == [f"[{evil}]", "['\"]", "[$HOME]", f"[{evil}]", f"[{evil[:120]}]", str(workdir)]
    assert not pwned.exists() and not list(tmp_path.rglob("pwned*"))


def test_a_shell_string_is_one_argument_to_sh_c(env, tmp_path):
    settings, ledger, runner = env
    jid, token = placed(ledger, ["/bin/sh", "-c", 'echo "[$0] $#"; echo two'], tmp_path, shell=True)
    assert runner.run_job(jid, token) == "SUCCEEDED"
    assert log_of(ledger, jid) == "[/bin/sh] 0\ntwo\n"


def test_the_wrapper_never_contains_the_users_text():
    argv = wrapper_argv(["echo", "$(reboot)"])
    assert argv[:4] == ["/bin/sh", "-c", WRAPPER, "rig-job"] and argv[4:] == ["echo", "$(reboot)"]


def test_exit_files_are_read_safely(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _read_exit_file(fifo) is None  # never blocks
    (tmp_path / "real").write_text("3\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert _read_exit_file(tmp_path / "real") == 3 and _read_exit_file(tmp_path / "link") is None
    (tmp_path / "big").write_text("7" * 10_000_000)
    (tmp_path / "junk").write_text("rm -rf /")
    assert _read_exit_file(tmp_path / "big") is None and _read_exit_file(tmp_path / "junk") is None
    assert _read_exit_file(tmp_path / "missing") is None


# -- @rig.task payloads -------------------------------------------------------------------------
@pytest.mark.parametrize(("payload", "message"), [
    ("%%% not base64 %%%", "the call's payload is not base64"),
    (base64.b64encode(b"not a pickle").decode(), "the call's payload cannot be unpickled here"),
    (base64.b64encode(pickle.dumps(["a", "list"])).decode(), "the call's payload is a list, not a dict"),
    (base64.b64encode(pickle.dumps({"module": "os", "qualname": "getpid"})).decode(),
     "the call's payload has no argument list"),
], ids=["not-base64", "not-pickle", "not-dict", "no-args"])
def test_a_malformed_call_payload_fails_at_once_with_a_clear_line(env, tmp_path, payload, message):
    settings, ledger, runner = env
    jid, token = placed(ledger, [sys.executable, "-m", "rig.call"], tmp_path, kind="python")
    ledger.store.update(jid, payload=payload)
    began = time.monotonic()
    assert runner.run_job(jid, token) == "FAILED"
    assert time.monotonic() - began < 30
    job = ledger.store.get(jid)
    assert job.exit_code == 2
    assert f"rig.call: job {jid}: {message}" in log_of(ledger, jid)


# -- running as the submitting user ---------------------------------------------------------------
def _other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("the worker runs as root only in that case (run the tests as root to cover it)")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account on this machine to run a job as")


def test_a_root_worker_runs_the_job_as_its_submitter(env, tmp_path, request):
    settings, ledger, runner = env
    other = _other_user()
    command = 'id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; touch /root/.rig-run-as-probe; exit 3'
    # A working folder the submitter may enter: pytest's own (under 0700 /tmp/pytest-of-root) is
    # not, and the wrapper enters it again as the job's user (c59488b): the job would end there.
    workdir = Path(tempfile.mkdtemp(prefix="rig-run-as-"))
    workdir.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(workdir, ignore_errors=True))
    jid, token = placed(ledger, ["/bin/sh", "-c", command], workdir, shell=True, user=other.pw_name,
                        uid=other.pw_uid)
    assert runner.run_job(jid, token) == "FAILED"
    job = ledger.store.get(jid)
    lines = log_of(ledger, jid).splitlines()
    groups = {str(g) for g in os.getgrouplist(other.pw_name, other.pw_gid)}
    assert lines[:2] == [str(other.pw_uid), str(other.pw_gid)] and set(lines[2].split()) == groups, lines
    assert lines[3] == f"{other.pw_dir} {other.pw_name} {other.pw_name}"
    assert "Permission denied" in lines[4] and not Path("/root/.rig-run-as-probe").exists()
    # The exit file (the worker's, the job could not open it by name) has the status.
    exit_file = Path(job.log_paths[-1]).with_suffix(".exit")
    # The exit file is allocated (padded with spaces) before the job starts (workers/log_space.py).
    assert job.exit_code == 3 and exit_file.read_text().strip() == "3"
    assert exit_file.stat().st_uid == 0 and Path(job.log_paths[-1]).stat().st_uid == other.pw_uid
    assert stat.S_IMODE(exit_file.stat().st_mode) == 0o644


def test_a_user_unknown_on_this_node_fails_with_the_reason(env, tmp_path):
    settings, ledger, runner = env
    _other_user()
    jid, token = placed(ledger, ["true"], tmp_path, user="no-such-user-here", uid=4242)
    assert runner.run_job(jid, token) == "failed-to-start"
    job = ledger.store.get(jid)
    assert job.state is JobState.FAILED and job.failure == "run_as_refused"
    assert "user 'no-such-user-here' does not exist on this node" in job.reason
    assert "does not exist on this node" in log_of(ledger, jid)
    assert ledger.card("n1", 0).reserved == 0


def test_root_jobs_only_where_allowed(env, real_redis, key_prefix, tmp_path):
    settings, ledger, _ = env
    _other_user()
    strict = CardRunner(load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                                      node_name="n1", allow_root_jobs=False), "n1", 0, "card0@n1")
    try:
        jid, token = placed(ledger, ["true"], tmp_path, user="root", uid=0)
        assert strict.run_job(jid, token) == "failed-to-start"
        assert "allow_root_jobs = false" in ledger.store.get(jid).reason
        forged, token = placed(ledger, ["true"], tmp_path, user="root", uid=1000)
        assert CardRunner(settings, "n1", 0, "card0@n1").run_job(forged, token) == "failed-to-start"
        assert "uid 0 on this node but uid 1000" in ledger.store.get(forged).reason
    finally:
        strict.stop()


# -- a real node ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_card_worker_survives_a_hostile_record_and_runs_the_next_job(tmp_path):
    harness = RigHarness(tmp_path / "home", fake_gpus="1x80G")
    go, pwned = tmp_path / "go", tmp_path / "pwned"
    try:
        harness.up()
        worker = harness.worker_pid("card0@testnode")
        # A job filling the only card, so the hostile record below waits, damaged, until it ends.
        blocker = harness.client.submit(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                                        gpu_memory="76G", workdir=tmp_path)
        assert harness.wait_for_state(blocker.id, {JobState.RUNNING}, timeout=60) is JobState.RUNNING
        hostile = harness.client.store.create(Job(
            id=0, name="t", user=ME, command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.HIGH,
            state=JobState.PENDING, workdir=str(tmp_path), created_at=time.time())).id
        harness.redis.hset(harness.keys.job(hostile), mapping={
            "command": json.dumps(["sh", "-c", f"touch {pwned}", {"x": 1}]),
            "env": json.dumps({"A": ["not", "text"]})})
        go.touch()
        assert harness.wait_for_state(hostile, {JobState.FAILED}, timeout=60) is JobState.FAILED
        assert harness.client.get(hostile).reason.startswith("invalid record: field command: argument 3")
        evil = f"x; touch {pwned}"
        good = harness.client.submit(["sh", "-c", 'echo "$1"', "sh", f"$(touch {pwned})"], name=evil,
                                     gpu_memory="1G", workdir=tmp_path)
        assert good.wait(60).state is JobState.SUCCEEDED
        assert good.log() == f"$(touch {pwned})\n" and not pwned.exists()
        assert harness.worker_pid("card0@testnode") == worker  # the same worker, still serving
        assert blocker.state is JobState.SUCCEEDED and harness.leaked_bytes() == 0
    finally:
        harness.cleanup()
