"""`rig top`'s frame: built from a hand-made StatusReport, no Redis and no terminal."""

from __future__ import annotations

import io

import pytest
import redis
from rich.console import Console

from rig.cli.top import NO_CARDS, build_view, run_top
from rig.client import StatusReport, WorkerInfo
from rig.models import CardState, Job, JobState, Priority

GIB = 2**30
NOW = 1_700_000_000.0


def _job(job_id: int, name: str, card: int, *, user: str = "alice", declared: int = 24,
         peak: int = 12, gpus: int = 1) -> Job:
    over = peak * GIB if peak > declared else 0
    return Job(
        id=job_id, name=name, user=user, command=["python", "train.py"],
        gpu_memory=declared * GIB, gpus=gpus, priority=Priority.MEDIUM, state=JobState.RUNNING,
        workdir="/tmp", created_at=NOW - 900, node="gpu01",
        cards=list(range(card, card + gpus)), assigned_at=NOW - 800, started_at=NOW - 754,
        vram_peak=peak * GIB, vram_sum=2 * peak * GIB, vram_samples=2, overuse=over,
    )


def _report(n_jobs_per_card: int = 1) -> StatusReport:
    cards: list[CardState] = []
    running: dict[str, list[Job]] = {}
    job_id = 40
    for i in range(8):
        card = CardState(
            node="gpu01", index=i, total=80 * GIB, usable=79 * GIB, max_jobs=4,
            model="NVIDIA H100 80GB HBM3", utilization=10 * i,
            temperature=35 + 6 * i,
        )
        jobs = []
        if i not in (0, 7):
            for _ in range(n_jobs_per_card):
                job_id += 1
                name = "overeager-llm" if job_id == 42 else f"train-{job_id}"
                jobs.append(_job(job_id, name, i, peak=30 if job_id == 42 else 12))
        card.jobs = len(jobs)
        card.reserved = sum(max(j.gpu_memory, j.vram_peak) for j in jobs)
        card.used = sum(j.vram_peak for j in jobs)
        cards.append(card)
        running[card.id] = jobs
    cards[3].healthy = False
    cards[3].health_reason = "XID 79"
    cards[4].allowed = False
    return StatusReport(
        cards=cards, running=running,
        pending={Priority.HIGH: 3, Priority.MEDIUM: 0, Priority.LOW: 12},
        oldest_wait={Priority.HIGH: 65.0, Priority.MEDIUM: None, Priority.LOW: 7300.0},
        workers=[WorkerInfo(f"w{i}", "card", "gpu01", i, 100 + i, 0, NOW) for i in range(8)],
        counts={JobState.RUNNING: 6, JobState.PENDING: 15},
    )


def _render(report: StatusReport | None, width: int, height: int, **kwargs) -> list[str]:
    console = Console(width=width, height=height, record=True, file=io.StringIO(),
                      color_system=None)
    console.print(build_view(report, 2, width, height, NOW, **kwargs))
    return console.export_text().rstrip("\n").splitlines()


def _check_fits(lines: list[str], width: int, height: int) -> None:
    assert len(lines) <= height, "\n".join(lines)
    for line in lines:
        assert len(line) <= width, repr(line)


@pytest.mark.parametrize(("width", "height"), [(80, 24), (200, 50), (120, 40)])
def test_frame_shows_cards_queues_and_jobs(width: int, height: int) -> None:
    lines = _render(_report(), width, height)
    _check_fits(lines, width, height)
    text = "\n".join(lines)
    for i in range(8):
        assert f"gpu01/{i}" in text
    assert "high 3" in text and "low 12" in text and "oldest 1m05s" in text
    assert "overeager-llm" in text
    assert "OVER" in text  # used more than it declared
    assert "train-41" in text
    assert "12m34s" in text  # elapsed
    assert "UNHEALTHY: XID 79" in text
    assert "not in whitelist" in text
    assert "errors 2" in text and "8 alive" in text
    assert "█" in text and "▒" in text and "░" in text  # used, reserved-unused, free


def test_wide_frame_shows_more_columns() -> None:
    text = "\n".join(_render(_report(), 200, 50))
    assert "res/used/free/usable GiB" in text
    assert "H100 80GB HBM3" in text  # the full model name
    assert "mean" in text and "prio" in text
    assert "41:train-41 (alice)" in text


def test_80x24_fits_with_many_jobs() -> None:
    report = _report(n_jobs_per_card=4)  # 24 running jobs: cannot all fit
    lines = _render(report, 80, 24)
    _check_fits(lines, 80, 24)
    text = "\n".join(lines)
    assert "more running jobs" in text
    for i in range(8):
        assert f"gpu01/{i}" in text  # the cards keep their rows


