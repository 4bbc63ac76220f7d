"""Rendering for people (rich tables). No logic: everything shown comes from rig.client.

Every text that a submitter, a job or a node supplied (names, commands, reasons, evidence,
users, folders, models, health reasons) goes through ``rig.text.markup`` (``M``): control
sequences stripped, rich markup escaped. Only rig's own markup reaches rich unescaped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rig.cli.common import paused_words, stuck_words
from rig.cli.fit import Cell, Col, fitted_table
from rig.cli.logview import attempt_logs
from rig.client import StatusReport
from rig.clock import shared_now
from rig.data_format import mixed_note
from rig.draining import why_closed
from rig.durations import format_duration as duration
from rig.memory import format_memory, measured
from rig.models import CardState, Job, JobState, Priority
from rig.nodes import NodeInfo, clock
from rig.text import clean
from rig.text import markup as M

STATE_STYLE = {
    JobState.PENDING: "yellow", JobState.ASSIGNED: "cyan", JobState.RUNNING: "bold cyan",
    JobState.SUCCEEDED: "green", JobState.FAILED: "bold red", JobState.CANCELLED: "magenta",
    JobState.TIMEOUT: "red",
}


class RigConsole(Console):
    """rich's Console, but a closed stdout pipe (``rig status | head -1``) is left to
    rig.cli.common.handle_errors, which ends the command quietly with exit 0 (rich's own
    handler exits 1)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


def make_console() -> Console:
    """A console for stdout; when piped, wide enough that tables don't wrap (COLUMNS wins)."""
    import os
    import sys

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return RigConsole()
    return RigConsole(width=180)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def measured_memory(nbytes: int | float | None) -> str:
    """A measured memory figure (peak or mean, bytes per card) as `rig show` and `rig metrics`
    both print it: "-" when nothing was measured (rig.memory.measured), so "0 B" never claims
    a measurement there was not."""
    return format_memory(measured(nbytes))


def ago(ts: float | None) -> str:
    if not ts:
        return "-"
    return duration(shared_now() - ts) + " ago"


def when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


#: What a node in each state means for its jobs (`rig status`, and the web page beside its state);
#: a silent node's depends on its heartbeat's age: NodeInfo.silent_note.
NODE_STATE_NOTES = {
    "down": "takes no jobs; its running jobs were retried by their policy",
    "stopped": "takes no jobs; its running jobs run on, adopted on return",
}


#: What a node up with no live worker (NodeInfo.no_worker) means for its cards.
NO_WORKER_NOTE = "no worker alive: its cards run no job until one starts"


def node_title(node: NodeInfo | None, name: str, cards: int) -> str:
    """``node n1: up since 12:01:05, 2 cards, 3 workers`` (rich markup: a down node in red)."""
    if node is None:
        return f"node {M(name)}: {cards} card(s), never heartbeated"
    line = f"node {M(name)}: {M(node.describe)}"
    if node.mismatch:
        return f"[bold red]{line}[/]"  # both parts cleaned and escaped above
    if node.no_worker:  # up, but nothing runs its jobs: not said plainly "up"
        line = f"[bold yellow]{line}[/], {cards} card(s): {NO_WORKER_NOTE}"
    elif node.state == "up":
        line += f", {cards} card(s), {node.workers} worker(s)"
    elif node.writes_refused:  # rig.refused_beats: not silent, refused
        line = f"[bold yellow]{line}[/]"
    elif node.state == "silent":
        # A gone rig up's reason is in describe already: said once on the line.
        note = node.silent_note.removeprefix(f"{node.gone}; ") if node.gone else node.silent_note
        line = f"[bold yellow]{line}[/] (no heartbeat since {clock(node.last_seen)}; {note})"
    elif node.state == "down":
        line = f"[bold red]{line}[/] (last heartbeat {clock(node.last_seen)}): {NODE_STATE_NOTES['down']}"
    else:
        how = "" if node.stopped_why else " (rig down)"  # describe says why otherwise
        line = f"[yellow]{line}[/]{how}: {NODE_STATE_NOTES['stopped']}"
    if node.unrecorded:
        line += f"\n[bold red]{M(node.unrecorded)}[/]"
    if node.clock_skew:
        line += f"\n[bold yellow]{M(node.clock_skew)}[/]"
    mixed = mixed_note(node)
    if mixed:
        line += f"\n[bold red]{M(mixed)}[/]"
    return line


