"""`rig log -f` of another user's job printed the job's header ("--- job 312, attempt 1
(a/0) ---") on stderr and only then the refusal: the refusal comes first, alone (exit 8)."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.client import Identity
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards


@pytest.mark.redis
@pytest.mark.parametrize("follow", [["-f"], []])
def test_the_log_of_another_users_job_is_refused_before_any_line_about_it(cli_env, real_redis, tmp_path,
                                                                          monkeypatch, follow):
    ledger = Ledger(real_redis, Keys(cli_env))
    log = tmp_path / "attempt-1.log"
    log.write_text("alice's output\n")
    job = ledger.store.create(Job(
        id=0, name="t", user="alice", uid=1001, command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
        state=JobState.PENDING, workdir="/", created_at=time.time()))
    add_cards(ledger, 1, 80, uuid="u")
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok and ledger.claim(job.id, token, "card0@n1")[0]
    ledger.store.update(job.id, log_paths=[str(log)], log_path=str(log))
    ledger.transition(job.id, JobState.SUCCEEDED, token=token, expect=JobState.RUNNING, fields={"exit_code": 0})
    monkeypatch.setattr("rig.client.current_identity", lambda: Identity("bob", 1002))
    assert load_settings().admins == []
    result = CliRunner().invoke(cli, ["log", *follow, str(job.id)])
    assert result.exit_code == 8, result.output
    assert result.output.count("\n") == 1 and "--- job" not in result.output
    assert f"job {job.id} belongs to alice; only alice or an admin may read the log of it" in result.output
