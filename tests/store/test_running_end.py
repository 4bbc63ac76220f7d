"""`rig show` of a running job says when it is expected to end (issue 13: nothing, and
``expected_seconds: None`` in --json), from the same estimate the dispatcher uses for it
(Dispatcher.running_end), worded as an estimate with its source, "unknown" when there is none."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from rig import estimates
from rig.cli.main import cli
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import ledger_with_cards
from workers.dispatcher import Dispatcher


@pytest.fixture
def ledger(cli_env, real_redis) -> Ledger:
    return ledger_with_cards(real_redis, cli_env, 1, 24)


def _running(ledger: Ledger, **fields) -> Job:
    jid = ledger.store.create(Job(
        id=0, name="train", user="u", command=["python", "t.py"], gpu_memory=4 * GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time(), **fields)).id
    ok, token = ledger.reserve(jid, "n1", [0], 4 * GIB)
    assert ok and ledger.claim(jid, token, "w")[0]
    return ledger.store.get(jid)


def _show(job: Job) -> tuple[dict, str]:
    as_json = CliRunner().invoke(cli, ["show", str(job.id), "--json"])
    table = CliRunner().invoke(cli, ["show", str(job.id)], env={"COLUMNS": "200"})
    assert as_json.exit_code == 0 and table.exit_code == 0, (as_json.output, table.output)
    return json.loads(as_json.stdout), table.stdout


def test_without_runs_or_a_limit_the_end_is_unknown(ledger):
    data, text = _show(_running(ledger))
    assert data["expected_end"] is None and data["expected_end_text"].startswith("unknown (")
    assert "expected end" in text and "unknown (no earlier runs to go by, and no time limit)" in text


def test_the_end_is_the_dispatchers_from_the_recent_runs_of_its_size(ledger):
    r, keys = ledger.r, ledger.keys
    pipe = r.pipeline()
    for seconds in (600.0, 700.0, 800.0):
        estimates.record_run(pipe, keys, user="u", name="other", template=None, command="x", nbytes=4 * GIB,
                             gpus=1, seconds=seconds, ended_at=time.time())
    pipe.execute()
    job = _running(ledger)
    data, text = _show(job)
    now = shared_now(r)
    dispatcher = Dispatcher(load_settings(), client=r)
    dispatcher._read_holdings([], now)  # noqa: SLF001 - the round's read of the recent runs
    expected, _sure = dispatcher.running_end("u", 4 * GIB, 1, now - job.started_at, None, None, None, now)
    assert data["expected_end"] == pytest.approx(expected, abs=2.0)
    assert data["expected_end_source"] == "user-size"
    assert "expected to end ~" in text and "an estimate from the user's recent jobs of a similar size" in text


def test_a_time_limit_is_the_source_when_nothing_else_is_known(ledger):
    job = _running(ledger, time_limit=3600.0)
    data, _text = _show(job)
    assert data["expected_end_source"] == "limit"
    assert data["expected_end"] == pytest.approx(job.started_at + 3600.0, abs=2.0)
    assert "an estimate from its time limit" in data["expected_end_text"]
    assert Client(load_settings(), redis_client=ledger.r).running_end(job).source == "limit"