#: `rig status` card table columns, in rig.cli.fit's terms: the lowest ``drop`` goes first on a
#: narrow screen (what a dropped column said is in another column or in the lines under the
#: table: "flags" repeats closed_card_line). Card ids and job names shrink in the middle.
CARD_COLUMNS = (
    Col("card", "card", shrink="middle", min_width=8, want=16),
    Col("model", "model", drop=1, shrink="end", min_width=8, max_width=24),
    Col("total", "total", drop=2, justify="right"),
    Col("usable", "usable", drop=6, justify="right"),
    Col("reserved", "reserved", drop=7, justify="right"),
    Col("free", "free", justify="right"),
    Col("used", "used", drop=5, justify="right"),
    Col("util", "util", drop=4, justify="right"),
    Col("temp", "temp", drop=3, justify="right"),
    Col("jobs", "jobs", justify="right"),
    Col("flags", "flags", drop=0, shrink="end", min_width=12),
    Col("running", "running", shrink="middle", min_width=16, want=32),
)
#: `rig jobs` columns (rig.cli.fit). The reason (why a waiting job waits, or why a job ended as
#: it did) is what people read: before it is cut, age, exit (the reason says it), gpus (the
#: reason says "on each of 2 cards") and runtime go, in that order, so that at 160 columns a
#: waiting job's reason is whole; then est. start, prio, where and mem/card. At 80 columns id,
#: name, user, state, mem/card and the reason stay: on a shared server who submitted a job
#: matters more than where it ran. Names shrink before the reason does.
JOB_COLUMNS = (
    Col("id", "id", justify="right"),
    Col("name", "name", shrink="middle", min_width=12, want=16, max_width=48),
    Col("user", "user", drop=8, shrink="middle", min_width=6, want=10, max_width=16),
    Col("state", "state"),
    Col("prio", "prio", drop=5),
    Col("mem/card", "mem/card", drop=7, justify="right"),
    Col("gpus", "gpus", drop=2, justify="right"),
    Col("where", "where", drop=6, shrink="middle", min_width=7, want=9, max_width=24),
    Col("age", "age", drop=0, justify="right"),
    Col("runtime", "runtime", drop=3, justify="right"),
    Col("exit", "exit", drop=1, justify="right"),
    #: Only when estimated starts are given (rig.forecast).
    Col("est. start", "est. start", drop=4, justify="right"),
    Col("reason", "reason", drop=9, shrink="end", min_width=10, want=14, first_to=64, first_over=4),
)

#: `rig errors` (rig.cli.fit): the reason is cut at the end; `rig show JOB` has it whole. The
#: user goes last: who must look at a failure matters more than its class.
ERROR_COLUMNS = (
    Col("id", "id", justify="right"),
    Col("name", "name", shrink="middle", min_width=12, want=16, max_width=48),
    Col("user", "user", drop=3, shrink="middle", min_width=6, max_width=16),
    Col("state", "state"),
    Col("class", "class", drop=2, shrink="end", min_width=8, max_width=20),
    Col("attempts", "attempts", drop=0, justify="right"),
    Col("ended", "ended", drop=1, justify="right"),
    Col("reason", "reason", shrink="end", min_width=12, want=20, first_to=64),
)
#: `rig status`'s users and workers tables (rig.cli.fit).
USER_COLUMNS = (
    Col("user", "user", shrink="middle", min_width=8, want=16),
    Col("running", "running", justify="right"),
    Col("memory held", "memory held", drop=1, justify="right"),
    Col("waiting", "waiting", justify="right"),
    Col("recent GiB-h", "recent GiB-h", drop=0, justify="right"),
)
WORKER_COLUMNS = (
    Col("worker", "worker", shrink="middle", min_width=10, want=24),
    Col("role", "role", shrink="end", min_width=4, max_width=12),
    Col("card", "card", justify="right"),
    Col("pid", "pid", drop=1, justify="right"),
    Col("jobs", "jobs", drop=0, justify="right"),
    Col("last seen", "last seen", justify="right"),
)


