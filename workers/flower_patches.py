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
