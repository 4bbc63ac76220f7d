"""``rig kill A B C``: every id is checked before anything is killed.

A malformed id (``49x``) is one line on stderr (``'49x' is not a job id ...``), said before
Redis is asked, and then nothing at all is killed (exit 2): a mistyped list is a slip, and
half-acting on it (a tester's ``rig kill 13 abc`` cancelled 13, then refused abc) leaves the
user to work out what happened. With only well-formed ids, an unknown id (or one too long to
be any job's), or another user's job, is one line on stderr and the others are still killed
(another user's job among them refuses the whole command first: exit 8, nothing killed, and
the line says so and names the other users' jobs); a
running job that does not stop within the wait is one line too, never a traceback. The exit
status is 0 when every job was handled; else 2 when an id was malformed (nothing killed),
else the code of the first problem (4 unknown, 8 not yours, 1 still running: rig.errors). A
job whose node is stopped or down is not waited for: its kill is recorded, one line says it
happens when the node is back, and the status is 1 (it still runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click

import rig.client as rig_client
from rig.cli.common import parse_job_id, stuck_words
from rig.cli.entry import INTERRUPTED_EXIT
from rig.client import Client
from rig.errors import InvalidInput, JobNotFound, PermissionDenied, RedisUnavailable, RigError
from rig.listing import first_ids
from rig.models import Job, JobState
from rig.text import clean

#: Exit status when a kill was requested but the job still ran when the wait ended.
STILL_RUNNING_EXIT = 1


def kill_command(connect: Callable[[], Client], texts: Sequence[str], *, wait: bool) -> int:
    """``rig kill TEXTS``: every id is parsed first; a malformed one is one line each and
    nothing is killed (exit 2, Redis never asked); else :func:`kill_jobs` of them (``connect``
    makes the client and checks Redis answers). Returns the exit status (see the module doc)."""
    ids: list[int] = []
    unknown: list[JobNotFound] = []
    malformed: list[InvalidInput] = []
    for text in texts:
        try:
            jid = parse_job_id(text)
        except JobNotFound as exc:  # digits, but more than any job id has: no such job
            unknown.append(exc)
            continue
        except InvalidInput as exc:
            malformed.append(exc)
            continue
        if jid not in ids:  # `rig kill 5 5` kills job 5 once
            ids.append(jid)
    if malformed:
        others = len(texts) > len(malformed)
        for exc in malformed:
            click.echo(f"rig: error: {clean(str(exc))}{'; nothing was killed' if others else ''}", err=True)
        return InvalidInput.exit_code
    for exc in unknown:
        click.echo(f"rig: error: {clean(str(exc))}", err=True)
    status = kill_jobs(connect(), ids, wait=wait) if ids else 0
    return status or (JobNotFound.exit_code if unknown else 0)


def kill_jobs(client: Client, job_ids: list[int], *, wait: bool) -> int:
    """Kill ``job_ids`` in order, reporting one line per job; returns the exit status."""
    status = 0

    def problem(message: str, code: int) -> None:
        nonlocal status
        click.echo(f"rig: error: {clean(message)}", err=True)
        status = status or code

    known = []
    denied: list[tuple[int, PermissionDenied]] = []
    waiting: list[Job] = []
    records = client.records(job_ids)  # a sweep's 10,000 ids: a few round trips, not one each
    for jid in job_ids:
        job = records[jid]
        try:
            if isinstance(job, RigError):
                raise job
            if not job.state.terminal:
                client.check_control(job, "kill")  # no one else's job, unless an admin asks
        except PermissionDenied as exc:
            denied.append((jid, exc))
            continue
        except RedisUnavailable:
            raise  # Redis trouble stops everything: handle_errors says it in one line
        except RigError as exc:  # unknown (4), a damaged record (9): that id only
            problem(str(exc), exc.exit_code)
            continue
        known.append(jid)
        if job.state is JobState.PENDING:
            waiting.append(job)
    if denied:
        # Another user's job among them: a slip of the id list, so nothing is killed (exit 8),
        # said as for a malformed id: `rig kill 10 11` named only 10 and left 11 running unsaid.
        first = denied[0][1]
        if len(job_ids) == 1:
            raise first
        more = [jid for jid, _ in denied[1:]]
        also = f"; job(s) {first_ids(more)} are other users' too" if more else ""
        raise PermissionDenied(f"{first}{also}; nothing was killed")
    # Waiting jobs are cancelled together (one script call each, one nudge a batch); one placed
    # or started meanwhile is killed below like any other. Said batch by batch: a sweep cut
    # short (Redis stopped answering half-way) has said which jobs it cancelled before the error.
    cancelled: set[int] = set()
    batch = rig_client.KILL_BATCH
    for start in range(0, len(waiting), batch):
        for jid in client.cancel_waiting(waiting[start:start + batch]):
            click.echo(f"job {jid} cancelled (was pending); {_memory_words(JobState.PENDING)}")
            cancelled.add(jid)
    for jid in known:
        if jid in cancelled:
            continue
        try:
            before = client.get(jid)
            if before.state.terminal:
                click.echo(f"job {before.id} already ended ({before.state.value}); nothing to kill")
                continue
            if before.stuck and before.cancel_requested:
                # Stopped already, and a process outlived SIGKILL: waiting would only time out.
                problem(_stuck_line(before), STILL_RUNNING_EXIT)
                continue
            away = _node_away(client, before)
            if away is not None:
                # No card worker of that node runs to stop it: the request is recorded (its
                # worker acts on it when it adopts the job), and waiting would only time out.
                client.kill(jid, wait=False)
                click.echo(f"rig: job {jid}: kill recorded; {away}, so the job stops when the node is back "
                           f"(`rig up --node {before.node}`)", err=True)
                status = status or STILL_RUNNING_EXIT
                continue
            try:
                after = client.kill(jid, wait=wait)
            except KeyboardInterrupt:
                _interrupted(client, jid, [j for j in known[known.index(jid) + 1:] if j not in cancelled])
                raise SystemExit(INTERRUPTED_EXIT) from None
        except RedisUnavailable:
            raise
        except RigError as exc:  # it vanished or changed owner since the check
            problem(str(exc), exc.exit_code)
            continue
        except TimeoutError:
            waited = client.settings.kill_grace_seconds + 20
            now = client.get(jid)
            where = f" on {now.node}/{','.join(map(str, now.cards))}" if now.node else ""
            if now.stuck and not now.state.terminal:
                problem(_stuck_line(now), STILL_RUNNING_EXIT)
                continue
            problem(f"job {jid}: kill requested, but it is still {now.state.value.lower()}{where} after "
                    f"{waited:.0f} s; its card worker stops it when it sees the request (is that node up? "
                    "`rig status` shows its card workers)", STILL_RUNNING_EXIT)
            continue
        if after.state is JobState.CANCELLED and before.cancel_requested:
            # Another `rig kill` (or Flower's Terminate) asked first: it says the cancel; this
            # one saw it happen (two kills of one sweep both said "cancelled").
            click.echo(f"job {after.id} cancelled (a kill was already requested when this one came)")
        elif after.state is JobState.CANCELLED:
            click.echo(f"job {after.id} cancelled (was {before.state.value.lower()}); {_memory_words(before.state)}")
        elif after.state.terminal:
            click.echo(f"job {after.id} ended {after.state.value} before the kill reached it")
        else:
            click.echo(f"job {after.id}: kill requested; it is still {after.state.value.lower()}")
    return status


def _interrupted(client: Client, jid: int, rest: list[int]) -> None:
    """Ctrl-C while `rig kill` waited for job ``jid`` to stop (a job that ignores SIGTERM takes
    kill_grace_seconds): say, from its record, whether the kill was requested (its card worker
    then stops it without this command) and which ids were not handled; the command exits 130. It
    ended with a bare newline: nothing said whether the kill would still happen."""
    click.echo("", err=True)
    try:
        job = client.get(jid)
    except (RigError, OSError):
        job = None
    if job is None:
        click.echo(f"rig: job {jid}: interrupted; `rig show {jid}` says whether it is stopping", err=True)
    elif job.state.terminal:
        click.echo(f"rig: job {jid} ended {job.state.value}", err=True)
    elif job.cancel_requested:
        click.echo(f"rig: job {jid}: kill requested, it is stopping (SIGKILL after {client.settings.kill_grace_seconds:g} s); "
                   f"only the waiting was interrupted: `rig show {jid}` says when it ended", err=True)
    else:
        click.echo(f"rig: job {jid}: interrupted before the kill was requested; it is still "
                   f"{job.state.value.lower()}: run `rig kill {jid}` again", err=True)
    if rest:
        click.echo(f"rig: not handled (interrupted first): {first_ids(rest, sep=' ')}", err=True)


def _stuck_line(job: Job) -> str:
    """What `rig kill` says of a job it stopped whose process outlived SIGKILL (Job.stuck)."""
    where = f" on {job.node}/{','.join(map(str, job.cards))}" if job.node else ""
    return f"job {job.id}: kill requested and carried out{where}, but {stuck_words(job.stuck or '')}"


def _memory_words(was: JobState) -> str:
    """What cancelling a job in state ``was`` did to GPU memory: a waiting job never held any
    (issue 13: "its GPU memory is free" was said of pending jobs too)."""
    if was is JobState.PENDING:
        return "it held no GPU memory"
    if was is JobState.ASSIGNED:
        return "the GPU memory reserved for it is free"
    return "its GPU memory is free"


def _node_away(client: Client, job) -> str | None:  # noqa: ANN001 - rig.models.Job
    """"node a is stopped since 19:04:16" when ``job`` runs (or was started) on a node that is
    stopped or down, i.e. no worker there can act on a kill now; None otherwise (waiting jobs
    are cancelled at once; an up or silent node gets the usual wait)."""
    if job.state not in (JobState.RUNNING, JobState.ASSIGNED) or not job.node:
        return None
    found = [n for n in client.nodes() if n.name == job.node]
    if not found or found[0].state not in ("stopped", "down"):
        return None
    return f"node {job.node} is {found[0].describe}"
