"""Tables that fit (issue 14, item 4): `rig status`, `rig jobs` and `rig top` rendered at 80 and
160 columns from a hand-made 2-node, 8-card cluster with a 12-run sweep, hostile and long
names and many waiting jobs. No line is wider than the screen, every heading and every state is
whole, the sweep's suffixes stay visible (names are shortened in the middle), the reason column
is there. No Redis, no terminal."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from rich.console import Console

from rig.cli.fit import (
    Cell,
    Col,
    fit_widths,
    fitted_table,
    shorten_end,
    shorten_middle,
    shorten_names,
)
from rig.cli.render import (
    CARD_COLUMNS,
    JOB_COLUMNS,
    render_errors,
    render_job,
    render_jobs,
    render_status,
)
from rig.cli.top import LIST_MIN_ROWS, build_view
from rig.client import StatusReport, UserUsage, WorkerInfo
from rig.memory import GIB
from rig.models import CardState, Job, JobState, Priority
from rig.nodes import NodeInfo
from rig.redis_writes import short_notice
from rig.text import has_control
from rig.waiting import queued_words

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


def _no_heading_without_rows(lines: list[str]) -> None:
    """`rig top`: every column header ("id user name ...") is followed by a job's row."""
    for i, line in enumerate(lines):
        if line.lstrip().startswith("id "):
            assert i + 1 < len(lines) and re.match(r"\s*\d+ ", lines[i + 1]), lines[i:i + 2]


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


def test_a_jobs_id_before_its_name_stays_whole_and_names_shorten_among_names() -> None:
    cols = [Col("running", "running", shrink="middle", min_width=10)]
    rows = [{"running": Cell([SWEEP.format(1), SWEEP.format(12)], line_prefixes=["101:", "112:"])}]
    body = [line.strip("│ ") for line in _screen(30, lambda c: c.print(fitted_table(cols, rows, 30)))
            if line.startswith("│")]
    assert body == ["101:…2000-batch512-seed-1", "112:…2000-batch512-seed-12"], body  # the same cut


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
        assert {"user", "prio", "mem/card", "where"} <= set(heads), heads
        assert "age" not in heads and "exit" not in heads  # they go before a long reason is cut
        assert WAIT_REASON[:20] in text and FAIL_REASON[:15] in text
        assert "a-ver…-indeed" in text  # a long login name, shortened in the middle
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
    if width == 160:  # beside the reason: age, exit, gpus and runtime went before it was cut
        assert set(heads) == {c.header for c in JOB_COLUMNS} - {"age", "exit", "gpus", "runtime"}, heads
        assert sum("~14:20" in line for line in lines) == len(starts)
        assert _reason_width(lines) >= 56
    else:
        assert "est. start" not in heads and "reason" in heads


def _reason_width(lines: list[str]) -> int:
    """How much of WAIT_REASON a waiting job's row shows."""
    row = next(line for line in lines if "needs 24.0" in line)
    return len(row.split("│")[-2].strip())


def test_age_exit_gpus_and_runtime_never_stand_beside_a_cut_reason() -> None:
    """The README's rule: age, exit, gpus and runtime go before a waiting job's reason is cut
    below 64 characters. With estimated starts, 160 columns kept all four and cut the reason to
    25 cells while 180 showed 65 without them (and 140 brought exit back beside 16 cells)."""
    listed = _listed()
    starts = {j.id: "~14:20" for j in listed if j.state is JobState.PENDING}
    early = {"age", "exit", "gpus", "runtime"}
    last_early: set[str] = set()
    for width in range(80, 221, 10):
        lines = _screen(width, lambda c, w=width: render_jobs(listed, c, starts))
        shown = set(_headings(lines)[0])
        if _reason_width(lines) < min(64, len(WAIT_REASON)):  # cut: none of them is beside it
            assert not early & shown, (width, shown, _reason_width(lines))
        assert early & shown >= last_early, (width, shown)  # a wider screen never takes one back
        last_early = early & shown


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


def test_top_folds_the_lists_into_one_line_each_when_there_is_no_room() -> None:
    lines = _screen(80, lambda c: c.print(build_view(_cluster(), 3, 80, 24, NOW, waiting=_waiting(),
                                                     error_jobs=_errors())), 24)
    text = _fits(lines, 80)
    assert len(lines) <= 24 and "gpu-node-02/3" in text
    assert "waiting jobs (40), the first: 300 " in text and "(bob): needs 24.0" in text
    assert lines[-1] == "error queue (3): `rig errors`"
    _no_heading_without_rows(lines)


