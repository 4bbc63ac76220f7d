"""Recent history for rig's web page: one sample a minute, kept a day, in one bounded zset.

The cluster health pass (workers/health.py, once cluster-wide every health.check_interval s)
calls :func:`record`. A sample holds the cumulative ended-job counters (the same Redis counters
as ``rig_jobs_ended_total``, rig.metrics) and the cards' memory at that minute; what the page
draws is worked out from the samples by pure functions (:func:`ended_per_hour`,
:func:`memory_series`).

Key (rig.keys ``timeline``): a zset, score = the minute (epoch s, a multiple of 60), member =
the sample's JSON. Invariants: at most one member per minute (a later pass in the same minute
replaces it, in one MULTI), none older than TIMELINE_WINDOW_S (trimmed at every write), and the
key expires TIMELINE_WINDOW_S after the last write: so at most 1,440 members (~150 kB), ever.

A Redis that restarts empty loses the samples (the page then says since when it has them) and
starts its counters again from 0: a counter lower than in the sample before is read as a reset
(what it counts now all happened since), as Prometheus reads one. Samples are only written while
a beat and a control worker run; a gap's jobs count in the hour of the sample that ends it.
Units: epoch seconds, bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import redis

from rig.keys import Keys
from rig.lograte import Throttle
from rig.metrics import ended_by_label
from rig.models import CardState, JobState

log = logging.getLogger(__name__)

#: One sample per this many seconds.
STEP_S = 60
#: How long samples are kept (s): a day.
TIMELINE_WINDOW_S = 24 * 3600
#: Hours of "jobs ended per hour" and of "GPU memory in use" the page shows.
ENDED_HOURS = 24
MEMORY_HOURS = 6

_FAILED = frozenset({JobState.FAILED.value, JobState.TIMEOUT.value})


@dataclass(frozen=True)
class Sample:
    """The cluster at one minute. ``at``: the minute (epoch s). Job counts are cumulative
    (since the counters started: they only grow, until Redis loses its data); memory in bytes
    summed over every registered card (``used``: as the cards report it; cards without a
    reading count 0)."""

    at: int
    succeeded: int = 0
    failed: int = 0  # FAILED and TIMEOUT
    cancelled: int = 0
    used: int = 0
    reserved: int = 0
    usable: int = 0
    #: When the counters were read (epoch s, within the minute ``at``); 0 in samples written
    #: before this was kept.
    taken: int = 0

    @property
    def read_by(self) -> int:
        """Epoch s by which everything its counters hold had ended: when it was taken (the end
        of its minute for a sample that does not say)."""
        return self.taken or self.at + STEP_S

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> Sample | None:
        """None for a member that is not a sample (a hand-edited or foreign key)."""
        try:
            data = json.loads(text)
            return cls(**{k: int(data.get(k, 0)) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class HourCount:
    """Jobs that ended within the hour starting at ``start`` (epoch s)."""

    start: int
    succeeded: int
    failed: int
    cancelled: int


def sample_of(counters: dict[str, float], cards: Sequence[CardState], now: float) -> Sample:
    """The sample for ``now`` from the raw counters hash (rig.keys ``metrics_counters``) and
    the cards."""
    ended = {"succeeded": 0, "failed": 0, "cancelled": 0}
    for (state, _failure), n in ended_by_label(counters).items():
        if state in _FAILED:
            ended["failed"] += int(n)
        elif state == JobState.SUCCEEDED.value:
            ended["succeeded"] += int(n)
        elif state == JobState.CANCELLED.value:
            ended["cancelled"] += int(n)
    return Sample(at=int(now // STEP_S * STEP_S), **ended,
                  used=sum(c.used or 0 for c in cards), reserved=sum(c.reserved for c in cards),
                  usable=sum(c.usable for c in cards), taken=int(now))


def record(r: redis.Redis, keys: Keys, cards: Sequence[CardState], now: float) -> Sample:
    """Write this minute's sample (replacing one written earlier in the same minute) and drop
    those older than TIMELINE_WINDOW_S, in one transaction."""
    counters = {k.decode() if isinstance(k, bytes) else k: float(v)
                for k, v in r.hgetall(keys.metrics_counters).items()}
    sample = sample_of(counters, cards, now)
    try:
        _write(r, keys, sample)
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        # rig's own key, set to something else (by hand, or an older tool): its samples are
        # lost anyway, so it is replaced, and said once (not at every pass: rig.lograte).
        line = f"the history key {keys.timeline} held another type than a zset: replaced (its samples are lost)"
        if _wrong_type_said.due(line):
            log.warning(line)
        r.delete(keys.timeline)
        _write(r, keys, sample)
    return sample


#: Says a replaced key once per REPEAT_AFTER_S, not at every health pass.
_wrong_type_said = Throttle()


def is_wrong_type(exc: redis.ResponseError) -> bool:
    """Is ``exc`` Redis' WRONGTYPE (a key holding another type than the command works on)?"""
    return "WRONGTYPE" in str(exc)  # a pipeline puts it after which of its commands failed


