"""Archived jobs through what people use: `rig show`, `rig log`, `rig metrics`, `rig jobs
--since`, `rig usage` (real Redis, the CLI in this process, SQLite under the test's RIG_HOME),
and the gateway's privacy rule on an archived job of another user."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
from click.testing import CliRunner

from rig.archive import Archive
from rig.archiving import Archiver
from rig.cli.main import cli
from rig.client import Client
from rig.clock import shared_now
from rig.config import load_settings
from rig.gateway import privacy, wire
from rig.gateway.server import Gateway, Peer
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import JobState
from tests.store.test_archive import DAY, finished

pytestmark = pytest.mark.redis


def _archive_all(r, prefix: str) -> int:
    settings = load_settings()
    with Archive(settings.archive_location, prefix, home=settings.home) as archive:
        return Archiver(r, Keys(prefix), archive, after_seconds=DAY, keep=0).run(shared_now(r) + 2 * DAY).archived


def test_show_log_metrics_jobs_and_usage_find_archived_jobs(cli_env, real_redis, tmp_path):
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)
    log = tmp_path / "1.log"
    log.write_text("epoch 1 loss 0.5\n")
    done = finished(ledger, ended=now - 3600, user="ann", gib=8, gpus=2, run_s=1800, mean=4 * 2**30)
    ledger.store.update(done.id, log_paths=[str(log)])
    oom = finished(ledger, ended=now - 60, user="bob", state=JobState.FAILED, failure="cuda_oom")
    old = finished(ledger, ended=now - 40 * DAY, user="ann")
    assert _archive_all(real_redis, cli_env) == 3
    assert not real_redis.exists(Keys(cli_env).job(done.id))

    run = CliRunner().invoke
    shown = json.loads(run(cli, ["show", str(done.id), "--json"]).stdout)
    assert (shown["state"], shown["gpus"]) == ("SUCCEEDED", 2)
    result = run(cli, ["log", str(done.id)])
    assert result.exit_code == 0 and result.stdout == "epoch 1 loss 0.5\n", result.output
    metrics = json.loads(run(cli, ["metrics", str(done.id), "--json"]).stdout)
    assert metrics["attempts"][0]["vram_mean"] == 4 * 2**30

    listed = [j["id"] for j in json.loads(run(cli, ["jobs", "--json"]).stdout)]
    assert sorted(listed) == sorted([done.id, oom.id, old.id])
    recent = [j["id"] for j in json.loads(run(cli, ["jobs", "--since", "30d", "--json"]).stdout)]
    assert sorted(recent) == sorted([done.id, oom.id])

    table = run(cli, ["usage", "--since", "30d"], env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert "cuda_oom=1" in table.stdout and "ann" in table.stdout
    rows = list(csv.DictReader(io.StringIO(run(cli, ["usage", "--since", "30d", "--csv"]).stdout)))
    ann = next(r for r in rows if r["user"] == "ann")
    assert (ann["jobs"], float(ann["card_hours"]), float(ann["reserved_gib_hours"])) == ("1", 1.0, 8.0)
    assert float(ann["used_gib_hours"]) == 4.0 and rows[-1]["user"] == "" and rows[-1]["jobs"] == "2"
    by_node = json.loads(run(cli, ["usage", "--since", "60d", "--by", "node", "--json"]).stdout)
    assert [ln["key"] for ln in by_node["lines"]] == ["n1"] and by_node["total"]["jobs"] == 3
    ever = json.loads(run(cli, ["usage", "--since", "all", "--json"]).stdout)  # every finished job
    assert ever["since"] is None and ever["total"]["jobs"] == 3
    table = run(cli, ["usage", "--since", "all"], env={"COLUMNS": "80"}).stdout
    assert "usage of all finished jobs" in table and "used GiB-h" in table  # used before cancelled at 80

    status = json.loads(run(cli, ["status", "--json"]).stdout)
    where = load_settings().archive_location  # where the history is: said, not left to the README
    assert (status["jobs_archived"], status["archive_url"]) == (3, where)
    assert f"archived (finished, out of Redis): 3 in {where}" in run(cli, ["status"], env={"COLUMNS": "400"}).stdout

    bad = run(cli, ["usage", "--since", "a week"])
    assert bad.exit_code == 2 and "--since: cannot read 'a week'" in bad.output


def test_usage_csv_keeps_a_user_named_total_apart_from_the_total(cli_env, real_redis):
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)
    finished(ledger, ended=now - 60, user="total")
    finished(ledger, ended=now - 60, user="ann")
    rows = list(csv.DictReader(io.StringIO(CliRunner().invoke(cli, ["usage", "--csv"]).stdout)))
    assert [(r["user"], r["jobs"]) for r in rows] in ([("ann", "1"), ("total", "1"), ("", "2")],
                                                      [("total", "1"), ("ann", "1"), ("", "2")])


def test_the_gateway_hides_an_archived_job_of_another_user_as_a_live_one(real_redis, key_prefix, tmp_path):
    settings = load_settings(home=tmp_path, key_prefix=key_prefix)
    gw = Gateway(settings, Client(settings, redis_client=real_redis))
    ledger = Ledger(real_redis, Keys(key_prefix))
    job = finished(ledger, ended=shared_now(real_redis) - 3600, user=str(os.getuid() + 40001))
    real_redis.hset(ledger.keys.job(job.id), "result", "gASVBQAAAAAAAACMATGULg==")  # a @rig.task's pickle
    with Archive(settings.archive_location, key_prefix, home=settings.home) as archive:
        Archiver(real_redis, ledger.keys, archive, after_seconds=1, keep=0).run(shared_now(real_redis))
    assert not real_redis.exists(ledger.keys.job(job.id))

    def ask(uid: int, op: str, **args):  # noqa: ANN202
        answer = gw.handle(Peer(os.getpid(), uid, uid), {"op": op, "args": wire.encode(args)})
        assert answer["ok"], answer
        return wire.decode(answer["result"])

    other = os.getuid() + 40002
    seen = ask(other, "get", job_id=job.id)
    assert seen.command == [privacy.HIDDEN] and seen.env == {"A": privacy.HIDDEN} and seen.name == "train"
    assert ask(other, "jobs", since=0.0)[0].command == [privacy.HIDDEN]
    lines, total = ask(other, "usage", since=0.0, by="user")
    assert total.jobs == 1 and lines[0].key == job.user
    assert gw.client.result_of(job.id) == "gASVBQAAAAAAAACMATGULg=="  # from the archived record (root: an admin)
    refused = gw.handle(Peer(os.getpid(), other, other), {"op": "result", "args": wire.encode({"job_id": job.id})})
    assert refused["error"]["type"] == "PermissionDenied"
