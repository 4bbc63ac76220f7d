"""What rig's web page shows, as one JSON document (``GET /api/overview``; the page polls it).

Everything comes from what the CLI views already read and word, never a second rule:
``Client.status`` (cards, nodes, users, counts: `rig status`), ``Client.waiting`` (priority, then submission)
with ``Client.why_waiting`` (the one explanation, rig.waiting: what `rig show` says),
``Client.start_estimates`` (rig.forecast: each waiting job's estimated start, as `rig show`
says it, read from the leading dispatcher's stored forecast: rig.forecast_store), ``Client.errors`` (`rig errors`), ``job_reason`` for why an ended job ended (`rig errors`),
``card_flag_words`` for why a card takes no jobs (`rig status`), and rig.timeline for history.

Job-, node- and submitter-supplied text goes through rig.text.clean (control and reordering
characters made visible, as in a terminal); the page also puts every string in with
``textContent``, never as HTML. Environment variables and commands are left out (tokens live
there): the page shows names. Units: bytes, epoch seconds (Redis' clock), percent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis

from rig import timeline
from rig.cli.render import NO_WORKER_NOTE, NODE_STATE_NOTES, card_flag_words, job_reason
from rig.client import Client, StatusReport
from rig.clock import shared_now
from rig.models import Job, JobState, Priority, waiting_since
from rig.text import clean

#: Waiting jobs listed (the head of the queue: priority, then submission), each with why it waits; the
#: total is given beside them. Bounded: each sentence reads the cards and the jobs ahead.
WAITING_SHOWN = 25
#: Jobs of the error queue listed: the newest (a new failure must show; `rig errors` lists all, oldest first).
ERRORS_SHOWN = 25
#: Job fields the page uses (raw values but for text, which is cleaned).
_JOB_TEXT = ("name", "user", "node", "pool", "template", "failure")
_JOB_VALUES = ("id", "gpu_memory", "gpus", "cards", "created_at", "started_at", "ended_at",
               "exit_code", "attempt", "vram_peak", "overuse", "expected_seconds")


def job_row(job: Job, **extra: Any) -> dict[str, Any]:
    """The page's view of one job: its figures, its text cleaned, and ``extra``."""
    row: dict[str, Any] = {k: getattr(job, k) for k in _JOB_VALUES}
    row.update({k: clean(getattr(job, k)) if getattr(job, k) is not None else None for k in _JOB_TEXT})
    row.update(state=job.state.value, priority=job.priority.value, vram_mean=job.vram_mean,
               util_mean=job.util_mean, over=bool(job.overuse) or job.vram_peak > job.gpu_memory)
    row.update(extra)
    return row


def _cards(report: StatusReport) -> list[dict[str, Any]]:
    rows = []
    for card in report.cards:
        rows.append({
            "id": clean(card.id), "node": clean(card.node), "index": card.index, "model": clean(card.model),
            "total": card.total, "usable": card.usable, "reserved": card.reserved, "used": card.used,
            "free": card.free, "foreign": card.foreign, "utilization": card.utilization,
            "temperature": card.temperature, "jobs": card.jobs, "max_jobs": card.max_jobs,
            "healthy": card.checked_healthy, "takes_jobs": report.takes_jobs(card),
            "flags": [clean(w) for w in card_flag_words(card)],
            # over: the OVER mark `rig status` puts beside a job that used more than it declared.
            "running": [{"id": j.id, "name": clean(j.name), "user": clean(j.user), "over": bool(j.overuse)}
                        for j in report.running.get(card.id, [])],
        })
    return rows


def _running(report: StatusReport) -> list[dict[str, Any]]:
    """Jobs holding cards (ASSIGNED or RUNNING), oldest start first, as `rig top` lists them."""
    seen: dict[int, Job] = {}
    for jobs in report.running.values():
        for job in jobs:
            seen.setdefault(job.id, job)
    ordered = sorted(seen.values(), key=lambda j: (j.started_at or j.assigned_at or 0, j.id))
    return [job_row(j) for j in ordered]


