"""Issue 11 (minor): `rig kill` of a job whose node was stopped by `rig down` said nothing for
30 s and then exited 1. Now at once: one line that the kill is recorded and happens when the
node is back, exit 1 (it still runs); the request is in the record for the node to act on."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from tests.store.conftest import add_cards

pytestmark = pytest.mark.redis


@pytest.fixture
def cli_ledger(cli_env, real_redis) -> Ledger:
    return Ledger(real_redis, Keys(cli_env))


def _running_on_stopped_node(ledger: Ledger) -> Job:
    add_cards(ledger, 1, 24, max_jobs=2)
    nodes = NodeRegistry(ledger.r, ledger.keys)
    nodes.register("n1", ttl=30)
    jid = ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id
    ok, token = ledger.reserve(jid, "n1", [0], GIB)
    assert ok and ledger.claim(jid, token, "w")[0]
    assert nodes.mark_stopped("n1")  # rig down: the job keeps running, unwatched
    return ledger.store.get(jid)


def test_kill_of_a_job_on_a_stopped_node_says_so_at_once(cli_ledger):
    job = _running_on_stopped_node(cli_ledger)
    began = time.monotonic()
    result = CliRunner().invoke(cli, ["kill", str(job.id)])
    assert time.monotonic() - began < 5, "it waited for a worker that is not there"
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, lines
    assert lines[0].startswith(f"rig: job {job.id}: kill recorded; node n1 is stopped since "), lines[0]
    assert lines[0].endswith("so the job stops when the node is back (`rig up --node n1`)"), lines[0]
    after = cli_ledger.store.get(job.id)
    assert after.state is JobState.RUNNING and after.cancel_requested  # for its worker on return
