"""What the command line tells people is true and safe (issue 10, items 5, 9, 12): the wait
reason after `rig down`, Ctrl-C on `rig-submit --wait`, job text with escape sequences.
The CLI in this process against real Redis under the test's prefix; no workers."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.cli.submit import main as submit_main
from rig.client import Client
from rig.config import load_settings
from rig.forecast import forecast
from rig.forecast_store import publish
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.text import has_control

pytestmark = pytest.mark.redis


def _node(r, prefix: str, name: str = "n1") -> tuple[Ledger, NodeRegistry]:
    keys = Keys(prefix)
    ledger, nodes = Ledger(r, keys), NodeRegistry(r, keys)
    nodes.register(name, ttl=30, backend="fake", cards=1)
    ledger.register_card(name, GpuReading(index=0, uuid="u0", model="m", total=24 * GIB),
                         max_jobs=2, reserve_fraction=0.0, allowed=True, fake=True)
    return ledger, nodes


def test_submit_after_rig_down_says_no_node_is_up(cli_env, real_redis):
    _, nodes = _node(real_redis, cli_env)
    nodes.mark_stopped("n1")  # `rig down` of the only node
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"])
    assert result.exit_code == 0, result.output
    jid = result.stdout.strip()
    line = next(x for x in result.stderr.splitlines() if x.startswith(f"job {jid} waits: "))
    assert "no rig node is up (node n1: stopped since" in line and "it fits now" not in line

    shown = json.loads(CliRunner().invoke(cli, ["show", jid, "--json"]).stdout)
    assert shown["waiting_because"].startswith("no rig node is up (node n1: stopped since")
    assert shown["wait_reason"] == shown["waiting_because"]  # one explanation
    table = CliRunner().invoke(cli, ["show", jid]).stdout
    assert "no rig node is up" in table


def test_submit_with_a_node_up_but_no_dispatcher_says_so(cli_env, real_redis):
    _node(real_redis, cli_env)
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"])
    assert "no dispatcher is running" in result.stderr, result.stderr
    jid = result.stdout.strip()
    # Its estimated start (rig.forecast) says the same instead of a time ...
    table = CliRunner().invoke(cli, ["show", jid]).stdout
    assert "estimated start" in table and "unknown (no dispatcher is running" in table, table
    # ... once a dispatcher holds the lock, and before it stored a forecast, it says when one comes ...
    real_redis.set(Keys(cli_env).sched_leader, "someone", px=60_000)
    table = CliRunner().invoke(cli, ["show", jid]).stdout
    assert "not estimated yet (the dispatcher makes one every 10 s)" in table, table
    # ... and once the leader stored one (rig.forecast_store), a job that fits now is "now", with
    # the forecast's age, in the table and in --json, which also has the raw times (epoch s).
    client = Client(load_settings(), redis_client=real_redis)
    publish(real_redis, client.keys, forecast(client))
    table = CliRunner().invoke(cli, ["show", jid]).stdout
    assert "now (waiting for the dispatcher's next pass) (as of 0 s ago)" in " ".join(table.split()), table
    shown = json.loads(CliRunner().invoke(cli, ["show", jid, "--json"]).stdout)
    assert shown["estimated_start"] > 0 and shown["estimated_start_short"] == "now"
    assert shown["estimated_at"] == pytest.approx(time.time(), abs=30)
    listed = json.loads(CliRunner().invoke(cli, ["jobs", "--json"]).stdout)
    assert [j["estimated_start_short"] for j in listed] == ["now"]  # the same in `rig jobs --json`
    # A job submitted after the forecast was made says so, not "later".
    newer = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"]).stdout.strip()
    listed = json.loads(CliRunner().invoke(cli, ["jobs", "--json"]).stdout)
    assert {j["id"]: j["estimated_start_short"] for j in listed} == {int(jid): "now", int(newer): "not yet"}


@pytest.mark.parametrize(("state", "says"), [
    (JobState.PENDING, "stays queued"), (JobState.RUNNING, "keeps running")])
def test_ctrl_c_on_wait_says_the_job_goes_on(cli_env, real_redis, monkeypatch, state, says):
    from rig.client import Client

    def interrupted(self, job_id, **_kw):  # noqa: ANN001, ANN003 - the user presses Ctrl-C
        if state is JobState.RUNNING:
            real_redis.hset(Keys(cli_env).job(job_id), "state", state.value)
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "wait", interrupted)
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--wait", "--", "sleep", "60"])
    jid = result.stdout.strip()
    assert result.exit_code == 130, result.output
    assert f"job {jid} {says} (rig-submit only stopped waiting); `rig kill {jid}` stops it" in result.stderr


def test_hostile_job_text_is_stripped_in_every_view(cli_env, real_redis):
    """A lone ESC from a job's failure evidence reached the terminal through `rig show`."""
    ledger, _ = _node(real_redis, cli_env)
    osc = "\x1b]0;TITLE"
    job = ledger.store.create(Job(
        id=0, name="t", user="u", command=["sh", "-c", "echo \x1b[2J"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time()))
    ledger.transition(job.id, JobState.FAILED, error_queue=True, expect=JobState.PENDING,
                      fields={"reason": f"exit 1 {osc}", "evidence": json.dumps([osc, "\x9b31mx"]),
                              "failure": "nonzero_exit"})
    for args in (["show", str(job.id)], ["jobs"], ["errors"], ["status"], ["metrics", str(job.id)]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
        assert not has_control(result.output.replace("\n", "")), (args, result.output)
    assert "0;TITLE" in CliRunner().invoke(cli, ["show", str(job.id)]).stdout
    raw = json.loads(CliRunner().invoke(cli, ["show", str(job.id), "--json"]).stdout)
    assert raw["evidence"][0] == osc  # JSON keeps the raw value


def test_submit_right_after_the_dispatcher_stopped_says_why_it_waits(cli_env, real_redis):
    """The dispatcher stopped under a second ago: its lock lingers (TTL 5 s). rig-submit said
    nothing (its view: 'it fits now; it starts at the dispatcher's next pass'); now it says the
    lock's holder did not answer."""
    _node(real_redis, cli_env)
    real_redis.set(Keys(cli_env).sched_leader, "n1:1:gone", px=5000)
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"])
    jid = result.stdout.strip()
    line = next((x for x in result.stderr.splitlines() if x.startswith(f"job {jid} waits: ")), None)
    assert line is not None, result.stderr
    assert "did not answer within" in line and "next pass" not in line, line


def test_rig_show_shows_the_whole_hidden_command(cli_env, real_redis):
    """Found from outside: `rig show` said `command  echo safe` for a command whose OSC hid
    `; touch /tmp/HIDDEN_RAN`, and a folder `d ESC]0;PWNEDDIR BEL x` as `.../dx`."""
    ledger, _ = _node(real_redis, cli_env)
    cmd = "echo safe \x1b]0;x; touch /tmp/HIDDEN_RAN \a"
    job = ledger.store.create(Job(
        id=0, name="innocent", user="u", command=["/bin/sh", "-c", cmd], shell=True, gpu_memory=GIB,
        gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/tmp/d\x1b]0;PWNEDDIR\ax",
        created_at=time.time()))
    out = CliRunner().invoke(cli, ["show", str(job.id)]).stdout
    assert not has_control(out.replace("\n", "")), out
    assert "echo safe \\x1b]0;x; touch /tmp/HIDDEN_RAN \\x07" in out, out
    assert "/tmp/d\\x1b]0;PWNEDDIR\\x07x" in out, out


def test_log_follow_of_a_waiting_job_says_why(cli_env, real_redis, monkeypatch):
    """`rig log -f 12` on a PENDING job waited silently; it says why the job waits at once."""
    from rig.client import Client

    ledger, nodes = _node(real_redis, cli_env)
    nodes.mark_stopped("n1")
    job = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time()))
    real_get, reads = Client.get, []

    def get(self, job_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - cancelled after rig log looked twice
        reads.append(job_id)
        if len(reads) == 3:
            ledger.transition(job.id, JobState.CANCELLED, expect=JobState.PENDING, fields={"reason": "x"})
        return real_get(self, job_id, *args, **kwargs)

    monkeypatch.setattr(Client, "get", get)
    result = CliRunner().invoke(cli, ["log", "-f", str(job.id)])
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"--- job {job.id} is waiting: no rig node is up (node n1: stopped since"), first
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["jobs", "--limit", "-1"], ["jobs", "-n", "0"], ["errors", "--limit", "-5"],
                                  ["errors", "-n", "0"], ["jobs", "--limit", "9" * 20],
                                  ["errors", "--limit", "9" * 20]])