@pytest.mark.parametrize("width", [80, 160])
def test_top_leaves_no_line_blank_while_it_cuts_the_running_jobs(width: int) -> None:
    """At 80x26 the running list gave up its tail for a waiting table that then folded to one
    line anyway: "... 10 more running jobs" above three blank lines. At 80x20 the waiting jobs
    and the error queue were not said at all in the line left; at 80x22 the error queue took
    the waiting jobs' place (README: the error queue folds first)."""
    for height in range(12, 60):
        for errors in (_errors(), []):
            lines = _screen(width, lambda c, h=height, e=errors: c.print(build_view(
                _cluster(), len(e), width, h, NOW, waiting=_waiting(), error_jobs=e)), height)
            text = _fits(lines, width)
            _no_heading_without_rows(lines)
            if "more running jobs" in text:
                assert len(lines) == height and lines[-1].strip(), (height, text)
                if height >= 20:  # lower, the cards and the running list's least fill it
                    assert "waiting jobs (40)" in text, (height, text)


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
    # Breaker, at 80 columns: "... shown (`rig errors --limit" / "N` shows more)": the command
    # cut by the wrap. It goes on a line of its own.
    assert _screen(80, lambda c: render_errors(jobs, c, total=2016))[:2] == [
        "error queue: 2,016 job(s) waiting for a person, 3 of 2,016 shown", "(`rig errors --limit N` shows more)"]


def test_jobs_with_a_repeated_id_show_their_instance() -> None:
    a, b = _job(1, "before", JobState.SUCCEEDED), _job(1, "after", JobState.SUCCEEDED)
    a.instance, b.instance = "3fa9c2" + "0" * 10, "71bd00" + "0" * 10
    text = "\n".join(_screen(160, lambda c: render_jobs([b, a], c)))
    assert "1 3fa9c2" in text and "1 71bd00" in text and "--instance HEX" in text
    assert "3fa9c2" not in "\n".join(_screen(160, lambda c: render_jobs([a], c)))


# -- names shortened column by column (issue 14, item 4: reviewer's points 2 and 3) --------------
SWEEP_RUNS = [f"sweep-lr{lr}-seed-{seed}" for lr in ("0.0003", "0.001", "0.01") for seed in (11, 12, 13)]


@pytest.mark.parametrize("width", [12, 14, 17, 20])
def test_sweep_runs_keep_what_tells_them_apart(width: int) -> None:
    short = shorten_names(SWEEP_RUNS, width)
    assert all(len(s) <= width for s in short), short
    assert len(set(short)) == len(SWEEP_RUNS), short  # every run told apart
    for name, cut in zip(SWEEP_RUNS, short, strict=True):
        lr, seed = re.match(r"sweep-lr0\.(\d+)-seed-(\d+)", name).groups()
        assert cut.endswith(f"-{seed}"), (name, cut)  # the seed stays
        assert f"{lr}-se" in cut, (name, cut)  # and the lr's digits
    # The shared start goes, as many characters for every run: they line up.
    starts = {n.index(s[1:].split("…")[0]) for n, s in zip(SWEEP_RUNS, short, strict=True) if s.startswith("…")}
    assert len(starts) == 1, short
    assert all(n.endswith(s[1:]) for n, s in zip(SWEEP_RUNS, short, strict=True) if width >= 14), short


def test_the_shared_start_goes_first_at_a_separator() -> None:
    assert shorten_names(SWEEP_RUNS[:6], 17)[:2] == ["…lr0.0003-seed-11", "…lr0.0003-seed-12"]
    assert shorten_names(["rigdemo-alice", "rigdemo-bob", "rigdemo-carol"], 8) == ["…alice", "…bob", "…carol"]
    assert shorten_names(["rigdemo-alice", "rigdemo-bob"], 16) == ["rigdemo-alice", "rigdemo-bob"]  # fits: whole
    # A lone name (nothing shared) is shortened in the middle, as before.
    assert shorten_names(["train-resnet50-long-context-ablation"], 20) == \
        [shorten_middle("train-resnet50-long-context-ablation", 20)]


def test_names_that_differ_only_at_the_start_keep_their_start() -> None:
    names = ["alpha-long-common-tail-name", "beta-long-common-tail-name", "gamma-long-common-tail-name"]
    short = shorten_names(names, 12)
    assert [s.split("-")[0] for s in short] == ["alpha", "beta", "gamma"], short
    assert all(len(s) <= 12 and s.endswith("…") for s in short), short


