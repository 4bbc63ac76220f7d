"""rig.estimates: run times predicted from history, the size prior, conditional remaining time."""

from __future__ import annotations

import math

import fakeredis
import pytest

from rig import estimates as E
from rig.keys import Keys

GIB = 2**30


def runs(seconds: list[float], nbytes: int = 8 * GIB, gpus: int = 1, user: str = "ann") -> list[E.RecentRun]:
    return [E.RecentRun(s, nbytes, gpus, user) for s in seconds]


def test_quantile_is_nearest_rank_and_inf_for_nothing():
    assert E.quantile([1, 2, 3, 4, 5], 0.5) == 3
    assert E.quantile([1, 2, 3, 4, 5], 0.8) == 4
    assert E.quantile([7], 0.8) == 7
    assert E.quantile([], 0.5) == math.inf


def test_remaining_is_conditional_on_the_age():
    samples = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert E.remaining(samples, 0) == 30.0
    # Past the median of all runs, a job is not "about to end": the runs longer than it say how long.
    assert E.remaining(samples, 31) == 40 - 31  # the median of (40, 50) by nearest rank
    # Older than every run: as long again as it has run.
    assert E.remaining(samples, 80) == 80
    # A point estimate only: what is left of it, then as long again.
    assert E.remaining([], 3, fallback=10) == 7
    assert E.remaining([], 12, fallback=10) == 12
    assert E.remaining([], 5) == math.inf


def test_an_outlived_jobs_expected_end_moves_once_a_tick_not_with_the_clock():
    """So that an idle dispatcher pass can be repeated while such jobs run (issue 15): as long
    again as it will have run at the next tick; the same end at every moment up to that tick,
    for every outlived job at once."""
    tick = E.OUTLIVED_TICK_S
    for began in (0.0, 1000.3, 5 * tick - 0.01):
        for now in (began + 0.5, began + 80.0, 20 * tick, 20 * tick + tick - 1e-6, began + 86400.0):
            if now < began:
                continue
            nxt = E.next_tick(now)
            assert now < nxt <= now + tick and nxt % tick == 0
            end = now + E.remaining([0.2], now - began, now=now)
            assert end == pytest.approx(began + 2 * (nxt - began))  # as long again, counted to the tick
            assert end >= now + (now - began)  # never less than as long again as it has run
            for later in (now + (nxt - now) / 2, nxt - 1e-6):
                assert later + E.remaining([0.2], later - began, now=later) == pytest.approx(end)
        found = E.Estimate(5.0, 5.0, "limit")  # a point estimate it outlived
        assert found.remaining(100.0, now=began + 100.0) == E.remaining((), 100.0, fallback=5.0, now=began + 100.0)


def test_an_estimates_remaining_time_is_the_rules_for_its_sorted_samples():
    """Estimate.remaining (a bisect into its sorted samples) answers as remaining() does."""
    import random

    rng = random.Random(15)
    for size in (0, 1, 2, 3, 7, 40):
        samples = [rng.choice([5.0, 30.0, 60.0, rng.uniform(0, 500)]) for _ in range(size)]
        found = E.from_samples(samples, "name")
        for age in (-1.0, 0.0, 5.0, 29.9, 30.0, 60.0, 499.0, 1e6, *samples):
            assert found.remaining(age) == E.remaining(samples, age, fallback=found.expected), (samples, age)
    assert E.Estimate(100.0, 150.0, "limit").remaining(30.0) == E.remaining((), 30.0, fallback=100.0) == 70.0


def test_a_jobs_own_history_wins_over_the_prior():
    prior = E.Prior(runs([100.0] * 10))
    found = prior.estimate(user="ann", nbytes=8 * GIB, gpus=1, own=[3.0, 5.0, 4.0])
    assert (found.expected, found.source) == (4.0, "history")


