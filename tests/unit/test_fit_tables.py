"""Tables that fit (issue 14, item 4): `rig status`, `rig jobs` and `rig top` rendered at 80 and
160 columns from a hand-made 2-node, 8-card cluster with a 12-run sweep, hostile and long
names and many waiting jobs. No line is wider than the screen, every heading and every state is
whole, the sweep's suffixes stay visible (names are shortened in the middle), the reason column
is there. No Redis, no terminal."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from rig.cli.fit import Cell, Col, fit_widths, fitted_table, shorten_end, shorten_middle
from rig.cli.render import CARD_COLUMNS, JOB_COLUMNS, render_errors, render_jobs, render_status
from rig.cli.top import build_view
from rig.client import StatusReport, UserUsage, WorkerInfo
from rig.memory import GIB
from rig.models import CardState, Job, JobState, Priority
from rig.nodes import NodeInfo
from rig.text import has_control

NOW = 1_700_000_000.0
SWEEP = "sweep-lr0.0003-warmup2000-batch512-seed-{}"
HOSTILE = "\x1b]0;TITLE [bold]x[/] \x9b31m"
LONG_USER = "a-very-long-login-name-indeed"
WAIT_REASON = ("needs 24.0 GiB on 1 card; the largest free block is 7.0 GiB (gpu-node-01/2); "
               "3 job(s) ahead of it")
FAIL_REASON = "CUDA out of memory (peak 30.1 GiB over 24.0 GiB declared)"


def _job(job_id: int, name: str, state: JobState, *, node: str | None = None, card: int = 0,
         user: str = "alice") -> Job:
    placed = state not in (JobState.PENDING, JobState.CANCELLED)
    job = Job(id=job_id, name=name, user=user, command=["python", "train.py"], gpu_memory=24 * GIB, gpus=1,
              priority=Priority.MEDIUM, state=state, workdir="/tmp", created_at=NOW - 900 + job_id,
              node=node if placed else None, cards=[card] if placed else [],
              assigned_at=NOW - 800 if placed else None, started_at=NOW - 754 if placed else None,
              vram_peak=12 * GIB, vram_sum=24 * GIB, vram_samples=2)
    if state is JobState.PENDING:
        job.wait_reason = WAIT_REASON
    if state in (JobState.FAILED, JobState.TIMEOUT):
        job.reason, job.failure, job.exit_code, job.ended_at = FAIL_REASON, "oom", 137, NOW - 60
    if state is JobState.SUCCEEDED:
        job.exit_code, job.ended_at = 0, NOW - 30
    return job


def _cluster() -> StatusReport:
    """2 nodes of 4 cards; 12 sweep runs and a hostile-named job running; one card unhealthy,
    one outside the whitelist."""
    cards, running = [], {}
    job_id = 100
    runs = iter(range(12))
    for node in ("gpu-node-01", "gpu-node-02"):
        for i in range(4):
            card = CardState(node=node, index=i, total=80 * GIB, usable=79 * GIB, max_jobs=4,
                             model="NVIDIA H100 80GB HBM3", utilization=10 * i, temperature=40 + i)
            jobs = []
            for _ in range(2 if i < 3 else 0):
                job_id += 1
                run = next(runs, None)
                name = SWEEP.format(run) if run is not None else HOSTILE
                jobs.append(_job(job_id, name, JobState.RUNNING, node=node, card=i,
                                 user=LONG_USER if run is None else "alice"))
            card.jobs, card.reserved, card.used = len(jobs), 24 * GIB * len(jobs), 12 * GIB * len(jobs)
            cards.append(card)
            running[card.id] = jobs
    cards[3].healthy, cards[3].health_reason = False, "XID 79 " + HOSTILE
    cards[7].allowed = False
    nodes = [NodeInfo(n, True, "up", NOW - 600, last_seen=NOW, started_at=NOW - 600, workers=5)
             for n in ("gpu-node-01", "gpu-node-02")]
    return StatusReport(
        cards=cards, running=running,
        pending={Priority.HIGH: 0, Priority.MEDIUM: 40, Priority.LOW: 0},
        oldest_wait={Priority.HIGH: None, Priority.MEDIUM: 900.0, Priority.LOW: None},
        workers=[WorkerInfo(f"card{i}@gpu-node-0{1 + i // 4}", "card", f"gpu-node-0{1 + i // 4}", i % 4,
                            100 + i, 1, NOW) for i in range(8)],
        counts={JobState.RUNNING: 12, JobState.PENDING: 40}, nodes=nodes,
        users=[UserUsage("alice", 12, 12 * 24 * GIB, 40, 33.3), UserUsage(LONG_USER, 4, 96 * GIB, 0, 1.0)])


def _waiting() -> list[Job]:
    return [_job(300 + k, SWEEP.format(k), JobState.PENDING, user="bob") for k in range(40)]


def _errors() -> list[Job]:
    return [_job(200 + k, f"eval-{k}", JobState.FAILED) for k in range(3)]


def _listed() -> list[Job]:
    jobs = [_job(300 + k, SWEEP.format(k), JobState.PENDING, user="bob") for k in range(12)]
    jobs += [_job(200 + i, f"job-{state.value.lower()}", state, node="gpu-node-01", user=LONG_USER)
             for i, state in enumerate(JobState)]
    jobs.append(_job(250, HOSTILE, JobState.FAILED, node="gpu-node-02"))
    return jobs


def _screen(width: int, draw, height: int = 200) -> list[str]:  # noqa: ANN001
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None, record=True)
    draw(console)
    return console.export_text().rstrip("\n").splitlines()


def _fits(lines: list[str], width: int) -> str:
    for line in lines:
        assert len(line) <= width, f"{len(line)} > {width}: {line!r}"
    text = "\n".join(lines)
    assert not has_control(text), repr(text)
    return text


def _headings(lines: list[str]) -> list[list[str]]:
    """The heading cells of every rich table in ``lines``."""
    return [[cell.strip() for cell in line.strip("┃").split("┃")] for line in lines if line.startswith("┃")]


# -- the rule -----------------------------------------------------------------------------------
def test_names_are_shortened_in_the_middle_so_sweep_runs_stay_apart() -> None:
    names = [SWEEP.format(k) for k in range(12)]
    for width in (12, 16, 20, 30):
        short = [shorten_middle(n, width) for n in names]
        assert all(len(s) <= width and "…" in s for s in short), short
        assert len(set(short)) == 12, short  # the suffixes keep them apart
        assert all(s.endswith(f"-{k}") for k, s in enumerate(short)), short
    assert shorten_middle("sweep-lr0.0003-warmup2000-seed-11", 17) == "sweep-lr…-seed-11"
    assert shorten_middle("short", 16) == "short"
    assert shorten_middle("日本語の名前-seed-1", 14) == "日本語…-seed-1"  # wide characters count 2
    assert shorten_end("a long reason", 6) == "a lon…"


def test_columns_go_in_their_drop_order_and_headings_stay_whole() -> None:
    cols = [Col("id", "id"), Col("name", "name", shrink="middle", min_width=8, want=20),
            Col("state", "state"), Col("age", "age", drop=0), Col("where", "where", drop=1),
            Col("reason", "reason", drop=2, shrink="end", min_width=10)]
    rows = [{"id": "1", "name": "x" * 40, "state": "SUCCEEDED", "age": "1m", "where": "n/0",
             "reason": "y" * 60}]
    kept = {w: [c.key for c, _ in fit_widths(cols, rows, w)] for w in (200, 66, 60, 50, 40, 30)}
    assert kept[200] == ["id", "name", "state", "age", "where", "reason"]
    assert kept[66] == ["id", "name", "state", "where", "reason"]  # age first
    assert kept[60] == ["id", "name", "state", "reason"]  # then where
    assert kept[40] == ["id", "name", "state"]  # never-dropped columns, the name at its least
    for width in (200, 60, 50, 40, 30):
        lines = _screen(width, lambda c, w=width: c.print(fitted_table(cols, rows, w)))
        if width >= 40:
            _fits(lines, width)
        assert "SUCCEEDED" in "\n".join(lines)  # a state is never cut, however narrow
        for heading in _headings(lines)[0]:
            assert "…" not in heading


def test_a_cell_never_wraps_and_keeps_its_suffix() -> None:
    cols = [Col("running", "running", shrink="middle", min_width=10)]
    rows = [{"running": Cell([SWEEP.format(1), SWEEP.format(2)], line_suffixes=[" OVER", ""])}]
    lines = _screen(30, lambda c: c.print(fitted_table(cols, rows, 30)))
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 2 and "OVER" in body[0] and body[1].rstrip(" │").endswith("seed-2"), lines


# -- rig status ---------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 160])
def test_status_fits(width: int) -> None:
    lines = _screen(width, lambda c: render_status(_cluster(), c))
    text = _fits(lines, width)
    headings = _headings(lines)
    card_heads = [h for h in headings if h[0] == "card"]
    assert len(card_heads) == 2  # one table per node
    known = {c.header for c in CARD_COLUMNS} | {"priority", "waiting", "oldest wait", "user", "running",
                                                "memory held", "recent GiB-h", "worker", "role", "card",
                                                "pid", "jobs", "last seen"}
    for head in headings:
        assert set(head) <= known, head  # every heading whole
    for k in range(12):  # every sweep run told apart by its suffix
        assert re.search(rf"-seed-{k}\b", text), (k, text)
    assert "takes no new jobs: unhealthy (XID 79" in text and "not in whitelist" in text
    if width == 160:
        assert {"model", "usable", "used", "util", "temp", "flags"} <= set(card_heads[0])
        assert "H100 80GB HBM3" in text and "[UNHEALTHY: XID 79" in text
    else:
        assert {"card", "free", "jobs", "running"} <= set(card_heads[0])
        assert "gpu-node-01/0" in text  # card ids whole at 80


# -- rig jobs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 160])
def test_jobs_fit_with_whole_states_and_a_reason(width: int) -> None:
    lines = _screen(width, lambda c: render_jobs(_listed(), c))
    text = _fits(lines, width)
    heads = _headings(lines)[0]
    assert set(heads) <= {c.header for c in JOB_COLUMNS}
    assert {"id", "name", "state", "reason"} <= set(heads), heads
    for state in JobState:
        assert f" {state.value} " in text, state  # whole, never "PEND…"
    for k in range(12):
        assert re.search(rf"-seed-{k}\b", text), (k, text)
    assert len({line for line in lines if "-seed-" in line}) == 12
    if width == 160:
        assert {"user", "prio", "mem/card", "where", "age", "runtime", "exit"} <= set(heads), heads
        assert WAIT_REASON[:20] in text and FAIL_REASON[:15] in text
        assert "a-ve…ndeed" in text  # a long login name, shortened in the middle
    else:  # who submitted a job matters more than where it ran (README's drop order)
        assert {"user", "mem/card"} <= set(heads) and "where" not in heads, heads
        assert "needs 24.0" in text and "CUDA out" in text  # shortened, but there
    assert "\\x1b]0;TITLE" in text.replace("\n", "") or "\\x1b" in text  # escaped, not acted on


@pytest.mark.parametrize("width", [80, 160])
def test_jobs_estimated_start_shows_at_160_and_goes_first_at_80(width: int) -> None:
    listed = _listed()
    starts = {j.id: "~14:20" for j in listed if j.state is JobState.PENDING}
    lines = _screen(width, lambda c: render_jobs(listed, c, starts))
    _fits(lines, width)
    heads = _headings(lines)[0]
    if width == 160:  # beside every other column
        assert set(heads) == {c.header for c in JOB_COLUMNS}, heads
        assert sum("~14:20" in line for line in lines) == len(starts)
    else:
        assert "est. start" not in heads and "reason" in heads


def test_jobs_never_wrap_a_cell() -> None:
    lines = _screen(80, lambda c: render_jobs(_listed(), c))
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == len(_listed())  # one line a job


# -- rig top ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("width", "height"), [(80, 60), (160, 60)])
def test_top_lists_waiting_jobs_and_the_error_queue_when_there_is_room(width: int, height: int) -> None:
    lines = _screen(width, lambda c: c.print(build_view(_cluster(), 3, width, height, NOW, hint="",
                                                        waiting=_waiting(), error_jobs=_errors())), height)
    text = _fits(lines, width)
    assert len(lines) <= height
    assert "waiting jobs (40)" in text and "why it waits" in text and "needs 24.0 GiB" in text
    assert "error queue (3)" in text and "FAILED" in text and "eval-2" in text
    assert "more waiting jobs" in text  # 40 do not fit: counted
    for k in range(12):  # the running sweep runs, told apart
        assert re.search(rf"-seed-{k}\b", text), (k, text)
    waiting = text[text.index("waiting jobs (40)"):]
    assert "-seed-0 " in waiting and "-seed-1 " in waiting  # queue order: the oldest first
    assert "health / jobs" in text  # the heading is never cut
    if width == 160:
        assert WAIT_REASON[:80] in text and FAIL_REASON in text


def test_top_leaves_the_lists_out_when_there_is_no_room() -> None:
    lines = _screen(80, lambda c: c.print(build_view(_cluster(), 3, 80, 24, NOW, waiting=_waiting(),
                                                     error_jobs=_errors())), 24)
    text = _fits(lines, 80)
    assert len(lines) <= 24 and "waiting jobs (40)" not in text and "gpu-node-02/3" in text


def test_top_with_an_empty_cluster_shows_the_whole_queue() -> None:
    """The issue: counts only, "even with 30 empty rows"."""
    report = _cluster()
    for card in report.cards:
        card.jobs, card.reserved, card.used = 0, 0, 0
    report.running = {c.id: [] for c in report.cards}
    waiting = _waiting()[:10]
    lines = _screen(80, lambda c: c.print(build_view(report, 0, 80, 40, NOW, waiting=waiting)), 40)
    text = _fits(lines, 80)
    assert "waiting jobs (40)" in text and all(f"-seed-{k} " in text for k in range(10))
    assert "30 more waiting jobs" in text


# -- rig errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 160])
def test_errors_fit_and_never_fold_a_cell(width: int) -> None:
    jobs = [_job(400 + k, SWEEP.format(k), JobState.FAILED, node="gpu-node-01", user=LONG_USER)
            for k in range(12)] + [_job(450, HOSTILE, JobState.TIMEOUT, node="gpu-node-02")]
    lines = _screen(width, lambda c: render_errors(jobs, c))
    text = _fits([line for line in lines if not line.startswith("`rig retry")], width)
    assert len([line for line in lines if line.startswith("│")]) == len(jobs)  # one line a job
    assert {"id", "name", "state", "reason"} <= set(_headings(lines)[0])
    assert " FAILED " in text and " TIMEOUT " in text
    for k in range(12):
        assert re.search(rf"-seed-{k}\b", text), (k, text)
    assert FAIL_REASON[:10] in text


def test_top_never_cuts_a_waiting_jobs_memory() -> None:
    waiting = [_job(500 + k, SWEEP.format(k), JobState.PENDING) for k in range(3)]
    for job in waiting:
        job.gpus, job.gpu_memory = 2, 70 * GIB
    lines = _screen(80, lambda c: c.print(build_view(_cluster(), 0, 80, 60, NOW, waiting=waiting)), 60)
    text = _fits(lines, 80)
    assert text.count(" 70.0x2 ") == 3, text


def test_status_job_counts_stay_on_one_line() -> None:
    report = _cluster()
    report.counts = {s: (3 if s in (JobState.RUNNING, JobState.FAILED) else 0) for s in JobState}
    narrow = [line for line in _screen(80, lambda c: render_status(report, c)) if line.startswith("jobs: ")]
    assert narrow == ["jobs: running=3  failed=3"]
    wide = [line for line in _screen(160, lambda c: render_status(report, c)) if line.startswith("jobs: ")]
    assert "pending=0" in wide[0] and "timeout=0" in wide[0]


def test_errors_say_how_many_wait_when_more_than_shown() -> None:
    jobs = [_job(500 + k, f"j{k}", JobState.FAILED) for k in range(3)]
    head = _screen(120, lambda c: render_errors(jobs, c, total=2016))[0]
    assert head.startswith("error queue: 2,016 job(s) waiting for a person, 3 of 2,016 shown")
    assert _screen(120, lambda c: render_errors(jobs, c, total=3))[0] == "error queue: 3 job(s) waiting for a person"


def test_jobs_with_a_repeated_id_show_their_instance() -> None:
    a, b = _job(1, "before", JobState.SUCCEEDED), _job(1, "after", JobState.SUCCEEDED)
    a.instance, b.instance = "3fa9c2" + "0" * 10, "71bd00" + "0" * 10
    text = "\n".join(_screen(160, lambda c: render_jobs([b, a], c)))
    assert "1 3fa9c2" in text and "1 71bd00" in text and "--instance HEX" in text
    assert "3fa9c2" not in "\n".join(_screen(160, lambda c: render_jobs([a], c)))
