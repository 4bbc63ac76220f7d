"""Beat's scheduler: celery-redbeat's, waiting through a Redis outage instead of dying.

redbeat retries its reads and writes when Redis cannot be reached, but not when Redis answers
and refuses the write (full: maxmemory with noeviction; a read-only replica; MISCONF): then its
schedule update raised out of ``tick`` and beat exited, and ``rig up`` restarted it into the same
error (a crash loop). Here both are one outage (rig.redis_writes.is_outage): beat logs it once,
sends nothing until Redis takes writes again, and carries on. Nothing is lost meanwhile: its
periodic tasks only nudge work that the next tick does anyway.
"""

from __future__ import annotations

import logging
import time

from redbeat import RedBeatScheduler
from redbeat.schedulers import acquire_distributed_beat_lock

from rig.redis_writes import is_outage

log = logging.getLogger(__name__)

#: Seconds between two tries while Redis is out (beat's own loop interval is 2 s).
OUTAGE_RETRY_S = 2.0


class _Sender:
    """What redbeat's beat_init handler reads of its sender: the scheduler."""

    def __init__(self, scheduler: RedBeatScheduler) -> None:
        self.scheduler = scheduler


class RigBeatScheduler(RedBeatScheduler):
    """RedBeatScheduler whose start and ticks wait through a Redis outage (module doc)."""

    _outage: str | None = None

    def setup_schedule(self) -> None:
        # Writes the static entries: wait until Redis takes them (beat's lock comes next).
        while True:
            try:
                super().setup_schedule()
                self._recovered()
                return
            except Exception as exc:  # noqa: BLE001 - judged by is_outage
                if not is_outage(exc):
                    raise
                self._out(exc)
                time.sleep(OUTAGE_RETRY_S)

    def tick(self, *args, **kwargs) -> float:  # noqa: ANN002, ANN003 - Scheduler.tick's signature
        try:
            if self.lock_key and self.lock is None:
                # redbeat takes its lock at beat_init, waiting for it (a second beat waits
                # there while the first one ticks); an outage ends that wait with an error
                # Celery swallows, leaving no lock (its tick then raised AttributeError).
                # Take it here, the same way, once Redis takes writes.
                acquire_distributed_beat_lock(_Sender(self))
            interval = super().tick(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - judged by is_outage
            if not is_outage(exc):
                raise
            self._out(exc)
            return OUTAGE_RETRY_S
        self._recovered()
        return interval

    def _out(self, exc: BaseException) -> None:
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if self._outage is None:
            log.warning("beat: Redis cannot be used (%s); sending nothing until it can, retrying every "
                        "%.0f s", text, OUTAGE_RETRY_S)
        self._outage = text

    def _recovered(self) -> None:
        if self._outage is not None:
            log.warning("beat: Redis takes writes again; sending periodic tasks")
            self._outage = None
