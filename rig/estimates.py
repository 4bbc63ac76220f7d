"""How long jobs run, estimated from what rig has seen: the one place run times are predicted.

rig never needs a declared duration. Each successful run leaves its run time (s) under three
sources of its user — its command (a digest; the COMMANDS_KEPT commands that ran last are
kept), its name, its template — and in that user's list of recent runs with their size
(``recent_runtimes``). A job's run-time *samples* come from the
most specific source that has enough of them (SOURCES, in order):

    command (1+ runs) -> name (3+) -> template (3+) -> the user's recent runs of a similar
    size (3+) -> everyone's recent runs of a similar size (3+; at most PER_USER_SIZE of each
    user) -> everyone's recent runs of any size (5+)

"Similar size" is a request (memory x cards) within a factor of SIZE_FACTOR of the job's. No
samples at all (a fresh installation's first jobs): the estimate is unknown (math.inf), and
the dispatcher treats the job's end as unknown, as before.

From the samples:

* a waiting job's **expected** run time is their median; its **cautious** run time (the one
  that decides whether it may backfill in front of a held job) their CAUTIOUS_QUANTILE;
  either is capped by a declared time limit. Only the job's own runs or runs of its size may
  let it backfill (BACKFILL_SOURCES); runs of any size only place shadow times.
* a running job that has run ``age`` s is expected to run for the median of the samples
  *longer than its age* (a conditional remaining time: a job past its estimate is not about
  to end just because the estimate says so); one older than every sample is expected to run
  as long again as it will have run at the next tick of the shared clock (a multiple of
  OUTLIVED_TICK_S, :func:`outlived_remaining`): every such job's expected end then stays put
  between ticks instead of moving with the clock, so a dispatcher pass that changed nothing
  can be repeated (workers.dispatcher) while such jobs run; they all move at once, each tick.

Pure functions over samples, plus the Redis reads and writes that keep them (``record_run``,
``read_own``, ``read_recent``). Units: seconds, bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from rig import bounded_runs
from rig.keys import Keys

#: Runs kept per name, template and command.
PER_KEY_RUNS = 20
#: Recent runs kept per user, and users whose recent runs are read (the latest to run).
PER_USER_RECENT = 100
RECENT_USERS = 100
#: Samples needed from each source before it is used: (source, minimum). The command comes
#: first: a name is often the script's (`train.py`), and one smoke run of it must not become
#: the estimate of every later run with other arguments.
SOURCES: tuple[tuple[str, int], ...] = (
    ("command", 1), ("name", 3), ("template", 3), ("user-size", 3), ("size", 3), ("recent", 5),
)
#: Where an estimate came from, as the views say it (after "expected run ~30 min, from ...").
SOURCE_WORDS: dict[str, str] = {
    "command": "earlier runs of this command", "name": "earlier runs of this name",
    "template": "earlier runs of this template", "history": "earlier runs of this job",
    "user-size": "the user's recent jobs of a similar size", "size": "recent jobs of a similar size",
    "recent": "recent jobs of any size", "limit": "its time limit",
}
#: Sources good enough to let a job backfill in front of a held one on its estimate: its own
#: history or runs of its size. Runs of any size only place shadow times.
BACKFILL_SOURCES = frozenset({"history", "command", "name", "template", "user-size", "size"})
#: Most recent runs of one user counted in the everyone's-runs-of-a-size source: one user's
#: flood of trivial jobs cannot set everybody's estimates (nor, through them, who backfills in
#: front of a held job). Each user's runs are kept in a list of their own for the same reason.
PER_USER_SIZE = 10
#: Seconds the per-name, -template and -command runs (and peaks) live after their last run (30 days).
OWN_KEYS_TTL_S = 30 * 86400
#: Commands whose run times are kept per user (the most recently run): a sweep of distinct
#: commands (one per learning rate) keeps Redis bounded, not one key per job for 30 days.
COMMANDS_KEPT = 1000
#: Names whose run times and peaks are kept per user (the most recently run), for the same
#: reason: a sweep that names each job (`lr-0.01-seed-3`) adds a name per job.
NAMES_KEPT = 1000
#: Measured peaks kept per name (``--gpu-memory auto`` reads the last 5).
PEAKS_KEPT = 20
#: A sample is of "a similar size" when its request (bytes x cards) is within this factor.
SIZE_FACTOR = 2.0
#: The quantile of the samples a backfill decision uses (a job expected to end in time by this
#: quantile of its kind's run times, not merely by their median).
CAUTIOUS_QUANTILE = 0.8


def command_digest(command: Sequence[str] | str) -> str:
    """The key under which runs of one command are kept (16 hex digits of its SHA-1)."""
    text = command if isinstance(command, str) else json.dumps(list(command), separators=(",", ":"))
    return hashlib.sha1(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


@dataclass(frozen=True)
class RecentRun:
    """One entry of the cluster-wide list: a successful run of ``seconds`` by ``user`` that
    reserved ``nbytes`` on each of ``gpus`` cards."""

    seconds: float
    nbytes: int
    gpus: int
    user: str

    def encode(self) -> str:
        return f"{self.seconds:.3f} {self.nbytes} {self.gpus} {self.user}"

    @classmethod
    def decode(cls, text: str) -> RecentRun | None:
        try:
            seconds, nbytes, gpus, user = text.split(" ", 3)
            run = cls(float(seconds), int(nbytes), int(gpus), user)
        except ValueError:
            return None  # a damaged entry is one sample less, never an error
        if not (math.isfinite(run.seconds) and run.seconds >= 0 and run.nbytes >= 0 and run.gpus >= 1):
            return None
        return run


@dataclass(frozen=True)
class Estimate:
    """A job's run time: ``expected`` (median, s), ``cautious`` (CAUTIOUS_QUANTILE, s), the
    ``source`` of the samples (one of SOURCES' names, "limit", or "unknown") and the samples
    themselves (sorted; for the conditional remaining time of a running job)."""

    expected: float
    cautious: float
    source: str
    samples: tuple[float, ...] = ()

    @property
    def known(self) -> bool:
        return self.expected != math.inf

    @property
    def backfills(self) -> bool:
        """Good enough to let its job backfill in front of a held one (BACKFILL_SOURCES)?"""
        return self.known and self.source in BACKFILL_SOURCES

    def remaining(self, age: float, now: float | None = None) -> float:
        """Seconds still to run for a job of this kind that has run ``age`` s (see the module):
        remaining(), with the samples longer than ``age`` a bisect away, as they are sorted (the
        dispatcher asks this of every running job every pass: 2,048 sorts were ~1/3 of reading them)."""
        samples = self.samples
        if not samples:
            return remaining(samples, age, fallback=self.expected, now=now)
        age = max(0.0, age)
        start = bisect.bisect_right(samples, age)
        if start < len(samples):
            return quantile(samples[start:], 0.5) - age
        return outlived_remaining(age, now)


UNKNOWN = Estimate(math.inf, math.inf, "unknown")


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ascending samples (nearest rank); inf for none."""
    if not sorted_samples:
        return math.inf
    index = min(len(sorted_samples) - 1, max(0, math.ceil(q * len(sorted_samples)) - 1))
    return sorted_samples[index]


#: Outlived jobs' expected ends are worked out as of the next multiple of this on the shared
#: clock (s): they all move together, once a tick, not each at its own moment or every pass.
OUTLIVED_TICK_S = 30.0


def next_tick(now: float) -> float:
    """The first multiple of OUTLIVED_TICK_S after ``now`` (epoch s on the shared clock)."""
    return (math.floor(now / OUTLIVED_TICK_S) + 1.0) * OUTLIVED_TICK_S


def outlived_remaining(age: float, now: float | None) -> float:
    """Expected seconds still to run for a job that has run ``age`` s (at ``now``, epoch s) and
    outlived every estimate of its kind: as long again as it will have run at the next tick, so
    its expected end (start + 2 x (tick - start)) is the same at every moment up to that tick.
    Without ``now``: as long again as it has run (at least 1 s)."""
    if now is None:
        return max(age, 1.0)
    return age + 2.0 * (next_tick(now) - now)


def remaining(samples: Sequence[float], age: float, *, fallback: float = math.inf,
              now: float | None = None) -> float:
    """Expected seconds still to run for a job that has run ``age`` s, whose kind ran
    ``samples`` s: the median of the samples longer than ``age``, less ``age``; as long again
    as ``age`` (as of the next tick after ``now``: :func:`outlived_remaining`) when it has
    outlived them all. With no samples,
    ``fallback`` - age (a declared or point estimate), or as long again once that has passed;
    inf when nothing is known."""
    age = max(0.0, age)
    longer = sorted(s for s in samples if s > age)
    if longer:
        return quantile(longer, 0.5) - age
    if samples:
        return outlived_remaining(age, now)
    if fallback == math.inf:
        return math.inf
    return fallback - age if fallback > age else outlived_remaining(age, now)


def from_samples(samples: Sequence[float], source: str, time_limit: float | None = None) -> Estimate:
    ordered = tuple(sorted(samples))
    expected, cautious = quantile(ordered, 0.5), quantile(ordered, CAUTIOUS_QUANTILE)
    if time_limit:
        expected, cautious = min(expected, time_limit), min(cautious, time_limit)
    return Estimate(expected, cautious, source, ordered)


def similar_size(run: RecentRun, nbytes: int, gpus: int) -> bool:
    """Is ``run`` of a size like a request of ``nbytes`` on ``gpus`` cards (within SIZE_FACTOR)?"""
    mine, theirs = _size(nbytes, gpus), _size(run.nbytes, run.gpus)
    return max(mine, theirs) <= SIZE_FACTOR * min(mine, theirs)


def _size(nbytes: int, gpus: int) -> int:
    return max(1, nbytes) * max(1, gpus)


def own_history(own: Mapping[str, Sequence[float]]) -> tuple[str, Sequence[float]] | None:
    """The first of a job's own sources ("command", "name", "template", in SOURCES' order)
    with enough runs, as (source, run times); None when none has."""
    for source, minimum in SOURCES[:3]:
        samples = own.get(source) or ()
        if len(samples) >= minimum:
            return source, samples
    return None


def own_estimate(own: Mapping[str, Sequence[float]], time_limit: float | None) -> Estimate | None:
    """A job's estimate from its own runs (``read_own``'s sources), capped by its time limit;
    None when no source has enough runs."""
    history = own_history(own)
    return from_samples(history[1], history[0], time_limit) if history else None


class Prior:
    """Estimates from the cluster's recent runs, for many jobs at once (one dispatcher round):
    the runs are sorted by size once, so a job's similar-size runs are one bisect away, and
    each (user, size, limit) is worked out once."""

    def __init__(self, recent: Sequence[RecentRun]) -> None:
        """``recent``: each user's runs newest first (as read_recent gives them)."""
        kept = sorted(((_size(run.nbytes, run.gpus), position, run) for position, run in enumerate(recent)),
                      key=lambda k: k[0])  # (size, position: the lower the newer, run)
        self.runs = [k[2] for k in kept]
        self.sizes = [k[0] for k in kept]
        self.positions = [k[1] for k in kept]
        self._cache: dict[tuple, Estimate] = {}

    def estimate(self, *, user: str, nbytes: int, gpus: int, own: Sequence[float] = (),
                 own_source: str = "history", time_limit: float | None = None,
                 own_cautious: float | None = None) -> Estimate:
        """A job's run time: its ``own`` earlier runs if any (or their median and
        ``own_cautious``, as submit stores them), else the user's recent runs of a similar
        size, else everyone's, else everyone's recent runs (SOURCES' minimums); else its time
        limit if declared; else UNKNOWN. Capped by the time limit."""
        if own:
            found = from_samples(own, own_source, time_limit)
            if own_cautious is not None and own_cautious > found.cautious:
                high = min(own_cautious, time_limit) if time_limit else own_cautious
                found = Estimate(found.expected, high, own_source, tuple(sorted((*own, high))))
            return found
        key = (user, _size(nbytes, gpus), time_limit)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._from_recent(user, _size(nbytes, gpus), time_limit)
        return found

    def _from_recent(self, user: str, size: int, time_limit: float | None) -> Estimate:
        lo = bisect.bisect_left(self.sizes, math.ceil(size / SIZE_FACTOR))
        hi = bisect.bisect_right(self.sizes, size * SIZE_FACTOR)
        sized = sorted(zip(self.positions[lo:hi], self.runs[lo:hi], strict=True), key=lambda p: p[0])
        everyone: list[float] = []
        counted: dict[str, int] = {}
        for _position, run in sized:  # newest first; at most PER_USER_SIZE of each user
            counted[run.user] = counted.get(run.user, 0) + 1
            if counted[run.user] <= PER_USER_SIZE:
                everyone.append(run.seconds)
        pools = {
            "user-size": [r.seconds for _p, r in sized if r.user == user],
            "size": everyone,
            "recent": [r.seconds for r in self.runs],
        }
        for source, minimum in SOURCES[3:]:
            if len(pools[source]) >= minimum:
                return from_samples(pools[source], source, time_limit)
        if time_limit:
            return Estimate(time_limit, time_limit, "limit")
        return UNKNOWN


# -- Redis --------------------------------------------------------------------------------------
def record_run(pipe: redis.client.Pipeline, keys: Keys, *, user: str, name: str, template: str | None,
               command: Sequence[str] | str, nbytes: int, gpus: int, seconds: float,
               ended_at: float = 0.0) -> None:
    """Queue on ``pipe`` the writes that keep one successful run's time (s) for estimates;
    ``ended_at`` (epoch s) orders the users whose runs are read."""
    seconds = round(max(0.0, seconds), 3)
    if template:
        key = keys.durations_of_template(user, template)
        pipe.lpush(key, seconds)
        pipe.ltrim(key, 0, PER_KEY_RUNS - 1)
        pipe.expire(key, OWN_KEYS_TTL_S)
    # By name and by command: bounded maps, since a sweep gives each job its own of either.
    bounded_runs.push(pipe, keys.durations_of_names(user), keys.durations_of_names_seen(user), name, seconds,
                      keep=PER_KEY_RUNS, fields_kept=NAMES_KEPT, at=ended_at, ttl=OWN_KEYS_TTL_S)
    bounded_runs.push(pipe, keys.durations_of_commands(user), keys.durations_of_commands_seen(user),
                      command_digest(command), seconds, keep=PER_KEY_RUNS, fields_kept=COMMANDS_KEPT,
                      at=ended_at, ttl=OWN_KEYS_TTL_S)
    pipe.lpush(keys.recent_runtimes(user), RecentRun(seconds, nbytes, gpus, user).encode())
    pipe.ltrim(keys.recent_runtimes(user), 0, PER_USER_RECENT - 1)
    pipe.expire(keys.recent_runtimes(user), OWN_KEYS_TTL_S)
    pipe.zadd(keys.recent_runtime_users, {user: ended_at})
    pipe.zremrangebyrank(keys.recent_runtime_users, 0, -2 * RECENT_USERS - 1)  # bounded


def record_peak(pipe: redis.client.Pipeline, keys: Keys, *, user: str, name: str, peak: int,
                ended_at: float) -> None:
    """Queue on ``pipe`` one successful run's measured peak (bytes), for ``--gpu-memory auto``."""
    bounded_runs.push(pipe, keys.peaks(user), keys.peaks_seen(user), name, int(peak), keep=PEAKS_KEPT,
                      fields_kept=NAMES_KEPT, at=ended_at, ttl=OWN_KEYS_TTL_S)


def recent_peaks(r: redis.Redis, keys: Keys, *, user: str, name: str, count: int) -> list[int]:
    """The measured peaks (bytes) of ``user``'s last ``count`` successful runs named ``name``,
    newest first."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(keys.peaks(user), name)
    pipe.lrange(keys.peaks_before_names_were_bounded(user, name), 0, count - 1)
    kept, before = pipe.execute()
    return [int(p) for p in (bounded_runs.split(kept) or before)[:count]]


def read_own(r: redis.Redis, keys: Keys, *, user: str, name: str, template: str | None,
             command: Sequence[str] | str) -> dict[str, list[float]]:
    """A job's own run times by source (one round trip)."""
    return read_own_many(r, keys, [(user, name, template, command)])[0]


def read_own_many(r: redis.Redis, keys: Keys,
                  jobs: Sequence[tuple[str, str, str | None, Sequence[str] | str]]
                  ) -> list[dict[str, list[float]]]:
    """``read_own`` for many jobs, given as (user, name, template, command), in one round
    trip: one HMGET per user for the names and one for the commands, each template's list once
    (a sweep's jobs share their name)."""
    fields: dict[str, dict[str, int]] = {}  # bounded map key -> field -> its place in the HMGET
    lists: dict[str, int] = {}  # template list key -> reply index
    wanted = []
    for user, name, template, command in jobs:
        own: dict[str, tuple[str, str]] = {"command": (keys.durations_of_commands(user), command_digest(command)),
                                           "name": (keys.durations_of_names(user), name)}
        for key, field in own.values():
            fields.setdefault(key, {}).setdefault(field, len(fields.get(key, ())))
        listed = keys.durations_of_template(user, template) if template else None
        if listed:
            lists.setdefault(listed, len(lists))
        wanted.append((own, listed))
    if not wanted:
        return []
    pipe = r.pipeline(transaction=False)
    for key in lists:
        pipe.lrange(key, 0, PER_KEY_RUNS - 1)
    for key, names in fields.items():
        pipe.hmget(key, list(names))
    replies = pipe.execute()
    by_key = dict(zip(fields, replies[len(lists):], strict=True))
    out = []
    for own, listed in wanted:
        found = {source: _floats(bounded_runs.split(by_key[key][fields[key][field]]))
                 for source, (key, field) in own.items()}
        if listed:
            found["template"] = _floats(replies[lists[listed]])
        out.append(found)
    return out


def read_recent(r: redis.Redis, keys: Keys) -> list[RecentRun]:
    """The recent runs of the RECENT_USERS users who ran last, each user's newest first (two
    round trips)."""
    users = r.zrevrange(keys.recent_runtime_users, 0, RECENT_USERS - 1)
    pipe = r.pipeline(transaction=False)
    queue_recent(pipe, keys, users)
    return decode_recent([v for values in pipe.execute() for v in values])


def queue_recent(pipe: redis.client.Pipeline, keys: Keys, users: Sequence[str]) -> None:
    """Queue on ``pipe`` the reads of ``users``' recent runs (one reply per user)."""
    for user in users:
        pipe.lrange(keys.recent_runtimes(user), 0, PER_USER_RECENT - 1)


def decode_recent(values: Sequence[str]) -> list[RecentRun]:
    return [run for run in map(RecentRun.decode, values) if run is not None]


def _floats(values: Sequence[str]) -> list[float]:
    out = []
    for value in values:
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number) and number >= 0:
            out.append(number)
    return out
