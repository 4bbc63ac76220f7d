"""A rig job as one Celery task in Flower: its task id, its name and the task event of each move.

Flower knows Celery tasks, and rig's Celery tasks are transport (``rig.start_job`` only drains
a start an older rig queued, ``rig.tick`` every second): none of them is a job. So those send no task
events (``send_events=False``, workers/app.py) and each job is shown instead as one task of its
own, through Celery's own task events, one per move of the job (workers/flower_bridge.py sends
them; this module decides what they say):

  PENDING (first time)        task-received   on the control worker
  RUNNING                     task-started    on the card worker that claimed it
  PENDING after an attempt    task-retried    (reason in ``exception``)
  SUCCEEDED                   task-succeeded  (``result``: exit code; ``runtime`` in s; an
                                              earlier attempt's failure cleared)
  FAILED, TIMEOUT             task-failed     (``exception``: failure class and exit code)
  CANCELLED                   task-revoked    (``terminated`` when it had started; ``result``: its
                                              exit code, ``exception``: who cancelled it, ``runtime``)

ASSIGNED sends nothing (the job waits for its card's worker; still "received").

The task id is ``rig-job-<id>-<instance>`` (:func:`task_id`): Flower's search finds it, and
Flower's Terminate on it comes back to rig as a revoke of that id (workers/remote_control.py).
Pure functions: no Redis, no Celery.
"""

from __future__ import annotations

import re
from typing import Any

from rig.keys import card_worker_name
from rig.memory import format_memory
from rig.models import Job, JobState

#: The prefix of every job's task id in Flower.
TASK_ID_PREFIX = "rig-job-"
#: How many hex digits of the job's instance (Job.instance) its task id carries.
INSTANCE_DIGITS = 8
_TASK_ID = re.compile(rf"{TASK_ID_PREFIX}(\d{{1,18}})(?:-([0-9a-f]{{{INSTANCE_DIGITS}}}))?")
#: The most characters of a reason put in an event (Flower shows it in a table cell).
REASON_MAX = 400


def task_id(job: Job) -> str:
    """The Celery task id of ``job`` in Flower, one for its whole life: ``rig-job-12-3f9a1c2e``,
    its id and the start of its instance. A job id is reused when Redis loses its data; its
    instance is not, so Flower's kept history never merges two jobs, and Terminate on an old
    row never stops the job that has its id now (``rig-job-12`` for a record without one)."""
    instance = (job.instance or "")[:INSTANCE_DIGITS]
    return f"{TASK_ID_PREFIX}{int(job.id)}" + (f"-{instance}" if len(instance) == INSTANCE_DIGITS else "")


def job_of(task: str) -> tuple[int, str | None] | None:
    """(job id, start of its instance or None) that a task id names (:func:`task_id`), or None
    for any other task id."""
    found = _TASK_ID.fullmatch(str(task).strip())
    return (int(found.group(1)), found.group(2)) if found else None


def same_job(job: Job, instance: str | None) -> bool:
    """Is ``job`` (its record now) the job a task id named with ``instance``?"""
    return instance is None or (job.instance or "").startswith(instance)


def task_name(job: Job) -> str:
    """What Flower's task list shows in its Name column: ``job 12 'bert' by ana: 12.0 GiB x 1
    on n1/3`` (``, waiting`` before it has cards). Job names and users are checked text
    (rig.records); the name is cut to keep one row one line."""
    where = f"on {job.node}/{','.join(map(str, job.cards))}" if job.node and job.cards else "waiting"
    name = job.name if len(job.name) <= 60 else job.name[:29] + "…" + job.name[-30:]
    return f"job {job.id} '{name}' by {job.user}: {format_memory(job.gpu_memory)} x {job.gpus}, {where}"


def task_kwargs(job: Job) -> str:
    """The kwargs column (a repr, as Celery's own events carry it): what a search may match."""
    fields: dict[str, Any] = {"job": job.id, "name": job.name, "user": job.user,
                              "gpu_memory": format_memory(job.gpu_memory), "gpus": job.gpus,
                              "priority": job.priority.value}
    if job.node:
        fields["node"] = job.node
        fields["cards"] = job.cards
    return repr(fields)