def _nodes(report: StatusReport) -> list[dict[str, Any]]:
    """Every node `rig status` lists, with or without cards. ``label`` and ``since`` (epoch s)
    make the state line in the browser's zone; ``alerts`` (red: FROZEN, jobs Redis has no record
    of) and ``warnings`` (yellow) are rig status' own lines under the node; ``note`` what the
    state means for its jobs."""
    rows = []
    for n in report.nodes:
        label = "FROZEN" if n.mismatch else {"up": "up", "silent": "silent", "down": "DOWN",
                                             "stopped": "stopped"}.get(n.state, n.state)
        rows.append({
            "name": clean(n.name), "state": n.state, "describe": clean(n.describe), "label": label,
            "since": None if n.mismatch or n.writes_refused else n.since, "last_seen": n.last_seen,
            "note": n.silent_note if n.state == "silent" else NODE_STATE_NOTES.get(n.state, ""),
            "alerts": [clean(line) for line in (f"FROZEN: {n.mismatch}" if n.mismatch else None, n.unrecorded)
                       if line],
            "warnings": [clean(line) for line in (n.writes_refused, n.auth_refused, n.clock_skew,
                                                  NO_WORKER_NOTE if n.no_worker else None) if line],
            "cards": sum(1 for c in report.cards if c.node == n.name and not c.gone), "workers": n.workers})
    return rows


def _history(client: Client, now: float) -> dict[str, Any]:
    """The charts' data; ``error`` (one line) instead of samples when the history key cannot be
    read as one, which fails this section only (the rest of the page reads other keys)."""
    try:
        samples = timeline.read(client.r, client.keys, now)
        error = None
    except redis.ResponseError as exc:
        if not timeline.is_wrong_type(exc):
            raise
        samples = []
        error = (f"the history could not be read: {client.keys.timeline} is not rig's history (another type of "
                 "key); the cluster health pass replaces it at its next sample")
    return {
        "error": error,
        "since": samples[0].at if samples else None,
        "ended_per_hour": [vars(h) for h in timeline.ended_per_hour(samples, now)],
        "ended_before_first": vars(before) if (before := timeline.ended_before_first(samples, now)) else None,
        "memory": [{"at": s.at, "used": s.used, "reserved": s.reserved, "usable": s.usable}
                   for s in timeline.memory_series(samples, now)],
        "memory_hours": timeline.MEMORY_HOURS,
    }


def _ended(jobs: Iterable[Job]) -> list[dict[str, Any]]:
    return [job_row(j, why=clean(job_reason(j))) for j in jobs]


def overview(client: Client, *, login: str) -> dict[str, Any]:
    """The page's document. ``login``: whose login the page was opened with (it says so)."""
    report = client.status()
    now = shared_now(client.r)
    waiting = client.waiting(limit=WAITING_SHOWN)
    starts = client.start_estimates([j.id for j in waiting])
    return {
        "now": now,
        # The sentences the server words (why a job waits, a node's lines) give times in its zone:
        # the page says which when the browser's differs (s east of UTC).
        "server_utc_offset_s": time.localtime(now).tm_gmtoff,
        "login": clean(login),
        "nodes": _nodes(report),
        "cards": _cards(report),
        "running": _running(report),
        "waiting": {
            "total": sum(report.pending.get(p, 0) for p in Priority),
            "by_priority": {p.value: report.pending.get(p, 0) for p in Priority},
            "jobs": [job_row(j, why=clean(client.why_waiting(j) or job_reason(j)), position=i + 1,
                             waiting_since=waiting_since(j.created_at, j.queued_at), **starts.row(j.id))
                     for i, j in enumerate(waiting)],
        },
        "errors": {"total": client.error_count(), "jobs": _ended(client.errors(limit=ERRORS_SHOWN, newest_first=True))},
        "users": [{"user": clean(u.user), "running": u.running, "held": u.held, "waiting": u.waiting,
                   "recent_gib_hours": round(u.recent_gib_hours, 2)} for u in report.users],
        "counts": {s.value: report.counts.get(s, 0) for s in JobState},
        "workers": len(report.workers),
        "notices": [clean(n) for n in report.notices],
        "history": _history(client, now),
    }
