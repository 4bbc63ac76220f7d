"""What one user may see and do of another's job: the one rule.

A shared server is transparent about who uses what and private about what they carry. Anyone
sees that a job exists, its owner, name, size (memory, cards), priority, state, node and
cards, times, attempts and their outcomes, failure class and why it waits. Only its owner and
admins (and the job itself) see its command, working folder, environment values, the log
lines that classified it and the end reasons that quote them, its ``@rig.task`` payload and
result, and may kill, retry or clear it.
"""

from __future__ import annotations

import dataclasses

from rig.client import Identity
from rig.models import Job
from rig.ownership import owns

#: What stands in for a value the viewer may not read.
HIDDEN = "(hidden)"


def as_seen_by(job: Job, who: Identity, *, admin: bool) -> Job:
    """``job`` as ``who`` may see it: unchanged for its owner and admins, else without what it
    carries (see the module's docstring). Environment names stay; their values do not."""
    if admin or owns(job, who):
        return job
    # The end reason and attempt summaries quote the job's own output (a CUDA or NCCL line) and
    # its folder: the failure class and outcome say what happened without them.
    return dataclasses.replace(
        job, command=[HIDDEN], shell=False, workdir=HIDDEN, env={name: HIDDEN for name in job.env},
        evidence=[], reason=HIDDEN if job.reason else None,
        attempts=[{**a, "evidence": [], "summary": HIDDEN} for a in job.attempts if isinstance(a, dict)],
        problems=list(job.problems))
