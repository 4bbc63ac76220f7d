"""Why a placed job has not started yet: the sentence `rig show`, the page and the gateway give
an ASSIGNED job whose start takes longer than a moment.

A placed job starts when its first card's worker takes its start off the card's start list
(``card:<node>:<i>:starts``, workers.start_list) and claims it, normally within milliseconds.
When it does not, the reason is one of: the card's worker is not running (no heartbeat: the
node's health check sends the job back to the queue once the worker has been gone for
``health.timeout`` s), it stopped heartbeating (hung, SIGSTOPped: replaced after
``health.timeout``), it runs ``max_task_per_gpu`` jobs already, or the start was lost (Redis
rolled back, the list deleted by hand: the worker pushes it again ``assigned_timeout`` s after
the placement). Times in epoch seconds on the shared clock.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rig.clock import shared_now
from rig.keys import card_worker_name
from rig.models import Job, JobState
from workers.start_list import Start

if TYPE_CHECKING:
    from rig.client import Client

#: A placed job younger than this (s) is simply starting: nothing to explain.
SLOW_START_S = 2.0


def why_not_started(client: Client, job: Job, *, now: float | None = None) -> str | None:
    """One sentence for an ASSIGNED job placed more than SLOW_START_S ago, else None. Reads
    the worker's heartbeat and the card's two start lists in one round trip."""
    if job.state is not JobState.ASSIGNED or not job.node or not job.cards:
        return None
    now = shared_now(client.r) if now is None else now
    placed = job.assigned_at or now
    waited = now - placed
    if waited < SLOW_START_S:
        return None
    node, index = job.node, job.cards[0]
    worker = card_worker_name(node, index)
    keys, s = client.keys, client.settings
    pipe = client.r.pipeline(transaction=False)
    pipe.get(keys.worker(worker))
    pipe.lrange(keys.card_starts(node, index), 0, -1)
    pipe.lrange(keys.card_taking(node, index), 0, -1)
    raw, starts, taking = pipe.execute()
    where = f"placed on {node}/{index} {waited:.0f} s ago"
    if not raw:
        return (f"{where}; its card worker {worker} is not running (no heartbeat): the node's health "
                f"check sends the job back to the queue once the worker has been gone for "
                f"{s.health.timeout:g} s (`rig status` shows the node)")
    beat = _beat(raw)
    silent = now - beat.get("seen_at", now)
    if silent > max(2.0 * s.telemetry_interval, SLOW_START_S):
        # Its heartbeat key lives on for health.timeout: a stopped or hung worker still has one.
        return (f"{where}; its card worker {worker} has not heartbeated for {silent:.0f} s (hung, stopped or "
                f"overloaded?): rig replaces a worker silent for {s.health.timeout:g} s, and the job then "
                "starts or goes back to the queue")
    if _lists(job.id, taking):
        return f"{where}; its card worker {worker} has taken its start and is starting it"
    if _lists(job.id, starts):
        running = beat.get("jobs", 0)
        if running >= s.max_task_per_gpu:
            return (f"{where}; its card worker {worker} runs {running} jobs, the most it runs at once "
                    f"(max_task_per_gpu = {s.max_task_per_gpu}): the start waits for one of them to end")
        return f"{where}; waiting for its card worker {worker} to take its start"
    resend = s.health.assigned_timeout - waited
    when = f"{resend:.0f} s from now" if resend >= 0.5 else f"now (due {-resend:.0f} s ago)"
    return (f"{where}; its start is not on the card's start list (Redis lost it?): {worker} pushes it "
            f"again {when} ({s.health.assigned_timeout:g} s after the placement)")


def _lists(job_id: int, entries: list[str]) -> bool:
    """Is a start of ``job_id`` among ``entries`` (workers.start_list's format)?"""
    return any(start is not None and start.job_id == job_id for start in map(Start.parse, entries))


def _beat(raw: str) -> dict:
    """A worker's heartbeat (workers.card_runner: pid, jobs, seen_at on the shared clock);
    an unreadable one as empty."""
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if k in ("jobs", "seen_at") and isinstance(v, (int, float))}
