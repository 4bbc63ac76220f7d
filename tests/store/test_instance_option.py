"""`rig show`, `rig log` and `rig metrics` take the same `--instance HEX` (rig.cli.common.
INSTANCE_OPTION): after Redis lost its data and an id was given again, each reads the job asked
for, archived or live, and each refuses a malformed or unknown instance with the same words."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.clock import shared_now
from rig.keys import Keys
from rig.ledger import Ledger
from tests.store.test_archive import DAY, finished
from tests.store.test_archive_reads import _archive_all

pytestmark = pytest.mark.redis


@pytest.fixture
def two_of_one_id(cli_env, real_redis, tmp_path):
    """Job N archived ('before', its log saying "old"), then Redis restarted empty and job N
    given again ('after', live, its log saying "new")."""
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)
    old = finished(ledger, ended=now - 3 * DAY, name="before", mean=3 * 2**30)
    (tmp_path / "old.log").write_text("old\n")
    ledger.store.update(old.id, log_paths=[str(tmp_path / "old.log")])
    assert _archive_all(real_redis, cli_env) == 1
    real_redis.delete(Keys(cli_env).next_job_id)  # ids start again at 1
    new = finished(ledger, ended=now - 60, name="after", mean=5 * 2**30)
    (tmp_path / "new.log").write_text("new\n")
    ledger.store.update(new.id, log_paths=[str(tmp_path / "new.log")])
    assert new.id == old.id and new.instance != old.instance
    return old, new


def test_log_and_metrics_pick_the_instance_show_picks(two_of_one_id):
    old, new = two_of_one_id
    run = CliRunner().invoke
    for inst, name, text, mean in ((old.instance[:6], "before", "old\n", 3 * 2**30),
                                   (new.instance[:6], "after", "new\n", 5 * 2**30),
                                   (None, "after", "new\n", 5 * 2**30)):  # without it: the live one
        extra = [] if inst is None else ["--instance", inst]
        assert json.loads(run(cli, ["show", str(old.id), *extra, "--json"]).stdout)["name"] == name
        got = run(cli, ["log", str(old.id), *extra])
        assert got.exit_code == 0 and got.stdout == text, got.output
        metrics = json.loads(run(cli, ["metrics", str(old.id), *extra, "--json"]).stdout)
        assert (metrics["name"], metrics["attempts"][0]["vram_mean"]) == (name, mean)


def test_show_of_a_repeated_id_says_the_archive_holds_an_earlier_job_of_it(two_of_one_id):
    """A tester's `rig show 1` after Redis restarted empty showed the new job 1 only; the
    quickstart's job 1 was in the archive, found only by `rig jobs --since 30d`."""
    old, new = two_of_one_id
    got = CliRunner().invoke(cli, ["show", str(old.id)])
    assert got.exit_code == 0, got.output
    assert got.stderr.strip() == (f"note: the archive also holds an earlier job {old.id} ('before' by {old.user}, "
                                  f"SUCCEEDED, instance {old.instance[:8]}): `rig show {old.id} --instance "
                                  f"{old.instance[:8]}`"), got.stderr
    asked = CliRunner().invoke(cli, ["show", str(old.id), "--instance", new.instance[:6]])
    assert asked.exit_code == 0 and "note:" not in asked.stderr  # the one asked for by its instance


def test_the_note_stays_once_the_later_job_of_the_id_is_archived_too(two_of_one_id, real_redis, cli_env):
    """A week on, the new job of the id is archived as well: the note was looked up as the
    archive's newest job of the id, which was then the very job shown, and said nothing."""
    old, new = two_of_one_id
    assert _archive_all(real_redis, cli_env) == 1
    got = CliRunner().invoke(cli, ["show", str(old.id)])
    assert got.exit_code == 0 and re.search(r"^name +after\b", got.stdout, re.M), got.output
    assert f"note: the archive also holds an earlier job {old.id} ('before'" in got.stderr, got.stderr


