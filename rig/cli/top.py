"""``rig top``: a live, full-screen view of the cards, the queues and the running jobs.

``build_view`` is pure (a StatusReport in, a rich renderable out) so it is testable without
Redis or a terminal; ``run_top`` is the loop that re-reads the data and redraws it. Text that
jobs, submitters or nodes supplied goes through ``rig.text.clean`` (``C``) on its way into a
``Text``: no control sequence reaches the terminal.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import click
import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from rig.cli.common import client_from, handle_errors
from rig.cli.fit import shorten_middle, shorten_names
from rig.cli.render import duration, job_reason, make_console
from rig.client import StatusReport
from rig.clock import shared_now
from rig.draining import why_closed
from rig.errors import RigError
from rig.memory import measured
from rig.models import CardState, Job, JobState, Priority, waiting_since
from rig.nodes import clock
from rig.redis_writes import short_notice
from rig.text import clean as C

GIB = 2**30
#: Redraws per second (elapsed times tick between two reads of the data).
REFRESH_PER_SECOND = 4
NO_CARDS = "no cards registered: no rig node is up (start one with `rig up`)"

# Bar segments: what the card really uses, what rig reserved but is not used yet, what is free.
BAR_USED, BAR_RESERVED, BAR_FREE = "█", "▒", "░"


# -- small formatting helpers -------------------------------------------------------------------
def _g(value: int | None) -> str:
    """Bytes as a short GiB number: 7.5, 79.1, 141."""
    if value is None:
        return "-"
    v = value / GIB
    return f"{v:.1f}" if v < 99.95 else f"{v:.0f}"


def _cell(value: str | Text, width: int, justify: str = "left", style: str = "") -> Text:
    """Exactly ``width`` cells: cut with an ellipsis when longer, padded when shorter."""
    text = value.copy() if isinstance(value, Text) else Text(value, style=style)
    if width <= 0:
        return Text()
    text.truncate(width, overflow="ellipsis")
    missing = width - text.cell_len
    if missing > 0:
        if justify == "right":
            text.pad_left(missing)
        else:
            text.pad_right(missing)
    return text


def _fit(text: Text, width: int) -> Text:
    """One screen line: never wraps, never wider than ``width``."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    if text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    text.rstrip()
    return text


@dataclass
class _Col:
    key: str
    header: str
    width: int
    justify: str = "left"
    middle: bool = False  # a name: shortened in the middle (rig.cli.fit), its end stays


def _row(cols: list[_Col], values: dict[str, str | Text]) -> Text:
    out = Text()
    for i, col in enumerate(cols):
        if i:
            out.append(" ")
        value = values.get(col.key, "")
        if col.middle:
            value = _middle(value, col.width)
        out.append_text(_cell(value, col.width, col.justify))
    return out


def _middle(value: str | Text, width: int) -> str | Text:
    """``value`` shortened in the middle to ``width`` cells (a Text keeps its style)."""
    if isinstance(value, Text):
        return Text(shorten_middle(value.plain, width), style=value.style)
    return shorten_middle(value, width)


def _rows(cols: list[_Col], rows: list[dict[str, str | Text]]) -> list[Text]:
    """One line a row; the names of each ``middle`` column shortened together
    (rig.cli.fit.shorten_names), so a sweep's runs and a team's users stay apart."""
    rows = [dict(values) for values in rows]
    for col in cols:
        if not col.middle:
            continue
        cells = [values.get(col.key, "") for values in rows]
        short = shorten_names([c.plain if isinstance(c, Text) else c for c in cells], col.width)
        for values, cell, name in zip(rows, cells, short, strict=True):
            values[col.key] = Text(name, style=cell.style) if isinstance(cell, Text) else name
    return [_row(cols, values) for values in rows]


def _header(cols: list[_Col]) -> Text:
    line = _row(cols, {c.key: c.header for c in cols})
    line.stylize("bold dim")
    return line


def _layout(cols: list[_Col], width: int, rest: _Col, rest_min: int, drop: list[str]) -> list[_Col]:
    """Give ``rest`` (the last, elastic column) what is left; drop columns in ``drop`` order
    while it would get less than ``rest_min``."""
    cols = list(cols)
    for key in [None, *drop]:
        if key is not None:
            cols = [c for c in cols if c.key != key]
        used = sum(c.width + 1 for c in cols)
        if width - used >= rest_min:
            break
    rest.width = max(1, width - sum(c.width + 1 for c in cols))
    return [*cols, rest]


