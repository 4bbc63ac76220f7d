"""Several nodes on one Redis: real workers of two "servers" (n1 2x80G, n2 2x40G) on this
machine, one key prefix. Jobs land on both; `rig status` shows both nodes; a node stopped on
purpose (`rig down`) keeps its running jobs (nobody re-runs them) and adopts them on return; a
node whose rig died while its jobs ran on stops those old copies when it comes back (they were
re-run elsewhere meanwhile).

The hard loss of a node (SIGKILL of its processes and jobs, fail-over of beat and dispatcher,
retries elsewhere, rejoin) is the fault scenario ``node-lost`` (rig.testing.faults.node_lost),
run by tests/integration/test_faults.py and scripts/fault_scenarios.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.models import JobState
from rig.nodes import NODE_STOPPED_REASON, NodeRegistry
from rig.testing.faults import DONE, GATE, TRACED, _done_lines, _wait, duplicated_jobs
from rig.testing.harness import RigCluster

pytestmark = [pytest.mark.slow, pytest.mark.background]


def _rig(cluster: RigCluster, *args: str) -> str:
    """Run the `rig` CLI against the cluster's Redis and keys; returns its stdout."""
    s = cluster["n2"].settings
    env = {"RIG_REDIS_URL": s.redis_url, "RIG_KEY_PREFIX": s.key_prefix, "RIG_HOME": str(s.home),
           "COLUMNS": "200"}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_two_nodes_share_work_and_a_stopped_node_keeps_its_jobs(tmp_path):
    # A health timeout of 10 s, not 3: nothing here waits for a node to be declared down, and
    # on a loaded host a 3 s heartbeat gap had n1 declared down (its jobs run again) before
    # its `rig down` (CI, once).
    cluster = RigCluster(tmp_path / "nodes", {"n1": "2x80G", "n2": "2x40G"},
                         health={"check_interval": 1.0, "timeout": 10.0}, max_retries=2)
    n1, n2 = cluster["n1"], cluster["n2"]
    trace, go = tmp_path / "trace.txt", tmp_path / "go"
    nodes = NodeRegistry(cluster.redis, cluster.keys)
    try:
        n1.up(beat=True)
        n2.up(beat=True)
        body = TRACED.format(body=f"{GATE}; {DONE}")
        # 14 x 10G: more than either node holds (n1: 4 per card; n2: 3 per 38G card).
        ids = [cluster.client.submit(body, gpu_memory="10G", env={"TRACE": str(trace), "GO": str(go)}).id
               for _ in range(14)]
        for jid in ids:
            n2.wait_for_state(jid, {JobState.RUNNING}, timeout=60)
        placed = {j.id: j.node for j in cluster.client.store.get_many(ids)}
        on_n1 = sorted(jid for jid, node in placed.items() if node == "n1")
        assert on_n1 and len(on_n1) < len(ids), placed  # both nodes took jobs

        status = json.loads(_rig(cluster, "status", "--json"))
        assert {(n["name"], n["state"]) for n in status["nodes"]} == {("n1", "up"), ("n2", "up")}
        assert sorted(c["id"] for c in status["cards"]) == ["n1/0", "n1/1", "n2/0", "n2/1"]
        assert all(c["uuid"] for c in status["cards"])  # the backend's card id is on the record

        n1.down()  # `rig down` on n1: its workers stop, its jobs keep running
        _wait(lambda: all(not c.eligible and c.health_reason.startswith(NODE_STOPPED_REASON)
                          for c in cluster.client.ledger.cards() if c.node == "n1"),
              30, "the cluster pass to take n1's cards out of placement")
        assert next(n for n in nodes.read() if n.name == "n1").state == "stopped"
        text = _rig(cluster, "status")
        assert "node n1: stopped since" in text and "node n2: up since" in text
        for job in cluster.client.store.get_many(on_n1):
            assert job.state is JobState.RUNNING and job.attempt == 1 and job.node == "n1"
        assert sorted({jid for jid, _ in n1.job_processes().values()}) == on_n1  # running, unwatched

        go.touch()  # every job may finish now: n2's under its workers, n1's on their own
        for jid in sorted(set(ids) - set(on_n1)):
            assert cluster.client.wait(jid, timeout=60).state is JobState.SUCCEEDED
        _wait(lambda: not n1.job_processes(), 30, "n1's jobs to finish on their own")
        assert all(j.state is JobState.RUNNING for j in cluster.client.store.get_many(on_n1))

        n1.up(beat=True)  # back: its card workers adopt the jobs that ended meanwhile
        finals = {jid: cluster.client.wait(jid, timeout=60) for jid in ids}
        assert {j.state for j in finals.values()} == {JobState.SUCCEEDED}
        assert all(j.attempt == 1 for j in finals.values())  # nothing ran again
        assert duplicated_jobs(trace, finals) == []
        assert _done_lines(trace) == {jid: 1 for jid in ids}
        _wait(lambda: all(c.eligible for c in cluster.client.ledger.cards() if c.node == "n1"),
              30, "n1's cards to take jobs again")
        assert {n.name: n.state for n in nodes.read()} == {"n1": "up", "n2": "up"}
        assert cluster.leaked_bytes() == 0
    finally:
        cluster.cleanup()


def test_a_node_back_after_its_jobs_ran_elsewhere_stops_the_old_copies(tmp_path):
    """rig's processes on n1 die but its jobs run on (rig crashed, or n1 was cut off from
    Redis): n1 is declared down and its jobs run again on n2. When n1 comes back, its own health
    check stops the old copies; nothing of theirs reaches the records."""
    cluster = RigCluster(tmp_path / "nodes", {"n1": "1x80G", "n2": "1x80G"},
                         health={"check_interval": 1.0, "timeout": 3.0}, max_retries=2)
    n1, n2 = cluster["n1"], cluster["n2"]
    trace, go = tmp_path / "trace.txt", tmp_path / "go"
    try:
        n1.up()  # alone at first, so the jobs land on it
        body = TRACED.format(body=f"{GATE}; {DONE}")
        ids = [cluster.client.submit(body, gpu_memory="15G", env={"TRACE": str(trace), "GO": str(go)}).id
               for _ in range(2)]
        for jid in ids:
            n1.wait_for_state(jid, {JobState.RUNNING}, timeout=60)
        n2.up(beat=True)
        assert n1.kill(jobs=False) == []
        old = n1.job_processes()
        assert sorted({job for job, _ in old.values()}) == ids  # the old copies run on

        def rerun_on_n2() -> bool:
            jobs = cluster.client.store.get_many(ids)
            return all(j.state is JobState.RUNNING and j.node == "n2" and j.attempt == 2 and j.pid
                       for j in jobs)

        _wait(rerun_on_n2, 60, "n1's jobs to run again on n2")
        n1.up()
        _wait(lambda: not any(attempt == 1 for _, attempt in n1.job_processes().values()), 30,
              "n1's health check to stop the copies that were re-run elsewhere")
        assert rerun_on_n2()  # the old copies' endings changed nothing
        go.touch()
        finals = {jid: cluster.client.wait(jid, timeout=60) for jid in ids}
        assert all(j.state is JobState.SUCCEEDED and j.attempt == 2 for j in finals.values())
        assert [j.attempts[0]["outcome"] for j in finals.values()] == ["lost", "lost"]
        done = [line.split() for line in trace.read_text().splitlines() if line.endswith(" done")]
        assert sorted((int(jid), int(attempt)) for jid, attempt, _ in done) == [(jid, 2) for jid in ids]
        assert cluster.leaked_bytes() == 0 and not n1.job_processes()
    finally:
        cluster.cleanup()