def test_a_limit_below_one_is_refused(cli_env, real_redis, args):
    """`rig jobs --limit -1` listed every job; `rig errors --limit -5` all but 5 of them ("2 of 7
    shown"), and 20 digits were a Redis error's traceback."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "--limit must be 1 or more" in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "said"), [(["jobs", "--user", ""], "--user needs a login name, got ''"),
                                           (["jobs", "-u", " "], "--user needs a login name"),
                                           (["jobs", "--state", ""], "unknown state ''"),
                                           (["jobs", "--since", ""], "--since: cannot read ''")])
def test_an_empty_user_or_state_is_refused(cli_env, real_redis, args, said):
    """`rig jobs --user "$U"` with U unset said "no jobs of user " (exit 0), and `--state "$S"`
    listed every job: an empty value is a slip, refused as an unknown one is (exit 2)."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["kill", "abc"], ["kill", "1.5"], ["log", "abc"], ["log", "-f", "1.5"]])
def test_a_malformed_job_id_is_bad_input_not_an_unknown_job(cli_env, real_redis, args):
    """`rig kill abc` exited 4 ("no job with id abc"), as for a job that does not exist."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "is not a job id" in result.stderr, result.stderr


def test_a_well_formed_unknown_job_id_is_still_not_found(cli_env, real_redis):
    result = CliRunner().invoke(cli, ["kill", "987654"])
    assert result.exit_code == 4 and "no job with id 987654" in result.stderr, result.output


@pytest.mark.parametrize("args", [["rig.cli.main", "status"], ["rig.cli.main", "jobs"],
                                  ["rig.cli.submit", "--gpu-memory", "1G", "--", "true"]])
def test_a_closed_stdout_pipe_ends_quietly(cli_env, real_redis, args):
    """`rig status | head -1` exited 1 (click's BrokenPipe handling): a reader that stops
    reading is not an error. The pipe's read end is closed before the command starts."""
    import os
    import subprocess
    import sys

    _node(real_redis, cli_env)
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", *args], stdout=write, stderr=subprocess.PIPE,
                              timeout=60, check=False)
    finally:
        os.close(write)
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "BrokenPipe" not in stderr and "Traceback" not in stderr, stderr