def _bar(card: CardState, width: int) -> Text:
    """Used / reserved-but-unused / free, scaled to the card's usable memory."""
    usable = max(card.usable, 1)
    used = card.used or 0
    taken = card.taken

    def cells(n: int) -> int:
        return max(0, min(width, round(min(n, usable) / usable * width)))

    n_used = cells(used)
    n_taken = max(n_used, cells(taken))
    if used and n_used == 0:
        n_used = min(1, width)  # a card in use never looks idle
        n_taken = max(n_taken, n_used)
    n_within = min(n_used, cells(taken))  # used cells covered by reservations
    bar = Text()
    bar.append(BAR_USED * n_within, style="green")
    bar.append(BAR_USED * (n_used - n_within), style="bold red")  # used beyond reservations
    bar.append(BAR_RESERVED * (n_taken - n_used), style="yellow")
    bar.append(BAR_FREE * (width - n_taken), style="dim")
    return bar


def _short_model(model: str, width: int | None = None) -> str:
    """The model without the vendor's prefix; cut at a word when ``width`` is too small."""
    for prefix in ("NVIDIA ", "GeForce ", "Tesla "):
        if model.startswith(prefix):
            model = model[len(prefix):]
    if width is not None and len(model) > width:
        cut = max(model.rfind(" ", 0, width + 1), model.rfind("-", 0, width + 1))
        if cut > 0:
            model = model[:cut]
    return model


def _over(job: Job) -> bool:
    """Used more than it declared (per card)."""
    return bool(job.overuse) or job.vram_peak > job.gpu_memory


def _card_flags(card: CardState, wide: bool) -> Text:
    flags = Text()
    left, right = ("[", "] ") if wide else ("", " ")
    if not card.healthy:
        reason = f"UNHEALTHY: {C(card.health_reason)}" if card.health_reason else "UNHEALTHY"
        flags.append(f"{left}{reason}{right}", style="bold red")
    closed = why_closed(card)  # Text, not markup: brackets show as typed
    if closed:
        flags.append(f"{left}{closed}{right}", style="yellow")
    if card.foreign:
        flags.append(f"{left}others {_g(card.foreign)}G{right}", style="magenta")
    return flags


def _temp(card: CardState) -> Text:
    if card.temperature is None:
        return Text("-")
    style = "bold red" if card.temperature >= 85 else "yellow" if card.temperature >= 75 else ""
    return Text(f"{card.temperature}C", style=style)


def _util(card: CardState) -> str:
    return "-" if card.utilization is None else f"{card.utilization}%"


# -- sections -----------------------------------------------------------------------------------
#: The card line's last heading ("health / jobs on it") on a narrow screen, the first that fits
#: (the last always). Never plain "jobs": the count column beside it is headed so ("jobs jobs").
NARROW_REST_HEADERS = ("health / jobs", "running", "on it")


