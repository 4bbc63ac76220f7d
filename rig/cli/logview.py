"""``rig log``: print a job's output, one attempt or (with ``-f``) every attempt to its end.

The job's output goes to stdout byte for byte (as ``cat`` would: it is the job's own output,
asked for by name, so it is not filtered). rig's own lines go to stderr, so
``rig log -f 12 > out.txt`` keeps out.txt the job's output alone:

- before each attempt's output: ``--- job 12, attempt 2 (n1/3) ---``; without ``-f`` the
  same line names the attempt shown (``attempt 2 of 3``);
- with ``-f``, when the job is final: ``--- job 12 SUCCEEDED after 2 attempt(s) ---``;
- with ``-f`` on a job that is waiting (at first, and again when a retry puts it back in the
  queue), at once: ``--- job 12 is waiting: <why> ---``, the one wait explanation
  (rig.waiting), so following a job that cannot start is never silent;
- with ``-f``, when something other than rig truncated the log under the follower (a
  copy-truncate rotation, ``: > attempt-1.log``): ``--- job 12, attempt 1: its log PATH was
  truncated by something other than rig ...; reading it again from its start ---``, and the
  file is printed again from its start (:meth:`CutFollower._resync`);
- with ``-f``, when the log was deleted while the attempt runs and its keeper made it again:
  ``--- job 12, attempt 1: its log PATH was deleted and made again (seen at 14:20:03);
  following the new file from its start ---`` (:meth:`CutFollower.replaced`).

A user who cannot read the log folder reads through the gateway (rig.gateway.client._RemoteLog):
each poll is one request that brings the file's size, identity and the keeper's note with the
bytes (Gateway.op_log_look), and the same CutFollower rules see a cut or a log made again. The
gateway opens the log by its name at each request, so what a deleted file got after the last
poll is not shown there; a gateway older than log_look is read as before (neither is seen).
A log renamed away (or replaced by another file) is told from one its keeper made again by the
keeper's count of those (the note): the gateway cannot reach the renamed file, so the follower
says so in one line and follows that attempt no further (a reader of the file goes on in it).

``-f`` follows the latest attempt, and when that attempt fails and is retried, the next one
(a retried job goes back to PENDING and gets a new log file), until the job is final:
SUCCEEDED, FAILED, CANCELLED or TIMEOUT, none of which has a retry pending. Ctrl-C stops
following (exit 130, the job is untouched). Log files stay on the node that ran the attempt;
an attempt whose file is not on this machine is named with its node and skipped once it ends;
when that is the last attempt (or the one asked for), ``-f`` ends as ``rig log`` does without
it: one line naming where rig expected the file, exit 1 (rig.errors.LogMissing).

The paths come from the job record (``log_paths``, oldest first; else ``log_path``): nothing
here builds a path. An attempt's number is the one in its file's name (``attempt-<n>.log``),
the number the record and `rig show` use; an attempt that never started (its history row says
``"started": false``) has no log, which ``--attempt N`` says in one line.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from rig import logspace
from rig.errors import InvalidInput, JobGone, JobNotFound, LogMissing, record_vanished
from rig.logs import SECONDS_PER_DAY, find_marker
from rig.models import Job, JobState
from rig.nodes import NodeInfo
from rig.text import clean

#: How often a followed job's record and log file are looked at again (s).
POLL_S = 0.25
#: A running attempt whose log file has not appeared for this long (s) is said to run elsewhere.
MISSING_SAY_S = 2.0
CHUNK = 65536


def attempt_paths(job: Job) -> list[str]:
    """The log file of each attempt, oldest first (the record's ``log_paths``, else its single
    ``log_path``)."""
    return list(job.log_paths) or ([job.log_path] if job.log_path else [])


_ATTEMPT_LOG = re.compile(r"attempt-([0-9]+)\.log")


def attempt_logs(job: Job) -> dict[int, str]:
    """attempt number -> its log file: the number in the file's name (``attempt-<n>.log``);
    a path not named so (older records) counts by its position."""
    out: dict[int, str] = {}
    for i, path in enumerate(attempt_paths(job), 1):
        match = _ATTEMPT_LOG.fullmatch(os.path.basename(path))
        out[int(match[1]) if match else i] = path
    return out


def last_attempt(job: Job) -> int:
    """The highest attempt number the record knows (started or not)."""
    return max([job.attempt, *attempt_logs(job)], default=0)


def never_started(job: Job, attempt: int) -> str | None:
    """The one line for an attempt that never started (so has no log), None for any other."""
    for item in job.attempts:
        if item.get("attempt") == attempt and item.get("started") is False:
            return clean(f"--- job {job.id}, attempt {attempt} never started, so it has no log: "
                         f"{item.get('summary') or item.get('outcome')} ---")
    return None


def ended_unstarted(job: Job) -> str:
    """The one line for a job that ended (cancelled, failed) before any attempt started."""
    return f"job {job.id} ended {job.state.value} before it started; no log"


def where(job: Job, attempt: int) -> str:
    """``n1/3``: the node and cards attempt ``attempt`` ran on (or runs on, the current one)."""
    for item in job.attempts:
        if item.get("attempt") == attempt:
            return f"{item.get('node')}/{','.join(map(str, item.get('cards') or []))}"
    return f"{job.node}/{','.join(map(str, job.cards))}" if job.node else "not placed yet"


def header(job: Job, attempt: int, of: int | None = None, *, name_instance: bool = False) -> str:
    """``--- job 12, attempt 2 of 3 (n1/0) ---``; with ``name_instance`` (the id was given to
    more than one job: :func:`id_given_again`) ``--- job 12 (instance 3fa9c2), ...`` with the
    six hex digits `rig jobs` shows where ids repeat."""
    count = f" of {of}" if of else ""
    which = f" (instance {job.instance[:6]})" if name_instance and job.instance else ""
    return clean(f"--- job {job.id}{which}, attempt {attempt}{count} ({where(job, attempt)}) ---")


def id_given_again(client: object, job: Job) -> bool:
    """Does another job hold, or once hold, ``job``'s id (Redis lost its data and gave it again)?
    Redis' record of the id, then the archive's instances of it. False when that cannot be
    told (a gateway client, an archive that cannot be read): it only decides a header's words."""
    history = getattr(client, "history", None)
    if history is None or not job.instance:
        return False
    try:
        live = history.get(job.id)
        if live.instance and live.instance != job.instance:
            return True
        archive = history.readable_archive()
        return archive is not None and any(inst != job.instance for _, inst in archive.keys_among([job.id]))
    except Exception:  # noqa: BLE001 - a header's words are not worth failing `rig log` for
        return False


