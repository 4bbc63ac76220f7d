"""scripts/bench_peers.py from outside (issue 13): a SIGTERM cleans up as an exception does, a
count of 0 is one argparse line, the ratio heading needs a peer, and oversubscription is also
counted against rig's own usable memory."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from rig.testing.trace import GIB, LowerBound, TraceJob
from tests.unit.bench_scripts import load_script, run_script


@pytest.fixture(scope="module")
def peers():
    return load_script("bench_peers.py")


@pytest.mark.parametrize("flag", ["--jobs", "--tiny-jobs", "--latency-jobs"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_count_below_one_is_one_argparse_line_and_exit_2(flag, value):
    """``--jobs 0`` ran every system and failed each run with ``min() arg is an empty sequence``."""
    # Should the count pass, nothing runs (no seeds, no tiny jobs) and no Redis is reachable:
    # a regression fails at once instead of benchmarking on the shared Redis.
    out = run_script("bench_peers.py", "--systems", "rig", "--seeds", "", "--skip-tiny", flag, value)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1] == (f"bench_peers.py: error: argument {flag}: give a whole number of at "
                                           f"least 1 (got {value!r})")


def test_sigterm_runs_the_finally_blocks_that_delete_the_key_prefix(peers, monkeypatch):
    """Killed by `timeout` (SIGTERM) it left its key prefix (57 keys) in the shared Redis: the
    cleanup is in finally blocks, which a default SIGTERM skips. main() installs the benchmarks'
    one SIGTERM rule (rig.testing.sigterm) before anything runs."""
    from rig.testing import sigterm

    assert peers.exit_on_sigterm is sigterm.exit_on_sigterm  # the shared rule, not a copy
    installed = []
    monkeypatch.setattr(peers, "exit_on_sigterm", lambda: installed.append(True))
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--systems", "rig", "--seeds", "", "--skip-tiny"])
    monkeypatch.setenv("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
    peers.main()  # nothing to run: no seeds, no tiny jobs
    assert installed == [True]
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    try:
        sigterm.exit_on_sigterm()
        with pytest.raises(SystemExit) as stop:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                signal.sigtimedwait([], 0)  # let the handler run here, before the finally
                raise AssertionError("SIGTERM did not stop the run")
            finally:
                cleaned.append(True)
        assert stop.value.code == 128 + signal.SIGTERM and cleaned == [True]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_ratio_heading_is_printed_only_with_a_peer(peers, capsys):
    run = {"makespan_s": 10.0}
    assert peers.print_ratios(["rig"], [8], [0.0], [False], lambda *_: run) == {}
    assert capsys.readouterr().out == ""
    got = peers.print_ratios(["rig", "ray"], [8], [0.0], [False], lambda *_: run)
    assert got == {"limits none, history off / ray": {8: 1.0}}
    assert "makespan ratio rig / peer per seed" in capsys.readouterr().out


def test_oversubscription_is_counted_against_rigs_usable_memory_too(peers, tmp_path):
    """Two jobs of 40 and 38 GiB on one 80 GiB card for 10 s: no break of the card's 80 GiB,
    10 card-s above rig's usable 76 GiB (vram_reserve_fraction 0.05)."""
    trace = [TraceJob(0, "large", 40 * GIB, 1, "low", 0.0, 10.0), TraceJob(1, "large", 38 * GIB, 1, "low", 0.0, 10.0)]
    for job in trace:
        (tmp_path / str(job.index)).write_text("S 100.0 0\nE 110.0\n")
    out = peers.stamped_metrics(trace, {0: 100.0, 1: 100.0}, tmp_path, LowerBound(10.0, 10.0, 10.0))
    assert out["rule_breaks"]["oversub_card_s"] == 0
    assert out["rule_breaks"]["oversub_usable_card_s"] == pytest.approx(10.0)


@pytest.mark.parametrize(("args", "says"), [
    (["--systems", ""], "--systems: give one or more of rig, ray, celery, sgs (got '')"),
    (["--time-limits", "nan"], "--time-limits: give both, or a factor of 0 (no limits) or more, such as 1.5 (got 'nan')"),
    (["--time-limits", "-1"], "--time-limits: give both, or a factor of 0 (no limits) or more, such as 1.5 (got '-1')"),
    (["--time-limits", "inf"], "--time-limits: give both, or a factor of 0 (no limits) or more, such as 1.5 (got 'inf')"),
    (["--json", "/nonexistent-folder/x.json"], "argument --json: folder '/nonexistent-folder' does not exist; "
                                               "create it or give another path"),
])
def test_no_system_or_a_factor_that_is_no_number_is_one_line_and_exit_2(args, says):
    """``--systems ''`` ended in a TypeError traceback after the heading; ``--time-limits nan``,
    ``-1`` and ``inf`` ran rig with limits of nan, none or inf s."""
    out = run_script("bench_peers.py", "--seeds", "1", "--skip-tiny", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1] == f"bench_peers.py: error: {says}"
