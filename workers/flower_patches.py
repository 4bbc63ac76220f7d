"""rig's Flower: what it changes in the Flower process (``celery -A workers.app flower``, RIG_ROLE
flower), installed when workers.app is imported there.

* **An event applied already is skipped.** rig's bridge tells a Flower that (re)starts the
  present state and the recent ends of jobs again (workers.flower_bridge): one that kept them
  in its history must not count them twice in its Workers page. A task event is skipped when
  the task is already in the state it says, reached at the very time it says (each event of a
  job carries the time of its move, rig.task_events).
* **Flower's Prometheus metrics are off.** Flower's ``/metrics`` answers without its login and
  labels every series with the task's name, which is rig's job name (id, name, user, size,
  card): a series per job, never removed. rig has its own ``/metrics`` (rig.metrics, ``rig
  up`` prints its URL); Flower's answers 404 with one line saying so, and no series is kept.
* **Shut down says what the worker answered.** Flower's Shut Down button broadcasts and, without
  waiting for a reply, says "Shutting down!"; rig's workers refuse it (workers.remote_control),
  so the page told an untruth. The patched handler waits for the replies (2 s) and answers 403
  with the worker's own line when it refused, as Flower already does for a refused pool
  restart.
"""

from __future__ import annotations

from typing import Any

from celery import states

#: The Task attribute a task event stamps with its time (celery.events.state.Task.event),
#: and the state it means.
_STAMPED = {"task-received": ("received", states.RECEIVED), "task-started": ("started", states.STARTED),
            "task-succeeded": ("succeeded", states.SUCCESS), "task-failed": ("failed", states.FAILURE),
            "task-retried": ("retried", states.RETRY), "task-revoked": ("revoked", states.REVOKED)}
#: What Flower's /metrics answers in rig.
METRICS_OFF = "Flower's metrics are off in rig: rig's own /metrics is on its web port (rig up prints its URL)\n"


def applied_already(tasks: Any, event: dict) -> bool:  # noqa: ANN401 - celery's LRU of Task
    """Is ``event`` a task event that its task has applied already (same state, same time)?"""
    stamped = _STAMPED.get(str(event.get("type")))
    task = tasks.get(event.get("uuid")) if stamped else None
    if task is None or event.get("timestamp") is None:
        return False
    field, state = stamped
    return task.state == state and getattr(task, field, None) == event["timestamp"]


class _NoMetrics:
    """Flower's PrometheusMetrics, keeping nothing."""

    def observe_task(self, *_: object) -> None:
        pass

    def observe_worker(self, *_: object) -> None:
        pass

    def remove_workers(self, *_: object) -> int:
        return 0


def install() -> None:
    """Patch Flower in this process (before it builds its state and its web app)."""
    from flower import events
    from flower.views import monitor

    events.PROMETHEUS_METRICS = _NoMetrics()
    original = events.EventsState.event
    if getattr(original, "rig_patched", False):
        return

    def event(self: Any, event: dict) -> None:  # noqa: ANN401 - flower.events.EventsState
        if applied_already(self.tasks, event):
            return
        original(self, event)

    event.rig_patched = True  # type: ignore[attr-defined]
    events.EventsState.event = event

    async def metrics_off(self: Any) -> None:  # noqa: ANN401 - a tornado handler
        self.set_status(404)
        self.set_header("Content-Type", "text/plain")
        self.write(METRICS_OFF)

    monitor.Metrics.get = metrics_off
    _shutdown_tells_the_reply()


def _shutdown_tells_the_reply() -> None:
    from flower.api import control
    from tornado import web

    @web.authenticated
    async def post(self: Any, workername: str) -> None:  # noqa: ANN401 - a Flower ControlHandler
        if self.application.options.read_only:
            raise web.HTTPError(403, "Read only mode is enabled")
        if not self.is_worker(workername):
            raise web.HTTPError(404, f"Unknown worker '{workername}'")
        replies = await self.run_blocking(
            "worker.shutdown", workername, self.capp.control.broadcast,
            "shutdown", destination=[workername], reply=True, timeout=2.0)
        refused = [answer.get("error") for reply in replies or [] for answer in reply.values()
                   if isinstance(answer, dict) and answer.get("error")]
        if refused:
            self.set_status(403)
            self.write(f"Not shut down: {refused[0]}")
            return
        self.write({"message": "Shutting down!"})

    control.WorkerShutDown.post = post
