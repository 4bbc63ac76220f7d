"""`rig retry` gives a job its own retry policy again (--retries, its template's), never the
retrier's max_retries: a `--retries 0` job (not to be re-run by itself) was re-run three times
after its second `rig retry`, and a `--retries 5` one got only 2."""

from __future__ import annotations

import pytest

from rig.memory import GIB
from rig.models import JobState
from tests.store.test_ownership import ALICE, as_user, client, job_of  # noqa: F401 - the fixture
from workers.outcomes import AttemptEnd, decide


def _fails_for_good(client, job_id: int, attempt: int) -> None:  # noqa: F811 - the fixture's name
    """The job's attempt ``attempt`` ended and left it FAILED in the error queue."""
    client.store.r.hset(client.keys.job(job_id), "attempt", str(attempt))
    client.ledger.transition(job_id, JobState.FAILED, error_queue=True, fields={"reason": "boom"})


@pytest.mark.parametrize("own", [0, 1, 5])
def test_each_retry_gives_the_jobs_own_retries_again(client, monkeypatch, own):  # noqa: F811
    as_user(monkeypatch, ALICE)
    assert client.settings.max_retries == 2  # the retrier's default, which must not count
    job = job_of(client, "alice", max_retries=own)
    attempt = own + 1  # it spent its own retries, then failed for good
    for _ in range(3):  # a person retries it, again and again
        _fails_for_good(client, job.id, attempt)
        again = client.retry(job.id)
        assert again.state is JobState.PENDING and again.max_retries == attempt + own
        # what the card worker decides after each of the attempts the retry allows
        for extra in range(1, own + 2):
            running = client.get(job.id)
            running.attempt, running.state = attempt + extra, JobState.RUNNING
            d = decide(running, AttemptEnd(exit_code=3), 80 * GIB)
            last = extra == own + 1
            assert (d.state, d.error_queue) == ((JobState.FAILED, True) if last else (JobState.PENDING, False))
        attempt += own + 1


def test_show_says_the_jobs_own_retries_after_a_retry(client, monkeypatch):  # noqa: F811
    from rich.console import Console

    from rig.cli.render import render_job

    as_user(monkeypatch, ALICE)
    job = job_of(client, "alice", max_retries=0)
    _fails_for_good(client, job.id, 1)
    client.retry(job.id)
    console = Console(width=200, record=True)
    render_job(client.get(job.id), None, console)
    assert "up to 0 after each `rig retry` (1 in all so far)" in console.export_text()


def test_a_retry_may_give_a_new_time_limit(client, monkeypatch):  # noqa: F811
    from rig.errors import InvalidInput

    as_user(monkeypatch, ALICE)
    job = job_of(client, "alice", time_limit=60.0)
    _fails_for_good(client, job.id, 1)
    with pytest.raises(InvalidInput, match="time_limit is empty"):  # the API's words for the flag
        client.retry(job.id, time_limit="")
    with pytest.raises(InvalidInput, match="more than ten years"):
        client.retry(job.id, time_limit="4000d")
    assert client.store.in_error_queue(job.id)  # nothing changed
    assert client.retry(job.id, time_limit="4h").time_limit == 4 * 3600
    _fails_for_good(client, job.id, 2)
    assert client.retry(job.id).time_limit == 4 * 3600  # kept when not given


def test_a_new_time_limit_makes_the_jobs_own_estimate_again(client, monkeypatch):  # noqa: F811
    """Its estimate had been capped by the old limit: the forecast took the retried job for
    one that ends within it."""
    from rig import estimates

    as_user(monkeypatch, ALICE)
    job = job_of(client, "alice", time_limit=60.0, expected_seconds=60.0, cautious_seconds=60.0,
                 expected_source="name")
    pipe = client.r.pipeline()
    for seconds in (600.0, 600.0, 600.0, 900.0):
        estimates.record_run(pipe, client.keys, user="alice", name=job.name, template=None,
                             command=job.command, nbytes=GIB, gpus=1, seconds=seconds)
    pipe.execute()
    _fails_for_good(client, job.id, 1)
    again = client.retry(job.id, time_limit="2h")
    assert (again.expected_seconds, again.cautious_seconds) == (600.0, 900.0)
