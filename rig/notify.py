"""The "submitted" Celery messages: no longer sent, and why nothing is lost.

Decision (issue 10, item 12): these messages were **never part of a submission**. A
submission is complete, and the job safe, once its record and its place in the pending queue
are written: one Redis transaction, which also pushes the dispatcher's wake-up
(``sched_wake``); and the dispatcher looks at the queue at least once a second regardless.
The message was for Flower; Flower shows each job itself, as a task of its own (issue 14.1:
rig.task_events, workers/flower_bridge.py), and the ``rig.submitted`` task (workers/app.py)
does nothing and sends no task events, so the message had no reader left.

Issue 13 (branch ``jobpath``) stopped sending it: it cost ~0.4 ms of each submit call's
~1.1 ms (a kombu publish, and the client's first Celery connection), and the control worker
a consume and an ack per submit call, beside the dispatcher's pass in the same process
(docs/PERFORMANCE.md, "The per-job cost, round 3"). The ``rig.submitted`` task stays, so a
message an older client queued is consumed and dropped as before.
"""

from __future__ import annotations


def flush(timeout: float = 0.0) -> bool:  # noqa: ARG001 - kept for callers of the older API
    """Nothing is ever pending (no submit call sends a message): True at once."""
    return True
