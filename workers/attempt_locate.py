"""Where an attempt that a worker adopts actually lives: its files and its process.

A node name can be taken over by a node of another ``RIG_HOME`` (another ``log_dir``), on
this host or another. The attempt's files are those it was *started* with — recorded on the
job (``log_path``, written once its process existed) or named in its process' environment
(``RIG_EXIT_FILE``) — never recomputed from the adopting node's own ``log_dir``. Its process is
recognised by the job's identity (``RIG_JOB_ID`` + ``RIG_JOB_INSTANCE`` + ``RIG_ATTEMPT`` +
``RIG_KEY_PREFIX``), not by a path. Why: a started attempt judged by the wrong folder looks
"never started" and is run a second time beside its still-running original (issue 11.1).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rig.logs import AttemptFiles, job_folder
from rig.models import Job
from workers.process_tree import environments


@dataclass(frozen=True)
class Located:
    """An attempt as found on this host."""

    files: AttemptFiles  # where its files are (recorded, or from its process, else our own)
    pid: int | None  # its wrapper (session leader first), None when no process of it runs here
    recorded: bool  # the job's record names this attempt's log: it started (Popen succeeded)

    @property
    def reachable(self) -> bool:
        """Are its files' folder visible from this host (False: another host's disk)?"""
        return self.files.folder.is_dir()


def identity_marks(job: Job, attempt: int, key_prefix: str) -> list[bytes]:
    """The environment entries every process of ``attempt`` of ``job`` carries."""
    marks = [f"RIG_JOB_ID={job.id}".encode(), f"RIG_ATTEMPT={attempt}".encode(),
             f"RIG_KEY_PREFIX={key_prefix}".encode()]
    if job.instance:
        marks.append(f"RIG_JOB_INSTANCE={job.instance}".encode())
    return marks


def carries_attempt(env: list[bytes], job: Job, attempt: int, key_prefix: str) -> bool:
    """Is a process with environment ``env`` one of this attempt's (not a pid reused by
    another process, nor a forged record's)?"""
    return all(mark in env for mark in identity_marks(job, attempt, key_prefix))


def recorded_files(job: Job, attempt: int) -> AttemptFiles | None:
    """The files ``attempt`` was started with, from the job's record, or None when the record
    names no log of this attempt. Only a path shaped like rig's own (``…/<id>-<instance>/
    attempt-<n>.log``) is believed: a damaged record never points adoption elsewhere."""
    for text in [job.log_path or "", *reversed(job.log_paths)]:
        if not text:
            continue
        path = Path(text)
        if (path.is_absolute() and path.name == f"attempt-{attempt}.log"
                and path.parent.name == job_folder(Path("."), job.id, job.instance).name):
            return AttemptFiles(path.parent, attempt)
    return None


def find_attempt_process(job: Job, attempt: int, key_prefix: str) -> tuple[int, Path | None] | None:
    """(pid, its RIG_EXIT_FILE) of the attempt's wrapper on this host — the session leader
    among the processes carrying its identity — or None when none runs here."""
    marks = identity_marks(job, attempt, key_prefix)
    found: list[tuple[bool, int, Path | None]] = []
    for pid, env in environments():
        if not all(mark in env for mark in marks):
            continue
        exit_file = next((Path(os.fsdecode(e[len(b"RIG_EXIT_FILE="):])) for e in env
                          if e.startswith(b"RIG_EXIT_FILE=")), None)
        try:
            found.append((os.getsid(pid) != pid, pid, exit_file))  # leaders first
        except ProcessLookupError:
            continue
    if not found:
        return None
    _, pid, exit_file = min(found, key=lambda f: (f[0], f[1]))
    return pid, exit_file


def locate(job: Job, attempt: int, own: AttemptFiles, key_prefix: str, pid: int | None) -> Located:
    """Where ``attempt`` of ``job`` is: ``pid`` when the caller already verified it as the
    attempt's (else looked for by identity), its files from the record, else from its
    process, else ``own`` (this node's log_dir: an attempt that never recorded a start)."""
    recorded = recorded_files(job, attempt)
    files = recorded
    if not pid:
        hit = find_attempt_process(job, attempt, key_prefix)
        if hit is not None:
            pid = hit[0]
            if files is None and hit[1] is not None and hit[1].name == f"attempt-{attempt}.exit":
                files = AttemptFiles(hit[1].parent, attempt)
    return Located(files or own, pid or None, recorded is not None)


def job_folders(job: Job, own: Path) -> list[Path]:
    """Every folder this job's attempts were started in that this host may see: ``own``
    (this node's log_dir) first, then those its record names (another home's, after a
    takeover of the node name), each once. Only rig-shaped paths are believed."""
    folders = [own]
    for text in [job.log_path or "", *job.log_paths]:
        path = Path(text) if text else None
        if (path is not None and path.is_absolute() and path.name.startswith("attempt-")
                and path.parent.name == own.name and path.parent not in folders):
            folders.append(path.parent)
    return folders
