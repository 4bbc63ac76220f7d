"""Job-supplied text never reaches a terminal as control sequences (issue 10, item 9).

Every human view is fed records whose every text field carries escape sequences (a lone OSC
that retitles the window, CSI, C1, BEL, DEL, bidi overrides) and rich markup; the output must
hold no ESC, C1 or other control byte, and the markup must show as typed. JSON keeps the raw
values. No Redis, no terminal."""

from __future__ import annotations

import io
import json
import time

import pytest
from rich.console import Console

from rig.cli import as_json
from rig.cli.render import render_errors, render_job, render_jobs, render_metrics, render_status
from rig.cli.top import build_view
from rig.client import StatusReport, UserUsage, WorkerInfo
from rig.memory import GIB
from rig.models import CardState, Job, JobState, Priority
from rig.nodes import NodeInfo
from rig.text import clean, has_control, markup

#: The issue's own: a lone ESC opening an OSC title that is never terminated.
LONE_OSC = "\x1b]0;TITLE"
HOSTILE = [
    LONE_OSC,
    "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "a\x1b[31mred\x1b[0m",
    "\x9b31m8-bit CSI",
    "\x9d0;c1 title\x07",
    "bell\x07 del\x7f bs\x08 cr\r nul\x00",
    "\u202eevil bidi",
    "x\x1b",  # a lone ESC at the end
    "[bold]not markup[/bold] [not in whitelist] [/]",
]
H = " | ".join(HOSTILE)


def _job(state: JobState = JobState.FAILED, **over) -> Job:  # noqa: ANN003
    now = time.time()
    job = Job(
        id=12, name=H, user=H, command=["python", H], gpu_memory=12 * GIB, gpus=1,
        priority=Priority.MEDIUM, state=state, workdir="/tmp/" + H, created_at=now - 60,
        env={H: "v", "OK": H}, node="n1", cards=[0], assigned_at=now - 50, started_at=now - 40,
        ended_at=now - 1, exit_code=1, reason=H, wait_reason=H, attempt=2, log_path="/l/" + H,
        log_paths=["/l/1" + H, "/l/2" + H], failure=H, evidence=[H, LONE_OSC, "plain"],
        attempts=[{"attempt": 1, "outcome": H, "summary": H, "node": H, "cards": [0],
                   "gpu_memory": GIB, "started_at": now - 30, "ended_at": now - 20, "vram_peak": GIB}],
        vram_peak=GIB, vram_samples=1, vram_sum=GIB, problems=[H], pool=H, template=H,
    )
    for key, value in over.items():
        setattr(job, key, value)
    return job


def _report() -> StatusReport:
    card = CardState(node="n1", index=0, total=80 * GIB, usable=76 * GIB, max_jobs=4, model=H,
                     healthy=False, health_reason=H, allowed=False, foreign=GIB)
    running = _job(JobState.RUNNING)
    return StatusReport(
        cards=[card], running={card.id: [running]}, pending={p: 1 for p in Priority},
        oldest_wait={p: 5.0 for p in Priority}, workers=[WorkerInfo(H, H, "n1", 0, 1, 1, time.time())],
        counts={JobState.RUNNING: 1}, notices=[H], nodes=[NodeInfo("n1", True, "up", time.time())],
        users=[UserUsage(H, 1, GIB, 1, 1.0)], pool=None,
    )


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    # force_terminal + a colour system: rich writes its own styling escapes, which are allowed;
    # everything else is checked after those are taken out.
    return Console(file=out, width=400, force_terminal=False, color_system=None), out


VIEWS = {
    "show": lambda c: render_job(_job(), H, c, in_error_queue=True),
    "show pending": lambda c: render_job(_job(JobState.PENDING), H, c),
    "jobs": lambda c: render_jobs([_job(), _job(JobState.RUNNING)], c),
    "errors": lambda c: render_errors([_job()], c),
    "metrics": lambda c: render_metrics(_job(JobState.RUNNING), c),
    "status": lambda c: render_status(_report(), c),
    "top": lambda c: c.print(build_view(_report(), 1, 300, 60, time.time(), problem=H,
                                        waiting=[_job(JobState.PENDING)], error_jobs=[_job()])),
    "top at 80": lambda c: c.print(build_view(_report(), 1, 80, 60, time.time(), problem=H,
                                              waiting=[_job(JobState.PENDING)], error_jobs=[_job()])),
    "jobs at 80": lambda c: render_jobs([_job(), _job(JobState.PENDING)], Console(file=c.file, width=80,
                                                                               color_system=None)),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_no_control_sequence_reaches_the_terminal(view: str) -> None:
    console, out = _console()
    VIEWS[view](console)
    text = out.getvalue()
    assert text.strip(), "the view printed nothing"
    assert not has_control(text.replace("\n", "")), repr([c for c in text if has_control(c)][:5])
    assert "TITLE" in text or view in ("top", "top at 80", "jobs at 80", "status", "metrics")  # shown as text, not acted on


def test_markup_in_job_text_shows_as_typed() -> None:
    console, out = _console()
    render_job(_job(), None, console)
    assert "[bold]not markup[/bold] [not in whitelist] [/]" in out.getvalue()
    console, out = _console()
    render_status(_report(), console)
    assert "[not in whitelist" in out.getvalue()  # rig's own flag, bracket kept


def test_json_keeps_the_raw_values() -> None:
    data = json.loads(as_json.dumps(as_json.job_dict(_job())))
    assert data["name"] == H and data["evidence"][1] == LONE_OSC
    assert "\\u001b" in as_json.dumps(as_json.job_dict(_job()))  # escaped by JSON, not stripped


@pytest.mark.parametrize("text", HOSTILE)
def test_clean_leaves_no_control_and_markup_escapes(text: str) -> None:
    assert not has_control(clean(text))
    assert not has_control(clean(text, multiline=True).replace("\n", "").replace("\t", ""))
    Console(file=io.StringIO()).print(markup(text))  # never a MarkupError


def test_clean_keeps_ordinary_text() -> None:
    assert clean("héllo wörld — 日本 [x]") == "héllo wörld — 日本 [x]"
    assert clean("a\tb\nc") == "a b c" and clean("a\tb\nc", multiline=True) == "a\tb\nc"
    assert clean("printf 'a\\n' C:\\dir") == "printf 'a\\n' C:\\dir"  # backslashes as typed
    assert clean(None) == "" and clean(3) == "3"


#: Found from outside: stripping a sequence also stripped what it enclosed, so `rig show`
#: showed a command (or a folder) other than the one that runs.
HIDING = {
    "osc hides a command": ("echo safe \x1b]0;x; touch /tmp/HIDDEN_RAN \a",
                            "echo safe \\x1b]0;x; touch /tmp/HIDDEN_RAN \\x07"),
    "utf-8 C1 CSI eats ;x": ("echo a\u009b0;x", "echo a\\x9b0;x"),
    "osc in a folder": ("/tmp/d\x1b]0;PWNEDDIR\ax", "/tmp/d\\x1b]0;PWNEDDIR\\x07x"),
    "lone osc": (LONE_OSC, "\\x1b]0;TITLE"),
    "bidi override": ("rm \u202eevil", "rm \\u202eevil"),
    "zero width": ("r\u200bm", "r\\u200bm"),
    "tag characters": ("a\U000e0041b", "a\\U000e0041b"),
    "del and nul": ("a\x7fb\x00c\rd", "a\\x7fb\\x00c\\x0dd"),
    "undecodable byte": ("x\udcff", "x\\udcff"),
}


@pytest.mark.parametrize("case", sorted(HIDING))
def test_clean_never_removes_a_character(case: str) -> None:
    raw, shown = HIDING[case]
    assert clean(raw) == shown
    assert not has_control(clean(raw)) and not has_control(markup(raw))


def test_escaped_text_reads_back_unambiguously() -> None:
    """A submitted backslash-x-1-b (four characters) and a real ESC never look alike."""
    assert clean("\\x1b") == "\\\\x1b" and clean("\x1b") == "\\x1b"
    assert clean("\\\x1b") == "\\\\\\x1b"  # a backslash, then ESC: 2 + 1
    assert clean("a\\u202e") == "a\\\\u202e" and clean("a\\q") == "a\\q"


def test_rig_show_shows_what_really_runs() -> None:
    """The tester's `rig show`: the whole command and folder appear, escaped, never acted on."""
    command, workdir = HIDING["osc hides a command"][0], HIDING["osc in a folder"][0]
    console, out = _console()
    render_job(_job(JobState.PENDING, command=["bash", "-c", command], shell=True, workdir=workdir), None,
               console)
    text = out.getvalue()
    assert not has_control(text.replace("\n", ""))
    assert "touch /tmp/HIDDEN_RAN" in text and "PWNEDDIR" in text, text
    assert "/tmp/d\\x1b]0;PWNEDDIR\\x07x" in text


def test_a_newline_in_a_command_is_shown_as_one() -> None:
    """`echo safe<NL>touch x` is two commands; in one line it would read as one echo."""
    console, out = _console()
    render_job(_job(JobState.PENDING, command=["/bin/sh", "-c", "echo safe\ntouch /tmp/x"], shell=True),
               None, console)
    lines = out.getvalue().splitlines()
    assert any(line.rstrip().endswith("echo safe") for line in lines), lines
    assert any(line.strip() == "touch /tmp/x" for line in lines), lines


def test_rig_show_names_the_pool_a_job_was_submitted_to() -> None:
    """A tester's finding: only --json said `pool: small`; the wait reason does not name it."""
    from dataclasses import replace

    console, out = _console()
    render_job(replace(_job(JobState.PENDING), pool="small"), None, console)
    assert any(line.split()[:2] == ["pool", "small"] for line in out.getvalue().splitlines()), out.getvalue()
