"""`rig log` of a job whose log the retention rule deleted says so, with the setting and when
(a tester's `rig log` of a job ended weeks ago said only "moved or deleted")."""

from __future__ import annotations

from datetime import datetime

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.clock import shared_now
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import JobState
from tests.store.test_archive import DAY, finished

pytestmark = pytest.mark.redis


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def test_a_log_the_retention_rule_deleted_is_said_to_be_so(cli_env, real_redis, monkeypatch):
    monkeypatch.setenv("RIG_NODE_NAME", "n1")  # the jobs ran here
    monkeypatch.setenv("RIG_LOG_RETENTION_DAYS", "7")
    monkeypatch.setenv("RIG_ERROR_LOG_RETENTION_DAYS", "60")
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)
    old = finished(ledger, ended=now - 10 * DAY)
    recent = finished(ledger, ended=now - 2 * DAY)
    failed = finished(ledger, ended=now - 10 * DAY, state=JobState.FAILED, failure="nonzero_exit", error_queue=True)
    failed_long_ago = finished(ledger, ended=now - 70 * DAY, state=JobState.FAILED, failure="nonzero_exit",
                               error_queue=True)
    run = CliRunner().invoke

    got = run(cli, ["log", str(old.id)])
    assert got.exit_code == 1 and got.stdout == "", got.output
    assert got.stderr.strip() == (
        f"rig: error: the log of job {old.id}, attempt 1 is not where rig wrote it, /logs/{old.id}/1.log: deleted by the "
        f"log retention rule (log_retention_days = 7) on or after {_day(old.ended_at + 7 * DAY)} (attempt 1 ran "
        "on n1/0, this machine)"), got.stderr
    followed = run(cli, ["log", "-f", str(old.id)])
    assert followed.exit_code == 1 and "deleted by the log retention rule (log_retention_days = 7)" in followed.stderr

    got = run(cli, ["log", str(failed_long_ago.id)])
    assert got.exit_code == 1
    assert (f"deleted by the log retention rule (error_log_retention_days = 60) on or after "
            f"{_day(failed_long_ago.ended_at + 60 * DAY)}") in got.stderr, got.stderr

    for young in (recent, failed):  # ended within the rule that keeps its log: not the rule's doing
        got = run(cli, ["log", str(young.id)])
        assert got.exit_code == 1
        assert "moved or deleted" in got.stderr and "retention" not in got.stderr, got.stderr