def _write(r: redis.Redis, keys: Keys, sample: Sample) -> None:
    pipe = r.pipeline(transaction=True)
    pipe.zremrangebyscore(keys.timeline, sample.at, sample.at)
    pipe.zadd(keys.timeline, {sample.encode(): sample.at})
    pipe.zremrangebyscore(keys.timeline, "-inf", f"({sample.at - TIMELINE_WINDOW_S}")
    pipe.expire(keys.timeline, TIMELINE_WINDOW_S)
    pipe.execute()


def read(r: redis.Redis, keys: Keys, now: float, hours: float = ENDED_HOURS) -> list[Sample]:
    """The samples of the last ``hours`` hours, oldest first."""
    raw = r.zrangebyscore(keys.timeline, now - hours * 3600 - STEP_S, "+inf")
    return [s for s in map(Sample.decode, raw) if s is not None]


def _grown(before: int, after: int) -> int:
    """How much a cumulative counter grew; a lower value is a reset (it counts from 0 again)."""
    return after - before if after >= before else after


def ended_per_hour(samples: Sequence[Sample], now: float, hours: int = ENDED_HOURS) -> list[HourCount]:
    """Jobs ended in each of the last ``hours`` clock hours (the current one last), from the
    growth of the counters between consecutive samples; hours before the first sample are left
    out (nothing is known of them)."""
    if not samples:
        return []
    this_hour = int(now // 3600 * 3600)
    first = max(this_hour - (hours - 1) * 3600, int(samples[0].at // 3600 * 3600))
    counts = {h: [0, 0, 0] for h in range(first, this_hour + 1, 3600)}
    for before, after in zip(samples, samples[1:], strict=False):
        hour = int(after.at // 3600 * 3600)
        if hour in counts:
            bucket = counts[hour]
            bucket[0] += _grown(before.succeeded, after.succeeded)
            bucket[1] += _grown(before.failed, after.failed)
            bucket[2] += _grown(before.cancelled, after.cancelled)
    return [HourCount(h, *c) for h, c in sorted(counts.items())]


@dataclass(frozen=True)
class EndedBefore:
    """Jobs that had ended ``by`` (epoch s: when the first sample was taken), when exactly unknown."""

    by: int
    succeeded: int
    failed: int
    cancelled: int


def ended_before_first(samples: Sequence[Sample], now: float, hours: int = ENDED_HOURS) -> EndedBefore | None:
    """The jobs the first sample's counters already hold when the samples began inside the last
    ``hours`` hours (a fresh install, or a Redis restarted empty): they ended by the moment it
    was taken (Sample.read_by; which may lie inside its minute, so "before its minute" would be
    wrong), but when is not known, so :func:`ended_per_hour` cannot place them (the page says
    them beside the bars). None when there are none, or when the samples began before the
    window (those jobs then lie before it)."""
    if not samples or samples[0].at <= now - hours * 3600:
        return None
    first = samples[0]
    if not (first.succeeded or first.failed or first.cancelled):
        return None
    return EndedBefore(first.read_by, first.succeeded, first.failed, first.cancelled)


def memory_series(samples: Sequence[Sample], now: float, hours: float = MEMORY_HOURS) -> list[Sample]:
    """The samples of the last ``hours`` hours (one a minute at most: 360 for 6 hours)."""
    since = now - hours * 3600
    return [s for s in samples if s.at >= since]
