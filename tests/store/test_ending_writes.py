"""An ending's writes ride with its transition (issue 13, item 2.3): the run's history (peak,
duration) and the dispatcher's wake-up are done by transition.lua in the step that ends the
job, with no round trip of their own, and only when that step moved it. fakeredis and real
Redis."""

from __future__ import annotations

import time

import pytest

from rig import estimates
from rig.ledger import Ledger, Writes
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.outcomes import AttemptEnd, conclude


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(1, 24)


def _running(ledger: Ledger) -> Job:
    jid = ledger.store.create(Job(
        id=0, name="train", user="u", command=["python", "t.py"], gpu_memory=4 * GIB, gpus=1,
        priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())).id
    ok, token = ledger.reserve(jid, "n1", [0], 4 * GIB)
    assert ok and ledger.claim(jid, token, "w")[0]
    ledger.store.update(jid, vram_peak=3 * GIB)
    return ledger.store.get(jid)


def _written(ledger: Ledger, job: Job) -> dict:
    r, keys = ledger.r, ledger.keys
    return {
        "peaks": (r.hget(keys.peaks(job.user), job.name) or "").split(),
        "durations": (r.hget(keys.durations_of_names(job.user), job.name) or "").split(),
        "commands": r.hlen(keys.durations_of_commands(job.user)),
        "recent": r.llen(keys.recent_runtimes(job.user)),
        "wake": r.llen(keys.sched_wake),
    }


def test_a_success_writes_its_history_and_wakes_the_dispatcher_in_one_round_trip(ledger, monkeypatch):
    job = _running(ledger)
    ledger.r.delete(ledger.keys.sched_wake)
    ledger.load_scripts()  # as a card worker has them: no NOSCRIPT on the way
    sent: list[str] = []
    real = type(ledger.r).execute_command

    def counting(self, *args, **options):  # noqa: ANN001, ANN202
        sent.append(str(args[0]))
        return real(self, *args, **options)

    monkeypatch.setattr(type(ledger.r), "execute_command", counting)
    monkeypatch.setattr(type(ledger.r), "pipeline", lambda *_a, **_k: pytest.fail("a round trip of its own"))
    code, state = conclude(ledger, job, str(job.assignments), AttemptEnd(exit_code=0, ended_at=time.time(), runtime=75.0))
    monkeypatch.undo()
    assert (code, state) == (1, JobState.SUCCEEDED)
    assert sent == ["EVALSHA"]  # the transition alone
    written = _written(ledger, job)
    assert written == {"peaks": [str(3 * GIB)], "durations": ["75.0"], "commands": 1, "recent": 1, "wake": 1}
    # The same rule as the script of its own (bounded_runs.lua through lib_runs.lua).
    assert ledger.r.hget(ledger.keys.durations_of_commands(job.user), estimates.command_digest(job.command)) == "75.0"
    for kept in (ledger.keys.durations_of_names(job.user), ledger.keys.peaks_seen(job.user)):
        assert 0 < ledger.r.ttl(kept) <= estimates.OWN_KEYS_TTL_S
    assert ledger.card("n1", 0).reserved == 0


def test_an_ending_that_does_not_move_the_job_writes_nothing(ledger):
    """A stale ending (another assignment now) writes no history and wakes no one."""
    job = _running(ledger)
    ledger.r.delete(ledger.keys.sched_wake)
    code, _ = conclude(ledger, job, "999", AttemptEnd(exit_code=0, ended_at=time.time(), runtime=75.0))
    assert code != 1
    assert ledger.store.get(job.id).state is JobState.RUNNING
    assert _written(ledger, job) == {"peaks": [], "durations": [], "commands": 0, "recent": 0, "wake": 0}


def test_a_failed_attempt_records_no_run_time_but_wakes_the_dispatcher(ledger):
    job = _running(ledger)
    ledger.r.delete(ledger.keys.sched_wake)
    code, state = conclude(ledger, job, str(job.assignments), AttemptEnd(exit_code=1, ended_at=time.time(), runtime=5.0))
    assert code == 1 and state in (JobState.PENDING, JobState.FAILED)
    assert _written(ledger, job) == {"peaks": [], "durations": [], "commands": 0, "recent": 0, "wake": 1}


def test_writes_carry_only_what_a_script_can_do():
    writes = Writes()
    writes.lpush("a", 1.5).expire("a", 10).zadd("z", {"m": 2.25})
    assert writes.keys == ["a", "a", "z"]
    assert writes.ops == [["LPUSH", 1, 1, "1.5"], ["EXPIRE", 1, 2, "10"], ["ZADD", 1, 3, "2.25", "m"]]
    with pytest.raises(ValueError, match="cannot be done"):
        writes.eval("return 1", 0)
    with pytest.raises(ValueError, match="cannot be done"):
        writes.rename("a", "b")