def _render_cards(report: StatusReport, cards_of_node: list[CardState], title: str, console: Console) -> None:
    """One node's cards (memory in GiB), under a title that says whether the node is up."""
    rows = []
    for card in cards_of_node:
        jobs = report.running.get(card.id, [])
        flags = card_flag_words(card)
        rows.append({
            "card": card.id, "model": card.model, "total": _gib(card.total), "usable": _gib(card.usable),
            "reserved": _gib(card.reserved), "free": _gib(card.free), "used": _gib(card.used),
            "util": "-" if card.utilization is None else f"{card.utilization}%",
            "temp": "-" if card.temperature is None else f"{card.temperature}C",
            "jobs": f"{card.jobs}/{card.max_jobs}",
            "flags": Cell(" ".join(f"[{w}]" for w in flags) or "-", style="bold red" if flags else "dim"),
            # One running job a line: its id and name (shortened in the middle), and a mark
            # when it used more than it declared.
            "running": Cell([j.name for j in jobs] or ["-"], line_prefixes=[f"{j.id}:" for j in jobs],
                            line_suffixes=[" OVER" if j.overuse else "" for j in jobs],
                            suffix_style="bold red"),
        })
    cards = fitted_table(CARD_COLUMNS, rows, console.width, title=title, title_justify="left",
                         caption="memory in GiB", caption_justify="left")
    console.print(cards)
    watched = {(w.node, w.card) for w in report.workers if w.role == "card"}
    # Also below the table: on a narrow screen the flags column is the first to go. Cards
    # closed for the same words are said in one line (a stopped node's 8 cards: 8 lines).
    said: dict[str, list[str]] = {}
    for card in cards_of_node:
        line = closed_card_line(card, len(report.running.get(card.id, [])), (card.node, card.index) in watched)
        if line:
            said.setdefault(line.removeprefix(f"{card.id} takes "), []).append(card.id)
    for rest, ids in said.items():
        if len(ids) == 1:
            console.print(M(f"{ids[0]} takes {rest}"))
        else:
            every = len(ids) == len(cards_of_node)
            who = f"all {len(ids)} cards of {cards_of_node[0].node}" if every else ", ".join(ids)
            console.print(M(f"{who} take {rest}"))


def closed_card_line(card: CardState, running: int, watched: bool = True) -> str | None:
    """``n1/1 takes no new jobs: not in whitelist; its 1 running job(s) are watched until they
    end`` for a card that takes no jobs, else None; ``watched``: a worker of the card is alive
    (else its running jobs are said to be unwatched). Plain text (the caller escapes it)."""
    closed = why_closed(card)
    why = closed or (f"unhealthy ({card.health_reason})" if not card.healthy and card.health_reason
                     else "unhealthy" if not card.healthy else None)
    if why is None:
        return None
    line = f"{card.id} takes no new jobs: {why}"
    if running and watched:
        line += f"; its {running} running job(s) are watched until they end"
    elif running:
        line += (f"; its {running} running job(s) have no card worker watching them now "
                 "(is `rig up` running on its node?)")
    return line


def card_flag_words(card: CardState) -> list[str]:
    """Why a card takes no (new) jobs and what else holds it, plain words: ``others use 1.0 GiB``,
    ``not in whitelist``, ``UNHEALTHY: reason`` (the reason as the node gave it: callers clean)."""
    parts = []
    if card.foreign:
        parts.append(f"others use {_gib(card.foreign)} GiB")
    closed = why_closed(card)
    if closed:
        parts.append(closed)
    if not card.healthy:
        parts.append(f"UNHEALTHY: {card.health_reason}" if card.health_reason else "UNHEALTHY")
    return parts