def cut_note(job: Job, attempt: int, path: str, words: str = "") -> str | None:
    """``--- job 4, attempt 1: log incomplete: disk full (ENOSPC) ...; 1.2 MiB of output lost ---``
    for an attempt whose log is not whole (a full disk, or cut to ``log_max_bytes``), None for a
    whole one: from the note file beside the log (rig.logspace, current while it runs), else
    ``words`` (the note as the gateway read it: :func:`note_words`), else the words the
    attempt's history row carries."""
    text = logspace.describe_note(logspace.read_note(Path(path).with_suffix(".note"))) or words
    if not text:
        for item in job.attempts:
            if item.get("attempt") == attempt:
                found = _NOTE_WORDS.search(str(item.get("summary") or ""))
                text = found.group(1) if found else ""
    return clean(f"--- job {job.id}, attempt {attempt}: {text} ---") if text else None


#: The note as rig.logspace.describe_note words it, inside an attempt row's summary "(...)".
_NOTE_WORDS = re.compile(r"(log (?:incomplete|cut): .*?)\)?$")


def note_words(fh: object) -> str:
    """The keeper's note in words for a log read through the gateway (one request:
    rig.gateway.client._RemoteLog.note_words), "" for a file read here (cut_note reads its note)."""
    words = getattr(fh, "note_words", None)
    return words() if callable(words) else ""


def ran_here(job: Job, attempt: int, here: Callable[[str], bool] | None) -> bool:
    """Did attempt ``attempt`` run on this machine (``here`` says whether a node name is one
    of this machine's)?"""
    node = where(job, attempt).split("/", 1)[0]
    return here is not None and bool(node) and here(node)


def this_machine(node_name: str, nodes: Iterable[NodeInfo]) -> Callable[[str], bool]:
    """Whether a node name is this machine's: the configured node name, or a node whose
    record says it runs on this host."""
    host = socket.gethostname()
    mine = {node_name} | {n.name for n in nodes if n.host == host}
    return mine.__contains__