def test_prior_prefers_the_users_runs_of_a_similar_size_then_everyones():
    recent = runs([1.0] * 6, nbytes=4 * GIB) + runs([50.0] * 6, nbytes=60 * GIB, user="bob") \
        + runs([40.0] * 5, nbytes=50 * GIB, user="ann")
    prior = E.Prior(recent)
    big = prior.estimate(user="ann", nbytes=64 * GIB, gpus=1)
    assert (big.expected, big.source) == (40.0, "user-size")
    # Carol has no runs: everyone's of her size.
    assert prior.estimate(user="carol", nbytes=64 * GIB, gpus=1).source == "size"
    small = prior.estimate(user="carol", nbytes=3 * GIB, gpus=1)
    assert (small.expected, small.source) == (1.0, "size")
    # A size nobody ran: everyone's recent runs.
    assert prior.estimate(user="carol", nbytes=GIB // 4, gpus=1).source == "recent"
    # Two cards of 32 GiB are the size of one of 64 GiB.
    assert prior.estimate(user="ann", nbytes=32 * GIB, gpus=2).source == "user-size"


def test_nothing_known_is_unknown_and_a_time_limit_caps():
    assert E.Prior(()).estimate(user="ann", nbytes=GIB, gpus=1) is E.UNKNOWN
    assert not E.UNKNOWN.known
    limited = E.Prior(()).estimate(user="ann", nbytes=GIB, gpus=1, time_limit=60)
    assert (limited.expected, limited.source) == (60, "limit")
    capped = E.Prior(runs([100.0] * 5, nbytes=GIB)).estimate(user="ann", nbytes=GIB, gpus=1, time_limit=30)
    assert capped.expected == capped.cautious == 30


def test_cautious_is_a_high_quantile():
    found = E.from_samples([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "size")
    assert found.expected == 5 and found.cautious == 8


def test_similar_size_is_within_the_factor():
    run = E.RecentRun(1.0, 10 * GIB, 1, "ann")
    assert E.similar_size(run, 20 * GIB, 1) and E.similar_size(run, 5 * GIB, 1)
    assert not E.similar_size(run, 21 * GIB, 1) and not E.similar_size(run, 4 * GIB, 1)
    # The Prior's bisect and the rule agree on the edges.
    prior = E.Prior([run])
    for nbytes in (4 * GIB, 5 * GIB, 20 * GIB, 21 * GIB):
        sized = prior.estimate(user="x", nbytes=nbytes, gpus=1)
        assert (sized.source == "size") is False  # one run is below the minimum of 5
    prior = E.Prior([run] * 5)
    for nbytes in (4 * GIB, 5 * GIB, 20 * GIB, 21 * GIB):
        source = prior.estimate(user="x", nbytes=nbytes, gpus=1).source
        assert (source == "size") == E.similar_size(run, nbytes, 1), nbytes


def test_damaged_entries_are_skipped():
    assert E.decode_recent(["1.5 100 1 ann", "junk", "x 1 1 a", "2 3", "nan 1 1 a", "inf 1 1 a",
                            "-1 1 1 a", "1 1 0 a"]) == [E.RecentRun(1.5, 100, 1, "ann")]


def test_record_run_and_read_back_through_redis():
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    for seconds in (3.0, 5.0, 4.0):
        pipe = r.pipeline()
        E.record_run(pipe, keys, user="ann", name="train", template="big", command=["python", "t.py"],
                     nbytes=8 * GIB, gpus=1, seconds=seconds)
        pipe.execute()
    own = E.read_own(r, keys, user="ann", name="train", template="big", command=["python", "t.py"])
    assert sorted(own["name"]) == sorted(own["template"]) == sorted(own["command"]) == [3.0, 4.0, 5.0]
    assert E.own_history(own) == ("command", own["command"])  # the most specific first
    # Another command under the same (script's) name: its name's 3 runs, not one smoke run.
    other = E.read_own(r, keys, user="ann", name="train", template=None, command=["python", "t.py", "-n", "9"])
    assert E.own_history(other) == ("name", other["name"])
    pipe = r.pipeline()
    E.record_run(pipe, keys, user="ann", name="once", template=None, command=["x"], nbytes=GIB, gpus=1, seconds=1)
    pipe.execute()
    assert E.own_history(E.read_own(r, keys, user="ann", name="once", template=None, command=["y"])) is None
    assert 0 < r.ttl(keys.durations_of_names("ann")) <= E.OWN_KEYS_TTL_S
    assert E.own_history(E.read_own(r, keys, user="bob", name="train", template="big",
                                    command=["python", "t.py"])) is None
    assert [x.seconds for x in E.read_recent(r, keys)] == [1.0, 4.0, 5.0, 3.0]  # newest first
    assert r.ttl(keys.recent_runtimes("ann")) > 0


def test_a_sweep_of_distinct_commands_keeps_the_last_commands_kept(monkeypatch):
    """Run times by command live in one bounded hash per user: a million-job sweep of distinct
    commands leaves COMMANDS_KEPT entries (the ones that ran last), not a key per job."""
    monkeypatch.setattr(E, "COMMANDS_KEPT", 3)
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    for i in range(5):
        pipe = r.pipeline(transaction=False)
        E.record_run(pipe, keys, user="ann", name="sweep", template=None, command=["t.py", str(i)],
                     nbytes=GIB, gpus=1, seconds=10 + i, ended_at=1000 + i)
        E.record_run(pipe, keys, user="ann", name="sweep", template=None, command=["t.py", "4"],
                     nbytes=GIB, gpus=1, seconds=1, ended_at=1000 + i)
        pipe.execute()
    assert r.hlen(keys.durations_of_commands("ann")) == r.zcard(keys.durations_of_commands_seen("ann")) == 3
    def own(i: int) -> list[float]:
        return E.read_own(r, keys, user="ann", name="sweep", template=None, command=["t.py", str(i)])["command"]
    assert [own(i) for i in range(5)] == [[], [], [12.0], [13.0], [1.0, 14.0, 1.0, 1.0, 1.0, 1.0]]
    assert 0 < r.ttl(keys.durations_of_commands("ann")) <= E.OWN_KEYS_TTL_S
    for _ in range(E.PER_KEY_RUNS + 5):
        pipe = r.pipeline(transaction=False)
        E.record_run(pipe, keys, user="ann", name="sweep", template=None, command=["t.py", "4"],
                     nbytes=GIB, gpus=1, seconds=2, ended_at=2000)
        pipe.execute()
    assert own(4) == [2.0] * E.PER_KEY_RUNS


def test_a_sweep_of_distinct_names_keeps_the_last_names_kept(monkeypatch):
    """Run times and peaks by name live in one bounded hash per user, as the commands' do: a
    sweep that names each job leaves NAMES_KEPT names (the ones that ran last), not two keys
    per job for 30 days."""
    monkeypatch.setattr(E, "NAMES_KEPT", 3)
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    for i in range(5):
        pipe = r.pipeline(transaction=False)
        E.record_run(pipe, keys, user="ann", name=f"lr-{i}", template=None, command=["t.py"],
                     nbytes=GIB, gpus=1, seconds=10 + i, ended_at=1000 + i)
        E.record_peak(pipe, keys, user="ann", name=f"lr-{i}", peak=GIB + i, ended_at=1000 + i)
        pipe.execute()
    assert r.hlen(keys.durations_of_names("ann")) == r.zcard(keys.durations_of_names_seen("ann")) == 3
    assert r.hlen(keys.peaks("ann")) == r.zcard(keys.peaks_seen("ann")) == 3
    assert len(r.keys("t:*")) == 8  # names, peaks, commands (2 keys each), the recent runs and their users
    def by_name(i: int) -> list[float]:
        return E.read_own(r, keys, user="ann", name=f"lr-{i}", template=None, command=["other"])["name"]
    assert [by_name(i) for i in range(5)] == [[], [], [12.0], [13.0], [14.0]]
    assert [E.recent_peaks(r, keys, user="ann", name=f"lr-{i}", count=5) for i in (0, 4)] == [[], [GIB + 4]]
    assert E.recent_peaks(r, keys, user="bob", name="lr-4", count=5) == []
    for ttl_key in (keys.durations_of_names("ann"), keys.peaks_seen("ann")):
        assert 0 < r.ttl(ttl_key) <= E.OWN_KEYS_TTL_S
    for _ in range(E.PEAKS_KEPT + 5):
        pipe = r.pipeline(transaction=False)
        E.record_peak(pipe, keys, user="ann", name="lr-4", peak=2 * GIB, ended_at=2000)
        pipe.execute()
    assert E.recent_peaks(r, keys, user="ann", name="lr-4", count=100) == [2 * GIB] * E.PEAKS_KEPT
    # Peaks an older rig kept (a list per name) still size `--gpu-memory auto` after an upgrade.
    r.lpush(keys.peaks_before_names_were_bounded("ann", "old"), 3 * GIB, 5 * GIB)
    assert E.recent_peaks(r, keys, user="ann", name="old", count=5) == [5 * GIB, 3 * GIB]


def test_one_users_flood_of_runs_does_not_set_everyones_estimate():
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")

    def ran(user: str, seconds: float, times: int) -> None:
        pipe = r.pipeline()
        for _ in range(times):
            E.record_run(pipe, keys, user=user, name="x", template=None, command=["x"], nbytes=8 * GIB, gpus=1,
                         seconds=seconds, ended_at=1.0)
        pipe.execute()

    for user in ("bob", "dave", "erin"):
        ran(user, 3600.0, 30)
    ran("mallory", 0.05, 400)  # one submit_many of `true`
    recent = E.read_recent(r, keys)
    assert len([x for x in recent if x.user == "bob"]) == 30  # not pushed out
    assert len([x for x in recent if x.user == "mallory"]) == E.PER_USER_RECENT
    found = E.Prior(recent).estimate(user="carol", nbytes=8 * GIB, gpus=1)
    assert found.source == "size" and found.expected == found.cautious == 3600.0


def test_only_own_or_same_size_runs_let_a_job_backfill():
    prior = E.Prior(runs([0.1] * 5, nbytes=70 * GIB))
    anything = prior.estimate(user="ann", nbytes=2 * GIB, gpus=1)
    assert anything.source == "recent" and anything.known and not anything.backfills
    assert prior.estimate(user="ann", nbytes=70 * GIB, gpus=1).backfills
    assert prior.estimate(user="ann", nbytes=2 * GIB, gpus=1, own=[5.0]).backfills


def test_own_cautious_from_submit_is_kept():
    found = E.Prior(()).estimate(user="ann", nbytes=GIB, gpus=1, own=[10.0], own_cautious=100.0)
    assert (found.expected, found.cautious) == (10.0, 100.0)
    # A running job past the median is expected to reach the high run, not to end at once.
    assert found.remaining(20) == 80.0
    limited = E.Prior(()).estimate(user="ann", nbytes=GIB, gpus=1, own=[10.0], own_cautious=100.0, time_limit=50)
    assert limited.cautious == 50


def test_read_own_many_reads_what_read_own_reads_for_each_job():
    r = fakeredis.FakeRedis(decode_responses=True)
    keys = Keys("t:")
    runs = [("ann", "train", "big", ["t.py", "1"], 3.0), ("ann", "train", None, ["t.py", "2"], 5.0),
            ("bob", "train", "big", ["t.py", "1"], 7.0), ("ann", "eval", None, ["e.py"], 1.0)]
    for user, name, template, command, seconds in runs * 3:
        pipe = r.pipeline(transaction=False)
        E.record_run(pipe, keys, user=user, name=name, template=template, command=command, nbytes=GIB, gpus=1,
                     seconds=seconds)
        pipe.execute()
    asked = [(u, n, t, c) for u, n, t, c, _ in runs] + [("ann", "train", "big", ["t.py", "1"]),
                                                        ("cy", "new", None, ["x"]), ("bob", "eval", None, ["t.py", "2"])]
    expected = [E.read_own(r, keys, user=u, name=n, template=t, command=c) for u, n, t, c in asked]
    assert E.read_own_many(r, keys, asked) == expected
    assert expected[0]["command"] == [3.0] * 3 and expected[5] == {"command": [], "name": []}
    assert E.read_own_many(r, keys, []) == []


def test_gpu_memory_auto_says_why_it_has_no_peak():
    """A tester's finding: three runs of `bert` on fake cards (peak 0 B, so no peak kept) and
    `--gpu-memory auto` said "no measured run ... yet"; it says the runs measured nothing."""
    from rig.client import Client
    from rig.config import load_settings
    from rig.errors import InvalidInput

    r = fakeredis.FakeRedis(decode_responses=True)
    client = Client(load_settings(key_prefix="t:"), redis_client=r)
    with pytest.raises(InvalidInput, match="no measured run of a job named 'bert' yet"):
        client.auto_memory("bert", user="ann")
    pipe = r.pipeline(transaction=False)
    for _ in range(3):
        E.record_run(pipe, Keys("t:"), user="ann", name="bert", template=None, command=["b"], nbytes=GIB,
                     gpus=1, seconds=5, ended_at=1000)
    pipe.execute()
    with pytest.raises(InvalidInput, match="the 3 earlier run\\(s\\) of 'bert' measured no GPU memory"):
        client.auto_memory("bert", user="ann")