def card_flags(card: CardState) -> str:
    """Why a card takes no (new) jobs and what else holds it, as rich markup: ``[others use
    1.0 GiB] [not in whitelist] [UNHEALTHY: reason]``. Every part is escaped here (a bracketed
    text is a rich tag otherwise, and would vanish): the one place these flags are built."""
    return " ".join(escape(f"[{clean(p)}]") for p in card_flag_words(card))


def render_status(report: StatusReport, console: Console) -> None:
    by_node: dict[str, list[CardState]] = {}
    for card in report.cards:
        by_node.setdefault(card.node, []).append(card)
    nodes = {n.name: n for n in report.nodes}
    for name, node_cards in by_node.items():
        # Cards gone from the node (kept while a job runs there) are not its cards any more.
        _render_cards(report, node_cards, node_title(nodes.get(name), name, sum(not c.gone for c in node_cards)),
                      console)
    for node in report.nodes:
        if node.name not in by_node:  # e.g. a control-only node
            console.print(node_title(node, node.name, 0))
    if report.pool_empty:  # the pool's own truth: its nodes may well be up (their nodes are listed only by card)
        console.print(escape(report.pool_empty))
    elif not report.cards and not report.nodes:  # a node without cards (FROZEN, control-only) is said above
        console.print("no cards registered: no rig node is up (start one with `rig up`)")

    if report.pool:
        console.print(f"pool {M(report.pool)}: {len(report.cards)} card(s); waiting jobs below are those "
                      f"submitted with --pool {M(report.pool)}")
    queues = Table(title="waiting jobs", title_justify="left")
    queues.add_column("priority")
    queues.add_column("waiting", justify="right")
    queues.add_column("oldest wait", justify="right")
    for prio in Priority:
        queues.add_row(prio.value, str(report.pending.get(prio, 0)), duration(report.oldest_wait.get(prio)))
    console.print(queues)

    if report.users:
        scope = "; the whole cluster" if report.pool else ""
        rows = [{"user": u.user, "running": str(u.running), "memory held": format_memory(u.held) if u.held else "-",
                 "waiting": str(u.waiting), "recent GiB-h": f"{u.recent_gib_hours:.1f}"} for u in report.users]
        # The title on a line of its own: as a table title it would wrap to the table's width.
        console.print(f"[italic]users (fair share: least recent usage starts next within a priority{scope})[/]")
        console.print(fitted_table(USER_COLUMNS, rows, console.width))

    title = f"workers alive: {len(report.workers)}"
    if report.beats_refused:  # rig.refused_beats: alive or not is unknown, not "0"
        title = f"workers with a heartbeat: {len(report.workers)} ({M(report.beats_refused)}: heartbeats are refused)"
    rows = [{"worker": w.name, "role": w.role, "card": "-" if w.card is None else str(w.card), "pid": str(w.pid),
             "jobs": str(w.jobs), "last seen": ago(w.seen_at)} for w in report.workers]
    console.print(fitted_table(WORKER_COLUMNS, rows, console.width, title=title, title_justify="left"))
    counts = "  ".join(f"{s.value.lower()}={n}" for s, n in report.counts.items())
    if len(counts) + 6 > console.width:  # one line: the states with no job go first
        counts = "  ".join(f"{s.value.lower()}={n}" for s, n in report.counts.items() if n) or "none"
    archived = "" if report.archived is None else f"; archived (finished, out of Redis): {report.archived}"
    if report.archived is not None and report.archive:
        archived += f" in {M(report.archive)}"  # a path of the operator's: may hold [ ]
    console.print(f"jobs: {counts}{archived}")
    for notice in report.notices:  # rig's Redis: full, or set up to lose rig's data
        console.print(M(f"warning: {notice}"), style="yellow")