#: The retention setting that governs a job's logs now, with its value in days:
#: ``("log_retention_days", 30.0)``, or ``("error_log_retention_days", 90.0)`` for a job in the
#: error queue (as workers.log_sweep applies them).
Retention = Callable[[Job], tuple[str, float]]


def retention_words(job: Job, retention: Retention | None, now: float) -> str | None:
    """``deleted by the log retention rule (log_retention_days = 30) on or after DATE`` when the
    job ended longer ago than the retention that governs its logs: the sweep (rig.logs.
    sweep_job_logs, hourly) deletes a job's log folder that long after its last write, the job's
    end. None when it ended more recently (or has not ended): something else took the log."""
    from rig.cli.render import when  # render reads this module

    if retention is None or not job.state.terminal or job.ended_at is None:
        return None
    setting, days = retention(job)
    due = job.ended_at + days * SECONDS_PER_DAY
    if now <= due:
        return None
    return f"deleted by the log retention rule ({setting} = {days:g}) on or after {when(due)}"


def missing_words(job: Job, attempt: int, path: str, here: Callable[[str], bool] | None,
                  retention: Retention | None = None, now: float | None = None) -> str:
    """The one line for an attempt's log that is not at ``path`` (rig.errors.LogMissing, exit 1
    with or without ``-f``): where it ran here, deleted by the log retention rule when the job
    ended longer ago than that (:func:`retention_words`), else moved or deleted; where it ran
    elsewhere, on the node that ran it."""
    if ran_here(job, attempt, here):
        swept = retention_words(job, retention, time.time() if now is None else now)
        return (f"the log of job {job.id}, attempt {attempt} is not where rig wrote it, {path}: "
                f"{swept or 'moved or deleted'} (attempt {attempt} ran on {where(job, attempt)}, "
                "this machine)")
    return (f"log file {path} is not on this machine (attempt {attempt} ran on {where(job, attempt)}; "
            "logs stay on the node that ran the job)")


def _open_file(path: str) -> BinaryIO:
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def followed(client, job_id: int, instance: str | None) -> Job:  # noqa: ANN001 - Client or GatewayClient
    """The record of the job `rig log -f` follows (``instance``: its own, read at the start):
    one that vanished, or whose id now names another job (Redis lost its data), raises JobGone
    saying so (it said "no job with id N" of a job still running, or followed the new job's log)."""
    try:
        return client.get_instance(job_id, instance)
    except JobGone:
        raise
    except JobNotFound:
        raise record_vanished(job_id, "followed") from None


def show_log(get: Callable[[], Job], *, attempt: int | None, follow: bool, out: BinaryIO,
             say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep,
             why: Callable[[Job], str | None] | None = None,
             here: Callable[[str], bool] | None = None,
             open_log: Callable[[str], BinaryIO] = _open_file,
             exists: Callable[[str], bool] = os.path.exists, name_instance: bool = False,
             retention: Retention | None = None) -> None:
    """Print the log of ``attempt`` (default: the latest) of the job ``get()`` reads, to
    ``out``; with ``follow``, keep printing that attempt and, when no attempt was named, every
    later one, until the job is final. ``say`` prints rig's own lines (stderr); ``why`` words
    why a PENDING job waits (rig.waiting.why_waiting), said once per wait for an attempt.
    ``open_log`` and ``exists`` reach the files (through the gateway for a user who cannot
    read them: rig.gateway.client). ``name_instance``: the headers name the job's instance (its
    id was given to another job too: :func:`id_given_again`). ``retention``: which retention rule
    governs a job's logs, to say that it deleted a missing one (:func:`missing_words`)."""
    job = get()
    logs, last = attempt_logs(job), last_attempt(job)
    if attempt is not None and not 1 <= attempt <= max(last, 1):
        raise InvalidInput(f"job {job.id} has {last} attempt(s); pick --attempt 1..{last}"
                           if last else f"job {job.id} has no log yet")
    if not follow:
        asked = attempt if attempt is not None else (None if logs else last)
        if asked is not None and asked not in logs and (line := never_started(job, asked)):
            say(line)
            return
        if not logs and job.state.terminal:
            raise InvalidInput(ended_unstarted(job))
        if not logs or (attempt is not None and attempt not in logs):
            raise InvalidInput(f"job {job.id} has no log yet (it is {job.state.value.lower()}); "
                               f"`rig log -f {job.id}` waits for it")
        n = attempt or max(logs)
        path = logs[n]
        if not exists(path):
            raise LogMissing(missing_words(job, n, path, here, retention))
        with contextlib.closing(open_log(path)) as fh:
            say(header(job, n, last, name_instance=name_instance))
            if note := cut_note(job, n, path, note_words(fh)):
                say(note)
            _copy(fh, out)
        return

    current = attempt or max(logs, default=1)
    missing_last = ""  # the last attempt followed left no log here: exit 1, as without -f
    while True:
        # Wait for this attempt's log to be recorded (a job still waiting, or being retried).
        told_waiting = False
        skipped = None
        while current not in attempt_logs(job):
            skipped = never_started(job, current)
            if skipped:
                say(skipped)
                break
            if job.state is JobState.PENDING and not told_waiting and why is not None:
                told_waiting = True
                say(_waiting_line(job, why))
            if job.state.terminal:
                if attempt_logs(job):
                    break
                raise InvalidInput(ended_unstarted(job))
            sleep(POLL_S)
            job = get()
        if skipped is None:
            if current not in attempt_logs(job):  # final, and no such attempt
                break
            say(header(job, current, name_instance=name_instance))
            job, words, shown = _follow_one(get, job, current, out, say, sleep, open_log, exists)
            if note := cut_note(job, current, attempt_logs(job)[current], words):
                say(note)
        ending = attempt is not None or (job.state.terminal and last_attempt(job) <= current)
        if skipped is None and not shown:
            missing = missing_words(job, current, attempt_logs(job)[current], here, retention)
            if ending:  # the attempt asked for (or the last): its log is missing, as without -f
                missing_last = missing
            else:
                say(clean(f"({missing}; skipped)"))
        if ending:
            break
        current += 1
    if job.state.terminal:
        n = last_attempt(job)
        reason = f": {job.reason}" if job.reason and job.state is not JobState.SUCCEEDED else ""
        say(clean(f"--- job {job.id} {job.state.value} after {n} attempt(s){reason} ---"))
    if missing_last:
        raise LogMissing(missing_last)


