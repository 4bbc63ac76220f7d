"""`rig kill` with a mix of ids: every id is checked before anything is killed (a tester's
`rig kill 13 abc` cancelled 13, then said abc is not a job id, exit 2); among well-formed ids,
an unknown one is named and the others are still killed."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority

UNKNOWN = "rig: error: no job with id 99999; `rig jobs` lists the jobs that exist"
MALFORMED = "rig: error: '49x' is not a job id: job ids are whole numbers from 1, like 12 (`rig jobs` lists them)"


@pytest.fixture
def ledger(cli_env, real_redis) -> Ledger:
    return Ledger(real_redis, Keys(cli_env))


def _job(ledger: Ledger) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.redis
def test_a_malformed_id_kills_nothing(ledger):
    jid = _job(ledger)
    result = CliRunner().invoke(cli, ["kill", str(jid), "49x"])
    assert result.exit_code == 2, result.output  # a malformed id: the command line was wrong
    assert _lines(result.stderr) == [MALFORMED + "; nothing was killed"], result.stderr
    assert result.stdout == "", result.stdout
    assert ledger.store.get(jid).state is JobState.PENDING


@pytest.mark.redis
def test_an_unknown_id_is_named_and_the_valid_one_is_killed(ledger):
    jid = _job(ledger)
    result = CliRunner().invoke(cli, ["kill", "99999", str(jid)])
    assert result.exit_code == 4, result.output
    assert _lines(result.stderr) == [UNKNOWN], result.stderr
    assert _lines(result.stdout) == [f"job {jid} cancelled (was pending); it held no GPU memory"], result.stdout
    assert ledger.store.get(jid).state is JobState.CANCELLED


@pytest.mark.redis
def test_an_id_too_long_for_any_job_is_no_such_job(ledger):
    jid = _job(ledger)
    result = CliRunner().invoke(cli, ["kill", "99999999999999999999999", str(jid)])
    assert result.exit_code == 4, result.output
    assert _lines(result.stderr) == [
        "rig: error: no job with id 99999999999999999999999; `rig jobs` lists the jobs that exist"], result.stderr
    assert ledger.store.get(jid).state is JobState.CANCELLED


@pytest.mark.redis
def test_only_an_unknown_and_a_malformed_id(ledger):
    result = CliRunner().invoke(cli, ["kill", "99999", "49x"])
    assert result.exit_code == 2, result.output
    assert _lines(result.stderr) == [MALFORMED + "; nothing was killed"], result.stderr
    assert "Traceback" not in result.output


@pytest.mark.redis
def test_only_malformed_ids_never_ask_redis(cli_env, monkeypatch):
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing answers there
    result = CliRunner().invoke(cli, ["kill", "49x", "0"])
    assert result.exit_code == 2, result.output
    assert len(_lines(result.stderr)) == 2 and all("is not a job id" in line for line in _lines(result.stderr))


@pytest.mark.redis
def test_an_id_given_twice_is_killed_once(ledger):
    jid = _job(ledger)
    result = CliRunner().invoke(cli, ["kill", str(jid), str(jid)])
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout) == [f"job {jid} cancelled (was pending); it held no GPU memory"], result.output


@pytest.mark.redis
def test_a_sweep_of_waiting_jobs_is_cancelled_together_and_a_placed_one_the_usual_way(ledger, monkeypatch):
    """A tester's `rig kill --no-wait $(seq 20 10018)` took 86 s: two reads, a write, a script
    and a nudge per job. The records are now read KILL_BATCH at a time and the waiting ones
    cancelled with one script call each and one nudge; a job placed after the read is killed
    as before (it is not cancelled as if it still waited)."""
    import rig.client
    from rig.client import Client

    monkeypatch.setattr(rig.client, "KILL_BATCH", 7)  # several batches
    ids = [_job(ledger) for _ in range(20)]
    moved = ids[5]
    real_records = Client.records

    def records_then_placed(self, job_ids):  # noqa: ANN001, ANN202
        found = real_records(self, job_ids)
        ledger.r.hset(ledger.keys.job(moved), "state", JobState.ASSIGNED.value)  # placed right after the read
        return found

    monkeypatch.setattr(Client, "records", records_then_placed)
    reads: list[int] = []
    real_get = Client.get
    monkeypatch.setattr(Client, "get", lambda self, jid, instance=None: reads.append(jid) or real_get(self, jid, instance))
    wakes = ledger.r.llen(ledger.keys.sched_wake)
    result = CliRunner().invoke(cli, ["kill", "--no-wait", *map(str, ids)])
    assert result.exit_code == 0, result.output
    assert all(ledger.store.get(j).state is JobState.CANCELLED for j in ids if j != moved)
    assert set(reads) == {moved}  # only the one that moved was read again: the usual kill
    assert ledger.r.llen(ledger.keys.sched_wake) - wakes <= 3 + 1  # one nudge a batch of 7 (and the usual path's)
    assert ledger.r.hget(ledger.keys.job(ids[0]), "cancelled_by") and ledger.store.get(ids[0]).reason.startswith("cancelled by ")
    assert len(_lines(result.stdout)) == 20


@pytest.mark.redis
def test_a_sweep_cut_short_by_redis_says_what_it_cancelled_before(ledger, monkeypatch):
    """A tester stopped Redis 1.2 s into `rig kill` of 6,000 ids: 2,617 were cancelled and the
    command said only the Redis error. The cancelled ones are said batch by batch."""
    import rig.client
    from rig.client import Client
    from rig.errors import RedisUnavailable

    monkeypatch.setattr(rig.client, "KILL_BATCH", 3)
    ids = [_job(ledger) for _ in range(7)]
    real_cancel = Client.cancel_waiting
    calls = []

    def cancel_then_redis_stops(self, jobs, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(len(jobs))
        if len(calls) == 2:
            raise RedisUnavailable("redis://127.0.0.1:6379/0", "Redis does not answer (a test)")
        return real_cancel(self, jobs, **kwargs)

    monkeypatch.setattr(Client, "cancel_waiting", cancel_then_redis_stops)
    result = CliRunner().invoke(cli, ["kill", "--no-wait", *map(str, ids)])
    assert result.exit_code == RedisUnavailable.exit_code, result.output
    assert _lines(result.stdout) == [f"job {j} cancelled (was pending); it held no GPU memory" for j in ids[:3]]


@pytest.mark.redis
def test_a_second_kill_of_a_running_job_does_not_claim_the_cancel(ledger, monkeypatch):
    """Two `rig kill` of one sweep at once: both said "job N cancelled (was running)" for the
    running jobs. The one that came after the first request says it saw it happen."""
    import dataclasses

    from rig.client import Client

    jid = _job(ledger)
    ledger.r.hset(ledger.keys.job(jid), mapping={"state": JobState.RUNNING.value, "cancel_requested": "1"})
    monkeypatch.setattr(Client, "kill", lambda self, job_id, **kw: dataclasses.replace(
        self.get(job_id), state=JobState.CANCELLED))
    result = CliRunner().invoke(cli, ["kill", str(jid)])
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout) == [f"job {jid} cancelled (a kill was already requested when this one came)"]


@pytest.mark.redis
def test_ctrl_c_while_a_kill_waits_says_the_kill_goes_on(ledger, monkeypatch):
    """Ctrl-C while `rig kill` waited out a job that ignores SIGTERM ended with a bare newline:
    nothing said that its card worker stops it anyway, nor that the ids after it were left."""
    waiting, running, later = _job(ledger), _job(ledger), _job(ledger)
    for jid in (running, later):
        ledger.store.r.hset(ledger.keys.job(jid), mapping={"state": "RUNNING", "node": "n", "cards": "[0]"})

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("rig.client.Client.wait", interrupted)
    monkeypatch.setattr("rig.client.current_identity", lambda: __import__("rig.client").client.Identity("u", 0))
    result = CliRunner().invoke(cli, ["kill", str(running), str(later), str(waiting)])
    assert result.exit_code == 130, result.output
    assert _lines(result.stderr) == [
        f"rig: job {running}: kill requested, it is stopping (SIGKILL after 10 s); only the waiting was "
        f"interrupted: `rig show {running}` says when it ended",
        f"rig: not handled (interrupted first): {later}"], result.stderr
    assert _lines(result.stdout) == [f"job {waiting} cancelled (was pending); it held no GPU memory"]
    assert ledger.store.get(running).cancel_requested and not ledger.store.get(later).cancel_requested