def test_a_redis_no_node_ever_used_is_named(cli_env, real_redis):
    """Breaker: RIG_HOME=/typo rig-submit ... found no config, went to the default Redis (one
    that answered, without rig), took job 1 there, and said only 'no rig node is up' while rig
    was up elsewhere; `rig status` said the same. Now both name the Redis and where to look."""
    result = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"])
    assert result.exit_code == 0, result.output
    note = [x for x in result.stderr.splitlines() if x.startswith("note: ")]
    assert len(note) == 1 and "no rig node has ever registered with the Redis at redis://" in note[0]
    assert f"key prefix '{cli_env}'" in note[0] and "no config file found" in note[0] and "RIG_HOME" in note[0]
    status = CliRunner().invoke(cli, ["status"])
    assert status.exit_code == 0 and status.stderr.count("note: no rig node has ever registered") == 1
    # A node known there (even stopped): no note, the wait reason says what it is.
    _, nodes = _node(real_redis, cli_env)
    nodes.mark_stopped("n1")
    again = CliRunner().invoke(submit_main, ["--gpu-memory", "4G", "--", "true"])
    assert again.exit_code == 0 and "note: " not in again.stderr


def test_the_largest_limit_lists_jobs(cli_env, real_redis):
    """Breaker (pyapi): once Client.jobs checked its limit (from Python), `rig jobs --limit
    1000000000` asked it for one more than that, to tell whether the list was cut, and was refused."""
    result = CliRunner().invoke(cli, ["jobs", "--limit", "1000000000"])
    assert result.exit_code == 0, result.output
