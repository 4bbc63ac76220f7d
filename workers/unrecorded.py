"""The node's "Redis has no record of these jobs" alert (node field ``unrecorded_jobs``: `rig
status`, rig.alerts' ``unrecorded_jobs:<node>``), the one rig raises when Redis' data was rolled
back to an older copy or lost while jobs ran on this node:

- jobs still running that Redis has no record of (workers.health, every health pass; cleared
  when none is left);
- an attempt that ended while its record was gone or held another job under the same id (the
  card worker, workers.card_runner): its ending could not be written anywhere, so it stays on
  disk only (exit and pid files) and its submitter may have to submit it again. That line stays
  until `rig recover` on the node, finding nothing else to recover, clears it (workers.recovery).
"""

from __future__ import annotations

import logging

import redis

from rig.keys import Keys

log = logging.getLogger(__name__)

#: The node record's field that carries the alert's line.
UNRECORDED_FIELD = "unrecorded_jobs"


def _ids(jobs: list[int]) -> str:
    return ", ".join(map(str, jobs[:10])) + (" ..." if len(jobs) > 10 else "")


def running_line(node: str, jobs: list[int]) -> str:
    """The line for jobs still running on ``node`` that Redis has no record of."""
    return (f"Redis has no record of job(s) {_ids(jobs)} still running on {node} (its data was rolled back to an "
            f"older copy or lost): they run on, untouched; on {node}: `rig recover --stop` stops them")


def ended_line(node: str, job_id: int) -> str:
    """The line for an attempt on ``node`` that ended after Redis lost its job's record."""
    return (f"Redis has no record of job {job_id} whose attempt ended on {node} (its data was rolled back to an "
            "older copy or lost; the id may now name another job): its ending is kept on disk only; submit it "
            f"again if it must run; `rig recover --node {node}` clears this")


def mark_lost_ending(r: redis.Redis, keys: Keys, node: str, job_id: int) -> None:
    """Raise the alert for an ending that could not be recorded (best effort: logged either way)."""
    line = ended_line(node, job_id)
    log.critical("%s", line)
    try:
        r.hset(keys.node(node), UNRECORDED_FIELD, line)
    except redis.RedisError as exc:
        log.warning("could not mark node %s (%s)", node, exc)