def test_unicode_names_are_measured_in_cells() -> None:
    from rich.cells import cell_len

    names = ["データ-実験-seed-1", "データ-実験-seed-2", "データ-前処理-seed-1"]
    for width in (8, 12, 16):
        short = shorten_names(names, width)
        assert all(cell_len(s) <= width for s in short), short
        assert len(set(short)) == 3, short


def test_one_width_per_name() -> None:
    short = shorten_names(["rigdemo-alice", "rigdemo-bob"], [8, 4])
    assert short[0] == "…alice" and len(short[1]) <= 4


# -- a three-user mixed load, as in docs/screens --------------------------------------------------
USERS = ("rigdemo-alice", "rigdemo-bob", "rigdemo-carol")
OOM = ("CUDA out of memory (PyTorch): torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
       "6.00 GiB (GPU 0; 24.00 GiB total)")


def _mixed() -> tuple[StatusReport, list[Job]]:
    """docs/screens' load: 4 cards of one node; 2 failed, 4 running, 5 waiting jobs of three users."""
    alice, bob, carol = USERS
    specs = [  # id, name, user, state, GiB, card
        (1, "preprocess-shards", alice, JobState.FAILED, 1, 0),
        (2, "finetune-llama-7b-bs64", bob, JobState.FAILED, 2, 0),
        (3, "train-resnet50", alice, JobState.RUNNING, 20, 0),
        (4, "eval-gpt2-xl", bob, JobState.RUNNING, 22, 1),
        (5, "sweep-lr0.001-seed-11", carol, JobState.RUNNING, 20, 2),
        (6, "sweep-lr0.001-seed-12", carol, JobState.RUNNING, 20, 3),
        (7, "sweep-lr0.001-seed-13", carol, JobState.PENDING, 20, 0),
        (8, "sweep-lr0.0003-seed-11", carol, JobState.PENDING, 20, 0),
        (9, "sweep-lr0.0003-seed-12", carol, JobState.PENDING, 20, 0),
        (10, "train-resnet50-long-context-ablation", alice, JobState.PENDING, 16, 0),
        (11, "eval-gpt2-xl", bob, JobState.PENDING, 22, 0),
    ]
    jobs = []
    for job_id, name, user, state, gib, card in specs:
        job = _job(job_id, name, state, node="demo", card=card, user=user)
        job.gpu_memory, job.created_at = gib * GIB, NOW - 80 + job_id
        if state is JobState.PENDING:
            job.wait_reason = f"needs {gib}.0 GiB on 1 card; every card is held for jobs ahead of it"
        if state is JobState.FAILED:
            job.reason, job.failure = (OOM, "cuda_oom") if job_id == 2 else ("exit code 3", "nonzero_exit")
        jobs.append(job)
    cards, running = [], {}
    for i in range(4):
        card = CardState(node="demo", index=i, total=24 * GIB, usable=int(22.8 * GIB), max_jobs=4, model="Fake GPU")
        running[card.id] = [j for j in jobs if j.state is JobState.RUNNING and j.cards == [i]]
        card.jobs, card.reserved = 1, running[card.id][0].gpu_memory
        cards.append(card)
    report = StatusReport(
        cards=cards, running=running,
        pending={Priority.HIGH: 1, Priority.MEDIUM: 3, Priority.LOW: 1},
        oldest_wait={Priority.HIGH: 62.0, Priority.MEDIUM: 65.0, Priority.LOW: 61.0},
        workers=[WorkerInfo(f"card{i}@demo", "card", "demo", i, 100 + i, 1, NOW) for i in range(5)],
        counts={JobState.RUNNING: 4, JobState.PENDING: 5, JobState.FAILED: 2},
        nodes=[NodeInfo("demo", True, "up", NOW - 600, last_seen=NOW, started_at=NOW - 600, workers=5)],
        notices=["Redis keeps no copy on disk (no RDB save, no AOF): a restart of it loses every job and "
                 "reservation; turn on AOF (`redis-cli -u redis://127.0.0.1:6379/0 CONFIG SET appendonly yes`, "
                 "and in its config file)"])
    return report, list(reversed(jobs))


def _rows_of(lines: list[str], job_id: int) -> list[str]:
    return [line for line in lines if re.match(rf"[│ ]\s*{job_id} ", line)]


def _tells_apart(lines: list[str], jobs: list[Job]) -> None:
    """Every job's row is there once, and shows its user told apart from the others."""
    for job in jobs:
        rows = _rows_of(lines, job.id)
        assert len(rows) == 1, (job.id, lines)
        assert job.user.split("-")[1] in rows[0], (job.user, rows[0])


