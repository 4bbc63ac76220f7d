"""Celery's remote control on rig's workers: what Flower's buttons may do, and what they may not.

Flower's buttons are Celery broadcasts (``celery.worker.control.Panel``), handled by every
worker. Two kinds would act behind rig's back, so rig's workers answer them differently:

* **revoke / terminate of a job** (Flower's Revoke and Terminate on a ``rig-job-…`` row,
  rig.task_events): a Celery revoke cannot stop a job (its process tree lives in a session of
  its own, and the threads pool has no ``kill_job``), so the control worker stops the job
  through ``rig kill``'s own path (rig.client.Client.kill), wherever it is: Flower offers
  Revoke on a waiting row and Terminate on a running one, and answers "Revoked" to both, so
  both stop the job (a row still waiting in Flower may have started meanwhile). Flower's login
  is an admin login: it may stop anyone's job (rig.ownership, as an admin), and the job's
  record says ``cancelled by Flower (admin login)``. Card workers leave it to the control
  worker, and every other task id goes to Celery's own revoke.
* **shutdown, pool_grow, pool_shrink, pool_restart, autoscale, add_consumer, cancel_consumer,
  rate_limit, time_limit** are refused on card and control workers with one line: a card worker
  shut down from Flower would leave its card unwatched while rig up restarts it; its pool size is
  the card's ``max_task_per_gpu``; its queue is its card's (a cancelled consumer leaves the
  card's jobs ASSIGNED for ever, an added one runs another card's jobs); a rate limit on
  ``rig.start_job`` holds back starts an older rig queued, and a time limit means nothing to a job (its
  limit is rig's ``--timeout``).

And one is passed on: **heartbeat**, which a Flower's event receiver broadcasts once it listens
(celery.events.EventReceiver ``wakeup``), tells the control worker's Flower bridge that a Flower
(re)started and missed what was told before (workers.flower_bridge.FlowerBridge.listener_joined).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery.utils.functional import maybe_list
from celery.worker.control import Panel, nok, ok

from rig.task_events import job_of

log = logging.getLogger(__name__)

#: Worker controls that would change a rig worker behind rig's back.
REFUSED = ("shutdown", "pool_grow", "pool_shrink", "pool_restart", "autoscale",
           "add_consumer", "cancel_consumer", "rate_limit", "time_limit")
#: The roles (RIG_ROLE) of the workers `rig up` starts.
WORKER_ROLES = ("card", "control")
#: Who the record names as having stopped a job from Flower.
FLOWER_ADMIN = "Flower (admin login)"

#: Stops one job for Flower: (job id, start of its instance or None) -> one line saying what
#: happened.
StopJob = Callable[[int, "str | None"], str]


def refusal(command: str, hostname: str) -> str:
    """The one line a refused worker control answers."""
    return (f"refused by rig: {hostname} is a rig worker and {command} would change it behind rig's back; "
            "`rig down` stops a node (its jobs keep running), `rig kill ID` stops a job")


def install(stop_job: StopJob | None, role: str | None = None,
            listener_joined: Callable[[], None] | None = None) -> None:
    """Put rig's answers in Celery's control registry for this worker process. ``stop_job``
    stops a job (the control worker); None: this worker leaves jobs to the control worker
    (card workers). ``listener_joined``: called when an event receiver (a Flower) says it has
    started listening (the control worker's Flower bridge). Workers of no rig role keep
    Celery's own answers."""
    role = os.environ.get("RIG_ROLE", "") if role is None else role
    if role not in WORKER_ROLES:
        return
    for name in REFUSED:
        Panel.data[name] = _refused(name)
    Panel.data["revoke"] = _revoke_jobs(Panel.data["revoke"], stop_job)
    Panel.data["terminate"] = _terminate_jobs(Panel.data["terminate"], stop_job)
    if listener_joined is not None:
        Panel.data["heartbeat"] = _heartbeat(Panel.data["heartbeat"], listener_joined)


def _hostname(state: Any) -> str:  # noqa: ANN401 - celery.worker.state
    return str(getattr(getattr(state, "consumer", None), "hostname", None) or "this worker")


def _refused(command: str) -> Callable[..., dict]:
    def handler(state: Any, *_args: object, **_kwargs: object) -> dict:  # noqa: ANN401
        line = refusal(command, _hostname(state))
        log.warning("remote control %s: %s", command, line)
        return nok(line)

    handler.__name__ = command
    return handler


def _heartbeat(celery_heartbeat: Callable[..., object], listener_joined: Callable[[], None]) -> Callable[..., object]:
    def heartbeat(state: Any, *args: object, **kwargs: object) -> object:  # noqa: ANN401
        try:
            return celery_heartbeat(state, *args, **kwargs)
        finally:
            listener_joined()

    heartbeat.__name__ = "heartbeat"
    return heartbeat


def _stop_all(jobs: list[tuple[int, str | None]], stop_job: StopJob | None) -> list[str]:
    if stop_job is None:
        return [f"job {j}: stopped by the control worker" for j, _ in jobs]
    said = []
    for job_id, instance in jobs:
        try:
            said.append(stop_job(job_id, instance))
        except Exception as exc:  # noqa: BLE001 - one job's answer must not lose the others'
            log.warning("job %s: not stopped from Flower: %s", job_id, exc)
            said.append(f"job {job_id}: not stopped: {exc}")
    return said


def _revoke_jobs(celery_revoke: Callable[..., dict], stop_job: StopJob | None) -> Callable[..., dict]:
    def revoke(state: Any, task_id: object, terminate: bool = False, signal: str | None = None,  # noqa: ANN401
               **kwargs: object) -> dict:
        ids = [str(i) for i in (maybe_list(task_id) or [])]
        jobs = [j for j in (job_of(i) for i in ids) if j is not None]
        others = [i for i in ids if job_of(i) is None]
        said = _stop_all(jobs, stop_job)
        if others:
            reply = celery_revoke(state, others, terminate=terminate, signal=signal, **kwargs)
            said.append(str(reply.get("ok") or reply.get("error") or reply))
        return ok("; ".join(said))

    revoke.__name__ = "revoke"
    return revoke


def _terminate_jobs(celery_terminate: Callable[..., dict], stop_job: StopJob | None) -> Callable[..., dict]:
    def terminate(state: Any, signal: str, task_id: object, **kwargs: object) -> dict:  # noqa: ANN401
        job = job_of(str(task_id))
        if job is None:
            return celery_terminate(state, signal, task_id, **kwargs)
        return ok("; ".join(_stop_all([job], stop_job)))

    terminate.__name__ = "terminate"
    return terminate
