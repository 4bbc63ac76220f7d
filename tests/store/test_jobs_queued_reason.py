"""`rig jobs` gives every waiting job a reason (issue 13: "-" for 218 of 250 rows, since the
dispatcher words only the queue heads it reads): one with none stored reads its place in the
queue, counted as `rig show` counts it; a stored sentence is shown as before."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from rig.cli.main import cli
from rig.client import Client
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority


def _waiting(ledger: Ledger) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.LOW, state=JobState.PENDING, workdir="/", created_at=time.time())).id


def test_a_waiting_job_without_a_stored_reason_shows_the_jobs_ahead_of_it(cli_env, real_redis, monkeypatch):
    ledger = Ledger(real_redis, Keys(cli_env))
    first, second, third = (_waiting(ledger) for _ in range(3))
    ledger.store.update(second, wait_reason="the dispatcher's own sentence")
    run = CliRunner().invoke

    out = run(cli, ["jobs", "--state", "pending", "--json"])
    assert out.exit_code == 0, out.output
    reasons = {row["id"]: row["wait_reason"] for row in json.loads(out.stdout)}
    assert reasons == {first: "queued: first in line", second: "the dispatcher's own sentence",
                       third: "queued: 2 job(s) ahead of it"}
    # the count `rig show` gives of the same job (rig.waiting.why_waiting)
    client = Client(load_settings(), redis_client=real_redis)
    assert "; 2 job(s) ahead of it" in client.why_waiting(client.get(third))

    monkeypatch.setenv("COLUMNS", "200")
    table = run(cli, ["jobs", "--state", "pending"])
    assert table.exit_code == 0, table.output
    assert "queued: 2 job(s) ahead of it" in table.stdout and "queued: first in line" in table.stdout
