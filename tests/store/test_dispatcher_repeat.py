"""A pass that repeats the last one's decisions (Dispatcher._repeats: same inputs, clock before
the first moment a time rule could change a decision) leaves Redis exactly as a pass worked out
in full would: two copies of one randomized cluster under two key prefixes, one dispatcher
working every pass out in full, the other repeating where it may, the shared clock moving by
random steps (sub-second to minutes: aging, hold times, backfill budgets and margins, expected
ends and fair-share usage all move), jobs ending and arriving between passes. After every pass
every job's state, placement, stored wait reason, its stamp and held_at and held_cards marks are the
same."""
from __future__ import annotations

import math
import random

import pytest

from rig.clock import clock_for
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards, ledger_with_cards
from workers.dispatcher import Dispatcher

COMPARED = ("state", "node", "cards", "wait_reason", "wait_reason_at", "held_at", "held_cards", "last_held_cards",
            "assignments")
START = 1_900_000_000.0


class _Clock:
    """The shared clock every rig call of the test reads (epoch s), moved by the test."""

    def __init__(self) -> None:
        self.t = START


class _Copy:
    """One copy of the cluster: its ledger, its dispatcher and the starts it made."""

    def __init__(self, r, prefix: str, repeat: bool, settings_update: dict) -> None:
        self.keys = Keys(prefix)
        self.ledger = Ledger(r, self.keys)
        self.started: list[tuple[int, str, str, int]] = []
        settings = load_settings(key_prefix=prefix, node_name="n0", **settings_update)
        self.dispatcher = Dispatcher(settings, lambda *start: self.started.append(start), client=r)
        self.dispatcher.repeat_idle = repeat


def _job(rng: random.Random, now: float, nbytes: int, gpus: int = 1,
         estimates: tuple = (None, None, 40.0, 1800.0, 3600.0),
         limits: tuple = (None, None, 120.0, 3600.0, 7200.0)) -> Job:
    expected = rng.choice(estimates)
    return Job(id=0, name="j", user=rng.choice(["ann", "bob", "cy"]), command=["true"], gpu_memory=nbytes,
               gpus=gpus, priority=rng.choice(list(Priority)), state=JobState.PENDING, workdir="/tmp",
               created_at=now - rng.uniform(0, 900), time_limit=rng.choice(limits),
               expected_seconds=expected, cautious_seconds=None if expected is None else expected * 1.5)


def _apply(copies: list[_Copy], clock: _Clock, action) -> None:  # noqa: ANN001
    """Do the same thing to every copy (the same rng draws: the copies stay identical)."""
    for copy in copies:
        action(copy, clock)


def _state(r, copy: _Copy, last_id: int) -> list[tuple]:  # noqa: ANN001
    pipe = r.pipeline(transaction=False)
    for jid in range(1, last_id + 1):
        pipe.hmget(copy.keys.job(jid), COMPARED)
    return [tuple(values) for values in pipe.execute()]


@pytest.mark.parametrize(("seed", "outlive", "full_reads"),
                         [(seed, False, False) for seed in range(5)] + [(5, True, False), (6, True, False),
                                                                         (7, False, True), (8, True, True)])