def _waiting_line(job: Job, why: Callable[[Job], str | None]) -> str:
    """``--- job 12 is waiting: <why> ---`` (an explanation that cannot be read is not an error:
    the job is followed all the same)."""
    try:
        reason = why(job) or "in the queue"
    except Exception as exc:  # noqa: BLE001 - following goes on without the explanation
        reason = f"in the queue (why could not be read: {exc})"
    return clean(f"--- job {job.id} is waiting: {reason} ---")


def _follow_one(get: Callable[[], Job], job: Job, attempt: int, out: BinaryIO,
                say: Callable[[str], None], sleep: Callable[[float], None],
                open_log: Callable[[str], BinaryIO] = _open_file,
                exists: Callable[[str], bool] = os.path.exists) -> tuple[Job, str, bool]:
    """Print attempt ``attempt``'s log as it grows, until that attempt is over (a later one
    has a log, or the job is final); then print what is left and return the job as last read,
    the keeper's note in words as the gateway read it at the end ("" read here: note_words),
    and whether the log was found here at all (the caller says so when it was not)."""
    path = attempt_logs(job)[attempt]
    fh = None
    follower: CutFollower | None = None
    opened = False  # the log was here once: never said to be elsewhere after
    told_missing = False
    missing_since: float | None = None

    lost = False  # the file its keeper writes is no longer at the path (gateway): not reopened

    def open_if_there() -> None:
        nonlocal fh, follower, opened
        if fh is None and not lost and exists(path):
            try:
                fh = open_log(path)  # kept open while the attempt runs
            except FileNotFoundError:
                return  # deleted again between the look and the open: the next poll looks again
            follower, opened = CutFollower(fh, path), True
            follower.on_foreign = lambda: say(clean(
                f"--- job {job.id}, attempt {attempt}: its log {path} was truncated by something other than "
                f"rig (a log rotation? seen at {time.strftime('%H:%M:%S')}); reading it again from its start ---"))

    def copy() -> None:
        """Print what the log has now; if its keeper made it again (it was deleted), print the
        old file to its end, then the new one from its start (rig.logkeeper.LogCopy)."""
        nonlocal fh, follower, lost
        if fh is None or follower is None:
            return
        follower.copy(out)
        if follower.moved:
            fh.close()
            fh = follower = None
            lost = True
            say(clean(f"--- job {job.id}, attempt {attempt}: its log {path} was renamed away or replaced by "
                      f"another file (seen at {time.strftime('%H:%M:%S')}); its keeper writes on into the old "
                      "file, which the gateway cannot read: not followed further ---"))
            return
        if not follower.replaced(path):
            return
        # Seen after the new file's name: the keeper writes no more into the old one.
        follower.copy(out)
        fh.close()
        fh = follower = None
        say(clean(f"--- job {job.id}, attempt {attempt}: its log {path} was deleted and made again "
                  f"(seen at {time.strftime('%H:%M:%S')}); following the new file from its start ---"))
        open_if_there()
        if follower is not None:
            follower.copy(out)

    try:
        while True:
            # Over: final, a later attempt has a log, or the job is back in the queue for a retry.
            over = (job.state.terminal or last_attempt(job) > attempt
                    or (job.state is JobState.PENDING and last_attempt(job) == attempt))
            open_if_there()
            copy()
            if over:
                if fh is not None:
                    copy()  # whatever was written before the end was seen
                return job, note_words(fh) if fh is not None else "", opened
            if fh is None and not opened and job.state is JobState.RUNNING:
                missing_since = missing_since or time.monotonic()
            if fh is None and missing_since and not told_missing and time.monotonic() - missing_since >= MISSING_SAY_S:
                told_missing = True
                say(clean(f"(waiting for {path}: attempt {attempt} runs on {where(job, attempt)}; "
                          "logs stay on the node that runs the job)"))
            sleep(POLL_S)
            job = get()
    finally:
        if fh is not None:
            fh.close()


