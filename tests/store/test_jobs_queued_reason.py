"""`rig jobs` gives every waiting job a reason (issue 13: "-" for 218 of 250 rows, since the
dispatcher words only the queue heads it reads): one with none stored reads its place in the
queue, counted as `rig show` counts it; a stored sentence is shown while it is current (as `rig
show` judges it, rig.waiting), else `rig show`'s own live sentence."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from rig.cli.main import cli
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from tests.store.conftest import add_cards


def _waiting(ledger: Ledger) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.LOW, state=JobState.PENDING, workdir="/", created_at=time.time())).id


def test_a_waiting_job_without_a_stored_reason_shows_the_jobs_ahead_of_it(cli_env, real_redis, monkeypatch):
    ledger = Ledger(real_redis, Keys(cli_env))
    first, second, third = (_waiting(ledger) for _ in range(3))
    real_redis.set(Keys(cli_env).sched_leader, "someone", px=60_000)  # a dispatcher leads
    real_redis.hset(Keys(cli_env).job(second), mapping={"wait_reason": "the dispatcher's own sentence",
                                                        "wait_reason_at": shared_now(real_redis)})
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


def test_a_sentence_no_dispatcher_keeps_is_not_shown(cli_env, real_redis, monkeypatch):
    """Seen: after `rig down`, `rig jobs` and `rig top` went on saying "vm/2 held for it
    (expected free ~18:15)" (the dispatcher's last sentence: a hold nobody keeps any more) while
    `rig show` of the same job said no node is up and no dispatcher runs. All three say the same."""
    keys = Keys(cli_env)
    ledger = Ledger(real_redis, keys)
    nodes = NodeRegistry(real_redis, keys)
    nodes.register("n1", ttl=30.0, backend="fake", cards=1)
    add_cards(ledger, 1, 40, uuid="n1-u0")
    jid = _waiting(ledger)
    held = "needs 1.0 GiB on 1 card; n1/0 held for job 9 (expected free ~Dec 07 18:15 UTC)"
    real_redis.set(keys.sched_leader, "someone", px=60_000)
    stamp = max(shared_now(real_redis), float(real_redis.hget(keys.node("n1"), "started_at")))
    real_redis.hset(keys.job(jid), mapping={"wait_reason": held, "wait_reason_at": stamp})
    run = CliRunner().invoke
    monkeypatch.setenv("COLUMNS", "250")

    def said() -> tuple[str, str, str]:
        listed = run(cli, ["jobs", "--state", "pending", "--json"])
        table = run(cli, ["jobs", "--state", "pending"])
        top = run(cli, ["top", "--once"])
        assert listed.exit_code == table.exit_code == top.exit_code == 0, listed.output + table.output + top.output
        return json.loads(listed.stdout)[0]["wait_reason"], table.stdout, top.stdout

    reason, table, top = said()
    assert reason == held and "n1/0 held for job 9" in table and "n1/0 held for job 9" in top  # current
    time.sleep(0.01)
    real_redis.delete(keys.sched_leader)  # `rig down`: the dispatcher is gone, the node stopped
    nodes.mark_stopped("n1")
    reason, table, top = said()
    client = Client(load_settings(), redis_client=real_redis)
    assert reason == client.why_waiting(client.get(jid))
    assert reason.startswith("no rig node is up (node n1: stopped since"), reason
    for shown in (table, top):
        assert "held for job 9" not in shown and "no rig node is up" in shown, shown
