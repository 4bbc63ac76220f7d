"""The "submitted" Celery messages: what they are for, and why none is ever "dropped".

Decision (issue 10, item 12): these messages are **not part of a submission**. A submission is
complete, and the job safe, once its record and its place in the pending queue are written:
one Redis transaction, which also pushes the dispatcher's wake-up (``sched_wake``); and the
dispatcher looks at the queue at least once a second regardless. The ``rig.submitted`` task
(workers/app.py) does nothing. The message was for Flower; Flower now shows each job itself,
as a task of its own (issue 14.1: rig.task_events, workers/flower_bridge.py), and
``rig.submitted`` sends no task events, so the message is left with no reader: removing it
would save ~0.4 ms of each submit call. So a message that is never sent loses nothing and
delays nothing, and rig never reports one as "dropped".

:func:`announce` sends them: one message per submit call and priority (a ``submit_many`` of
1,000 jobs is one message naming the id range, ~0.4 ms), on the caller's thread, before the
call returns, so nothing is pending when it returns and nothing is left at exit. A send that
fails (broker unreachable) is logged at debug level and ignored, for the reason above.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rig.models import Job

log = logging.getLogger(__name__)


def flush(timeout: float = 0.0) -> bool:  # noqa: ARG001 - kept for callers of the older API
    """Nothing is ever pending (announce sends before a submit call returns): True at once."""
    return True


def announce(celery, jobs: Sequence[Job]) -> int:  # noqa: ANN001 - a Celery app, imported lazily
    """Send the "submitted" message(s) for ``jobs``, just stored by one submit call: one message
    per priority among them, on that priority's queue, named for Flower (``job 12 'bert' by ana:
    12.0 GiB x 1, high`` or ``jobs 12-1011 (1000) 'sweep' by ana, low``). Runs on the caller's
    thread and returns when sent; a failure is logged at debug level and ignored (module doc).
    Returns how many messages were sent."""
    from rig.celery_config import TASK_SUBMITTED
    from rig.memory import format_memory

    by_priority: dict[object, list[Job]] = {}
    for job in jobs:
        by_priority.setdefault(job.priority, []).append(job)
    sent = 0
    for priority, group in by_priority.items():
        first = group[0]
        if len(group) == 1:
            label = (f"job {first.id} '{first.name}' by {first.user}: {format_memory(first.gpu_memory)} x "
                     f"{first.gpus}, {priority.value}")
        else:
            ids = sorted(j.id for j in group)
            span = f"{ids[0]}-{ids[-1]}" if ids[-1] - ids[0] + 1 == len(ids) else f"{ids[0]}..{ids[-1]}"
            names = sorted({j.name for j in group})
            users = sorted({j.user for j in group})
            label = (f"jobs {span} ({len(group)}) '{names[0]}'{' and others' if len(names) > 1 else ''} "
                     f"by {', '.join(users[:3])}{' ...' if len(users) > 3 else ''}, {priority.value}")
        try:
            # The task only wakes the dispatcher; its argument is the first id, for Flower.
            celery.send_task(TASK_SUBMITTED, args=[first.id], queue=priority.queue, retry=False,
                             argsrepr=label[:400])
            sent += 1
        except Exception:  # noqa: BLE001 - the jobs are queued; this message is for Flower only
            log.debug("could not send the 'submitted' message for %s; the jobs are queued", label,
                      exc_info=True)
    return sent
