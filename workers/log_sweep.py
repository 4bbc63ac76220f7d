"""Deleting old job logs (each node's control worker, hourly, its own: workers/app.py), never
those of live jobs or of recent errors."""

from __future__ import annotations

import logging
import os
import time

import redis

from rig.config import Settings
from rig.keys import Keys
from rig.logs import (
    SYSTEM_LOG_MAX_BYTES,
    RetentionPolicy,
    SweepReport,
    human_size,
    rotate_system_logs,
    sweep_job_logs,
)
from rig.models import JobState
from rig.store import JobStore

log = logging.getLogger(__name__)


def rotate_own_logs(settings: Settings) -> None:
    """rig's own logs of this node past their size (rig.logs.rotate_system_logs): no lock, each
    node's folder is its own. A failure is one log line; the job logs' sweep goes on."""
    try:
        rotated = rotate_system_logs(settings.rig_log_dir)
    except OSError as exc:
        log.warning("rig's own logs in %s not rotated: %s", settings.rig_log_dir, exc)
        return
    if rotated:
        log.info("rig's own logs moved aside past %s: %s (older copies: .1, .2)",
                 human_size(SYSTEM_LOG_MAX_BYTES), ", ".join(p.name for p in rotated))


def sweep_logs(settings: Settings, client: redis.Redis) -> SweepReport | None:
    """Apply log_retention_days / error_log_retention_days to this node's job logs."""
    keys = Keys(settings.key_prefix)
    if not client.set(keys.logs_lock, os.getpid(), nx=True, px=600_000):
        return None
    try:
        store = JobStore(client, keys)

        def protected(job_id: int, instance: str | None) -> str | None:
            raw, recorded = client.hmget(keys.job(job_id), "state", "instance")
            if raw is None or recorded != instance:
                return "unknown"  # no record, or the folder is another job's (ids are reused)
            if JobState(raw) in (JobState.PENDING, JobState.ASSIGNED, JobState.RUNNING):
                return "running"
            if store.in_error_queue(job_id):
                return "error"
            return None

        policy = RetentionPolicy(job_days=settings.log_retention_days,
                                 error_days=settings.error_log_retention_days)
        report = sweep_job_logs(settings.job_log_dir, policy, now=time.time(), protected=protected)
        if report.deleted:
            log.info("log sweep: deleted the logs of %d jobs (%d bytes)", len(report.deleted),
                     report.bytes_freed)
        return report
    finally:
        client.delete(keys.logs_lock)
