"""The starting round's shortcuts (Dispatcher.shortcuts: a request that found no cards in a round
is not placed again with the same closed held cards; a start's cards found by position; hold
plan options carried from round to round by HoldPlanner's memo) decide
as the plain round does: two copies of one randomized cluster under two key prefixes, one
dispatcher with the shortcuts, one without, through passes where jobs end (so several start in a
round, behind holds: hold_after_seconds 0 for some seeds, every blocked job holds) and arrive.
After every pass every job's state, placement, stored reason and held_at mark are the same, and
the shortcut copy called place fewer times at least once and worked out fewer hold plan options
(rig.placement.fit_time) at least once (else the comparison proved nothing)."""
from __future__ import annotations

import random

import pytest

import rig.placement as placement_module
import workers.dispatcher as dispatcher_module
from rig import estimates
from rig.clock import clock_for
from rig.gpus.base import GpuReading
from rig.memory import GIB
from rig.models import JobState
from tests.store.test_dispatcher_repeat import START, _apply, _Clock, _Copy, _job, _last_id, _state


def _record_runs(copy, ended_at: float, made: list[tuple[str, int, float]]) -> None:  # noqa: ANN001
    """Record runs (user, bytes per card, seconds) ended at ``ended_at`` in ``copy``'s recent runs."""
    pipe = copy.ledger.r.pipeline()
    for user, nbytes, seconds in made:
        estimates.record_run(pipe, copy.keys, user=user, name="r", template=None, command=["true"],
                             nbytes=nbytes, gpus=1, seconds=seconds, ended_at=ended_at)
    pipe.execute()


@pytest.mark.parametrize(("seed", "with_runs"), [*((s, False) for s in range(6)), *((s, True) for s in range(3))])
def test_the_round_s_shortcuts_decide_as_the_plain_round(redis_client, key_prefix, monkeypatch, seed, with_runs):
    """``with_runs``: new recent runs arrive between passes too, so placed jobs' estimate entries
    are kept or made again (Dispatcher._read_holdings) while jobs start and end around them."""
    r = redis_client
    clock = _Clock()
    monkeypatch.setattr(type(clock_for(r)), "now", lambda self, refresh=True: clock.t)
    calls = {"place": 0}
    real_place = dispatcher_module.place

    def counted_place(*a, **kw):  # noqa: ANN002, ANN003
        calls["place"] += 1
        return real_place(*a, **kw)

    monkeypatch.setattr(dispatcher_module, "place", counted_place)
    real_fit_time = placement_module.fit_time

    def counted_fit_time(*a, **kw):  # noqa: ANN002, ANN003
        calls["fit_time"] += 1
        return real_fit_time(*a, **kw)

    monkeypatch.setattr(placement_module, "fit_time", counted_fit_time)
    rng = random.Random(seed)
    update = {"hold_after_seconds": rng.choice([0.0, 0.0, 60.0]), "aging_seconds": 1800.0,
              "backfill_estimate_delay_seconds": rng.choice([0.0, 300.0]),
              "fair_share": rng.random() < 0.7, "kill_grace_seconds": 5.0}
    copies = [_Copy(r, f"{key_prefix}plain:", False, update), _Copy(r, f"{key_prefix}short:", False, update)]
    copies[0].dispatcher.shortcuts = False
    nodes = ("n0", "n1", "n2")
    seeds = rng.random()
    for copy in copies:
        local = random.Random(seeds)
        for node in nodes:
            for index in range(4):
                copy.ledger.register_card(node, GpuReading(index, f"u-{node}-{index}", "m", 40 * GIB),
                                          max_jobs=local.choice([3, 5]), reserve_fraction=0.0, allowed=True,
                                          fake=True)
        for node in nodes:
            for index in range(4):
                for size in [local.choice([6, 10, 14]) for _ in range(local.randint(1, 3))]:
                    clock.t = START - local.uniform(5, 900)
                    made = _job(local, clock.t, size * GIB, estimates=(None, 900.0, 1500.0, 3600.0),
                                limits=(None, 3600.0))
                    job = copy.ledger.store.create_many([(made, None)])[0]
                    ok, token = copy.ledger.reserve(job.id, node, [index], job.gpu_memory, user=job.user)
                    if ok:
                        copy.ledger.claim(job.id, token, f"card{index}@{node}")
                    else:
                        copy.ledger.transition(job.id, JobState.FAILED)
        clock.t = START
        copy.ledger.store.create_many([(_job(local, clock.t, local.choice([4, 8, 12, 20, 30, 36]) * GIB,
                                             local.choice([1, 1, 1, 2, 3])), None) for _ in range(40)])

    fewer = carried = False
    kept_across = 0  # estimate entries the shortcut copy kept across a new Prior
    runs = random.Random(seed + 1000)  # new recent runs (its own draws: the cluster's stay as they were)
    for step in range(25):
        clock.t += rng.choice([1.0, 9.0, 31.0, 75.0])
        if with_runs and runs.random() < 0.5:  # placed jobs' estimates kept or made again (Dispatcher._read_holdings)
            made = [(runs.choice(["ann", "bob", "cy"]), runs.choice([6, 10, 14]) * GIB,
                     runs.choice([30.0, 900.0, 3600.0])) for _ in range(runs.choice([1, 3, 12]))]
            _apply(copies, clock, lambda c, clk, m=made: _record_runs(c, clk.t, m))
        running = sorted(copies[0].ledger.store.ids_in_state(JobState.RUNNING))
        for gone in rng.sample(running, min(len(running), rng.choice([0, 2, 4, 6]))):  # several end at once
            _apply(copies, clock, lambda c, _clk, j=gone: c.ledger.transition(j, JobState.SUCCEEDED))
        if rng.random() < 0.3:  # a job arrives
            drawn = rng.random()
            _apply(copies, clock, lambda c, clk, d=drawn: c.ledger.store.create_many(
                [(_job(random.Random(d), clk.t, (4 + int(d * 30)) * GIB), None)]))
        results, placed, options = [], [], []
        short = copies[1].dispatcher
        prior, entries = short._prior, dict(short._running_estimates)
        for copy in copies:
            calls["place"] = calls["fit_time"] = 0
            results.append(copy.dispatcher.dispatch_pass())
            placed.append(calls["place"])
            options.append(calls["fit_time"])
        if short._prior is not prior:
            kept_across += sum(entry is entries.get(jid) for jid, entry in short._running_estimates.items())
        fewer = fewer or placed[1] < placed[0]
        carried = carried or options[1] < options[0]
        assert results[0] == results[1], (step, results)
        assert [s[0] for s in copies[0].started] == [s[0] for s in copies[1].started], step
        for copy in copies:
            for job_id, token, node, card in copy.started:
                copy.ledger.claim(job_id, token, f"card{card}@{node}")
            copy.started.clear()
        last_id = _last_id(copies[0])
        assert _state(r, copies[0], last_id) == _state(r, copies[1], last_id), (seed, step)
    if with_runs:
        assert kept_across, "no estimate entry was kept across new recent runs: the comparison proved nothing"
        return
    assert fewer, "the shortcut never skipped a place: the comparison proved nothing"
    assert carried, "no hold plan option came from an earlier round: the comparison proved nothing"


