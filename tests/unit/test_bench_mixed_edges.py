"""scripts/bench_mixed.py from outside (issue 13): a bad argument is one argparse line and exit 2
before anything starts, a strategy that could not run makes the exit non-zero, and a SIGTERM
runs the clean-up (killed by `timeout`, each run left ~390 keys in the shared Redis, its home
folder and sometimes its control worker behind)."""

from __future__ import annotations

import sys

import pytest

from tests.unit.bench_scripts import load_script, run_script


@pytest.fixture(scope="module")
def mixed():
    return load_script("bench_mixed.py")


@pytest.mark.parametrize(("args", "says"), [
    (["--jobs", "0"], "argument --jobs: give a whole number of at least 1 (got '0')"),
    (["--jobs", "-5"], "argument --jobs: give a whole number of at least 1 (got '-5')"),
    (["--time-limits", "nan"], "argument --time-limits: give a factor of 0 (no limits) or more, such as 1.5 (got 'nan')"),
    (["--time-limits", "-1"], "argument --time-limits: give a factor of 0 (no limits) or more, such as 1.5 (got '-1')"),
    (["--latency-jobs", "0"], "argument --latency-jobs: give a whole number of at least 1 (got '0')"),
    (["--tiny-jobs", "-1"], "argument --tiny-jobs: give a whole number of at least 1 (got '-1')"),
    (["--decision-sizes", "abc"], "argument --decision-sizes: give whole numbers of at least 1 separated by "
                                  "commas, e.g. 1000,10000 (got 'abc')"),
    (["--decision-sizes", "0"], "argument --decision-sizes: give whole numbers of at least 1 separated by "
                                "commas, e.g. 1000,10000 (got '0')"),
    (["--decision-passes", "0"], "argument --decision-passes: give a whole number of at least 1 (got '0')"),
    (["--timeout", "-3"], "argument --timeout: give a number of seconds above 0 (got '-3')"),
    (["--strategies", ""], "--strategies: give one or more of multi-factor, best-fit, least-loaded, first-fit"),
    (["--strategies", "nosuch"], "--strategies: nosuch: unavailable: scheduler_type (given to load_settings): "),
    (["--set", "nosuch=1"], "--set: unknown setting 'nosuch'; correct or remove it"),
    (["--set", "max_task_per_gpu=2"], "--set: max_task_per_gpu: the benchmark sets it itself; leave it out"),
    (["--set", "hold_after_seconds=abc"], "--set: hold_after_seconds (given to load_settings): "),
    (["--json", "/nonexistent-folder/x.json"], "argument --json: folder '/nonexistent-folder' does not exist; "
                                               "create it or give another path"),
    (["--json", "/"], "argument --json: '/' is a folder; give a file name in it"),
])
def test_a_bad_argument_is_one_line_and_exit_2_before_anything_runs(args, says):
    """Each of these ran (a ZeroDivisionError, a traceback mid-run, a run with a limit of nan s,
    every strategy "unavailable"/"failed" and exit 0, or a whole run, then a traceback writing
    its figures)."""
    out = run_script("bench_mixed.py", "--skip-latency", "--skip-decision", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith(f"bench_mixed.py: error: {says}"), last
    assert out.stdout == ""  # refused before the run's heading


def test_sigterm_runs_the_clean_up_and_a_failed_strategy_exits_1(mixed, monkeypatch, capsys):
    """main() installs the benchmarks' SIGTERM rule (rig.testing.sigterm: SystemExit, so
    run_trace's finally stops the node, deletes its key prefix and its folder) before a node
    starts; a strategy whose run failed is a failed benchmark, exit 1, not 0."""
    from rig.testing import sigterm

    assert mixed.exit_on_sigterm is sigterm.exit_on_sigterm  # the shared rule, not a copy
    events = []
    monkeypatch.setattr(mixed, "exit_on_sigterm", lambda: events.append("sigterm rule"))

    def failing_run(strategy, *_args, **_kw):
        events.append(f"run {strategy}")
        raise RuntimeError("node did not come up")

    monkeypatch.setattr(mixed, "run_trace", failing_run)
    monkeypatch.setattr(mixed, "redis_problem", lambda url: None)  # no Redis is used: run_trace stands in
    monkeypatch.setattr(sys, "argv", ["bench_mixed.py", "--strategies", "best-fit", "--jobs", "3",
                                      "--skip-latency", "--skip-decision"])
    assert mixed.main() == 1
    assert events == ["sigterm rule", "run best-fit"]
    assert "[best-fit] failed: RuntimeError('node did not come up')" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["bench_mixed.py", "bench_peers.py"])
def test_no_redis_at_the_url_is_one_line_and_exit_5_before_a_node_starts(script):
    """Where nothing answered, each throwaway node's `rig up` started a private Redis with a
    password of its own on that port, the benchmark's client was refused by it, every run
    "failed: RedisAuthFailed" and the idle-latency part ended in a traceback."""
    args = ["--jobs", "1"] + (["--systems", "rig", "--seeds", "1", "--skip-tiny"] if script == "bench_peers.py"
                              else ["--skip-latency", "--skip-decision"])
    out = run_script(script, *args)  # RIG_BENCH_REDIS_URL: a port where nothing listens
    assert out.returncode == 5 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1].startswith(
        f"{script}: no Redis answers at redis://127.0.0.1:1/0 (") and "set RIG_BENCH_REDIS_URL" in out.stderr
    assert "node up" not in out.stderr
