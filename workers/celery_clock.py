"""Celery on Redis' clock (rig.clock), for beat's schedule and the expiry of periodic tasks.

Beat stamps each periodic task (``rig-tick``, ``rig-health``, ``rig-alerts``) with an expiry of
one interval, computed with ``app.now()``; the control worker that takes it, on any node,
compares that with *its own* wall clock (``Request.maybe_expire``). With node clocks 2 minutes
apart, every task a beat on a node behind sends is expired on arrival at a node ahead (no
dispatcher ticks, no health passes there), and RedBeat compares the stored last run with
``app.now()``, so a beat taking over on a node 2 minutes behind runs nothing for 4 minutes. Both
use the shared clock here: ``app.now`` and the expiry check.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import redis
from celery import Celery
from celery.worker import request as celery_request

from rig.clock import shared_now


def install(app: Celery, client: Callable[[], redis.Redis]) -> None:
    """``app.now()`` and the workers' expiry check on Redis' clock (``client`` returns the
    Redis client; called on first use). Idempotent."""
    holder: list[redis.Redis] = []

    def now_s() -> float:
        if not holder:
            holder.append(client())
        return shared_now(holder[0])

    def now() -> datetime:
        return datetime.fromtimestamp(now_s(), tz=timezone.utc).astimezone(app.timezone or timezone.utc)

    app.now = now  # type: ignore[method-assign]

    request_cls = celery_request.Request
    if getattr(request_cls.maybe_expire, "_rig_shared", False):
        return

    def maybe_expire(self: celery_request.Request) -> bool | None:
        """If expired on the shared clock, mark the task as revoked (Celery's own, but not
        on this machine's wall clock)."""
        expires = self.expires
        if expires:
            stamp = expires.timestamp() if expires.tzinfo else expires.replace(tzinfo=timezone.utc).timestamp()
            if now_s() > stamp:
                celery_request.revoked_tasks.add(self.id)
                return True
        return None

    maybe_expire._rig_shared = True  # type: ignore[attr-defined]
    request_cls.maybe_expire = maybe_expire  # type: ignore[method-assign]