def test_an_unknown_or_malformed_instance_is_refused_alike_by_show_log_and_metrics(two_of_one_id):
    old, new = two_of_one_id
    bad = next(h for h in ("ffff", "0000", "1234") if not old.instance.startswith(h)
               and not new.instance.startswith(h))
    run = CliRunner().invoke
    answers = {cmd: run(cli, [cmd, str(old.id), "--instance", bad]) for cmd in ("show", "log", "metrics")}
    for cmd, got in answers.items():
        assert got.exit_code == 4, (cmd, got.output)
        assert got.stderr.strip() == (f"rig: error: no job {old.id} of instance {bad}; `rig jobs --since 30d` "
                                      "shows each job's instance where ids repeat"), (cmd, got.output)
    for cmd in ("show", "log", "metrics"):
        got = run(cli, [cmd, str(old.id), "--instance", "XYZ!"])
        # One line, as every other bad value (a tester got click's Usage/Try/Error form).
        assert got.exit_code == 2 and got.stderr.splitlines() == [
            "rig: error: --instance: give the first hex digits of the instance, e.g. 3fa9c2 (got 'XYZ!'; "
            "`rig jobs --since 30d` shows them)"], (cmd, got.output)


def test_log_of_an_archived_instance_through_the_gateway(cli_env, real_redis, monkeypatch):
    """`rig log ID --instance HEX` of a user who reads through the gateway: the gateway checks
    the path against the picked job's record (the archived one), not the live job now holding
    the id, whose record names other logs."""
    import os
    import threading
    from pathlib import Path

    from rig.client import Client
    from rig.config import load_settings
    from rig.gateway.client import GatewayClient
    from rig.gateway.server import Gateway, bind

    settings = load_settings()
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)

    def with_log(job, text: str) -> None:
        path = settings.job_log_dir / f"{job.id}-{job.instance}" / "attempt-1.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        ledger.store.update(job.id, log_paths=[str(path)])

    old = finished(ledger, ended=now - 3 * DAY, name="before")
    with_log(old, "old\n")
    assert _archive_all(real_redis, cli_env) == 1
    real_redis.delete(Keys(cli_env).next_job_id)  # ids start again at 1
    new = finished(ledger, ended=now - 60, name="after")
    with_log(new, "new\n")
    assert new.id == old.id and new.instance != old.instance
    gw = Gateway(settings, Client(settings))
    socket_path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-instance.sock")
    server = bind(socket_path, gw)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setattr("rig.cli.main.client_from", lambda ctx: GatewayClient(settings, socket_path))
        run = CliRunner().invoke
        for extra, text in ((["--instance", old.instance[:6]], "old\n"), (["--instance", new.instance[:6]], "new\n"),
                            ([], "new\n")):
            got = run(cli, ["log", str(old.id), *extra])
            assert got.exit_code == 0 and got.stdout == text, (extra, got.output)
            got = run(cli, ["log", "-f", str(old.id), *extra])
            assert got.exit_code == 0 and got.stdout == text, (extra, got.output)
    finally:
        server.shutdown()
        server.server_close()
        socket_path.unlink(missing_ok=True)


def test_the_log_header_names_the_instance_where_the_id_repeats(two_of_one_id, real_redis, cli_env, tmp_path):
    """`--- job 5, attempt 1 of 1 ---` did not say which job 5 (a tester's finding)."""
    old, new = two_of_one_id
    run = CliRunner().invoke
    for extra, job in (([], new), (["--instance", old.instance[:6]], old)):
        got = run(cli, ["log", str(old.id), *extra])
        assert got.exit_code == 0, got.output
        assert got.stderr.startswith(f"--- job {old.id} (instance {job.instance[:6]}), attempt 1 of 1 ("), got.stderr
    # An id given once: the header as before.
    ledger = Ledger(real_redis, Keys(cli_env))
    single = finished(ledger, ended=shared_now(real_redis) - 60, name="single", mean=2**30)
    (tmp_path / "single.log").write_text("one\n")
    ledger.store.update(single.id, log_paths=[str(tmp_path / "single.log")])
    got = run(cli, ["log", str(single.id)])
    assert got.exit_code == 0 and got.stderr.startswith(f"--- job {single.id}, attempt 1 of 1 ("), got.output
