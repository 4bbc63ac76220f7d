"""`rig log -f` through a log deleted while its job runs: the card's keeper makes the file again
(rig.logkeeper.LogCopy, with a line saying so) and the follower must go on in the new file from
its start, saying so once on stderr, instead of following the deleted one for ever (a tester's
finding: it showed nothing more). Real files, the real keeper's copy, a scripted job record;
each poll's sleep is where the test's next moment happens, so nothing waits on the clock."""

from __future__ import annotations

import io
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rig import logkeeper
from rig.cli import logview
from rig.cli.logview import show_log
from rig.logkeeper import LogCopy
from rig.memory import GIB
from rig.models import Job, JobState, Priority

MADE_AGAIN = "was deleted and made again"


def _job(log: Path, state: JobState) -> Job:
    return Job(id=7, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
               state=state, workdir="/", created_at=time.time(), node="n1", cards=[0], attempt=1,
               log_paths=[str(log)], exit_code=0 if state is JobState.SUCCEEDED else None)


class Keeper:
    """The card's keeper of one log, the real LogCopy, fed numbered lines."""

    def __init__(self, log: Path) -> None:
        log.parent.mkdir(parents=True)
        self.copy = LogCopy(log, 1 << 20)
        self.n = 0

    def write(self, lines: int) -> None:
        for _ in range(lines):
            self.copy.feed(b"line %d\n" % self.n)
            self.n += 1

    def looks_at_once(self, yes: bool) -> None:
        """Whether its next output checks whether the log was unlinked (else: not yet, as
        within UNLINK_CHECK_S of its last look)."""
        self.copy._check_at = 0.0 if yes else float("inf")


def _follow(log: Path, moments: list[Callable[[], None] | None], final_at: int,
            lost_opens: frozenset[int] = frozenset()) -> tuple[str, list[str], dict]:
    """Follow the job: before poll i, ``moments[i]`` runs; the record says SUCCEEDED from
    ``final_at`` on; the opens numbered in ``lost_opens`` (1 first) find the file gone.
    Returns (stdout, rig's lines, counts of polls, sleeps and opens)."""
    counts = {"gets": 0, "sleeps": 0, "opens": 0}

    def get() -> Job:
        i = counts["gets"]
        counts["gets"] += 1
        if i < len(moments) and moments[i] is not None:
            moments[i]()
        return _job(log, JobState.SUCCEEDED if i >= final_at else JobState.RUNNING)

    def sleep(seconds: float) -> None:
        assert seconds > 0
        counts["sleeps"] += 1
        assert counts["sleeps"] < 100, "the follower does not end"

    def open_log(path: str):  # noqa: ANN202
        counts["opens"] += 1
        if counts["opens"] in lost_opens:
            raise FileNotFoundError(path)  # deleted again between the follower's look and its open
        return open(path, "rb")  # noqa: SIM115 - show_log closes it

    out, said = io.BytesIO(), []
    show_log(get, attempt=None, follow=True, out=out, say=said.append, sleep=sleep, open_log=open_log)
    return out.getvalue().decode(), said, counts


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line (\d+)$", text, re.M)]


def test_a_log_deleted_and_made_again_is_followed_in_the_new_file_from_its_start(tmp_path):
    log = tmp_path / "jobs" / "7" / "attempt-1.log"
    keeper = Keeper(log)
    keeper.write(10)

    def delete_folder() -> None:
        shutil.rmtree(log.parent)
        keeper.looks_at_once(False)
        keeper.write(5)  # before the keeper looks: into the deleted file (the follower reads it)

    def made_again() -> None:
        keeper.looks_at_once(True)
        keeper.write(10)  # the keeper makes the log again; several lines before the next poll
        assert log.exists() and MADE_AGAIN not in log.read_text()

    idle = [None] * 6  # polls with nothing new: no reopen, no second line, each poll sleeps
    moments = [None, lambda: keeper.write(10), delete_folder, made_again, *idle, lambda: keeper.write(10)]
    text, said, counts = _follow(log, moments, final_at=len(moments) - 1)

    assert _numbers(text) == list(range(keeper.n))  # every line once, in order: the new file's first too
    assert text.count("[rig: this log was deleted") == 1  # the keeper's line, from the new file
    assert sum(MADE_AGAIN in line for line in said) == 1
    assert f"job 7, attempt 1: its log {log} {MADE_AGAIN}" in "".join(said)
    assert counts["opens"] == 2  # the first file, then the new one: once
    assert counts["sleeps"] == counts["gets"] - 1  # never a poll without its sleep (no spin)
    assert said[-1] == "--- job 7 SUCCEEDED after 1 attempt(s) ---"
    keeper.copy.close()