@pytest.mark.parametrize("seed", range(4))
def test_placed_jobs_ends_after_new_recent_runs_are_the_plain_rounds(redis_client, key_prefix, monkeypatch, seed):
    """New recent runs (a new estimates.Prior) keep a placed job's estimate entry, and so the ends
    worked out from it, only where they leave its estimate equal: after every change of the recent
    runs, the releases and fair share _read_holdings gives equal those of a dispatcher without the
    shortcuts reading the same cluster, and some entries were kept and some made again (else the
    comparison proved nothing)."""
    r = redis_client
    clock = _Clock()
    monkeypatch.setattr(type(clock_for(r)), "now", lambda self, refresh=True: clock.t)
    rng = random.Random(seed)
    copy = _Copy(r, key_prefix, False, {"kill_grace_seconds": 5.0})
    plain = _Copy(r, key_prefix, False, {"kill_grace_seconds": 5.0}).dispatcher
    plain.shortcuts = False
    ledger = copy.ledger
    for node in ("n0", "n1"):
        for index in range(4):
            ledger.register_card(node, GpuReading(index, f"u-{node}-{index}", "m", 40 * GIB), max_jobs=5,
                                 reserve_fraction=0.0, allowed=True, fake=True)
            for size in [rng.choice([6, 10, 14]) for _ in range(rng.randint(1, 3))]:
                clock.t = START - rng.uniform(5, 900)
                job = ledger.store.create_many([(_job(rng, clock.t, size * GIB), None)])[0]
                ok, token = ledger.reserve(job.id, node, [index], job.gpu_memory, user=job.user)
                assert ok, token
                ledger.claim(job.id, token, f"card{index}@{node}")
    clock.t = START
    kept = remade = 0
    for step in range(12):
        pipe = r.pipeline()
        for _ in range(rng.choice([1, 3, 12])):  # runs of one size: the other sizes' estimates stay
            estimates.record_run(pipe, copy.keys, user=rng.choice(["ann", "bob", "cy"]), name="r", template=None,
                                 command=["true"], nbytes=rng.choice([6, 14]) * GIB, gpus=1,
                                 seconds=rng.choice([30.0, 300.0, 3000.0]), ended_at=clock.t)
        pipe.execute()
        clock.t += rng.choice([0.0, 1.0, 40.0])
        before = dict(copy.dispatcher._running_estimates)
        answers = []
        for dispatcher in (copy.dispatcher, plain):
            releases, team = dispatcher._read_holdings(dispatcher._read_cards(), clock.t)
            answers.append((releases, {user: vars(load) for user, load in team.loads.items()}))
        assert answers[0] == answers[1], (seed, step)
        if step:
            for jid, entry in copy.dispatcher._running_estimates.items():
                kept += entry is before.get(jid)
                remade += entry is not before.get(jid)
    assert kept and remade, (kept, remade)