@pytest.mark.parametrize("width", [80, 160])
def test_mixed_load_jobs_tell_ids_users_and_sweep_runs_apart(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rig.cli.render.shared_now", lambda: NOW)  # ages of a minute, as on the real screen
    _, jobs = _mixed()
    lines = _screen(width, lambda c: render_jobs(jobs, c, {j.id: "~15:20" for j in jobs if j.state is JobState.PENDING}))
    text = _fits(lines, width)
    _tells_apart(lines, jobs)
    for job in jobs:
        if job.name.startswith("sweep-"):  # its lr and its seed
            lr, seed = re.match(r"sweep-lr0\.(\d+)-seed-(\d+)", job.name).groups()
            assert f"{lr}-seed-{seed}" in _rows_of(lines, job.id)[0], _rows_of(lines, job.id)
    if width == 160:  # the reason whole, before names are
        assert "every card is held for jobs ahead of it" in text and "est. start" in text


def test_mixed_load_errors_and_their_hint_fit_80() -> None:
    _, jobs = _mixed()
    failed = [j for j in jobs if j.state is JobState.FAILED]
    lines = _screen(80, lambda c: render_errors(failed, c))
    _fits(lines, 80)
    _tells_apart(lines, failed)
    assert lines[-2:] == ["`rig retry JOB [--gpu-memory SIZE]` sends one back;", "`rig errors --clear JOB` dismisses it"]
    assert len(_screen(160, lambda c: render_errors(failed, c))[-1]) > 80  # one line when it fits


def test_mixed_load_top_at_80x24_lists_waiting_jobs_with_rows() -> None:
    report, jobs = _mixed()
    waiting = [j for j in jobs if j.state is JobState.PENDING]
    failed = [j for j in jobs if j.state is JobState.FAILED]
    lines = _screen(80, lambda c: c.print(build_view(report, 2, 80, 24, NOW, waiting=waiting, error_jobs=failed)), 24)
    text = _fits(lines, 80)
    assert len(lines) <= 24
    _no_heading_without_rows(lines)
    assert "waiting jobs (5), by priority, then submission" in text
    after = lines[lines.index("waiting jobs (5), by priority, then submission") + 2:]
    assert len([line for line in after if re.match(r"\s*\d+ ", line)]) >= LIST_MIN_ROWS
    assert "CONFIG SET appendonly yes (rig status)" in text  # the warning keeps what mends it
    for name in ("…alice", "…bob", "…carol"):
        assert name in text, text


def test_a_short_notice_keeps_the_command_that_mends_it() -> None:
    report, _ = _mixed()
    for notice in [*report.notices, "Redis' maxmemory-policy is allkeys-lru: when it fills it silently deletes keys, "
                   "rig's job records and reservations among them; set it to noeviction (redis-cli CONFIG SET "
                   "maxmemory-policy noeviction, and in its config file)"]:
        short = short_notice(notice)
        # The setting, and where the whole command line is (with rig's URL it does not fit).
        assert len(short) < 80 and "CONFIG SET" in short and "(rig status)" in short, short


@pytest.mark.parametrize("columns", [80, 160])
def test_rig_templates_fits_and_never_wraps(rig_home, monkeypatch, columns):
    """`rig templates` at 80 columns: one line per template, no heading cut (it wrapped the
    description onto 7 lines and cut every heading, as a tester found)."""
    from click.testing import CliRunner

    from rig.cli.main import cli

    monkeypatch.setenv("COLUMNS", str(columns))
    done = CliRunner().invoke(cli, ["templates"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert all(len(line.rstrip()) <= columns for line in lines), done.output
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 3 and [b.split("│")[1].strip() for b in body] == ["finetune", "inference", "test"], done.output
    assert "what for" in done.output and "…" not in lines[1] + lines[2] + lines[3], done.output


@pytest.mark.parametrize("columns", [80, 160])
def test_rig_metrics_fits_with_whole_headings_and_outcomes(columns):
    """`rig metrics` at 80 columns cut its heading to "peak/de…" and the outcome to "succeed…"
    (a tester found): now columns go in a fixed order instead, and what stays is whole."""
    import time as _time

    from rig.cli.render import render_metrics
    from rig.memory import GIB
    from rig.models import Job, JobState, Priority

    now = _time.time()
    job = Job(id=26, name="sweep-lr0.001-seed-11", user="alice", command=["true"], gpu_memory=12 * GIB, gpus=1,
              priority=Priority.MEDIUM, state=JobState.SUCCEEDED, workdir="/tmp", created_at=now - 90,
              attempts=[{"attempt": 1, "outcome": "nonzero_exit", "gpu_memory": 12 * GIB, "started_at": now - 80,
                         "ended_at": now - 60, "vram_peak": 13 * GIB, "vram_mean": 9 * GIB, "util_mean": 55.0},
                        {"attempt": 2, "outcome": "succeeded", "gpu_memory": 12 * GIB, "started_at": now - 50,
                         "ended_at": now - 5, "vram_peak": 11 * GIB, "vram_mean": 8 * GIB, "util_mean": 60.0}])
    console = Console(width=columns, record=True, file=io.StringIO())
    render_metrics(job, console)
    text = console.export_text()
    assert all(len(line) <= columns for line in text.splitlines()), text
    assert "succeeded" in text and "nonzero_exit" in text and "peak" in text, text
    assert "…" not in "".join(line for line in text.splitlines() if line.startswith("┃")), text
    if columns >= 160:
        assert "peak/declared" in text and "108% over" in text, text


def test_a_retried_running_job_says_which_attempt_its_reason_is_from():
    """A job running its second attempt showed a bare "nonzero_exit" as its reason, as if it
    were failing now (a tester found): the reason names the attempt it comes from."""
    import time as _time

    from rig.cli.render import job_reason
    from rig.memory import GIB
    from rig.models import Job, JobState, Priority

    now = _time.time()
    job = Job(id=28, name="flaky", user="alice", command=["true"], gpu_memory=GIB, gpus=1,
              priority=Priority.MEDIUM, state=JobState.RUNNING, workdir="/tmp", created_at=now - 60,
              attempt=2, failure="nonzero_exit", reason="exit code 7",
              attempts=[{"attempt": 1, "outcome": "nonzero_exit", "summary": "exit code 7"}])
    assert job_reason(job) == "attempt 2; attempt 1: exit code 7"
    job.attempts, job.attempt = [], 1
    assert job_reason(job) == "-"


def test_top_gives_unworded_waiting_jobs_their_place_in_the_queue() -> None:
    """`rig jobs` said "queued: N job(s) ahead of it" where the dispatcher had worded nothing;
    `rig top` still said "-" (a helper's leftover)."""
    report = _cluster()
    waiting = _waiting()[:3]
    for job in waiting:
        job.wait_reason = None
    said = {waiting[0].id: queued_words(0), waiting[1].id: queued_words(7)}  # Client.waiting_words
    lines = _screen(160, lambda c: c.print(build_view(report, 0, 160, 40, NOW, waiting=waiting, said=said)), 40)
    text = " ".join(" ".join(lines).split())
    assert "queued: first in line" in text and "queued: 7 job(s) ahead of it" in text


@pytest.mark.parametrize("home", ["/srv/rig[/x]", "/srv/exp[red]"])
def test_status_shows_the_archive_path_as_it_is(home) -> None:
    """A path of the operator's is text, not rich markup: '[/x]' was a MarkupError traceback
    out of rig status, '[red]' silently dropped from the path shown."""
    report = _cluster()
    report.archived, report.archive = 4, f"sqlite:///{home}/archive.sqlite3"
    lines = [line for line in _screen(200, lambda c: render_status(report, c)) if line.startswith("jobs: ")]
    assert lines[0].endswith(f"; archived (finished, out of Redis): 4 in sqlite:///{home}/archive.sqlite3")


def test_rig_show_names_the_template_a_job_was_submitted_with():
    """`rig-submit -t finetune -m 20G`: rig show said 24.0 GiB, high priority, retries up to 1
    and never where they came from; the record keeps the template's name."""
    job = dataclasses.replace(_job(7, "ft", JobState.PENDING), template="finetune", pool="a100")
    lines = _screen(120, lambda c: render_job(job, None, c))
    assert any(line.split() == ["template", "finetune"] for line in lines), lines
    plain = dataclasses.replace(job, template=None)
    assert not any(line.startswith("template") for line in _screen(120, lambda c: render_job(plain, None, c)))


@pytest.mark.parametrize("width", [36, 40, 44, 50, 60])
def test_tops_card_heading_names_each_column_once(width: int) -> None:
    """At 40 columns the heading read "card  res/used/free/usable jobs jobs": the last column's
    narrow heading was the count's."""
    lines = _screen(width, lambda c: c.print(build_view(_cluster(), 3, width, 60, NOW, hint="")), 60)
    (heading,) = [line for line in lines if line.startswith("card ")]
    assert " ".join(heading.split()[-2:]) != "jobs jobs", heading
