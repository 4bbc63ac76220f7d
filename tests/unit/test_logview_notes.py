"""`rig log` of a log that is not whole, or whose file was deleted (issue 11 follow-up, items
13-14): stderr says so, stdout stays the job's output alone. Real files, no Redis."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path

import pytest

from rig import logspace
from rig.cli.logview import show_log, this_machine
from rig.errors import LogMissing
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeInfo


def _job(log: Path, summary: str = "exit code 0") -> Job:
    return Job(id=4, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM,
               state=JobState.SUCCEEDED, workdir="/", created_at=time.time(), node="vm", cards=[0], attempt=1,
               log_paths=[str(log)], attempts=[{"attempt": 1, "node": "vm", "cards": [0], "outcome": "succeeded",
                                                "summary": summary}])


def _show(job: Job, **kw) -> tuple[bytes, list[str]]:  # noqa: ANN003
    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=kw.pop("attempt", None), follow=kw.pop("follow", False), out=out,
             say=said.append, sleep=lambda s: None, **kw)
    return out.getvalue(), said


@pytest.mark.parametrize("note", [
    {"lost": 1258291, "error": "ENOSPC", "strerror": "No space left on device", "at": 0, "log_bytes": 3 << 20},
    {"cap_cut": 40 << 20, "cap": 64 << 20},
], ids=["disk-full", "log-max-bytes"])
@pytest.mark.parametrize("follow", [False, True], ids=["plain", "follow"])
def test_a_cut_log_says_so_on_stderr_and_stdout_is_the_output_alone(tmp_path, note, follow):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"partial output\n")
    logspace.preallocate(log.with_suffix(".note"), logspace.NOTE_BYTES)
    logspace.overwrite(log.with_suffix(".note"), json.dumps(note), logspace.NOTE_BYTES)
    out, said = _show(_job(log), follow=follow)
    assert out == b"partial output\n"
    words = "log incomplete: disk full (ENOSPC)" if "lost" in note else "log cut: 40.0 MiB of output cut"
    notes = [line for line in said if words in line]
    assert len(notes) == 1, said
    assert notes[0].startswith("--- job 4, attempt 1: ")
    if "lost" in note:
        assert "1.2 MiB of output lost" in notes[0]


def test_the_note_comes_from_the_attempt_row_when_the_note_file_is_gone(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"x\n")
    summary = ("exit code 0 (log incomplete: disk full (ENOSPC) at 12:03:04 after 3.0 MiB; "
               "1.2 MiB of output lost)")
    _, said = _show(_job(log, summary))
    assert said[-1] == ("--- job 4, attempt 1: log incomplete: disk full (ENOSPC) at 12:03:04 after 3.0 MiB; "
                        "1.2 MiB of output lost ---"), said


def test_a_whole_log_has_no_note(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"all\n")
    logspace.preallocate(log.with_suffix(".note"), logspace.NOTE_BYTES)  # allocated, never written
    out, said = _show(_job(log))
    assert out == b"all\n" and len(said) == 1 and said[0].startswith("--- job 4, attempt 1 of 1 (vm/0)")


def test_a_deleted_log_of_an_attempt_that_ran_here_says_moved_or_deleted(tmp_path):
    """`mv` rotation: the log is not where rig wrote it. A missing log is not bad input: exit 1
    (rig.errors.LogMissing), with -f as without (a tester saw exit 2 without -f, 0 with it)."""
    job = _job(tmp_path / "attempt-1.log")
    with pytest.raises(LogMissing) as here:
        _show(job, attempt=1, here=this_machine("vm", []))
    assert here.value.exit_code == 1
    assert "moved or deleted" in str(here.value) and str(tmp_path / "attempt-1.log") in str(here.value)
    assert "not on this machine" not in str(here.value) and "\n" not in str(here.value)
    said: list[str] = []
    with pytest.raises(LogMissing, match="moved or deleted"):
        show_log(lambda: job, attempt=None, follow=True, out=io.BytesIO(), say=said.append,
                 sleep=lambda s: None, here=this_machine("vm", []))
    assert said[-1].startswith("--- job 4 SUCCEEDED after 1 attempt(s)"), said
    # Named by a node record of this host (a node name other than this home's).

    by_host = this_machine("other", [NodeInfo(name="vm", state="up", alive=True, since=0.0, host=socket.gethostname())])
    with pytest.raises(LogMissing, match="deleted"):
        _show(job, attempt=1, here=by_host)
    # Ran elsewhere: still "not on this machine".
    with pytest.raises(LogMissing, match="is not on this machine"):
        _show(job, attempt=1, here=this_machine("b", [NodeInfo(name="vm", state="up", alive=True, since=0.0, host="elsewhere")]))
