"""A card's log keeper that dies (SIGKILL) never takes its jobs with it: the card worker holds a
read end of every job's pipe, starts a new keeper at once and hands it every log; the log says
so in one line; the job runs on and succeeds on its first attempt. The job's wrapper holds a read
end of its own pipe too, so a keeper that dies while no worker runs leaves the job waiting on a
full pipe, never killed, until the next worker takes its log over. No keeper at all: the worker
copies the log itself."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from rig.logs import job_folder
from rig.models import JobState
from tests.integration.test_card_runner import placed
from workers.card_runner import read_pid_file

pytestmark = pytest.mark.redis

RESTART = re.compile(rb"\[rig: the log keeper \(pid (\d+)\) died at [0-9:]+; a new one took this log over")


def _until(check, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(check())


def _numbers(text: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^line (\d+)$", text, re.M)]


def lost_lines(text: bytes) -> tuple[int, int]:
    """(lines missing from the numbered output, their bytes): what a keeper's death cost."""
    numbers = _numbers(text)
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    return len(missing), sum(len(b"line %d\n" % n) for n in missing)


def _writer(tmp_path: Path) -> tuple[str, Path]:
    """A job that writes numbered lines without pause until a go-file appears."""
    go = tmp_path / "go"
    return (f"i=0; while [ ! -e {go} ]; do echo line $i; i=$((i+1)); done; echo the-last-line", go)


def _start(card_runner_env, command: str, tmp_path: Path) -> tuple[object, Path, list[str], threading.Thread]:
    """``command`` placed on the env's card and run by its worker in a thread: the job, its
    attempt's log folder, the list the thread puts the attempt's end state in, the thread."""
    settings, ledger, runner, _ = card_runner_env
    job, token = placed(ledger, command, tmp_path)
    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    thread.start()
    return job, job_folder(settings.job_log_dir, job.id, job.instance), results, thread