def _copy(fh: BinaryIO, out: BinaryIO) -> None:
    while chunk := fh.read(CHUNK):
        out.write(chunk)
    out.flush()


@dataclass(frozen=True)
class Look:
    """What one look at a followed log finds (one fstat and a few preads, or one gateway request:
    rig.gateway.server.Gateway.op_log_look). Positions and sizes in bytes.

    ``ident`` is the (device, inode) of the file the path names now, where the reader cannot
    hold the file itself open (the gateway opens the log by name at each request), else None
    (an open file is its own identity). ``gone``: the path names no file just now."""

    size: int = 0  # the file's size now
    cap_cut: int = 0  # bytes of output the keeper's note says were cut in all
    before: bytes = b""  # the bytes just before the place asked for (at most ``back``)
    probe: bytes = b""  # the bytes at the range asked for (the marker's place)
    data: bytes = b""  # the bytes from the place asked for (at most ``want``)
    ident: tuple[int, int] | None = None
    gone: bool = False
    #: How many times the keeper made the log again (its note), where a look says (the
    #: gateway); None: not said. Another file under the path without a new count is not one
    #: the keeper made: the log was renamed away or replaced, and its keeper writes on elsewhere.
    made_again: int | None = None


class LogSource(Protocol):
    """What CutFollower reads a log through: the open file (_OpenFile) or the gateway
    (rig.gateway.client._RemoteLog)."""

    def look(self, pos: int, back: int, probe: tuple[int, int] | None, want: int) -> Look | None:
        """The facts at ``pos`` (see Look); None where they cannot be had (an older gateway).

        Read in this order: the data first, then the bytes before it, the marker's place, the
        size, and last the keeper's note (which it writes after a cut). A cut that falls before
        or while the data is read then shows in what is read after it, and CutFollower drops
        that data and finds its place again. Read the other way round, a cut between the checks
        and the data gave bytes of the new file at the old place, taken as the next output:
        lines shown twice (CI saw 972 under load)."""

    def read_at(self, pos: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``pos`` (b"" past the end, or while the log is gone)."""


class _OpenFile:
    """A log this process reads itself: an open file (kept open, so a log deleted under it is
    read to its end) and its note beside it."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.note = fd, Path(path).with_suffix(".note")

    def look(self, pos: int, back: int, probe: tuple[int, int] | None, want: int) -> Look:
        # The data first, then what tells a cut (LogSource.look).
        data = os.pread(self.fd, want, pos) if want else b""
        before = os.pread(self.fd, back, pos - back) if back else b""
        probed = os.pread(self.fd, probe[1], probe[0]) if probe else b""
        size = os.fstat(self.fd).st_size
        try:
            cut = int(logspace.read_note(self.note).get("cap_cut") or 0)
        except (TypeError, ValueError):
            cut = 0
        return Look(size=size, cap_cut=cut, before=before, probe=probed, data=data)

    def read_at(self, pos: int, size: int) -> bytes:
        return os.pread(self.fd, size, pos)


class CutFollower:
    """Copies a running attempt's log while its keeper may cut it in place
    (rig.logs.enforce_size_cap: the head stays, then a marker line, then the newest output), or
    delete it and make it again (rig.logkeeper.LogCopy). A follower that kept its place in the
    *file* would, after a cut, be past the file's end or in the middle of the newest output: it
    would skip output and miss the job's last lines. This one keeps its place in the job's
    *output*. A cut is seen when the marker's count moved, the file shrank under its place, the
    bytes just before its place changed, or the keeper's note counts more cut; it then finds the
    marker and goes on from the same output in the newest part, or, when output it had not read
    yet was cut, prints the marker line and goes on after it. It takes no lock: the card's one
    keeper must never wait on a reader (a stopped `rig log -f`, or a user's own, would stall
    every job of the card), so a read that falls in the middle of a cut can still show a glitch
    in what it prints, never in the log.

    The same rules hold for a log read through the gateway (rig.gateway.client._RemoteLog, which
    has ``look`` and ``read_at``): each look is one request that brings the facts with the bytes.
    A gateway too old to give them (``look`` returns None), or a log that cannot be seeked, is
    copied as read, as before."""

    #: Bytes kept from the end of what was read, to see the file change under the follower.
    TAIL = 64
    #: The most read at once (bytes); the rest right after, each read checked for a cut first.
    READ_MAX = 4 << 20
    #: Times one copy finds its place again after cuts that follow each other (then the next poll).
    RESYNC_TRIES = 8

    def __init__(self, fh: BinaryIO, path: str) -> None:
        self.fh = fh
        self.pos = 0  # the follower's place in the file (bytes)
        self.marker: tuple[int, int, int] | None = None  # (start, end, bytes cut) in the file now
        self.cut_seen: int | None = None  # the note's count at the first look, then as seen
        self.last = b""  # the last bytes read, ending at the follower's place
        self.fd = -1
        self.ident: tuple[int, int] | None = None  # the file read, where a look names it (gateway)
        self.remade = False  # a look found another file under the path (gateway)
        #: A look found another file under the path that its keeper did not make (gateway): the
        #: log was renamed away or replaced; the keeper writes on into the file read so far.
        self.moved = False
        self.made_seen: int | None = None  # the keeper's made-again count at the last look
        #: Times the log was truncated or rewritten by something other than its keeper (no
        #: marker, and the bytes before the follower's place are gone: ``cp f f.1; : > f``); the
        #: follower then reads it again from its start and its caller says so (one line each).
        self.foreign_cuts = 0
        self._foreign_once = False  # the last look saw that, not yet confirmed by a second
        self.on_foreign: Callable[[], None] | None = None  # called then, before the re-read
        self._other_once = False  # the last look found another file, its count not moved yet
        self.source: LogSource | None = None  # None: copied as read
        if hasattr(fh, "look") and hasattr(fh, "read_at"):
            self.source = cast(LogSource, fh)
            return
        try:
            fh.tell()
            self.fd = fh.fileno()
        except (AttributeError, OSError, ValueError):
            return
        self.pos = fh.tell()
        self.source = _OpenFile(self.fd, path)

    def replaced(self, path: str) -> bool:
        """Was the log deleted and made again under the follower? For a file it holds open: True
        when that file has no name any more (``st_nlink`` 0) and ``path`` names another file
        (device, inode): the keeper makes the log again only once the old one has no name
        (rig.logkeeper.LogCopy), and then writes only into the new one. A log renamed away still
        has a name, and its keeper still writes there: it is followed on. Two stats a poll at
        most (one while the log is whole). For a log read by name (the gateway): True once a
        look found another file under ``path`` than the one it read (the old one's last output,
        unnamed, cannot be reached through the gateway)."""
        if self.remade:
            return True
        if self.fd < 0:
            return False
        try:
            mine = os.fstat(self.fd)
            if mine.st_nlink:
                return False
            now = os.stat(path)
        except OSError:
            return False  # not made again yet: the keeper may still write into the old file
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    def _output_at(self, pos: int) -> int:
        """The place in the job's output of file position ``pos``, by the marker seen last."""
        if self.marker is None or pos <= self.marker[0]:
            return pos
        start, end, cut = self.marker
        return start + cut + max(0, pos - end)

    def _look(self) -> Look | None:
        """One look at the place reached; None when the file is gone, another one now (then
        ``remade``), or the source cannot look (an old gateway: the follower copies as read)."""
        source = self.source
        probe = None if self.marker is None else (self.marker[0], self.marker[1] - self.marker[0] + 32)
        assert source is not None
        look = source.look(self.pos, len(self.last), probe, self.READ_MAX)
        if look is None:
            self.source = None
            return None
        if look.gone:
            return None  # deleted, not made again yet: the next poll looks again
        if look.ident is not None:
            if self.ident is None:
                self.ident = look.ident
            elif look.ident != self.ident:
                if look.made_again is None or self.made_seen is None or look.made_again > self.made_seen:
                    self.remade = True
                elif self._other_once:
                    self.moved = True  # two looks, and its keeper counts no log made again
                else:
                    self._other_once = True  # the keeper counts one just after making it: look again
                return None
            self._other_once = False
            self.made_seen = look.made_again
        return look

    def copy(self, out: BinaryIO) -> None:
        while self.source is not None:
            look = self._look()
            if look is None:
                if self.source is None:
                    break  # copied as read from here on
                return
            said = b""
            tries = 0
            # The look after finding its place again is checked as the first was: the keeper can
            # cut again in between (a burst of output on a loaded host), and data read at the
            # place of the cut before was taken for what follows it (lines shown twice).
            while self._was_cut(look):
                resynced = self._resync()
                if resynced is None:
                    return  # a rewrite by someone else, maybe: the next poll looks again
                said = resynced or said  # the marker of the latest cut counts all cut before it
                tries += 1
                look = self._look() if tries < self.RESYNC_TRIES else None
                if look is None:  # cut on every look: the next poll goes on from this place
                    out.write(said)
                    out.flush()
                    return
            data = look.data
            if data and self.marker is None and (found := find_marker(data)) is not None:
                # A cut before this follower began (or one its note did not count yet): the
                # marker read in order is where the file's places stop being the output's.
                self.marker = (self.pos + found[0], self.pos + found[1], found[2])
            if data:
                self.pos += len(data)
                self.last = (self.last + data)[-self.TAIL:]
            out.write(said + data)
            out.flush()
            if len(data) < self.READ_MAX:
                return
        _copy(self.fh, out)

    def _was_cut(self, look: Look) -> bool:
        if self.cut_seen is None:
            self.cut_seen = look.cap_cut  # cut before the first look: the file is read in order
        elif look.cap_cut != self.cut_seen:
            self.cut_seen = look.cap_cut
            return True
        if look.size < self.pos:
            return True
        if self.last and look.before != self.last:
            return True
        if self.marker is not None:
            start, end, count = self.marker
            return find_marker(look.probe) != (0, end - start, count)
        return False

    def _resync(self) -> bytes | None:
        """Go on from the same output after a cut; returns the marker's bytes when output not
        read yet was cut. A file with no marker whose bytes before the follower's place are gone
        was not cut by its keeper (whose cut keeps the head and writes a marker) but truncated
        or rewritten by something else (a copy-truncate log rotation): seen on two looks in a
        row (the keeper's own cut has a moment between its truncate and its append where the
        marker is not there yet), it is read again from its start (``foreign_cuts`` counts it);
        on the first look, None: nothing moves and the next poll looks again."""
        done = self._output_at(self.pos)
        head = b""
        assert self.source is not None
        while len(head) < done + (1 << 16) and (chunk := self.source.read_at(len(head), CHUNK)):
            head += chunk
            if find_marker(head) is not None:
                break
        marker = find_marker(head)
        if marker is None and (len(head) < self.pos or head[self.pos - len(self.last):self.pos] != self.last):
            if not self._foreign_once:
                self._foreign_once = True
                return None
            self._foreign_once = False
            self.foreign_cuts += 1
            self.pos, self.marker, self.last = 0, None, b""
            if self.on_foreign is not None:
                self.on_foreign()
            return b""
        self._foreign_once = False
        self.marker = marker
        self.last = b""
        if self.marker is None or done <= self.marker[0]:
            self.pos = done  # still in the head, which a cut never changes
            return b""
        start, end, cut = self.marker
        resume = end + (done - start - cut)
        said = b""
        if resume < end:  # output it had not read was cut: say so as the file does
            said = head[start:end]
            resume = end
        self.pos = resume
        return said
