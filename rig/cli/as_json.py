"""Plain JSON for scripts (`--json`): the same data the tables show, with raw units
(bytes, epoch seconds, percent)."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from enum import Enum
from typing import Any

from rig.client import StatusReport
from rig.models import CardState, Job, JobState


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {(k.value if isinstance(k, Enum) else str(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def job_dict(job: Job, **extra: Any) -> dict[str, Any]:
    """The job's fields (raw: JSON escapes control characters, nothing is stripped) and
    ``extra``. Given ``waiting_because`` (rig.waiting.why_waiting), ``wait_reason`` is that same
    sentence: one explanation, never a stored one that says otherwise."""
    data = _plain(job)
    data.update(vram_mean=job.vram_mean, util_mean=job.util_mean, **extra)
    if "waiting_because" in extra and job.state is JobState.PENDING:
        data["wait_reason"] = extra["waiting_because"]
    return data


def card_dict(card: CardState, report: StatusReport | None = None) -> dict[str, Any]:
    """``takes_jobs``: StatusReport.takes_jobs with ``report`` (its node's state counts), else
    the card's own record."""
    data = _plain(card)
    # free, healthy: as every report shows them (rig.models.CardState.free / checked_healthy).
    takes = report.takes_jobs(card) if report is not None else card.eligible
    data.update(id=card.id, free=card.free, healthy=card.checked_healthy, takes_jobs=takes)
    return data


def status_dict(report: StatusReport) -> dict[str, Any]:
    return {
        "cards": [
            {**card_dict(c, report), "running": [j.id for j in report.running.get(c.id, [])]} for c in report.cards
        ],
        "waiting": _plain(report.pending),
        "oldest_wait_seconds": _plain(report.oldest_wait),
        "workers": _plain(report.workers),
        "nodes": _plain(report.nodes),
        "jobs_by_state": _plain(report.counts),
        "jobs_archived": report.archived,
        "archive_url": report.archive,
        "users": _plain(report.users),
        "pool": report.pool,
        "pool_empty": report.pool_empty,
        "notices": list(report.notices),
    }


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)
