"""`rig log` / `rig log -f` over a job that fails once and is retried (issue 10, item 6): a
scripted record (each read is the next moment of the job's life) and real files. No Redis."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rig.cli.logview import show_log
from rig.errors import InvalidInput, LogMissing
from rig.memory import GIB
from rig.models import Job, JobState, Priority


def _job(**fields) -> Job:  # noqa: ANN003
    base = dict(id=12, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=time.time())
    return Job(**{**base, **fields})


class Life:
    """The job's moments in order; every read (``get``) moves one on, after running that
    moment's action (a worker writing its log). The last moment repeats."""

    def __init__(self, moments: list[tuple[Callable[[], None] | None, Job]]) -> None:
        self.moments = moments
        self.i = -1

    def get(self) -> Job:
        self.i = min(self.i + 1, len(self.moments) - 1)
        action, job = self.moments[self.i]
        if action:
            action()
        return job


def _retried_life(tmp: Path) -> tuple[Life, Path, Path]:
    a1, a2 = tmp / "attempt-1.log", tmp / "attempt-2.log"
    first_ended = {"attempt": 1, "node": "n1", "cards": [0], "outcome": "failed"}

    def write(path: Path, text: str) -> Callable[[], None]:
        return lambda: path.open("a").write(text)

    life = Life([
        (None, _job(state=JobState.RUNNING, node="n1", cards=[0], attempt=1, log_paths=[str(a1)])),
        (write(a1, "one\n"), _job(state=JobState.RUNNING, node="n1", cards=[0], attempt=1, log_paths=[str(a1)])),
        (write(a1, "boom\n"), _job(state=JobState.PENDING, attempt=1, log_paths=[str(a1)], attempts=[first_ended])),
        (None, _job(state=JobState.PENDING, attempt=1, log_paths=[str(a1)], attempts=[first_ended])),
        (None, _job(state=JobState.RUNNING, node="n2", cards=[3], attempt=2, log_paths=[str(a1), str(a2)],
                    attempts=[first_ended])),
        (write(a2, "two\n"), _job(state=JobState.RUNNING, node="n2", cards=[3], attempt=2,
                                  log_paths=[str(a1), str(a2)], attempts=[first_ended])),
        (write(a2, "done\n"), _job(state=JobState.SUCCEEDED, node="n2", cards=[3], attempt=2, exit_code=0,
                                   log_paths=[str(a1), str(a2)], attempts=[first_ended])),
    ])
    a1.write_text("")
    return life, a1, a2


def test_follow_goes_on_through_the_retry_until_the_job_is_final(tmp_path):
    """It stopped after attempt 1 while attempt 2 was starting."""
    life, _, _ = _retried_life(tmp_path)
    out, said = io.BytesIO(), []
    show_log(life.get, attempt=None, follow=True, out=out, say=said.append, sleep=lambda s: None)
    assert out.getvalue() == b"one\nboom\ntwo\ndone\n"  # stdout: the job's output alone
    assert said == ["--- job 12, attempt 1 (n1/0) ---", "--- job 12, attempt 2 (n2/3) ---",
                    "--- job 12 SUCCEEDED after 2 attempt(s) ---"]


def test_without_follow_it_says_which_attempt_it_shows(tmp_path):
    life, a1, a2 = _retried_life(tmp_path)
    a1.write_text("one\n")
    a2.write_text("two\n")
    final = life.moments[-1][1]
    out, said = io.BytesIO(), []
    show_log(lambda: final, attempt=None, follow=False, out=out, say=said.append)
    assert out.getvalue() == b"two\n" and said == ["--- job 12, attempt 2 of 2 (n2/3) ---"]
    out, said = io.BytesIO(), []
    show_log(lambda: final, attempt=1, follow=False, out=out, say=said.append)
    assert out.getvalue() == b"one\n" and said == ["--- job 12, attempt 1 of 2 (n1/0) ---"]


def test_follow_of_one_named_attempt_stops_when_it_ends(tmp_path):
    life, _, _ = _retried_life(tmp_path)
    out, said = io.BytesIO(), []
    show_log(life.get, attempt=1, follow=True, out=out, say=said.append, sleep=lambda s: None)
    assert out.getvalue() == b"one\nboom\n" and said == ["--- job 12, attempt 1 (n1/0) ---"]