def test_a_repeated_pass_leaves_redis_as_a_full_pass_does(redis_client, key_prefix, monkeypatch, seed, outlive,
                                                          full_reads):
    """``outlive``: running jobs run on past every estimate of theirs (their expected end moves
    in steps, rig.estimates.outlived_total), ended only by their time limit or at random.
    ``full_reads``: FULL_READ_S's full read falls before about a third of the passes (the repeat
    memo outlives it, Dispatcher._full_read)."""
    r = redis_client
    clock = _Clock()
    monkeypatch.setattr(type(clock_for(r)), "now", lambda self, refresh=True: clock.t)
    rng = random.Random(seed)
    update = {"hold_after_seconds": rng.choice([0.0, 30.0, 120.0]), "aging_seconds": rng.choice([300.0, 1800.0]),
              "backfill_estimate_delay_seconds": rng.choice([0.0, 45.0, 300.0]),
              "fair_share": rng.random() < 0.8, "kill_grace_seconds": 5.0}
    copies = [_Copy(r, f"{key_prefix}full:", False, update), _Copy(r, f"{key_prefix}repeat:", True, update)]
    repeated = []
    real = copies[1].dispatcher._repeats
    copies[1].dispatcher._repeats = lambda *a: repeated.append(real(*a)) or repeated[-1]

    # The cluster: 2 nodes x 3 cards of 40 GiB, each card with 1-2 running jobs begun at
    # different moments; then waiting jobs of mixed sizes, users, priorities, limits, estimates.
    layout = [(node, index, [rng.choice([6, 8, 12]) for _ in range(rng.randint(2, 3))],
               [rng.uniform(5, 700) for _ in range(3)]) for node in ("n0", "n1") for index in range(3)]
    seeds = rng.random()
    for copy in copies:
        local = random.Random(seeds)
        for node in ("n0", "n1"):
            add_cards(copy.ledger, 3, 40, node=node, max_jobs=5, uuid="u-{node}-{index}")
        for node, index, sizes, ages in layout:
            for size, age in zip(sizes, ages, strict=False):
                clock.t = START - age
                # Mostly within their estimates at first (an end that outlived every estimate
                # moves with the clock: no pass repeats then); they outlive them as time goes on.
                made = _job(local, clock.t, size * GIB, estimates=(None, 900.0, 1500.0, 3600.0),
                            limits=(None, 3600.0))
                job = copy.ledger.store.create_many([(made, None)])[0]
                ok, token = copy.ledger.reserve(job.id, node, [index], job.gpu_memory, user=job.user)
                assert ok, token
                copy.ledger.claim(job.id, token, f"card{index}@{node}")
        clock.t = START
        copy.ledger.store.create_many([(_job(local, clock.t, local.choice([4, 20, 30, 36]) * GIB,
                                             2 if local.random() < 0.2 else 1), None) for _ in range(14)])

    for step in range(60):
        clock.t += rng.choice([0.3, 1.0, 1.0, 4.0, 9.0, 31.0, 75.0])
        # Jobs end near their estimate and by their time limit, as they do (one that outlived
        # every estimate has an expected end that moves with the clock: no pass repeats then).
        for job in map(copies[0].ledger.store.get, sorted(copies[0].ledger.store.ids_in_state(JobState.RUNNING))):
            age = clock.t - (job.started_at or clock.t)
            if (job.expected_seconds and age > job.expected_seconds * 1.1 and not outlive) \
                    or (job.time_limit and age > job.time_limit):
                _apply(copies, clock, lambda c, _clk, j=job.id: c.ledger.transition(j, JobState.SUCCEEDED))
        event = rng.random()
        if event < 0.12:  # a running job ends
            running = copies[0].ledger.store.ids_in_state(JobState.RUNNING)
            if running:
                gone = rng.choice(sorted(running))
                _apply(copies, clock, lambda c, _clk, j=gone: c.ledger.transition(j, JobState.SUCCEEDED))
        elif event < 0.24:  # a job arrives
            drawn = rng.random()
            _apply(copies, clock, lambda c, clk, d=drawn: c.ledger.store.create_many(
                [(_job(random.Random(d), clk.t, (6 + int(d * 30)) * GIB), None)]))
        if full_reads and rng.random() < 0.35:
            for copy in copies:
                copy.dispatcher._full_read_at = -math.inf
        results = [copy.dispatcher.dispatch_pass() for copy in copies]
        assert results[0] == results[1], (step, results)
        assert [s[0] for s in copies[0].started] == [s[0] for s in copies[1].started], step
        for copy in copies:  # what a card worker does with each start: the job runs
            for job_id, token, node, card in copy.started:
                copy.ledger.claim(job_id, token, f"card{card}@{node}")
            copy.started.clear()
        last_id = _last_id(copies[0])
        full, repeat = _state(r, copies[0], last_id), _state(r, copies[1], last_id)
        for a, b in zip(full, repeat, strict=True):
            if a != b:
                print("DIFF", step, a, b, sep="\n")
            assert a == b, (seed, step)
    assert any(repeated), "no pass was repeated: the comparison proved nothing"


def _last_id(copy: _Copy) -> int:
    ids = [jid for state in JobState for jid in copy.ledger.store.ids_in_state(state)]
    return max(ids, default=0)


@pytest.mark.parametrize("repeat", [False, True])
def test_a_blocked_jobs_reason_is_the_run_order_loops_and_stays_put(redis_client, key_prefix, repeat):
    """A job past its hold time is worded twice in a round: by the loop that plans holds (no
    jobs ahead counted) and by the run-order loop (its place). The later one is its reason, every
    pass: it used to alternate between the two (the first written whenever the second was
    already stored)."""
    ledger = ledger_with_cards(redis_client, key_prefix, 2, 40, max_jobs=2)
    dispatcher = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n1", hold_after_seconds=0),
                            lambda *a: None, client=redis_client)
    dispatcher.repeat_idle = repeat
    rng = random.Random(1)

    def make(gib: int, priority: Priority, expected: float | None = None) -> int:
        job = _job(rng, 1_000.0, gib * GIB, estimates=(expected,), limits=(None,))
        job.priority, job.user, job.created_at = priority, "ann", 0.0
        return ledger.store.create_many([(job, None)])[0].id

    for index in range(2):
        running = make(30, Priority.MEDIUM, 600.0)
        ok, token = ledger.reserve(running, "n1", [index], 30 * GIB, user="ann")
        assert ok, token
        ledger.claim(running, token, f"card{index}@n1")
    make(36, Priority.HIGH)
    second = make(36, Priority.MEDIUM)
    reasons = []
    for _ in range(4):
        assert dispatcher.dispatch_pass() == 0
        reasons.append(ledger.store.get(second).wait_reason)
    assert "1 job(s) ahead of it" in reasons[-1], reasons
    assert len(set(reasons[1:])) == 1, reasons
