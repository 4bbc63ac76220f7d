"""@rig.task jobs and failures a retry cannot help, run for real by a card worker (real Redis,
real subprocesses; no Celery): a hostile `rig` folder, a script without a __main__ guard, an
unpicklable result, a command that does not exist, a working folder that is gone."""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rig.client import current_identity
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.pytask import call_argv

pytestmark = pytest.mark.slow

ME = current_identity().name


@pytest.fixture
def env(card_runner_env):
    settings, ledger, runner, _resent = card_runner_env  # tests/integration/conftest.py
    return settings, ledger, runner


def placed(ledger: Ledger, command: list[str], workdir: Path, **fields) -> tuple[int, str]:
    """A job reserved on card n1/0, as the dispatcher leaves it."""
    values = dict(name="t", user=ME, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
                  state=JobState.PENDING, workdir=str(workdir), created_at=time.time(), max_retries=2)
    values.update(fields)
    job = ledger.store.create(Job(id=0, command=command, **values))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    return job.id, token


def call(ledger: Ledger, workdir: Path, module: str, qualname: str, file: Path, *args) -> tuple[int, str]:
    jid, token = placed(ledger, call_argv(), workdir, kind="python")
    payload = {"module": module, "qualname": qualname, "file": str(file), "root": str(file.parent),
               "args": args, "kwargs": {}}
    ledger.store.update(jid, payload=base64.b64encode(pickle.dumps(payload)).decode())
    return jid, token


def log_of(ledger: Ledger, job_id: int) -> str:
    return Path(ledger.store.get(job_id).log_paths[-1]).read_text()


def hostile_rig(folder: Path) -> None:
    (folder / "rig").mkdir(parents=True)
    (folder / "rig" / "__init__.py").write_text("raise SystemExit('the hostile rig folder was imported')\n")


def test_a_folder_named_rig_beside_the_script_and_in_the_workdir_does_not_break_the_call(env, tmp_path):
    settings, ledger, runner = env
    code, work = tmp_path / "code", tmp_path / "work"
    work.mkdir()
    hostile_rig(code)
    hostile_rig(work)
    (code / "mytasks.py").write_text(textwrap.dedent("""
        import rig
        import helper  # the script's own folder is on sys.path, as for a script

        @rig.task(gpu_memory="1G")
        def double(x):
            return helper.twice(x)
    """))
    (code / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    jid, token = call(ledger, work, "mytasks", "double", code / "mytasks.py", 21)
    assert runner.run_job(jid, token) == "SUCCEEDED", log_of(ledger, jid)
    raw = ledger.r.hget(ledger.keys.job(jid), "result")
    assert pickle.loads(base64.b64decode(raw)) == 42


def test_a_script_without_a_main_guard_fails_once_with_what_to_write_and_submits_nothing(env, tmp_path):
    settings, ledger, runner = env
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import rig

        @rig.task(gpu_memory="1G")
        def train(lr):
            return lr

        train.delay(0.1)  # no `if __name__ == "__main__":` guard
    """))
    jid, token = call(ledger, tmp_path, "__main__", "train", script, 0.1)
    last_id = int(ledger.r.get(ledger.keys.next_job_id))
    assert runner.run_job(jid, token) == "FAILED"
    job = ledger.store.get(jid)
    assert (job.failure, job.attempt, job.exit_code) == ("bad_call", 1, 2)
    assert ledger.store.in_error_queue(jid) and "not retried" in job.reason
    assert 'submits train() when it is imported' in log_of(ledger, jid)
    assert 'under `if __name__ == "__main__":`' in log_of(ledger, jid)
    assert int(ledger.r.get(ledger.keys.next_job_id)) == last_id  # no nested job


def test_an_unpicklable_result_fails_once(env, tmp_path):
    settings, ledger, runner = env
    (tmp_path / "gen.py").write_text("def make():\n    return (x for x in range(3))\n")
    jid, token = call(ledger, tmp_path, "gen", "make", tmp_path / "gen.py")
    assert runner.run_job(jid, token) == "FAILED"
    job = ledger.store.get(jid)
    assert (job.failure, job.attempt, job.exit_code, job.state) == ("bad_result", 1, 3, JobState.FAILED)
    assert "returned a generator that cannot be pickled" in log_of(ledger, jid)


@pytest.mark.parametrize(("command", "workdir", "failure"), [
    (["no-such-command-rig-test"], None, "command_not_found"),
    (["true"], "gone", None),
], ids=["command-not-found", "workdir-gone"])
def test_a_failure_a_retry_cannot_help_is_not_retried(env, tmp_path, command, workdir, failure):
    settings, ledger, runner = env
    folder = tmp_path / workdir if workdir else tmp_path
    jid, token = placed(ledger, command, folder, max_retries=3)
    assert runner.run_job(jid, token) in ("FAILED", "failed-to-start")
    job = ledger.store.get(jid)
    assert job.state is JobState.FAILED and job.attempt == 1 and ledger.store.in_error_queue(jid)
    assert job.failure in ({failure} if failure else {"command_not_found", "start_failed"})
    assert "not retried" in job.reason
    assert ledger.holdings("n1", 0) == {}


#: A script whose class travels to the job as an argument and back as the result: `submit`
#: prints the payload .delay() builds, `read B64` unpickles a result as rig.client does.
CLASS_SCRIPT = textwrap.dedent('''
    import base64, pickle, sys
    import rig

    class Point:
        def __init__(self, x):
            self.x = x
        def __repr__(self):
            return f"Point({self.x})"

    @rig.task(gpu_memory="1G")
    def move(p, by=1):
        return [Point(p.x + by)]

    if __name__ == "__main__" and sys.argv[1] == "submit":
        from tests.unit.test_pytask import StubClient  # (the job does not see tests/)
        client = StubClient()
        move.apply_async((Point(1),), {"by": 2}, client=client)
        print(client.submitted[0][1]["extra"]["payload"])
    elif __name__ == "__main__" and sys.argv[1] == "read":
        value = pickle.loads(base64.b64decode(sys.argv[2]))
        print("RESULT", value, type(value[0]) is Point)
''')


def run_script(script: Path, *args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_class_of_the_script_travels_to_the_job_and_back(env, tmp_path):
    settings, ledger, runner = env
    script = tmp_path / "points.py"
    script.write_text(CLASS_SCRIPT)
    jid, token = placed(ledger, call_argv(), tmp_path, kind="python")
    ledger.store.update(jid, payload=run_script(script, "submit"))
    assert runner.run_job(jid, token) == "SUCCEEDED", log_of(ledger, jid)
    raw = ledger.r.hget(ledger.keys.job(jid), "result")
    assert run_script(script, "read", raw.decode() if isinstance(raw, bytes) else raw) == "RESULT [Point(3)] True"


def test_top_level_argparse_fails_once_saying_the_job_imports_the_script(env, tmp_path):
    settings, ledger, runner = env
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import argparse
        import rig

        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, required=True)
        args = parser.parse_args()  # at top level: runs again when the job imports train.py

        @rig.task(gpu_memory="1G")
        def train(lr):
            return lr
    """))
    jid, token = call(ledger, tmp_path, "__main__", "train", script, 0.1)
    assert runner.run_job(jid, token) == "FAILED"
    job = ledger.store.get(jid)
    assert (job.failure, job.attempt, job.exit_code) == ("bad_call", 1, 2)
    said = " ".join(job.evidence)
    assert "the job imports train.py to find train, so its top-level code runs in the job too" in said, said
    assert 'exited (sys.exit(2)): move it under `if __name__ == "__main__":`' in said
    assert "the following arguments are required: --lr" in log_of(ledger, jid)