def test_a_job_outlives_its_cards_keeper_killed_under_it(card_runner_env, tmp_path):
    settings, ledger, runner, _ = card_runner_env
    command, go = _writer(tmp_path)
    job, folder, results, thread = _start(card_runner_env, command, tmp_path)
    log = folder / "attempt-1.log"
    try:
        assert _until(lambda: log.exists() and log.stat().st_size > 20_000
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        first = read_pid_file(log.with_suffix(".pid"))[3]
        assert first == runner._keepers.server().proc.pid
        os.kill(first, signal.SIGKILL)
        # A new keeper takes the log over at once; the pid file names it (a worker that adopts
        # the job waits on that one).
        assert _until(lambda: (read_pid_file(log.with_suffix(".pid")) or (0, 0, 0, first))[3] not in (first, None))
        assert _until(lambda: RESTART.search(log.read_bytes()) is not None
                      and len(log.read_bytes()) > RESTART.search(log.read_bytes()).end() + 20_000)
    finally:
        go.touch()
    thread.join(30)
    assert results == ["SUCCEEDED"]
    done = ledger.store.get(job.id)
    assert done.state is JobState.SUCCEEDED and done.attempt == 1 and done.exit_code == 0
    assert "log keeper restarted once" in done.reason
    text = log.read_bytes()
    assert text.endswith(b"the-last-line\n")
    (note,) = RESTART.finditer(text)
    assert int(note.group(1)) == first
    before, after = _numbers(text[:note.start()]), _numbers(text[note.end():])
    assert before and after and before[0] == 0  # output from before and after the death
    lines, nbytes = lost_lines(text)
    # At most what the dead keeper had read and not written: one read (the pipe holds 64 KiB).
    assert nbytes <= 64 * 1024, (lines, nbytes)
    print(f"lost across a keeper SIGKILL: {lines} line(s), {nbytes} bytes")


def test_a_job_whose_keeper_dies_with_no_other_to_take_over_is_copied_by_its_worker(card_runner_env, tmp_path,
                                                                                   monkeypatch):
    """The keeper dies and no other can be started (no process): the worker copies the log
    itself in a thread (workers.card_keeper.ThreadKeeper), with a line that says so; the job is
    neither killed (SIGPIPE) nor blocked, and succeeds on its first attempt."""
    settings, ledger, runner, _ = card_runner_env
    command, go = _writer(tmp_path)
    job, token = placed(ledger, command, tmp_path)
    ledger.store.update(job.id, max_retries=0)
    log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
    results: list[str] = []
    thread = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    thread.start()
    try:
        assert _until(lambda: log.exists() and log.stat().st_size > 1000
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        keepers = runner._keepers
        monkeypatch.setattr(keepers, "_to_server", lambda kept, opening: False)
        monkeypatch.setattr(keepers, "_to_own", lambda kept, opening: False)
        os.kill(read_pid_file(log.with_suffix(".pid"))[3], signal.SIGKILL)
        # The pid file names the worker itself as the log's keeper now.
        assert _until(lambda: (read_pid_file(log.with_suffix(".pid")) or (0,) * 4)[3] == os.getpid())
        assert _until(lambda: b"the card worker copies this log itself" in log.read_bytes()
                      and len(log.read_bytes().split(b"copies this log itself", 1)[1]) > 20_000)
    finally:
        go.touch()
    thread.join(30)
    assert results == ["SUCCEEDED"]
    done = ledger.store.get(job.id)
    assert done.attempt == 1 and done.exit_code == 0 and "log keeper restarted once" in done.reason
    text = log.read_bytes()
    assert text.endswith(b"the-last-line\n")
    lines, nbytes = lost_lines(text)
    assert nbytes <= 64 * 1024, (lines, nbytes)


def test_a_log_folder_deleted_while_the_job_runs_is_made_again(card_runner_env, tmp_path, caplog, monkeypatch):
    """Someone deletes the job's log folder while it runs: its keeper makes it again on the
    next output, with a line in the log; the worker's log says so as it sees it (once), the
    job's reason at its end; the job keeps its own exit status."""
    import logging
    import shutil

    from workers import card_runner

    monkeypatch.setattr(card_runner, "LOG_CAP_POLL_S", 0.05)  # the worker's look at its log
    caplog.set_level(logging.WARNING, logger="workers.card_runner")
    settings, ledger, runner, _ = card_runner_env
    go, end = tmp_path / "go", tmp_path / "end"
    # After the deletion it writes until told to end: the keeper looks at most every
    # UNLINK_CHECK_S whether its log is gone (what it wrote before the look is lost with it).
    job, folder, results, thread = _start(card_runner_env, f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; "
                                          f"while [ ! -e {end} ]; do echo after; sleep 0.02; done", tmp_path)
    log = folder / "attempt-1.log"
    try:
        assert _until(lambda: log.exists() and log.read_bytes() == b"before\n"
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        shutil.rmtree(folder)
        assert _until(lambda: "was deleted while it runs" in caplog.text)  # said while it runs
        go.touch()
        assert _until(lambda: log.exists() and log.read_bytes().endswith(b"after\n"))
    finally:
        go.touch()
        end.touch()
    thread.join(30)
    assert results == ["SUCCEEDED"]
    lines = log.read_bytes().splitlines()
    assert lines[0].startswith(b"[rig: this log was deleted") and set(lines[1:]) == {b"after"}
    assert caplog.text.count("was deleted while it") == 1  # once, not again at its end
    done = ledger.store.get(job.id)
    assert done.exit_code == 0 and "log deleted while it ran (once) and made again" in done.reason


def test_a_log_folder_deleted_before_the_worker_saw_its_file_is_said_too(card_runner_env, tmp_path, caplog,
                                                                       monkeypatch):
    """CI, under load: the file lived a few ms before the folder went, and the worker, whose
    look had not come yet, never said the deletion. The attempt's folder is made before the
    job starts: its absence says it was deleted."""
    import logging
    import shutil

    from workers import card_runner

    monkeypatch.setattr(card_runner, "LOG_CAP_POLL_S", 0.05)
    real_inode = card_runner._inode
    monkeypatch.setattr(card_runner, "_inode", lambda path: None)  # the worker has not seen the file yet
    caplog.set_level(logging.WARNING, logger="workers.card_runner")
    settings, ledger, runner, _ = card_runner_env
    end = tmp_path / "end"
    job, folder, results, thread = _start(card_runner_env, f"echo before; while [ ! -e {end} ]; do sleep 0.02; done",
                                          tmp_path)
    log = folder / "attempt-1.log"
    try:
        assert _until(lambda: log.exists() and log.read_bytes() == b"before\n")
        shutil.rmtree(folder)
        monkeypatch.setattr(card_runner, "_inode", real_inode)
        assert _until(lambda: "was deleted while it runs" in caplog.text)
    finally:
        end.touch()
    thread.join(30)
    assert results == ["SUCCEEDED"]
    assert caplog.text.count("was deleted while it") == 1


def test_an_adopted_job_outlives_the_keeper_of_the_worker_before(card_runner_env, tmp_path):
    """The worker stops (its keeper copies on), the next one adopts the job and takes a read
    end of its pipe through /proc; then the old keeper is killed: the new worker's keeper takes
    the log over, and the job runs on and succeeds."""
    from workers.card_runner import CardRunner
    from workers.process_tree import is_alive

    settings, ledger, runner, _ = card_runner_env
    command, go = _writer(tmp_path)
    job, token = placed(ledger, command, tmp_path)
    log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    first.start()
    second = None
    try:
        assert _until(lambda: log.exists() and log.stat().st_size > 20_000
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        old = read_pid_file(log.with_suffix(".pid"))
        runner.stop()  # the worker goes; the job and its keeper run on
        first.join(10)
        assert results == ["detached"]
        second = CardRunner(settings, "n1", 0, "card0@n1")
        second.adopt()
        assert second.active_ids() == [job.id]
        assert _until(lambda: any(k.job is not None for k in second._keepers._logs))  # its read end
        os.kill(old[3], signal.SIGKILL)
        assert _until(lambda: (read_pid_file(log.with_suffix(".pid")) or old)[3] != old[3])
        assert _until(lambda: RESTART.search(log.read_bytes()) is not None
                      and len(log.read_bytes()) > RESTART.search(log.read_bytes()).end() + 20_000)
        go.touch()
        assert _until(lambda: ledger.store.get(job.id).state is JobState.SUCCEEDED, timeout=30)
    finally:
        go.touch()
        if second is not None:
            second.stop()
    done = ledger.store.get(job.id)
    assert done.attempt == 1 and done.exit_code == 0
    text = log.read_bytes()
    assert text.endswith(b"the-last-line\n") and len(RESTART.findall(text)) == 1
    lines, nbytes = lost_lines(text)
    assert nbytes <= 64 * 1024, (lines, nbytes)
    print(f"adopted, lost across a keeper SIGKILL: {lines} line(s), {nbytes} bytes")
    assert not is_alive(old[3], old[4])


def test_an_adopted_job_whose_read_end_could_not_be_taken_is_taken_when_its_keeper_dies(
        card_runner_env, tmp_path, monkeypatch):
    """Adopted without a read end of its own (none could be taken then): the old keeper's death
    is watched, and at it the worker takes the job's pipe again and hands the log to a keeper of
    its own (the job's wrapper held the pipe meanwhile). The job succeeds on its first attempt."""
    from workers.card_runner import CardRunner

    settings, ledger, runner, _ = card_runner_env
    command, go = _writer(tmp_path)
    job, token = placed(ledger, command, tmp_path)
    ledger.store.update(job.id, max_retries=0)
    log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
    first = threading.Thread(target=lambda: runner.run_job(job.id, token))
    first.start()
    second = None
    try:
        assert _until(lambda: log.exists() and log.stat().st_size > 1000
                      and read_pid_file(log.with_suffix(".pid")) is not None)
        old = read_pid_file(log.with_suffix(".pid"))
        runner.stop()
        first.join(10)
        second = CardRunner(settings, "n1", 0, "card0@n1")
        adopt = second._keepers.adopt
        tries: list[int] = []

        def once_refused(*args):
            tries.append(1)
            return None if len(tries) == 1 else adopt(*args)

        monkeypatch.setattr(second._keepers, "adopt", once_refused)
        second.adopt()
        assert second.active_ids() == [job.id]
        os.kill(old[3], signal.SIGKILL)
        assert _until(lambda: RESTART.search(log.read_bytes()) is not None
                      and len(log.read_bytes()) > RESTART.search(log.read_bytes()).end() + 20_000)
        go.touch()
        assert _until(lambda: ledger.store.get(job.id).state is JobState.SUCCEEDED, timeout=30), (
            ledger.store.get(job.id).state, ledger.store.get(job.id).reason, log.read_bytes()[-300:])
    finally:
        go.touch()
        if second is not None:
            second.stop()
    assert len(tries) == 2
    done = ledger.store.get(job.id)
    assert done.attempt == 1 and done.exit_code == 0 and log.read_bytes().endswith(b"the-last-line\n")


_WORKER = """
import sys
from pathlib import Path
from rig.config import load_settings
from workers.card_runner import CardRunner
prefix, url, home, job_id, token = sys.argv[1:]
settings = load_settings(key_prefix=prefix, redis_url=url, home=Path(home), node_name="n1", kill_grace_seconds=1.0)
print(CardRunner(settings, "n1", 0, "card0@n1").run_job(int(job_id), token), flush=True)
"""


def test_a_job_outlives_its_worker_and_then_its_keeper_killed_until_the_next_worker(card_runner_env, tmp_path):
    """The window no worker covers: the card worker is SIGKILLed (a real process), then its
    keeper too, while the job writes on. The job's wrapper holds a read end of its own pipe, so
    the job is never killed by SIGPIPE: it waits on the full pipe until the next worker adopts
    it, takes a read end through /proc and hands the log to a keeper of its own (with the line
    that says what may be missing). The job succeeds on its first attempt."""
    import subprocess
    import sys

    from workers.card_runner import CardRunner
    from workers.process_tree import is_alive

    settings, ledger, runner, _ = card_runner_env
    runner.stop()  # this test's workers are its own
    command, go = _writer(tmp_path)
    job, token = placed(ledger, command, tmp_path)
    log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, settings.key_prefix, settings.redis_url,
                               str(settings.home), str(job.id), token], stdout=subprocess.PIPE)
    second = None
    try:
        assert _until(lambda: log.exists() and log.stat().st_size > 20_000
                      and read_pid_file(log.with_suffix(".pid")) is not None, timeout=60)
        pid, start, _attempt, keeper, keeper_start = read_pid_file(log.with_suffix(".pid"))
        worker.kill()
        worker.wait(10)
        os.kill(keeper, signal.SIGKILL)
        assert _until(lambda: not is_alive(keeper, keeper_start))
        # Nobody reads its pipe now: the job writes until the pipe is full and waits there.
        assert is_alive(pid, start)
        second = CardRunner(settings, "n1", 0, "card0@n1")
        second.adopt()
        assert second.active_ids() == [job.id]
        assert _until(lambda: (read_pid_file(log.with_suffix(".pid")) or (0, 0, 0, keeper))[3] not in (keeper, 0))
        assert _until(lambda: RESTART.search(log.read_bytes()) is not None
                      and len(log.read_bytes()) > RESTART.search(log.read_bytes()).end() + 20_000)
        go.touch()
        assert _until(lambda: ledger.store.get(job.id).state is JobState.SUCCEEDED, timeout=30), (
            ledger.store.get(job.id).state, ledger.store.get(job.id).reason)
    finally:
        go.touch()
        if worker.poll() is None:
            worker.kill()
        worker.wait(10)
        if second is not None:
            second.stop()
    done = ledger.store.get(job.id)
    assert done.attempt == 1 and done.exit_code == 0
    assert "log keeper restarted once" in done.reason
    text = log.read_bytes()
    assert text.endswith(b"the-last-line\n")
    (note,) = RESTART.finditer(text)
    assert int(note.group(1)) == keeper
    lines, nbytes = lost_lines(text)
    assert nbytes <= 64 * 1024, (lines, nbytes)
    print(f"worker and keeper SIGKILLed, adopted: lost {lines} line(s), {nbytes} bytes")