def job_reason(job: Job, said: str | None = None) -> str:
    """One line for `rig jobs` and `rig top`: why a waiting job waits (``said``, what
    rig.waiting.waiting_words gives it: the dispatcher's current sentence, its place in the
    queue, or the live sentence `rig show` gives; without it, the stored sentence), else why a
    job ended as it did (its failure class when it has no reason: `rig errors` shows both)."""
    if job.state is JobState.PENDING:
        return said or job.wait_reason or "-"
    if job.state in (JobState.ASSIGNED, JobState.RUNNING):
        if job.stuck:
            return stuck_words(job.stuck)
        if job.paused_since and job.state is JobState.RUNNING:
            return paused_words(job.id, when(job.paused_since))
        # A live job's reason and class are its last attempt's: say so, never as if now.
        if not job.attempts:
            return "-"
        last = job.attempts[-1]
        said = last.get("summary") or last.get("outcome") or job.failure or "failed"
        return f"attempt {job.attempt}; attempt {last.get('attempt', job.attempt - 1)}: {said}"
    return job.reason or job.failure or "-"


def render_jobs(jobs: list[Job], console: Console, starts: Mapping[int, str] | None = None,
                said: Mapping[int, str] | None = None) -> None:
    """`rig jobs`; with ``starts`` (job id -> rig.forecast's short words, e.g. ``~14:20``), an
    ``est. start`` column for the waiting jobs; ``said`` (job id -> why it waits,
    Client.waiting_words) is a waiting job's reason."""
    now = shared_now()
    rows = []
    seen = Counter(job.id for job in jobs)
    for job in jobs:
        runtime = None
        if job.started_at:
            runtime = (job.ended_at or now) - job.started_at
        rows.append({
            # An id shown twice (given again after Redis lost its data): its instance tells them apart.
            "id": f"{job.id} {(job.instance or '?')[:6]}" if seen[job.id] > 1 else str(job.id),
            "name": job.name, "user": job.user,
            # A state is never cut (its column is as wide as the longest one shown).
            "state": Cell(job.state.value, style=STATE_STYLE[job.state]), "prio": job.priority.value,
            "mem/card": format_memory(job.gpu_memory), "gpus": str(job.gpus),
            "where": f"{job.node}/{','.join(map(str, job.cards))}" if job.node else "-",
            "age": duration(now - job.created_at), "runtime": duration(runtime),
            "exit": "-" if job.exit_code is None else str(job.exit_code),
            "reason": Cell(job_reason(job, (said or {}).get(job.id)), style="dim" if job.state is JobState.SUCCEEDED else ""),
            "est. start": (starts or {}).get(job.id, "-"),
        })
    if not jobs:
        console.print("no jobs")
    else:
        columns = [c for c in JOB_COLUMNS if starts is not None or c.key != "est. start"]
        console.print(fitted_table(columns, rows, console.width))
        if any(n > 1 for n in seen.values()):
            console.print("ids repeat (Redis lost its data and gave them again): `rig show ID --instance HEX` "
                          "shows one")


#: `rig metrics`: what goes first on a narrow screen (lowest drop first); never a cut heading.
METRICS_COLUMNS = (
    Col("attempt", "attempt", justify="right"),
    Col("outcome", "outcome", shrink="end", min_width=7, want=12),
    Col("declared", "declared", drop=4, justify="right"),
    Col("peak", "peak", justify="right"),
    Col("mean", "mean", drop=2, justify="right"),
    Col("ratio", "peak/declared", drop=3, justify="right"),
    Col("util", "gpu util", drop=1, justify="right"),
    Col("duration", "duration", drop=5, justify="right"),
)


