"""The pure helpers of scripts/bench_peers.py (rig.testing.peers): names, stamps, rule breaks."""

from __future__ import annotations

import math
import subprocess

import pytest

from rig.testing.peers import (
    Stamp,
    job_name,
    parse_stamp,
    records_from_stamps,
    rule_breaks,
    stamped_command,
    trace_metrics,
)
from rig.testing.trace import GIB, LowerBound, RunRecord, TraceJob

CARD = 80 * GIB


def job(index: int, kind: str = "finetune", gib: int = 24, gpus: int = 1,
        priority: str = "low") -> TraceJob:
    return TraceJob(index, kind, gib * GIB, gpus, priority, 0.0, 1.0)


def rec(start: float, end: float, cards: tuple[int, ...], gib: int, gpus: int = 1) -> RunRecord:
    return RunRecord(priority="low", gpu_memory=gib * GIB, gpus=gpus, cards=cards,
                     created_at=0.0, started_at=start, ended_at=end, state="ended")


def test_names_without_history_are_unique_and_with_history_repeat_per_bucket() -> None:
    a, b = job(1, gib=24), job(2, gib=30)
    assert job_name(a, history=False, run_tag="t") != job_name(b, history=False, run_tag="t")
    assert job_name(a, history=True, run_tag="t") == job_name(b, history=True, run_tag="u") == "ft-24g"
    assert job_name(job(3, "large", 70, gpus=2), history=True, run_tag="t") == "large-64g-x2"
    assert job_name(job(4, "inference", 7), history=True, run_tag="t") == "inf-0g"


def test_parse_stamp_reads_start_cards_and_end() -> None:
    assert parse_stamp("S 10.5 3,4\nE 12.25\n") == Stamp(10.5, 12.25, (3, 4))
    assert parse_stamp("S 10.5 \n") == Stamp(10.5, None, ())
    assert parse_stamp("") == Stamp(None, None, ())
    assert parse_stamp("S x 1\nE 2\n") == Stamp(None, 2.0, ())


def test_stamped_command_stamps_its_own_start_card_and_end(tmp_path) -> None:
    stamp = tmp_path / "7"
    subprocess.run(["/bin/sh", "-c", stamped_command(str(stamp), "sleep 0.05")],
                   env={"CUDA_VISIBLE_DEVICES": "5,6", "PATH": "/usr/bin:/bin"}, check=True)
    got = parse_stamp(stamp.read_text())
    assert got.cards == (5, 6)
    assert got.started_at is not None and got.ended_at is not None
    assert got.ended_at - got.started_at >= 0.04


def test_records_from_stamps_marks_missing_jobs() -> None:
    trace = [job(1), job(2)]
    records = records_from_stamps(trace, {1: 100.0, 2: 101.0}, {1: Stamp(102.0, 104.0, (0,))})
    assert records[0].started_at == 102.0 and records[0].cards == (0,)
    assert records[0].state == "ended" and records[1].state == "missing"
    assert records[1].created_at == 101.0


def test_rule_breaks_memory_and_cap_separately() -> None:
    # card 0: 50 + 40 GiB overlap for 1 s (over 80 GiB); card 1: 5 jobs for 2 s (over 4)
    records = [rec(0, 2, (0,), 50), rec(1, 3, (0,), 40)]
    records += [rec(0, 2, (1,), 1) for _ in range(5)]
    out = rule_breaks(records, card_bytes=CARD, max_jobs=4)
    assert out["oversub_card_s"] == pytest.approx(1.0)
    assert out["cap_card_s"] == pytest.approx(2.0)
    assert out["peak_gib"] == pytest.approx(90.0) and out["peak_jobs"] == 5


def test_rule_breaks_two_card_job_counts_on_both_cards_and_touching_intervals_do_not() -> None:
    records = [rec(0, 2, (0, 1), 60, gpus=2), rec(1, 2, (1,), 30), rec(2, 3, (0,), 76)]
    out = rule_breaks(records, card_bytes=CARD, max_jobs=4)
    assert out["oversub_card_s"] == pytest.approx(1.0)  # card 1 from 1 s to 2 s only
    assert out["cap_card_s"] == 0.0


def test_trace_metrics_from_stamps() -> None:
    records = [RunRecord("high", 40 * GIB, 1, (0,), 0.0, 1.0, 3.0, "ended"),
               RunRecord("low", 40 * GIB, 2, (1, 2), 0.0, 2.0, 4.0, "ended"),
               RunRecord("low", 40 * GIB, 1, (), 0.0, None, None, "missing")]
    out = trace_metrics(records, LowerBound(2.0, 1.0, 1.0), capacity_bytes=3 * 80 * GIB,
                        card_bytes=CARD, max_jobs=4)
    assert out["makespan_s"] == 4.0 and out["x_lower_bound"] == 2.0
    assert out["wait_s"]["high"]["p50"] == 1.0 and out["wait_s"]["low"]["n"] == 1
    assert out["two_card_wait_s"]["p50"] == 2.0
    assert out["vram_time_utilisation"] == pytest.approx((40 * 2 + 40 * 2 * 2) / (240 * 4))
    assert out["ended"] == 2 and out["jobs"] == 3 and out["jobs_wrong_card_count"] == 0
    assert math.isnan(out["wait_s"]["medium"]["p50"])