def test_small_terminal_says_what_it_left_out() -> None:
    lines = _render(_report(), 60, 12)
    _check_fits(lines, 60, 12)
    assert "more" in "\n".join(lines)


@pytest.mark.parametrize("width", [20, 40, 80, 120])
def test_a_pane_a_few_lines_high_shows_no_heading_without_rows(width: int) -> None:
    """A tmux pane 4-7 lines high drew the cards' and the running jobs' column headings with no
    row under them (or only "... 8 more cards"); README: never a heading without rows. Such a
    section is one line that says what is not listed and where to see it."""
    for height in range(3, 16):
        lines = _render(_report(), width, height)
        _check_fits(lines, width, height)
        for i, line in enumerate(lines):
            if line.startswith(("card ", "id ")):
                below = lines[i + 1] if i + 1 < len(lines) else ""
                assert below.strip() and not below.startswith(("...", "id ")), (width, height, lines)
        if 4 <= height <= 6:  # said, not dropped
            assert any(line.startswith("6 running job(s)") for line in lines), (width, height, lines)


def test_multi_card_job_listed_once() -> None:
    report = _report()
    job = _job(99, "two-card-job", 0, gpus=2)
    report.running["gpu01/0"] = [job]
    report.running["gpu01/1"] = [*report.running["gpu01/1"], job]
    lines = _render(report, 200, 50)
    assert sum("two-card-job" in line and "gpu01/0,1" in line for line in lines) == 1


def test_oldest_wait_and_the_jobs_waited_read_the_same_clock() -> None:
    """The report is read once a second and the frame redrawn in between: the title's "oldest"
    was the report's figure while the waiting job's row was aged to the frame's clock (seen at
    100x40: "low 7 (oldest 36s)" above job 8 "waited 37s", the same job)."""
    report = _report()
    report.taken_at = NOW - 10  # the frame is drawn 10 s after the read
    report.pending = {Priority.HIGH: 1, Priority.MEDIUM: 0, Priority.LOW: 0}
    report.oldest_wait = {Priority.HIGH: 55.0, Priority.MEDIUM: None, Priority.LOW: None}
    oldest = Job(id=7, name="only-waiter", user="bob", command=["true"], gpu_memory=GIB, gpus=1,
                 priority=Priority.HIGH, state=JobState.PENDING, workdir="/", created_at=NOW - 65)
    text = "\n".join(_render(report, 120, 40, waiting=[oldest]))
    assert "oldest 1m05s" in text, text
    row = next(line for line in text.splitlines() if "only-waiter" in line)
    assert "1m05s" in row, row


def test_empty_report_points_to_rig_up() -> None:
    report = StatusReport(cards=[], running={}, pending={}, oldest_wait={}, workers=[], counts={})
    lines = _render(report, 80, 24)
    _check_fits(lines, 80, 24)
    text = "\n".join(lines)
    assert NO_CARDS in text
    assert "no cards registered" in text and "rig up" in text
    assert "0 alive" in text


FROZEN_LINE = ("node vm joined installation inst-35d821716124, but this Redis holds no rig installation (it lost "
               "its data, or it is another Redis or database than the one the node used: check RIG_REDIS_URL / "
               "--redis); 1 job(s) of another installation still run here (1), untouched; on vm: `rig recover` "
               "says more, `rig recover --stop` stops them and joins this Redis")


@pytest.mark.parametrize(("width", "height", "with_cards"), [(80, 24, False), (60, 20, False), (80, 24, True)])
def test_a_frozen_node_is_said_never_no_node_is_up(width: int, height: int, with_cards: bool) -> None:
    """Breaker: with Redis restarted empty, `rig status` said node vm FROZEN while `rig top`
    said "no cards registered: no rig node is up (start one with `rig up`)" and nothing of it."""
    from rig.nodes import NodeInfo

    base = _report() if with_cards else StatusReport(cards=[], running={}, pending={}, oldest_wait={},
                                                     workers=[], counts={})
    base.nodes = [NodeInfo(name="vm", alive=True, state="up", since=NOW - 60, workers=3, mismatch=FROZEN_LINE)]
    lines = _render(base, width, height)
    _check_fits(lines, width, height)
    text = "\n".join(lines)
    assert NO_CARDS not in text and "rig up" not in text
    assert lines[2] == "node vm FROZEN: `rig recover` on vm says why"
    if not with_cards:
        assert "no cards registered" in text and any(line.startswith("node vm  FROZEN: node vm joined")
                                                     for line in lines)