def worker_of(job: Job, state: JobState) -> str | None:
    """The Celery worker the event of ``job``'s move to ``state`` is counted for in Flower's
    Workers page: the card worker that ran it (its first card's), also for the retry that
    followed an attempt (the record keeps the attempt's node and cards in ``attempts``); None
    for a job that never ran (its event comes from the control worker that sends it)."""
    if job.worker and state is not JobState.PENDING:
        return job.worker
    last = job.attempts[-1] if job.attempts and state is not JobState.RUNNING else None
    node, cards = (last.get("node"), last.get("cards")) if isinstance(last, dict) else (job.node, job.cards)
    if node and isinstance(cards, list) and cards:
        return card_worker_name(str(node), str(cards[0]))
    return None


def _reason(job: Job) -> str:
    return (job.reason or "")[:REASON_MAX]


def _runtime(job: Job) -> float | None:
    """Seconds the last attempt ran, from its record (None when it never started)."""
    if job.started_at is None or job.ended_at is None:
        return None
    return round(max(0.0, job.ended_at - job.started_at), 3)


def _moved_at(job: Job, state: JobState) -> float | None:
    """When ``job`` made its move to ``state`` (epoch s on rig's shared clock, rig.clock), from
    its record; None when the record does not say."""
    if state is JobState.PENDING:
        last = job.attempts[-1] if job.attempts else None
        return last.get("ended_at") if isinstance(last, dict) else job.created_at
    if state is JobState.RUNNING:
        return job.started_at
    return job.ended_at


def event_for(job: Job, state: JobState) -> tuple[str, dict[str, Any]] | None:
    """The Celery task event (type, fields without hostname) that says ``job`` moved to
    ``state``, read from its record just after the move; None when the move says nothing to
    Flower (ASSIGNED). ``fields`` always carry ``uuid`` and ``name``, and ``timestamp`` (when
    the move happened, not when the event is sent) when the record says it: Flower's Received
    column is the submission, also for an event sent late or again."""
    fields: dict[str, Any] = {"uuid": task_id(job), "name": task_name(job)}
    moved_at = _moved_at(job, state)
    if isinstance(moved_at, int | float) and moved_at > 0:
        fields["timestamp"] = float(moved_at)
    if state is JobState.PENDING:
        if job.attempts:
            # An attempt ended and the job waits again: a retry, as Celery counts them. Every
            # ended attempt was retried but the last one of a job that has ended (the record is
            # read when the event is sent, perhaps after the job moved on).
            retries = max(1, len(job.attempts) - (1 if job.state.terminal else 0))
            retried = job.attempts[retries - 1]
            summary = str(retried.get("summary") or "") if isinstance(retried, dict) else ""
            fields.update(exception=f"attempt {retries} failed: {summary}"[:REASON_MAX], traceback="",
                          retries=retries)
            return "task-retried", fields
        fields.update(args="()", kwargs=task_kwargs(job), retries=0, eta=None, expires=None)
        return "task-received", fields
    if state is JobState.RUNNING:
        # Celery's received fields too: a Flower that missed the job's task-received (started
        # after it was submitted) still shows whose job it is.
        fields.update(args="()", kwargs=task_kwargs(job), retries=max(0, job.attempt - 1))
        return "task-started", fields
    if state is JobState.SUCCEEDED:
        fields.update(result=repr(f"exit code {job.exit_code if job.exit_code is not None else 0}"),
                      runtime=_runtime(job))
        if job.attempts:  # a retry's "attempt 1 failed" is not this success's exception
            fields.update(exception="", traceback="")
        return "task-succeeded", fields
    if state in (JobState.FAILED, JobState.TIMEOUT):
        failure = job.failure or ("timeout" if state is JobState.TIMEOUT else "failed")
        code = "none" if job.exit_code is None else str(job.exit_code)
        fields.update(exception=f"{failure}: exit code {code}: {_reason(job)}", traceback=_reason(job),
                      runtime=_runtime(job))
        return "task-failed", fields
    if state is JobState.CANCELLED:
        fields.update(terminated=job.started_at is not None, signum=None, expired=False,
                      exception=_reason(job), runtime=_runtime(job))
        if job.exit_code is not None:
            fields["result"] = repr(f"exit code {job.exit_code}")
        return "task-revoked", fields
    return None
