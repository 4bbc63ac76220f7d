"""Damaged and hostile records in Redis: every reader gets a job with its problems named (never
an exception), the ledger can still end such a job, and the CLI shows it."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.redis_conn import connect
from tests.conftest import REDIS_URL
from tests.store.conftest import add_cards

#: Hand-written damage, each with the start of the problem it must produce.
DAMAGE = [
    ({"gpus": "x"}, "field gpus: expected a whole number of cards from 1 to 256, got 'x'"),
    ({"command": "not json"}, "field command: expected JSON"),
    ({"command": json.dumps(["sh", "-c", "x"] * 2000)}, "field command: more than 4096 arguments"),
    ({"command": "A" * (20 * 1024 * 1024)}, "field command: longer than"),
    ({"env": json.dumps({"LD_PRELOAD": 7})}, "field env: variable LD_PRELOAD: expected a string"),
    ({"workdir": "../../etc"}, "field workdir: expected an absolute path"),
    ({"priority": "HIGHEST"}, "field priority"),
    ({"name": "x\n; touch /tmp/pwned"}, "field name: expected printable text"),
    ({"gpu_memory": "9" * 39}, "field gpu_memory: expected a size in bytes"),
]


@pytest.fixture
def ledger(redis_client, key_prefix) -> Ledger:
    return Ledger(redis_client, Keys(key_prefix))


def create(ledger: Ledger, **damage: str) -> int:
    job = ledger.store.create(Job(
        id=0, name="t", user="alice", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time()))
    if damage:
        ledger.r.hset(ledger.keys.job(job.id), mapping=damage)
    return job.id


@pytest.mark.parametrize(("damage", "problem"), DAMAGE, ids=[next(iter(d)) + str(i) for i, (d, _) in enumerate(DAMAGE)])
def test_every_reader_gets_the_job_with_its_problem(ledger, damage, problem):
    good = create(ledger)
    bad = create(ledger, **damage)
    job = ledger.store.get(bad)
    assert job.id == bad and job.problems[0].startswith(problem), job.problems
    listed = {j.id: j for j in ledger.store.list()}
    assert set(listed) == {good, bad} and not listed[good].problems and listed[bad].problems
    assert [j.id for j in ledger.store.get_many([good, bad])] == [good, bad]


def test_the_ledger_can_still_end_a_damaged_job(ledger):
    add_cards(ledger, 1, 80, uuid="u")
    jid = create(ledger)
    ok, token = ledger.reserve(jid, "n1", [0], GIB)
    assert ok
    ledger.r.hset(ledger.keys.job(jid), mapping={"command": "{", "cards": "[[["})
    code, _ = ledger.transition(jid, JobState.FAILED, token=token, error_queue=True,
                                fields={"reason": "invalid record: field command: expected JSON"})
    assert code == 1 and ledger.store.get(jid).state is JobState.FAILED
    # Its card list is unreadable, so the reservation is given back by the reclaim (as the
    # card runner and the health check do).
    assert ledger.reclaim("n1", 0, jid) == GIB and ledger.card("n1", 0).reserved == 0


def test_a_damaged_card_takes_no_jobs(ledger):
    add_cards(ledger, 1, 80, uuid="u")
    ledger.r.hset(ledger.keys.card("n1", 0), "usable", "all of it")
    (card,) = ledger.cards()
    assert not card.eligible and card.health_reason.startswith("invalid record: field usable: ")


@pytest.mark.redis
def test_bytes_that_are_not_utf8_are_a_problem_not_a_crash(real_redis, key_prefix):
    import redis

    ledger = Ledger(connect(REDIS_URL), Keys(key_prefix))  # rig's own client
    jid = create(ledger)
    redis.Redis.from_url(REDIS_URL).hset(ledger.keys.job(jid), "command", b'["\xff\xfe"]')
    job = ledger.store.get(jid)
    assert job.problems[0].startswith("field command: not valid UTF-8"), job.problems


# -- the command line shows them --------------------------------------------------------------
@pytest.fixture
def cli_ledger(cli_env, real_redis) -> Ledger:
    return Ledger(real_redis, Keys(cli_env))


@pytest.mark.redis
def test_jobs_show_and_errors_render_damaged_records(cli_ledger):
    ids = [create(cli_ledger, **damage) for damage, _ in DAMAGE[:3]]
    markup = create(cli_ledger, name="[/]", reason="[bold red]not markup[/]")
    empty = create(cli_ledger)
    cli_ledger.r.delete(cli_ledger.keys.job(empty))
    cli_ledger.r.hset(cli_ledger.keys.job(empty), mapping={"id": str(empty), "state": "WHO KNOWS"})
    cli_ledger.transition(ids[0], JobState.FAILED, error_queue=True, fields={"reason": "x"})
    runner = CliRunner()
    for args in (["jobs"], ["jobs", "--json"], ["errors"], ["errors", "--json"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (args, result.output, result.exception)
    listed = runner.invoke(cli, ["jobs"]).output
    assert "[/]" in listed
    shown = runner.invoke(cli, ["show", str(ids[1])])
    assert shown.exit_code == 0 and "invalid record" in shown.output and "field command" in shown.output
    shown = runner.invoke(cli, ["show", str(markup)])
    assert shown.exit_code == 0 and "[bold red]not markup[/]" in shown.output, shown.output
    as_json = json.loads(runner.invoke(cli, ["show", "--json", str(empty)]).output)
    assert any(p.startswith("field state: expected one of") for p in as_json["problems"])
    assert runner.invoke(cli, ["show", str(empty)]).exit_code == 0