def test_a_log_made_again_as_the_job_ends_is_printed_to_its_end(tmp_path):
    """The record is final at the same poll the follower could first see the new file: its
    last look still goes on in the new file."""
    log = tmp_path / "jobs" / "7" / "attempt-1.log"
    keeper = Keeper(log)
    keeper.write(3)

    def deleted_made_again_and_ended() -> None:
        log.unlink()
        keeper.looks_at_once(True)
        keeper.write(4)

    text, said, counts = _follow(log, [None, deleted_made_again_and_ended], final_at=1)
    assert _numbers(text) == list(range(7))
    assert sum(MADE_AGAIN in line for line in said) == 1 and counts["opens"] == 2
    keeper.copy.close()


def test_a_log_gone_again_as_it_is_reopened_is_opened_at_the_next_poll(tmp_path, monkeypatch):
    """The new file vanishes between the follower's look and its open: the next poll opens it
    (from its start); the log is never said to be on another machine."""
    log = tmp_path / "jobs" / "7" / "attempt-1.log"
    keeper = Keeper(log)
    keeper.write(3)

    def made_again() -> None:
        log.unlink()
        keeper.looks_at_once(True)
        keeper.write(3)

    monkeypatch.setattr(logview, "MISSING_SAY_S", 0.0)  # a log missing that long is said to be elsewhere
    moments = [None, made_again, None, lambda: keeper.write(2)]
    text, said, counts = _follow(log, moments, final_at=len(moments) - 1, lost_opens=frozenset({2}))
    assert _numbers(text) == list(range(8))
    assert sum(MADE_AGAIN in line for line in said) == 1 and counts["opens"] == 3
    assert not [line for line in said if "waiting for" in line or "left no log" in line], said
    keeper.copy.close()


def test_a_deleted_log_not_made_again_yet_is_read_on(tmp_path):
    """Deleted, but the keeper has not looked yet: it still writes into the old file, which the
    follower reads on; nothing is said, nothing reopened."""
    log = tmp_path / "jobs" / "7" / "attempt-1.log"
    keeper = Keeper(log)
    keeper.write(3)

    def deleted() -> None:
        log.unlink()
        keeper.looks_at_once(False)
        keeper.write(3)

    text, said, counts = _follow(log, [None, deleted, None, lambda: keeper.write(2)], final_at=3)
    assert _numbers(text) == list(range(8))
    assert not any(MADE_AGAIN in line for line in said) and counts["opens"] == 1
    keeper.copy.close()


def test_a_log_renamed_away_is_followed_where_its_keeper_writes(tmp_path):
    """`mv attempt-1.log elsewhere; touch attempt-1.log`: the old file still has a name, so the
    keeper writes on into it, and the follower stays with it rather than the empty new file."""
    log = tmp_path / "jobs" / "7" / "attempt-1.log"
    keeper = Keeper(log)
    keeper.write(3)

    def renamed() -> None:
        log.rename(log.with_name("kept.log"))
        log.touch()
        keeper.looks_at_once(True)
        keeper.write(3)

    text, said, counts = _follow(log, [None, renamed, lambda: keeper.write(2)], final_at=2)
    assert _numbers(text) == list(range(8))
    assert not any(MADE_AGAIN in line for line in said) and counts["opens"] == 1
    keeper.copy.close()


@pytest.fixture(autouse=True)
def _keeper_looks_when_told(monkeypatch):
    """The keeper's look for an unlinked log happens when a test says (Keeper.looks_at_once)."""
    monkeypatch.setattr(logkeeper, "UNLINK_CHECK_S", 0.0)
