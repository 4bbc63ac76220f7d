"""A team on one server: who submitted a job, and who may kill, retry or clear it.

Other users are simulated by writing another user on the record, or by replacing the
function that says who is calling (rig.client.current_identity)."""

from __future__ import annotations

import os
import pwd
import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.client import Client, Identity
from rig.config import load_settings
from rig.errors import InvalidRecord, PermissionDenied
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.conftest import REDIS_URL

ALICE = Identity("alice", 1001)
BOB = Identity("bob", 1002)
CAROL = Identity("carol", 1003)
ROOT = Identity("root", 0)


@pytest.fixture
def client(redis_client, key_prefix, tmp_path, monkeypatch) -> Client:
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             admins=["carol"])
    c = Client(settings, redis_client=redis_client)
    return c


def as_user(monkeypatch, who: Identity) -> None:
    monkeypatch.setattr("rig.client.current_identity", lambda: who)


def job_of(client: Client, user: str, **fields) -> Job:
    return client.store.create(Job(
        id=0, name="t", user=user, uid=1001, command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time(), **fields))


def failed_job_of(client: Client, user: str) -> Job:
    job = job_of(client, user)
    client.ledger.transition(job.id, JobState.FAILED, error_queue=True, fields={"reason": "boom"})
    return job


def test_submit_records_the_real_os_user_not_the_environment(client, monkeypatch, tmp_path):
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    job = client.submit(["true"], gpu_memory="1G", workdir=tmp_path).record
    assert job.uid == os.getuid()
    assert job.user == pwd.getpwuid(os.getuid()).pw_name != "mallory"


def test_another_users_job_cannot_be_killed(client, monkeypatch):
    job = job_of(client, "alice")
    as_user(monkeypatch, BOB)
    with pytest.raises(PermissionDenied) as err:
        client.kill(job.id)
    assert err.value.exit_code == 8
    assert str(err.value).startswith(f"job {job.id} belongs to alice; only alice or an admin may kill it")
    assert client.get(job.id).state is JobState.PENDING
    assert client.store.pending_head(5) == [job.id]


@pytest.mark.parametrize("who", [ALICE, CAROL, ROOT], ids=["owner", "admin", "root"])
def test_the_owner_an_admin_and_root_may_kill(client, monkeypatch, who):
    job = job_of(client, "alice")
    as_user(monkeypatch, who)
    after = client.kill(job.id)
    assert after.state is JobState.CANCELLED and after.reason == f"cancelled by {who.name}"