def _card_lines(report: StatusReport, width: int) -> tuple[Text, list[Text], list[bool]]:
    """The cards' heading and lines, a node's heading line before its cards where there are
    several nodes, and which lines are a card's (a node's heading is no card to count)."""
    cards = report.cards
    wide = width >= 140
    id_w = min(max((len(c.id) for c in cards), default=4), 24 if wide else 14 if width >= 80 else 12)
    model_cap = 28 if wide else 16 if width >= 100 else 8
    model_w = max((len(_short_model(c.model, model_cap)) for c in cards), default=5)
    model_w = min(model_w, model_cap)
    mem_values = [f"{_g(c.reserved)}/{_g(c.used)}/{_g(c.free)}/{_g(c.usable)}" for c in cards]
    mem_header = "res/used/free/usable GiB" if wide else "res/used/free/usable"
    mem_w = max(len(mem_header), *(len(v) for v in mem_values))
    jobs_w = max(4, *(len(f"{c.jobs}/{c.max_jobs}") for c in cards))
    bar_w = max(8, min(48, width // 7 if width >= 100 else width // 8))
    cols = [
        _Col("id", "card", max(id_w, 4), middle=True),
        _Col("model", "model", max(model_w, 5)),
        _Col("bar", "memory", bar_w),
        _Col("mem", mem_header, mem_w, "right"),
        _Col("util", "util", 4, "right"),
        _Col("temp", "temp", 4, "right"),
        _Col("jobs", "jobs", jobs_w, "right"),
    ]
    rest = _Col("names", "health / jobs on it", 0)
    cols = _layout(cols, width, rest, 14, drop=["model", "temp", "util", "bar"])
    if rest.width < len(rest.header):  # a heading is never cut, nor says "jobs" beside the count's
        rest.header = next(h for h in NARROW_REST_HEADERS if len(h) <= rest.width or h == NARROW_REST_HEADERS[-1])
    # Each job gets its share of the room, its name shortened with every other running job's
    # (rig.cli.fit.shorten_names) so a sweep's runs stay apart ("…lr0.001-seed-11"); too little
    # room for a name: the job ids (the running jobs below name them).
    plans: dict[tuple[str, int], tuple[str, int]] = {}  # (card, job) -> (user shown, room for the name)
    for card in cards:
        jobs = report.running.get(card.id, [])
        share = (rest.width - _card_flags(card, wide).cell_len - 2 * (len(jobs) - 1)) // max(1, len(jobs))
        for job in jobs:
            user = f" ({C(job.user)})" if wide else ""
            room = share - (len(f"{job.id}:") if wide else 0) - len(user)
            if wide and room < 8:
                user, room = "", share - len(f"{job.id}:")
            plans[(card.id, job.id)] = (user, room)
    named = [(key, C(job.name), plans[key][1]) for card in cards for job in report.running.get(card.id, [])
             if plans[key := (card.id, job.id)][1] >= 8]
    short = dict(zip((key for key, _, _ in named),
                     shorten_names([name for _, name, _ in named], [room for _, _, room in named]), strict=True))
    lines = []
    is_card: list[bool] = []
    headed = _group_by_node(report)
    last_node = None
    for card, mem in zip(cards, mem_values, strict=True):
        if headed and card.node != last_node:
            lines.append(_node_line(report, card.node))
            is_card.append(False)
            last_node = card.node
        jobs = report.running.get(card.id, [])
        names = _card_flags(card, wide)
        for i, job in enumerate(jobs):
            if i:
                names.append(", ")
            user, _ = plans[(card.id, job.id)]
            name = short.get((card.id, job.id))
            if name is None:
                names.append(str(job.id))
            else:
                names.append(f"{job.id}:{name}" if wide else name)
            if user:
                names.append(user, style="dim")
            if _over(job):
                names.append("!", style="bold red")
        if not jobs and not names:
            names.append("-", style="dim")
        id_style = "bold red" if not card.healthy else "dim" if not card.allowed else "bold"
        full = card.jobs >= card.max_jobs
        values: dict[str, str | Text] = {
            "id": Text(C(card.id), style=id_style),
            "model": _short_model(C(card.model), cols[1].width if cols[1].key == "model" else None),
            "bar": _bar(card, bar_w),
            "mem": mem,
            "util": _util(card),
            "temp": _temp(card),
            "jobs": Text(f"{card.jobs}/{card.max_jobs}", style="cyan" if full else ""),
            "names": names,
        }
        lines.append(_row(cols, values))
        is_card.append(True)
    return _header(cols), lines, is_card


def _group_by_node(report: StatusReport) -> bool:
    """Cards get a line per node once there is more than one node, or one is not up."""
    names = {c.node for c in report.cards} | {n.name for n in report.nodes}
    return len(names) > 1 or any(n.state != "up" for n in report.nodes)


def _node_line(report: StatusReport, name: str) -> Text:
    """``node n2  DOWN since 12:03:40  2 cards`` above that node's cards."""
    node = next((n for n in report.nodes if n.name == name), None)
    count = sum(1 for c in report.cards if c.node == name)
    line = Text(f"node {C(name)}  ", style="bold")
    if node is None:
        line.append("never heartbeated", style="yellow")
    else:
        style = "bold red" if node.mismatch else {"up": "green", "silent": "bold yellow", "down": "bold red",
                                                  "stopped": "yellow"}[node.state]
        line.append(C(node.describe), style=style)
        if node.state == "down":
            line.append(f"  (last heartbeat {clock(node.last_seen)}; its jobs were retried)", style="dim")
        elif node.state == "stopped":
            line.append("  (rig down; its jobs run on)", style="dim")
    line.append(f"  {count} card(s)", style="dim")
    return line


def _node_alerts(report: StatusReport, width: int) -> list[Text]:
    """rig status' red lines under a node (FROZEN: its Redis is not its installation; jobs Redis
    has no record of) as the lines under the title, whole when they fit, else in a short form
    that keeps where to run `rig recover`. At most two."""
    lines = []
    for node in report.nodes:
        name = C(node.name)
        if node.mismatch:
            whole = f"node {name} FROZEN: {C(node.mismatch)}"
            short = f"node {name} FROZEN: `rig recover` on {name} says why"
            lines.append(Text(whole if len(whole) <= width else short, style="bold red"))
        if node.unrecorded:
            whole = C(node.unrecorded)
            short = f"node {name}: jobs Redis has no record of: `rig recover` on {name}"
            lines.append(Text(whole if len(whole) <= width else short, style="bold red"))
    return lines[:2]


def _running_jobs(report: StatusReport) -> list[Job]:
    seen: dict[int, Job] = {}
    for jobs in report.running.values():
        for job in jobs:
            seen.setdefault(job.id, job)
    return sorted(seen.values(), key=lambda j: (j.started_at or j.assigned_at or 0, j.id))


def _job_cards(job: Job) -> str:
    if not job.node:
        return "-"
    return C(f"{job.node}/{','.join(map(str, job.cards))}")


def _job_lines(jobs: list[Job], width: int, now: float) -> tuple[Text, list[Text]]:
    wide = width >= 140
    id_w = max(2, *(len(str(j.id)) for j in jobs)) if jobs else 2
    user_w = min(max((len(j.user) for j in jobs), default=4), 16 if wide else 8)
    cards_w = min(max((len(_job_cards(j)) for j in jobs), default=5), 28 if wide else 14)
    cols = [
        _Col("id", "id", id_w, "right"),
        _Col("user", "user", max(user_w, 4), middle=True),
        _Col("name", "name", 0, middle=True),  # placeholder: sized below
        _Col("elapsed", "elapsed", 7, "right"),
    ]
    if wide:
        cols += [_Col("prio", "prio", 6), _Col("state", "state", 8)]
    cols += [
        _Col("mem", "decl/peak GiB" if wide else "decl/peak", 13 if wide else 9, "right"),
        _Col("over", "over", 4),
    ]
    if wide:
        cols += [_Col("mean", "mean", 5, "right"), _Col("util", "util", 4, "right")]
    rest = _Col("cards", "card(s)", 0, middle=True)
    fixed = [c for c in cols if c.key != "name"]
    used = sum(c.width + 1 for c in fixed) + max(cards_w, 7) + 1
    name_w = max(6, min(width - used, 48 if wide else 40))
    for c in cols:
        if c.key == "name":
            c.width = name_w
    cols = _layout(cols, width, rest, 5, drop=["user", "over"])
    table: list[dict[str, str | Text]] = []
    for job in jobs:
        over = _over(job)
        elapsed = duration(now - job.started_at) if job.started_at else "-"
        peak = "-" if (seen := measured(job.vram_peak)) is None else _g(seen)
        mem = Text(f"{_g(job.gpu_memory)}/")
        mem.append(peak, style="bold red" if over else "")
        state = job.state.value.lower() if job.state is not JobState.RUNNING else "running"
        values: dict[str, str | Text] = {
            "id": str(job.id),
            "user": C(job.user),
            "name": Text(C(job.name), style="bold red" if over else ""),  # shortened by _row
            "elapsed": elapsed if job.started_at else Text("start", style="cyan"),
            "prio": job.priority.value,
            "state": state,
            "mem": mem,
            "over": Text("OVER", style="bold red") if over else "",
            "mean": _g(job.vram_mean),
            "util": "-" if job.util_mean is None else f"{job.util_mean:.0f}%",
            "cards": _job_cards(job),
        }
        table.append(values)
    return _header(cols), _rows(cols, table)


def _waiting_lines(jobs: Sequence[Job], width: int, now: float,
                   said: Mapping[int, str] | None = None) -> tuple[Text, list[Text]]:
    """Waiting jobs in run order (priority, then age), each with why it waits (``said``: job
    id -> its sentence, Client.waiting_words: render.job_reason)."""
    wide = width >= 140
    id_w = max(2, *(len(str(j.id)) for j in jobs)) if jobs else 2
    user_w = min(max((len(j.user) for j in jobs), default=4), 16 if wide else 8)
    name_need = max((len(C(j.name)) for j in jobs), default=4)
    mems = [_g(j.gpu_memory) + (f"x{j.gpus}" if j.gpus > 1 else "") for j in jobs]
    mem_head = "GiB/card" if wide else "GiB"
    cols = [
        _Col("id", "id", id_w, "right"),
        _Col("user", "user", max(user_w, 4), middle=True),
        _Col("name", "name", max(4, min(name_need, 40 if wide else 22)), middle=True),
        _Col("prio", "prio", 6),
        _Col("mem", mem_head, max(len(mem_head), *(len(m) for m in mems)) if mems else len(mem_head), "right"),
        _Col("wait", "waited", 6, "right"),
    ]
    rest = _Col("why", "why it waits", 0)
    cols = _layout(cols, width, rest, 16, drop=["user", "prio", "mem"])
    table: list[dict[str, str | Text]] = []
    for job, mem in zip(jobs, mems, strict=True):
        values: dict[str, str | Text] = {
            "id": str(job.id), "user": C(job.user), "name": C(job.name), "prio": job.priority.value,
            "mem": mem, "wait": duration(now - waiting_since(job.created_at, job.queued_at)),
            "why": Text(C(job_reason(job, (said or {}).get(job.id))), style="dim" if not job.wait_reason else ""),
        }
        table.append(values)
    return _header(cols), _rows(cols, table)


def _error_lines(jobs: Sequence[Job], width: int, now: float) -> tuple[Text, list[Text]]:
    """The error queue: jobs that failed for good or timed out, with why."""
    id_w = max(2, *(len(str(j.id)) for j in jobs)) if jobs else 2
    user_w = min(max((len(j.user) for j in jobs), default=4), 16 if width >= 140 else 8)
    name_need = max((len(C(j.name)) for j in jobs), default=4)
    cols = [
        _Col("id", "id", id_w, "right"),
        _Col("user", "user", max(user_w, 4), middle=True),
        _Col("name", "name", max(4, min(name_need, 40 if width >= 140 else 22)), middle=True),
        _Col("state", "state", max(len(s.value) for s in JobState)),  # never cut
        _Col("ended", "ended", 6, "right"),
    ]
    rest = _Col("why", "why", 0)
    cols = _layout(cols, width, rest, 16, drop=["user", "ended"])
    table: list[dict[str, str | Text]] = []
    for job in jobs:
        values: dict[str, str | Text] = {
            "id": str(job.id), "user": C(job.user), "name": C(job.name),
            "state": Text(job.state.value, style="bold red"),
            "ended": duration(now - job.ended_at) if job.ended_at else "-",
            "why": C(job_reason(job)),
        }
        table.append(values)
    return _header(cols), _rows(cols, table)


def _queue_line(report: StatusReport, width: int, now: float) -> Text:
    """The waiting jobs per priority and the oldest one's wait, as of ``now`` (the frame's
    clock, which the waiting jobs' "waited" column reads too: the report is older)."""
    line = Text("queue ", style="bold")
    since = max(0.0, now - report.taken_at) if report.taken_at is not None else 0.0
    for prio in Priority:
        n = report.pending.get(prio, 0)
        line.append(f" {prio.value} ", style="bold" if n else "dim")
        line.append(str(n), style="yellow" if n else "dim")
        wait = report.oldest_wait.get(prio)
        if n and wait is not None:
            wait += since
            line.append(f" (oldest {duration(wait)})" if width >= 70 else f" ({duration(wait)})")
        line.append(" ")
    return line


def _title_line(report: StatusReport | None, errors: int, now: float, width: int,
                hint: str) -> Text:
    line = Text("rig top", style="bold reverse")
    line.append(f"  {time.strftime('%H:%M:%S', time.localtime(now))}")
    if report is not None:
        workers = len(report.workers)
        line.append("  workers ")
        line.append(f"{workers} alive", style="green" if workers else "bold red")
        line.append("  errors ")
        line.append(str(errors), style="bold red" if errors else "green")
        if _group_by_node(report) and report.nodes:
            up = sum(1 for n in report.nodes if n.state == "up")
            line.append(f"  nodes {up}/{len(report.nodes)} up", style="green" if up == len(report.nodes)
                        else "bold red")
        if width >= 100:
            counts = report.counts
            line.append(f"  cards {len(report.cards)}"
                        f"  running {counts.get(JobState.RUNNING, 0)}"
                        f"  done {counts.get(JobState.SUCCEEDED, 0)}", style="dim")
    hint = f"  {hint}" if hint else ""
    if hint and line.cell_len + len(hint) <= width:
        line.append(" " * (width - line.cell_len - len(hint)))
        line.append(hint, style="dim")
    return line


def _more(n: int, what: str) -> Text:
    return Text(f"... {n} more {what}", style="dim italic")


def _clip(lines: list[Text], room: int, what: str, counted: Sequence[bool] | None = None) -> list[Text]:
    """At most ``room`` lines; the last says how many did not fit: of the lines ``counted``
    marks, when given (a node's heading line among the cards is no card: "... 64 more cards"
    stood under 3 of 64 cards shown)."""
    if len(lines) <= room:
        return lines
    if room <= 0:
        return []
    left = len(lines) - room + 1 if counted is None else sum(counted[room - 1:])
    return [*lines[: room - 1], _more(left, what)]


def _no_row(need: int, room: int) -> bool:
    """Would :func:`_clip` of ``need`` lines to ``room`` leave no line of its own (nothing, or
    only the "... N more" line)?"""
    return need > 0 and need > room and room <= 1


def _unlisted(n: int, what: str, where: str) -> Text:
    """One line for a section with no room for a row: ``8 card(s): no room to list them (`rig status`)``."""
    return Text(f"{n} {what}: no room to list them (`{where}`)", style="dim italic")


# -- the frame ----------------------------------------------------------------------------------
def build_view(report: StatusReport | None, errors: int, width: int, height: int, now: float,
               *, problem: str | None = None, hint: str = "q quits", waiting: Sequence[Job] = (),
               error_jobs: Sequence[Job] = (), said: Mapping[int, str] | None = None) -> RenderableType:
    """One frame of ``rig top``, exactly fitting ``width`` x ``height`` (at most).

    ``waiting``: some waiting jobs (any order: shown in run order, priority then age, each with
    why it waits); ``error_jobs``: some of the error queue. Both are shown, in that order, in
    the lines the cards and running jobs leave free; what does not fit is counted.

    ``problem``: a one-line complaint shown at the top (e.g. Redis cannot be reached; the data
    shown is then the last that was read). ``report`` is None when nothing could be read yet.
    ``hint``: how to leave, shown at the right of the title line.
    """
    width = max(20, width)
    height = max(3, height)
    top: list[Text] = [_title_line(report, errors, now, width, hint)]
    if problem:
        top.append(Text(C(problem.splitlines()[0]) if problem else "", style="bold red"))
    if report is None:
        top.append(Text("waiting for rig's Redis ...", style="dim"))
        return Group(*[_fit(t, width) for t in top[:height]])
    top.append(_queue_line(report, width, now))
    # A notice too long for the screen says what is wrong and what mends it (rig.redis_writes).
    top += [Text(C(n if len(n) <= width else short_notice(n)), style="yellow") for n in report.notices[:2]]
    top += _node_alerts(report, width)

    card_what = "cards"
    is_card: list[bool] | None = None
    if report.cards:
        card_head, card_rows, is_card = _card_lines(report, width)
    elif report.nodes:  # up (a FROZEN one registers no card in this Redis), stopped, down: said, never "no node"
        card_head, card_what = Text("no cards registered", style="yellow"), "nodes"
        card_rows = [_node_line(report, n.name) for n in report.nodes]
    else:
        card_head, card_rows = Text(NO_CARDS, style="yellow"), []
    jobs = _running_jobs(report)
    if jobs:
        job_head, job_rows = _job_lines(jobs, width, now)
    else:
        job_head, job_rows = Text("no jobs running", style="dim"), []

    room = height - len(top) - 2  # the two section headers
    if room < 0:
        top = top[:height]
        return Group(*[_fit(t, width) for t in top])
    need_cards, need_jobs = len(card_rows), len(job_rows)
    if need_cards + need_jobs <= room:
        show_cards, show_jobs = need_cards, need_jobs
    else:
        show_jobs = min(need_jobs, max(min(3, room // 2), room - need_cards))
        show_cards = room - show_jobs
        if show_cards > need_cards:
            show_jobs += show_cards - need_cards
            show_cards = need_cards
    total_waiting = sum(report.pending.values())
    queued = sorted(waiting, key=lambda j: (j.priority.rank, j.created_at, j.id))
    # Not "next first": the dispatcher also weighs size (largest-first), fair share and waiting
    # time, so a later, larger job often starts first (its row said "1 job(s) ahead of it" under
    # a title that called it next). The web page's words, for the same order.
    lists = [_List(f"waiting jobs ({total_waiting}), by priority, then submission", total_waiting, queued,
                   functools.partial(_waiting_lines, said=said),
                   "waiting jobs", functools.partial(_waiting_summary, said=said,
                                                     head=f"waiting jobs ({total_waiting}), the first")),
             _List(f"error queue ({errors}): `rig errors`", errors, list(error_jobs), _error_lines,
                   "in the error queue", None)]
    lists = [section for section in lists if section.shown]
    # The waiting jobs' least table takes lines from the running list's tail (which keeps
    # RUNNING_KEEP lines) before it is folded into one line: see _List. Where even that leaves
    # no room for the table, the tail gives only what the summary lines need (it gave up to
    # the table's share, and the lines the folded list left stood blank at the bottom).
    if queued:
        below = room - show_cards - show_jobs - 2  # 2: a blank line, the running title
        spare_tail = max(0, show_jobs - RUNNING_KEEP)
        need = lists[0].least() + 2 * (len(lists) - 1)  # the later lists' summary lines
        if need - below > spare_tail:
            need = 2 * len(lists)  # every list one summary line, after a blank one
        short = need - below
        if short > 0:
            show_jobs -= min(short, spare_tail)
    # A heading left without one row of its own (a pane a few lines high) folds, with its
    # "... N more", into one line that says what is not listed and where to see it.
    cards_folded = report.cards and _no_row(need_cards, show_cards)
    jobs_folded = bool(jobs) and _no_row(need_jobs, show_jobs)
    card_rows = _clip(card_rows, show_cards, card_what, is_card)
    job_rows = _clip(job_rows, show_jobs, "running jobs")
    if cards_folded:
        card_head, card_rows = _unlisted(len(report.cards), "card(s)", "rig status"), []
    if jobs_folded:
        job_head, job_rows = _unlisted(len(jobs), "running job(s)", "rig jobs --state running"), []
    spare = room - len(card_rows) - len(job_rows)

    lines = list(top)
    if spare > 0:
        lines.append(Text())
        spare -= 1
    lines += [card_head, *card_rows]
    if spare > 0 and jobs and not jobs_folded:
        lines.append(Text(f"running jobs ({len(jobs)})", style="bold"))
        spare -= 1
    lines += [job_head, *job_rows]
    for i, section in enumerate(lists):
        spare = height - len(lines)
        later = lists[i + 1:]
        # Room this list leaves to the later ones: their full table when that leaves this one
        # its least, else one line each (a blank and a summary).
        keep_full = sum(s.full() for s in later)
        keep = keep_full if spare - keep_full >= section.least() else 2 * len(later)
        # Never at this list's summary's expense: the waiting jobs come before the error queue.
        keep = min(keep, spare - min(2, spare))
        lines += section.draw(spare - keep, width, now)
    return Group(*[_fit(t, width) for t in lines[:height]])


#: What the running list keeps when the waiting jobs need its tail (rows, counting "... more").
RUNNING_KEEP = 3
#: The fewest rows a list of waiting jobs or of the error queue is shown with (fewer jobs: all
#: of them); with less room it is one summary line, never a heading with no rows.
LIST_MIN_ROWS = 2
#: The most rows the error queue's table asks for while later lists still want room.
ERRORS_FULL_ROWS = 3


@dataclass
class _List:
    """A list under the running jobs in ``rig top``: the waiting jobs, then the error queue.

    Each is a blank line, a title, a column header and rows (the last one "... N more" when
    not all fit), or, with too little room for :data:`LIST_MIN_ROWS` rows, one summary line
    after a blank one (the summary alone where one line is left). Lines go, in this order:
    the error queue's table folds to its title, the running list's tail gives way down to
    :data:`RUNNING_KEEP` lines, then the waiting jobs fold to one line."""

    title: str
    total: int
    shown: list[Job]
    lines: object  # (jobs, width, now) -> (header, rows)
    what: str
    summary: object | None  # (jobs, title) -> the one line, or None: the title alone

    def _rows(self, n: int) -> int:
        """Lines for ``n`` job rows, with the "... more" line when not all are shown."""
        return n + (1 if self.total > n else 0)

    def least(self) -> int:
        return 3 + self._rows(min(len(self.shown), LIST_MIN_ROWS))

    def full(self) -> int:
        return 3 + self._rows(min(len(self.shown), ERRORS_FULL_ROWS))

    def draw(self, room: int, width: int, now: float) -> list[Text]:
        """At most ``room`` lines (none when under 1; the summary alone, without the blank line
        before it, in 1)."""
        if room < 1:
            return []
        if room < self.least():
            line = self.summary(self.shown, self.title) if self.summary else Text(self.title, style="bold")
            return [Text(), line][-room:]
        head, rows = self.lines(self.shown, width, now)  # type: ignore[operator]
        fit = room - 3
        if len(rows) > fit or self.total > len(rows):
            keep = min(len(rows), fit if self.total <= fit else fit - 1)
            rows = rows[:keep]
            if self.total > keep:
                rows.append(_more(self.total - keep, self.what))
        return [Text(), Text(self.title, style="bold"), head, *rows]


#: The most cells a job's name takes in a summary line (the reason follows it).
SUMMARY_NAME = 20


def _waiting_summary(jobs: Sequence[Job], title: str, said: Mapping[int, str] | None = None,
                     head: str | None = None) -> Text:
    """``waiting jobs (5), the first: 10 train-resnet50 (alice): needs 16.0 GiB ...`` in one line
    (``said``: as _waiting_lines; ``head``: a shorter title than the table's, so that the reason
    keeps its room at 80 columns)."""
    line = Text(head or title, style="bold")
    job = jobs[0]
    line.append(f": {job.id} {shorten_middle(C(job.name), SUMMARY_NAME)} ({C(job.user)}): ")
    line.append(C(job_reason(job, (said or {}).get(job.id))), style="dim")
    return line


# -- the loop -----------------------------------------------------------------------------------
#: How many waiting jobs and error-queue jobs `rig top` reads each time (shown as room allows).
WAITING_READ, ERRORS_READ = 50, 20


@dataclass
class _Snapshot:
    report: StatusReport | None = None
    errors: int = 0
    problem: str | None = None
    waiting: list[Job] = field(default_factory=list)
    error_jobs: list[Job] = field(default_factory=list)
    said: dict[int, str] = field(default_factory=dict)  # waiting job id -> why it waits (_read_lists)


def _read(client) -> tuple[StatusReport, int]:  # noqa: ANN001
    report = client.status()
    return report, client.error_count()


def _read_lists(client, old: tuple[list[Job], list[Job], dict[int, str]] = ([], [], {}),  # noqa: ANN001
                ) -> tuple[list[Job], list[Job], dict[int, str]]:
    """The head of the queue, the oldest of the error queue (what the frame lists) and why each
    waiting job waits (Client.waiting_words, as `rig jobs` says it). They are extras: when they cannot be read (e.g. a gateway older than
    `waiting`), the last ones read stay and the frame's cards, counts and running jobs go on."""
    try:
        waiting = client.waiting(limit=WAITING_READ)
        errors = client.errors(limit=ERRORS_READ)
        return waiting, errors, client.waiting_words(waiting)
    except (RigError, redis.RedisError, OSError):
        return old


def _problem_text(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "cannot reach redis" not in text.lower():
        text = f"cannot reach Redis ({text})"
    return f"{text}; retrying"


class _Poller(threading.Thread):
    """Re-reads the data every ``interval`` seconds; keeps the last good report on errors."""

    def __init__(self, client, interval: float) -> None:  # noqa: ANN001
        super().__init__(name="rig-top-poller", daemon=True)
        self.client = client
        self.interval = interval
        self.snapshot = _Snapshot()
        self.stop = threading.Event()

    def poll(self) -> None:
        """Read once; on failure keep the last report and say what went wrong."""
        try:
            report, errors = _read(self.client)
            old = self.snapshot
            waiting, error_jobs, said = _read_lists(self.client, (old.waiting, old.error_jobs, old.said))
            self.snapshot = _Snapshot(report, errors, None, waiting, error_jobs, said)
        except (RigError, redis.RedisError, OSError) as exc:
            old = self.snapshot
            self.snapshot = _Snapshot(old.report, old.errors, _problem_text(exc), old.waiting, old.error_jobs,
                                      old.said)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(self.interval)


class _Keys:
    """Single key presses from stdin in cbreak mode, without blocking; a no-op off a TTY."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self._saved = None

    def __enter__(self) -> _Keys:
        try:
            import termios
            import tty

            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.fd = fd
        except Exception:  # ImportError, termios.error, a closed or odd stdin
            self.fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self.fd = None

    def read(self, timeout: float) -> str:
        """What was typed within ``timeout`` seconds ('' if nothing)."""
        if self.fd is None:
            time.sleep(timeout)
            return ""
        import select

        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return ""
        try:
            return os.read(self.fd, 64).decode(errors="ignore")
        except OSError:
            return ""


def run_top(client, interval: float = 1.0, once: bool = False, *,  # noqa: ANN001
            console: Console | None = None) -> None:
    """Show the view until `q` (or Ctrl-C); with ``once``, or when the output is not a terminal
    (``rig top > f``, ``rig top | head``: a full-screen redraw there would only hang and print
    nothing), print one frame and return."""
    console = console or make_console()  # piped: laid out as every piped table is (180 columns)
    if once or not console.is_terminal:
        report, errors = _read(client)
        waiting, error_jobs, said = _read_lists(client)
        height = console.height if console.is_terminal else 10_000
        console.print(build_view(report, errors, console.width, height, shared_now(), hint="",
                                 waiting=waiting, error_jobs=error_jobs, said=said))
        return

    poller = _Poller(client, interval)
    poller.start()

    try:
        with _Keys() as keys:
            hint = "q quits" if keys.fd is not None else "Ctrl-C quits"

            def frame() -> RenderableType:
                snap = poller.snapshot
                width, height = console.size
                return build_view(snap.report, snap.errors, width, height, shared_now(),
                                  problem=snap.problem, hint=hint, waiting=snap.waiting,
                                  error_jobs=snap.error_jobs, said=snap.said)

            with Live(get_renderable=frame, console=console, screen=True,
                      refresh_per_second=REFRESH_PER_SECOND,
                      redirect_stdout=False, redirect_stderr=False):
                while True:
                    typed = keys.read(1 / REFRESH_PER_SECOND)
                    if "q" in typed.lower():
                        break
    except KeyboardInterrupt:
        pass
    finally:
        poller.stop.set()


@click.command("top")
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.option("--once", is_flag=True, help="Print one frame and exit (no full screen; the default when stdout is not a terminal).")
@click.pass_context
@handle_errors
def top(ctx: click.Context, interval: float, once: bool) -> None:
    """A live view of the cards, queues, running and waiting jobs and the error queue (press q
    to quit)."""
    if interval <= 0:
        raise click.BadParameter("must be above 0 seconds", param_hint="--interval")
    run_top(client_from(ctx), interval=interval, once=once)
