"""Per-user limits and fair share: pure functions the dispatcher applies. No Redis here.

Usage is counted in GiB-hours: a job holding ``g`` GiB on each of ``n`` cards for ``h`` hours uses
``g * n * h``. A user's *recent usage* is

    decayed history (finished attempts, halving every ``half_life`` seconds)
  + for each running job: its GiB x max(running time so far, MIN_CHARGE_S)

The minimum charge makes a job count from the moment it is placed, so when several users wait
in the same priority their starts alternate (lowest recent usage first) instead of the first
submitter's whole batch starting before anyone else's.

Limits (``max_jobs`` placed-or-running jobs, ``max_bytes`` reserved memory summed over cards;
0 = no limit) are checked before placement; a job over its user's limit waits with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from rig.memory import GIB, format_memory

#: A running job counts as at least this many seconds of its memory (s).
MIN_CHARGE_S = 60.0


def decay(value: float, since: float, now: float, half_life_s: float) -> float:
    """``value`` (GiB-hours recorded at epoch ``since``) decayed to ``now``."""
    if half_life_s <= 0 or now <= since:
        return value
    return value * math.pow(0.5, (now - since) / half_life_s)


def gib_hours(nbytes_per_card: int, cards: int, seconds: float) -> float:
    return nbytes_per_card * cards / GIB * max(0.0, seconds) / 3600.0


@dataclass(frozen=True)
class UserLimit:
    """0 means no limit."""

    max_jobs: int = 0
    max_bytes: int = 0


@dataclass
class UserLoad:
    """What one user holds right now: placed-or-running jobs, reserved bytes summed over their
    cards, and recent usage (GiB-hours, see the module docstring)."""

    jobs: int = 0
    nbytes: int = 0
    usage: float = 0.0

    def add_job(self, nbytes_per_card: int, cards: int, running_s: float) -> None:
        self.jobs += 1
        self.nbytes += nbytes_per_card * cards
        self.usage += gib_hours(nbytes_per_card, cards, max(running_s, MIN_CHARGE_S))


@dataclass
class TeamState:
    """Every user's load during one dispatcher pass (updated as the pass starts jobs)."""

    loads: dict[str, UserLoad] = field(default_factory=dict)

    def load(self, user: str) -> UserLoad:
        return self.loads.setdefault(user, UserLoad())


def limit_for(user: str, default: UserLimit, overrides: Mapping[str, UserLimit]) -> UserLimit:
    """The user's own limit where configured, else the default."""
    return overrides.get(user, default)


def over_limit(user: str, load: UserLoad, nbytes_per_card: int, cards: int,
               limit: UserLimit) -> str | None:
    """Why starting this job would take ``user`` over their limit, or None."""
    if limit.max_jobs and load.jobs + 1 > limit.max_jobs:
        return f"user {user} has {load.jobs} job(s) placed or running (limit {limit.max_jobs})"
    wanted = nbytes_per_card * cards
    if limit.max_bytes and load.nbytes + wanted > limit.max_bytes:
        return (f"user {user} holds {format_memory(load.nbytes)} and this job needs "
                f"{format_memory(wanted)} more (limit {format_memory(limit.max_bytes)})")
    return None


def exceeds_alone(limit: UserLimit, nbytes_per_card: int, cards: int) -> str | None:
    """Why a job could never start under ``limit`` even with nothing else running, or None."""
    wanted = nbytes_per_card * cards
    if limit.max_bytes and wanted > limit.max_bytes:
        return (f"it needs {format_memory(wanted)} in all but its user may hold at most "
                f"{format_memory(limit.max_bytes)} (max_gpu_memory_per_user / user_limits); ask for less")
    return None
