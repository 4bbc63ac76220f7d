"""A card leaves the whitelist or the node while a job runs on it (issue 11, item 2), and the
smaller slips of item 7: a stale ending writes nothing, a wait names the stopped node, `rig
kill A B C` kills the known ids. fakeredis and real Redis (the CLI tests: real Redis only)."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.client import Client
from rig.config import load_settings
from rig.draining import (
    cards_to_serve,
    forget_if_idle,
    mark_gone_cards,
    needs_worker,
    send_back_unstarted,
    takes_new_jobs,
    worker_retired,
)
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NODE_STOPPED_REASON, NodeRegistry
from rig.pools import encode
from rig.waiting import why_waiting
from tests.store.conftest import add_cards
from workers.outcomes import AttemptEnd, conclude


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(4, 24, max_jobs=2)


def _job(ledger: Ledger, gib: float = 4, pool: str | None = None) -> int:
    return ledger.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=int(gib * GIB), gpus=1, pool=pool,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id


def _running(ledger: Ledger, card: int) -> Job:
    jid = _job(ledger)
    ok, token = ledger.reserve(jid, "n1", [card], 4 * GIB)
    assert ok
    assert ledger.claim(jid, token, "w")[0]
    return ledger.store.get(jid)


def _register(ledger: Ledger, allowed: set[int], present: int = 4) -> None:
    """What `rig up` does with a whitelist and ``present`` cards (rig.registration)."""
    add_cards(ledger, present, 24, max_jobs=2, allowed=allowed)
    mark_gone_cards(ledger.r, ledger.keys, "n1", range(present))


# -- which cards keep a worker ----------------------------------------------------------------------
def test_a_card_out_of_the_whitelist_with_a_running_job_keeps_its_worker(ledger):
    job = _running(ledger, 2)
    _register(ledger, allowed={0, 1})
    assert cards_to_serve(ledger.r, ledger.keys, "n1", [0, 1]) == [0, 1, 2]
    card = ledger.card("n1", 2)
    assert not card.allowed and needs_worker(card)  # a missing worker of it is a dead one
    assert card.refusal(GIB) == "not-allowed"  # nothing new is placed there
    assert not takes_new_jobs(ledger.r, ledger.keys, "n1", 2)
    assert ledger.holdings("n1", 2) == {job.id: 4 * GIB}  # still held for the running job
    # Once its job ends, the card needs no worker any more.
    conclude(ledger, ledger.store.get(job.id), str(job.assignments), AttemptEnd(exit_code=0))
    assert ledger.store.get(job.id).state is JobState.SUCCEEDED
    assert cards_to_serve(ledger.r, ledger.keys, "n1", [0, 1]) == [0, 1]
    assert not needs_worker(ledger.card("n1", 2))


def test_fewer_cards_marks_the_gone_ones_and_forgets_those_that_hold_nothing(ledger):
    job = _running(ledger, 3)
    _register(ledger, allowed={0, 1}, present=2)
    cards = {c.index: c for c in ledger.cards()}
    assert sorted(cards) == [0, 1, 3]  # card 2 held nothing: forgotten
    assert cards[3].gone and not cards[3].allowed and cards[3].refusal(GIB) == "not-allowed"
    assert cards_to_serve(ledger.r, ledger.keys, "n1", [0, 1]) == [0, 1, 3]
    assert not forget_if_idle(ledger.r, ledger.keys, "n1", 3)  # its job still runs
    conclude(ledger, ledger.store.get(job.id), str(job.assignments), AttemptEnd(exit_code=0))
    assert (ledger.card("n1", 3).reserved, ledger.card("n1", 3).jobs) == (0, 0)
    assert forget_if_idle(ledger.r, ledger.keys, "n1", 3)
    assert [c.index for c in ledger.cards()] == [0, 1]
    # The card comes back: registered afresh, not gone.
    _register(ledger, allowed={0, 1, 2, 3}, present=4)
    assert not any(c.gone for c in ledger.cards()) and all(c.allowed for c in ledger.cards())


def _measured(ledger: Ledger, index: int) -> None:
    ledger.record_reading("n1", GpuReading(index=index, uuid=f"u{index}", model="m", total=24 * GIB,
                                           used=10 * GIB, utilization=100, temperature=70))


def test_a_card_nobody_measures_any_more_shows_no_reading(ledger):
    """A breaker's finding: cards gone from the node, or left outside the whitelist once their
    worker retired, showed their last reading (10 GiB used, 100 %) in status and metrics for ever."""
    gone_job, closed_job = _running(ledger, 3), _running(ledger, 1)
    _measured(ledger, 3)
    _register(ledger, allowed={0, 1, 2}, present=3)  # card 3 gone, its job runs on
    gone = ledger.card("n1", 3)
    assert gone.gone and (gone.used, gone.utilization, gone.temperature) == (None, None, None)
    _register(ledger, allowed={0, 2}, present=3)  # card 1 out of the whitelist, its job runs on
    _measured(ledger, 1)  # its worker still measures it while it serves its job
    for job in (gone_job, closed_job):
        conclude(ledger, ledger.store.get(job.id), str(job.assignments), AttemptEnd(exit_code=0))
    for index in (1, 3):  # what rig up does once it stopped the drained card's worker
        worker_retired(ledger.r, ledger.keys, "n1", index)
    assert [c.index for c in ledger.cards()] == [0, 1, 2]  # the gone card left the ledger
    closed = ledger.card("n1", 1)
    assert not closed.allowed and (closed.used, closed.utilization, closed.temperature) == (None, None, None)


def test_a_job_placed_but_not_started_on_a_closed_card_goes_back_to_its_place(ledger):
    job = _running(ledger, 2)  # claimed by the card worker, not started yet
    _register(ledger, allowed={0, 1})
    assert send_back_unstarted(ledger, ledger.store.get(job.id), "n1", 2) == 1
    back = ledger.store.get(job.id)
    assert back.state is JobState.PENDING and back.attempt == 0 and back.attempts == []
    assert back.reason == "requeued: card n1/2 left gpu_whitelist before the job started"
    assert ledger.holdings("n1", 2) == {} and ledger.card("n1", 2).reserved == 0


# -- stale endings --------------------------------------------------------------------------------
@pytest.mark.parametrize("fresh", [False, True], ids=["old-read", "fresh-read"])
def test_a_stale_ending_writes_no_attempt_row_and_no_reason(ledger, fresh):
    """An old supervisor (or a late duplicate) ends attempt 1 after the job was requeued: with
    the same assignment number (not placed again yet) the token matched and the job, PENDING,
    got an attempt row "on None/" and its reason overwritten."""
    job = _running(ledger, 0)
    stale = ledger.store.get(job.id)
    assert ledger.transition(job.id, JobState.PENDING, token=str(job.assignments),
                             fields={"reason": "requeued: its worker stopped before starting it"})[0] == 1
    before = ledger.store.get(job.id)
    seen = before if fresh else stale
    code, _ = conclude(ledger, seen, str(job.assignments), AttemptEnd(exit_code=1, lost=True, note="late"))
    assert code != 1
    after = ledger.store.get(job.id)
    assert after.state is JobState.PENDING
    assert after.attempts == before.attempts == []
    assert after.reason == "requeued: its worker stopped before starting it"


# -- why a job waits ------------------------------------------------------------------------------
def test_a_wait_on_a_pool_whose_only_node_is_stopped_names_the_node(ledger, redis_client, key_prefix):
    """Its cards were closed by the node checks (node stopped) while the node's record still
    read as up: the reason was "no healthy allowed card is available"."""
    settings = load_settings(key_prefix=key_prefix, node_name="a")
    client = Client(settings, redis_client=redis_client)
    nodes = NodeRegistry(redis_client, ledger.keys)
    nodes.register("n1", ttl=30, backend="fake", cards=4, pools=encode({"p": ["n1"]}))  # the cluster's pools
    for i in range(4):
        ledger.set_healthy("n1", i, False, f"{NODE_STOPPED_REASON} at 12:01:05: its running jobs are "
                           "adopted when it returns")
    why = why_waiting(client, client.get(_job(ledger, pool="p")))
    assert "no healthy allowed card" not in why
    assert why.startswith("in pool 'p': needs 4.0 GiB on 1 card; no card takes jobs now "
                          "(node n1 is stopped since 12:01:05)"), why


def test_a_wait_names_each_closed_card(ledger, redis_client, key_prefix):
    settings = load_settings(key_prefix=key_prefix, node_name="a")
    client = Client(settings, redis_client=redis_client)
    _running(ledger, 3)
    _register(ledger, allowed={0}, present=4)
    _register(ledger, allowed={0}, present=4)
    ledger.set_healthy("n1", 0, False, "temperature 95 C > 90 C")
    _register(ledger, allowed={0}, present=3)
    why = why_waiting(client, client.get(_job(ledger)))
    assert ("n1/0: temperature 95 C > 90 C; n1/1: not in whitelist; n1/2: not in whitelist; "
            "n1/3: not on the node any more") in why, why


# -- rig kill A B C ---------------------------------------------------------------------------------
@pytest.fixture
def cli_ledger(cli_env, real_redis) -> Ledger:
    return Ledger(real_redis, Keys(cli_env))


@pytest.mark.redis
def test_kill_of_several_ids_kills_the_known_ones_and_names_each_unknown(cli_ledger):
    a, b = _job(cli_ledger), _job(cli_ledger)
    result = CliRunner().invoke(cli, ["kill", str(a), "987654", str(b), "987655"])
    assert result.exit_code == 4, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "rig: error: no job with id 987654; `rig jobs` lists the jobs that exist" in lines
    assert "rig: error: no job with id 987655; `rig jobs` lists the jobs that exist" in lines
    assert f"job {a} cancelled (was pending); it held no GPU memory" in lines
    assert f"job {b} cancelled (was pending); it held no GPU memory" in lines
    assert len(lines) == 4 and "Traceback" not in result.output
    assert {cli_ledger.store.get(j).state for j in (a, b)} == {JobState.CANCELLED}


@pytest.mark.redis
def test_kill_of_a_running_job_nobody_stops_is_one_line(cli_ledger, monkeypatch):
    """No card worker takes the request (its card lost its worker): one line and exit 1, never
    a TimeoutError traceback."""
    _register(cli_ledger, allowed={0, 1, 2, 3})
    job = _running(cli_ledger, 1)
    import rig.client

    monkeypatch.setattr(rig.client.Client, "wait", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("x")))
    result = CliRunner().invoke(cli, ["kill", str(job.id)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"rig: error: job {job.id}: kill requested, but it is still running on n1/1 after ")


@pytest.mark.redis
def test_kill_of_a_job_kept_running_by_a_stuck_process_says_so_at_once(cli_ledger, monkeypatch):
    """Its processes were stopped and one outlived SIGKILL (Job.stuck): another `rig kill` says
    so at once, without waiting out its 30 s (was: the wait, then 'is that node up?')."""
    _register(cli_ledger, allowed={0, 1, 2, 3})
    job = _running(cli_ledger, 1)
    cli_ledger.store.update(job.id, cancel_requested=True, stuck="pid 4242")
    import rig.client

    monkeypatch.setattr(rig.client.Client, "kill", lambda *a, **k: pytest.fail("waited for the kill"))
    result = CliRunner().invoke(cli, ["kill", str(job.id)])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"rig: error: job {job.id}: kill requested and carried out on n1/1, but pid 4242 outlived SIGKILL (stuck in "
        "the kernel: a GPU driver, a hung file system?); its cards stay reserved until it is gone")
