"""The benchmarks' Redis (rig.testing.bench_redis) and bench_peers' --seeds: the one rule for
the URL, said in --help, and a bad --seeds as one argparse line, never a traceback."""

from __future__ import annotations

import pytest

from rig.testing.bench_redis import DEFAULT_URL, bench_redis_url, described, with_db
from tests.unit.bench_scripts import load_script, run_script


@pytest.mark.parametrize("bench, plain, expected", [
    ("redis://b:1/0", "redis://r:2/0", ("redis://b:1/0", "RIG_BENCH_REDIS_URL")),
    (None, "redis://r:2/0", ("redis://r:2/0", "RIG_REDIS_URL")),
    ("", "redis://r:2/0", ("redis://r:2/0", "RIG_REDIS_URL")),  # set but empty: not used
    (None, None, (DEFAULT_URL, "default")),
])
def test_rig_bench_redis_url_first_then_rig_redis_url_then_the_default(monkeypatch, bench, plain, expected):
    for name, value in (("RIG_BENCH_REDIS_URL", bench), ("RIG_REDIS_URL", plain)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert bench_redis_url() == expected


def test_help_names_the_rule_and_the_url_in_use_without_its_password(monkeypatch):
    monkeypatch.delenv("RIG_BENCH_REDIS_URL", raising=False)
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:hunter2@10.0.0.5:6380/2")
    line = described()
    assert "now $RIG_REDIS_URL: redis://10.0.0.5:6380/2" in line and "hunter2" not in line
    assert with_db("redis://:pw@h:1/0", 11) == "redis://:pw@h:1/11" and with_db("redis://h:1", 11) == "redis://h:1/11"


def test_both_benchmarks_help_says_which_redis_they_use():
    env = {"RIG_REDIS_URL": "redis://127.0.0.1:6999/4"}
    for name in ("bench_mixed.py", "bench_peers.py"):
        out = run_script(name, "--help", env=env)
        assert out.returncode == 0 and "now $RIG_REDIS_URL: redis://127.0.0.1:6999/4" in out.stdout, out.stderr
    assert "Celery's broker: $PEERS_BROKER_URL, else DB 11 of that Redis; now DB 11 of $RIG_REDIS_URL: " \
        "redis://127.0.0.1:6999/11" in run_script("bench_peers.py", "--help", env=env).stdout


@pytest.mark.parametrize("seeds", ["abc", "8,x", "1.5"])
def test_bad_seeds_are_one_argparse_line_and_exit_2(seeds):
    out = run_script("bench_peers.py", "--seeds", seeds, env={})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1] == ("bench_peers.py: error: argument --seeds: give whole numbers separated "
                                           f"by commas, e.g. 8,3,5 (got {seeds!r})")


def test_seeds_read_as_before_and_none_is_allowed():
    module = load_script("bench_peers.py")
    assert module.seed_list("8,3,5") == [8, 3, 5] and module.seed_list(" 8, 3 ,") == [8, 3]
    assert module.seed_list("") == []  # docs/PERFORMANCE.md: --seeds "" runs only the tiny jobs' figures