def test_admins_come_from_the_environment_too(redis_client, key_prefix, tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_ADMINS", "dave, bob")
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home")
    assert settings.admins == ["dave", "bob"]
    c = Client(settings, redis_client=redis_client)
    job = job_of(c, "alice")
    as_user(monkeypatch, BOB)
    assert c.kill(job.id).state is JobState.CANCELLED


def test_retry_and_clear_of_another_users_job_are_refused(client, monkeypatch):
    job = failed_job_of(client, "alice")
    as_user(monkeypatch, BOB)
    with pytest.raises(PermissionDenied, match="only alice or an admin may retry it"):
        client.retry(job.id)
    with pytest.raises(PermissionDenied, match="only alice or an admin may clear it"):
        client.clear_error(job.id)
    assert client.store.in_error_queue(job.id) and client.get(job.id).state is JobState.FAILED
    as_user(monkeypatch, ALICE)
    assert client.retry(job.id).state is JobState.PENDING


def test_retry_of_a_cancelled_job_says_it_was_cancelled_and_how_to_run_it_again(client, monkeypatch):
    """Issue 13: it said "not in the error queue; `rig errors` lists those", which did not say
    why nor what to do. Retry stays for failures (M15): a cancelled job is submitted again."""
    from rig.errors import InvalidInput

    job = job_of(client, "alice")
    as_user(monkeypatch, ALICE)
    client.kill(job.id, wait=False)
    with pytest.raises(InvalidInput) as err:
        client.retry(job.id)
    assert str(err.value) == (f"job {job.id} was cancelled by alice; `rig retry` only sends back failed jobs "
                              f"(`rig errors`): to run it again, submit it again (`rig show {job.id}` gives "
                              "its command)")
    assert err.value.exit_code == 2 and client.get(job.id).state is JobState.CANCELLED


def test_retry_of_a_job_cleared_from_the_error_queue_says_how_to_run_it_again(client, monkeypatch):
    """A failed job cleared from the error queue (then archived) said "not in the error queue;
    `rig errors` lists those": it never will be there again, and nothing said what to do."""
    from rig.errors import InvalidInput

    job = failed_job_of(client, "alice")
    as_user(monkeypatch, ALICE)
    client.clear_error(job.id)
    with pytest.raises(InvalidInput) as err:
        client.retry(job.id)
    assert str(err.value) == (f"job {job.id} is FAILED, not in the error queue, the only jobs `rig retry` sends "
                              f"back: to run it again, submit it again (`rig show {job.id}` gives its command)")
    assert err.value.exit_code == 2
    waiting = job_of(client, "alice")  # not finished: nothing to submit again
    with pytest.raises(InvalidInput, match="is PENDING, not in the error queue; `rig errors` lists those"):
        client.retry(waiting.id)


def test_an_admin_may_clear_anyones_error(client, monkeypatch):
    job = failed_job_of(client, "alice")
    as_user(monkeypatch, CAROL)
    client.clear_error(job.id)
    assert not client.store.in_error_queue(job.id)


def test_a_job_whose_owner_is_unreadable_is_for_admins_only(client, monkeypatch):
    job = job_of(client, "alice")
    client.r.hset(client.keys.job(job.id), "user", "alice bob")  # not a login name
    as_user(monkeypatch, Identity("?", 1005))  # the neutral value a bad user field takes
    with pytest.raises(PermissionDenied, match="no valid owner in its record; only an admin"):
        client.kill(job.id)
    as_user(monkeypatch, CAROL)
    assert client.kill(job.id).state is JobState.CANCELLED


def test_a_damaged_job_is_not_retried(client, monkeypatch):
    job = failed_job_of(client, "alice")
    client.r.hset(client.keys.job(job.id), "gpus", "x")
    as_user(monkeypatch, ALICE)
    with pytest.raises(InvalidRecord, match=r"cannot be retried, resubmit it: invalid record: field gpus: expected"):
        client.retry(job.id)
    assert client.store.in_error_queue(job.id)


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture
def cli_ledger(cli_env, real_redis) -> Ledger:
    return Ledger(real_redis, Keys(cli_env))


def make(ledger: Ledger, user: str, failed: bool = False) -> int:
    job = ledger.store.create(Job(
        id=0, name="t", user=user, command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time()))
    if failed:
        ledger.transition(job.id, JobState.FAILED, error_queue=True)
    return job.id


@pytest.mark.redis
def test_cli_refuses_with_one_line_and_exit_8_before_killing_anything(cli_ledger, monkeypatch):
    ledger = cli_ledger
    mine, theirs, carols = make(ledger, "bob"), make(ledger, "alice"), make(ledger, "carol")
    as_user(monkeypatch, BOB)
    result = CliRunner().invoke(cli, ["kill", str(mine), str(theirs), str(carols)])
    assert result.exit_code == 8, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # All refusals come before any change: bob's own job was not killed either, and the line
    # says so (it named alice's job alone, and bob's was left running without a word).
    assert lines == [f"rig: error: job {theirs} belongs to alice; only alice or an admin may kill it "
                     f"(root, or a user named in `admins` / RIG_ADMINS); job(s) {carols} are other users' too; "
                     "nothing was killed"]
    assert ledger.store.get(mine).state is JobState.PENDING
    alone = CliRunner().invoke(cli, ["kill", str(theirs)])  # one id: the refusal alone
    assert alone.exit_code == 8 and alone.output.strip() == lines[0].split("; job(s)")[0], alone.output


@pytest.mark.redis
def test_cli_retry_and_clear_refused_exit_8_and_admins_may(cli_ledger, monkeypatch):
    ledger = cli_ledger
    job = make(ledger, "alice", failed=True)
    as_user(monkeypatch, BOB)
    for args in (["retry", str(job)], ["errors", "--clear", str(job)]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 8 and "belongs to alice" in result.output, result.output
    monkeypatch.setenv("RIG_ADMINS", "bob")
    result = CliRunner().invoke(cli, ["errors", "--clear", str(job)])
    assert result.exit_code == 0 and "cleared from the error queue" in result.output, result.output


# -- rig jobs --user / --mine (issue 14, item 4) -----------------------------------------------
def test_jobs_of_one_user_are_found_past_the_newest_page(client):
    """The filter reads the index page by page: a user's jobs behind 1,000 newer ones of
    another user are still found, newest first, up to the limit."""
    old = [job_of(client, "alice").id for _ in range(3)]
    store = client.store
    for _ in range(1005):  # cheaper than submitting: bare records in the all-jobs index
        store.create(Job(id=0, name="n", user="bob", command=["true"], gpu_memory=GIB, gpus=1,
                         priority=Priority.MEDIUM, state=JobState.SUCCEEDED, workdir="/", created_at=time.time()))
    assert [j.id for j in client.jobs(user="alice", limit=2)] == old[::-1][:2]
    assert [j.id for j in client.jobs(JobState.PENDING, user="alice")] == old[::-1]
    assert client.jobs(user="nobody-here") == []
    assert len(client.jobs(user="bob", limit=7)) == 7


@pytest.mark.redis
def test_cli_jobs_user_and_mine(cli_ledger, monkeypatch):
    ledger = cli_ledger
    mine, theirs = make(ledger, "bob"), make(ledger, "alice")
    as_user(monkeypatch, BOB)
    monkeypatch.setenv("COLUMNS", "160")
    result = CliRunner().invoke(cli, ["jobs", "--mine", "--json"])
    assert result.exit_code == 0, result.output
    import json

    assert [j["id"] for j in json.loads(result.output)] == [mine]
    result = CliRunner().invoke(cli, ["jobs", "--user", "alice", "--state", "pending"])
    ids = [line.split("│")[1].strip() for line in result.output.splitlines() if line.startswith("│")]
    assert result.exit_code == 0 and ids == [str(theirs)], result.output
    assert "reason" in result.output
    result = CliRunner().invoke(cli, ["jobs", "--user", "nobody-here"])
    assert result.exit_code == 0 and result.stdout == "", result.stdout
    assert "no jobs of user nobody-here" in result.stderr
    result = CliRunner().invoke(cli, ["jobs", "--mine", "--user", "alice"])
    assert result.exit_code != 0 and "--mine is bob, --user is alice" in result.output, result.output