def test_redis_problem_shown_in_one_line() -> None:
    problem = "cannot reach Redis at redis://x:6379/0; retrying"
    lines = _render(None, 80, 24, problem=problem)
    assert any(problem in line for line in lines)
    lines = _render(_report(), 80, 24, problem=problem)
    _check_fits(lines, 80, 24)
    assert any(problem in line for line in lines) and any("gpu01/0" in line for line in lines)


class _FakeStore:
    def error_ids(self) -> list[int]:
        return [7, 8]


class _FakeClient:
    def __init__(self, report: StatusReport) -> None:
        self.report = report
        self.store = _FakeStore()

    def status(self) -> StatusReport:
        return self.report

    def error_count(self) -> int:
        return len(self.store.error_ids())

    def waiting(self, *, limit: int = 50) -> list[Job]:
        return []

    def errors(self, *, limit: int = 100) -> list[Job]:
        return []

    def waiting_words(self, jobs) -> dict[int, str]:  # noqa: ANN001
        return {}


def test_run_top_once_prints_one_frame() -> None:
    out = io.StringIO()
    console = Console(width=100, height=30, file=out, color_system=None)
    run_top(_FakeClient(_report()), once=True, console=console)
    text = out.getvalue()
    assert "gpu01/7" in text and "errors 2" in text and "quits" not in text


def test_poller_keeps_last_report_when_redis_goes_away() -> None:
    from rig.cli.top import _Poller

    client = _FakeClient(_report())
    poller = _Poller(client, 0.01)
    poller.poll()
    assert poller.snapshot.report is client.report and poller.snapshot.problem is None

    def boom() -> StatusReport:
        raise redis.ConnectionError("Connection refused")

    client.status = boom  # type: ignore[method-assign]
    poller.poll()
    assert poller.snapshot.report is not None
    assert poller.snapshot.problem and "cannot reach Redis" in poller.snapshot.problem


def test_poller_goes_on_when_the_lists_cannot_be_read() -> None:
    """A gateway older than `waiting` (or a refused read): the frame's report still updates."""
    from rig.cli.top import _Poller
    from rig.errors import InvalidInput

    client = _FakeClient(_report())

    def old_gateway(*, limit: int = 50) -> list[Job]:
        raise InvalidInput("the gateway has no operation 'waiting'")

    client.waiting = old_gateway  # type: ignore[method-assign]
    poller = _Poller(client, 0.01)
    poller.poll()
    assert poller.snapshot.report is client.report and poller.snapshot.problem is None
    assert poller.snapshot.waiting == []


def test_run_top_off_a_terminal_prints_one_frame_and_returns() -> None:
    """`rig top > f` (or `| head -1`) hung with 0 bytes: without a terminal there is no live
    screen to redraw, so one frame is printed, as `--once` does."""
    import threading

    out = io.StringIO()  # not a terminal
    console = Console(width=100, height=30, file=out, color_system=None)
    done = threading.Event()

    def show() -> None:
        run_top(_FakeClient(_report()), console=console)
        done.set()

    threading.Thread(target=show, daemon=True).start()
    # A bound on a hang, not a timing: one frame takes milliseconds; the old loop never ended.
    assert done.wait(60), "rig top off a terminal did not return"
    text = out.getvalue()
    assert "gpu01/7" in text and "errors 2" in text and "quits" not in text


@pytest.mark.parametrize(("width", "height"), [(40, 12), (80, 24), (200, 30)])
def test_the_cards_left_out_are_counted_without_the_node_headings(width: int, height: int) -> None:
    """Four nodes of 16 cards at 40x12 said "... 64 more cards" under 3 cards shown (80x24: 52
    under 15): each node's heading line among the cards was counted as a card."""
    import re

    report = _report()
    cards, running = [], {}
    for n in range(4):
        for card in report.cards:
            copy = CardState(node=f"gpu{n:02d}", index=card.index, total=card.total, usable=card.usable,
                             max_jobs=card.max_jobs, model=card.model)
            cards.append(copy)
            running[copy.id] = []
    report.cards, report.running = cards, running
    lines = _render(report, width, height)
    _check_fits(lines, width, height)
    shown = sum(1 for line in lines if re.match(r"gpu\d\d/\d+ ", line))
    (more,) = [int(m.group(1)) for line in lines if (m := re.match(r"\.\.\. (\d+) more cards", line))]
    assert shown + more == len(cards) == 32, lines