def render_metrics(job: Job, console: Console) -> None:
    """Declared vs measured memory, utilisation and duration, per attempt (M12)."""
    rows: list[dict[str, str | Cell]] = []

    def row(n, outcome, declared, peak, mean, util, seconds) -> None:  # noqa: ANN001
        over = bool(peak and declared and peak > declared)
        ratio = f"{peak / declared:.0%}" + (" over" if over else "") if peak and declared else "-"
        rows.append({"attempt": str(n), "outcome": str(outcome), "declared": format_memory(declared),
                     "peak": measured_memory(peak), "mean": measured_memory(mean),
                     "ratio": Cell(ratio, style="bold red" if over else ""),
                     "util": "-" if util is None else f"{util:.0f}%", "duration": duration(seconds)})

    for a in job.attempts:
        took = (a.get("ended_at") or 0) - (a.get("started_at") or 0) if a.get("started_at") else None
        row(a.get("attempt"), a.get("outcome", "-"), a.get("gpu_memory"), a.get("vram_peak"),
            a.get("vram_mean"), a.get("util_mean"), took)
    if job.state is JobState.RUNNING:
        row(job.attempt, "running", job.gpu_memory, job.vram_peak, job.vram_mean, job.util_mean,
            shared_now() - job.started_at if job.started_at else None)
    if not job.attempts and job.state is not JobState.RUNNING:
        # A job that ended before it started never runs: "not run yet (cancelled)" promised it would.
        console.print(f"job {job.id} ended {job.state.value} before it started: nothing was measured"
                      if job.state.terminal else f"job {job.id} has not run yet ({job.state.value.lower()})")
        return
    console.print(fitted_table(METRICS_COLUMNS, rows, console.width,
                               title=f"job {job.id} '{M(job.name)}': measured on its card(s), per attempt",
                               title_justify="left"))


#: What a person does with the error queue, as one line or, on a narrow screen, two.
ERRORS_HINT = ("`rig retry JOB [--gpu-memory SIZE]` sends one back;", "`rig errors --clear JOB` dismisses it")


def _errors_hint(width: int) -> list[str]:
    """:data:`ERRORS_HINT` on one line when it fits ``width``, else one line each (never wrapped
    mid-sentence)."""
    return _parts_fitted(ERRORS_HINT, width)


def _parts_fitted(parts: Sequence[str], width: int) -> list[str]:
    """``parts`` on one line when it fits ``width``, else one line each: a terminal's wrap would
    cut a command inside them (`rig errors --limit` / `N` shows more)."""
    one = " ".join(parts)
    return [one] if len(one) <= width else list(parts)


def render_errors(jobs: list[Job], console: Console, *, total: int | None = None) -> None:
    """The error queue's first jobs; ``total``: how many it holds (said when more than shown)."""
    if not jobs:
        console.print("the error queue is empty")
        return
    rows = [{"id": str(job.id), "name": job.name, "user": job.user,
             "state": Cell(job.state.value, style=STATE_STYLE[job.state]), "class": job.failure or "-",
             "attempts": str(job.attempt), "ended": ago(job.ended_at), "reason": job.reason or "-"} for job in jobs]
    if total is not None and total > len(jobs):
        for line in _parts_fitted((f"error queue: {total:,} job(s) waiting for a person, {len(jobs):,} of "
                                   f"{total:,} shown", "(`rig errors --limit N` shows more)"), console.width):
            console.print(line)
    else:
        console.print(f"error queue: {len(jobs)} job(s) waiting for a person")
    console.print(fitted_table(ERROR_COLUMNS, rows, console.width))
    for line in _errors_hint(console.width):
        console.print(line)