def test_a_job_cancelled_before_it_started_has_no_log():
    life = Life([(None, _job()), (None, _job(state=JobState.CANCELLED))])
    with pytest.raises(InvalidInput, match="ended CANCELLED before it started"):
        show_log(life.get, attempt=None, follow=True, out=io.BytesIO(), say=print, sleep=lambda s: None)
    with pytest.raises(InvalidInput, match="no log yet"):
        show_log(lambda: _job(), attempt=None, follow=False, out=io.BytesIO(), say=print)
    # Without -f the same (a tester's finding: it said "no log yet; `rig log -f` waits for it",
    # and -f then answered at once that there would be none).
    with pytest.raises(InvalidInput, match="ended CANCELLED before it started; no log$"):
        show_log(lambda: _job(state=JobState.CANCELLED), attempt=None, follow=False, out=io.BytesIO(), say=print)


def test_an_attempt_on_another_node_is_named_and_skipped(tmp_path):
    elsewhere = str(tmp_path / "not-here" / "attempt-1.log")
    here = tmp_path / "attempt-2.log"
    here.write_text("two\n")
    ended = {"attempt": 1, "node": "b", "cards": [1], "outcome": "failed"}
    job = _job(state=JobState.FAILED, attempt=2, node="a", cards=[0], log_paths=[elsewhere, str(here)],
               attempts=[ended, {"attempt": 2, "node": "a", "cards": [0]}], reason="exit 1")
    out, said = io.BytesIO(), []
    # The attempt asked for left no log here: -f ends as `rig log` without it does (exit 1).
    with pytest.raises(LogMissing, match="is not on this machine .*b/1"):
        show_log(lambda: job, attempt=1, follow=True, out=out, say=said.append, sleep=lambda s: None)
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=None, follow=True, out=out, say=said.append, sleep=lambda s: None)
    assert out.getvalue() == b"two\n" and said[-1] == "--- job 12 FAILED after 2 attempt(s): exit 1 ---"


def test_follow_of_a_waiting_job_says_why_at_once(tmp_path):
    """`rig log -f` on a PENDING job waited silently: it says why the job waits, first thing,
    and again when a retry puts the job back in the queue."""
    life, _, _ = _retried_life(tmp_path)
    life.moments.insert(0, (None, _job(state=JobState.PENDING)))
    out, said = io.BytesIO(), []
    asked: list[int] = []

    def why(job: Job) -> str:
        asked.append(job.id)
        return "no rig node is up (\x1b]0;x)"

    show_log(life.get, attempt=None, follow=True, out=out, say=said.append, sleep=lambda s: None, why=why)
    assert said[0] == "--- job 12 is waiting: no rig node is up (\\x1b]0;x) ---", said
    assert said[1] == "--- job 12, attempt 1 (n1/0) ---"
    assert said.count("--- job 12 is waiting: no rig node is up (\\x1b]0;x) ---") == 2, said
    assert out.getvalue() == b"one\nboom\ntwo\ndone\n"


def test_a_wait_that_cannot_be_explained_does_not_stop_following():
    life = Life([(None, _job()), (None, _job(state=JobState.CANCELLED))])

    def broken(job: Job) -> str:
        raise ConnectionError("redis went away")

    said: list[str] = []
    with pytest.raises(InvalidInput, match="ended CANCELLED before it started"):
        show_log(life.get, attempt=None, follow=True, out=io.BytesIO(), say=said.append,
                 sleep=lambda s: None, why=broken)
    assert said == ["--- job 12 is waiting: in the queue (why could not be read: redis went away) ---"]


def test_follow_reads_only_the_job_it_began_with(tmp_path):
    """Breaker: `rig log -f 152` while Redis was flushed said "no job with id 152" (exit 4) of
    a job still running; and once the id was given again it would have followed the new job."""
    import fakeredis

    from rig.cli.logview import followed
    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import JobGone

    r = fakeredis.FakeRedis(decode_responses=True)
    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"), redis_client=r)
    first = client.submit(["true"], gpu_memory="1G")
    assert followed(client, first.id, first.instance).id == first.id
    for key in r.keys("t:*"):
        r.delete(key)  # what FLUSHALL does to it
    with pytest.raises(JobGone, match=f"job {first.id} is gone: its record vanished from rig's Redis while it was followed"):
        followed(client, first.id, first.instance)
    again = client.submit(["true"], gpu_memory="1G")
    assert again.id == first.id and again.instance != first.instance
    with pytest.raises(JobGone, match="now belongs to another job"):
        followed(client, first.id, first.instance)