def render_job(job: Job, why: str | None, console: Console, *, in_error_queue: bool = False,
               estimated_start: str | None = None, expected_run: str | None = None,
               expected_end: str | None = None) -> None:
    """`rig show`: ``why`` a waiting job waits (rig.waiting), its ``estimated_start`` and the
    ``expected_run`` that assumed (rig.forecast's sentences); a running job's ``expected_end``
    (rig.forecast.RunningEnd); then its record."""
    rows: list[tuple[str, str]] = [
        ("id", str(job.id)), ("name", job.name), ("user", job.user),
        ("state", f"[{STATE_STYLE[job.state]}]{job.state.value}[/]"),
        ("priority", job.priority.value), ("command", job.display_command),
        ("workdir", job.workdir), ("gpu memory", f"{format_memory(job.gpu_memory)} per card"),
        ("gpus", str(job.gpus)),
    ]
    if job.pool:
        rows.append(("pool", job.pool))  # it runs only on that pool's cards
    if job.template:
        # Where its priority, retries, time limit and margin came from when no flag said them.
        rows.append(("template", job.template))
    if why:
        rows.append(("waiting because", why))
    if estimated_start:
        rows.append(("estimated start", estimated_start))
    if expected_run:
        rows.append(("expected run", expected_run))
    if job.node:
        rows.append(("node / cards", f"{job.node} / {', '.join(map(str, job.cards))}"))
    rows += [("submitted", when(job.created_at))]
    if job.queued_at:  # its wait counts from here (rig.models.waiting_since)
        rows.append(("back in queue", when(job.queued_at)))
    rows += [("placed", when(job.assigned_at)),
             ("started", when(job.started_at)), ("ended", when(job.ended_at))]
    if job.started_at:
        rows.append(("runtime", duration((job.ended_at or shared_now()) - job.started_at)))
    if expected_end:
        rows.append(("expected end", expected_end))
    if job.exit_code is not None:
        rows.append(("exit code", str(job.exit_code)))
    if job.reason:
        rows.append(("reason", job.reason))
    if job.stuck and not job.state.terminal:
        rows.append(("stopping", stuck_words(job.stuck)))
    if job.paused_since and job.state is JobState.RUNNING:
        rows.append(("paused", paused_words(job.id, when(job.paused_since))))
    for problem in job.problems:  # a damaged record: what is wrong with it
        rows.append(("invalid record", problem))
    if job.vram_samples:
        rows.append(("measured", f"peak {measured_memory(job.vram_peak)}, mean {measured_memory(job.vram_mean)}"
                     + (f", util {job.util_mean:.0f}%" if job.util_mean is not None else "")))
    if job.overuse:
        rows.append(("over its declaration", f"[bold red]used up to {format_memory(job.overuse)}[/]"))
    if job.failure:
        rows.append(("failure class", job.failure))
    for line in job.evidence:
        rows.append(("evidence", line))
    if job.suggested_gpu_memory:
        rows.append(("suggested memory", f"{format_memory(job.suggested_gpu_memory)} per card"))
    if in_error_queue:
        rows.append(("error queue", f"yes: `rig retry {job.id}` or `rig errors --clear {job.id}`"))
    if job.retries is None:
        rows.append(("retries", f"up to {job.max_retries}"))
    else:  # retried by a person: max_retries counts every attempt before the last retry too
        rows.append(("retries", f"up to {job.retries} after each `rig retry` ({job.max_retries} in all so far)"))
    if job.time_limit:
        rows.append(("time limit", duration(job.time_limit)))
    if job.attempt:
        rows.append(("attempts", str(job.attempt)))
    for item in job.attempts:
        where = f"{item.get('node')}/{','.join(map(str, item.get('cards') or []))}"
        took = duration((item.get("ended_at") or 0) - (item.get("started_at") or 0)) if item.get("started_at") else "-"
        rows.append((f"attempt {item.get('attempt')}",
                     f"{item.get('outcome')}: {item.get('summary')} on {where}, {took}, "
                     f"{format_memory(item.get('gpu_memory'))}"))
    if job.pid:
        rows.append(("pid", str(job.pid)))
    for i, path in attempt_logs(job).items():  # numbered as the record numbers attempts
        rows.append((f"log (attempt {i})", path))
    if job.env:
        rows.append(("env", ", ".join(sorted(job.env))))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        # Names, commands, reasons... are the submitter's text, never rich markup.
        table.add_row(key, value if key in _MARKUP_ROWS else M(value, multiline=key in _MULTILINE_ROWS))
    console.print(table)


#: Rows of render_job whose values carry rich markup of rig's own.
_MARKUP_ROWS = frozenset({"state", "over its declaration"})
#: Rows whose line breaks are shown as line breaks: a newline in a shell command separates
#: commands, so shown as a space it would make `echo safe<NL>touch x` read as one echo.
_MULTILINE_ROWS = frozenset({"command"})
