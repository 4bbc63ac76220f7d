"""The leading dispatcher's forecast: a thread beside the dispatcher in each control worker that,
while that dispatcher holds the leader lock and jobs wait, runs rig.forecast and stores it
(rig.forecast_store.publish) at most every FORECAST_EVERY_S.

Its own thread, not the dispatcher's pass: a forecast (hundreds of ms of CPU for 200 waiting
jobs) must never delay a start, and a failure in it must never disturb the dispatcher (it is
logged at most once a minute and the next interval tries again). Its cost is bounded: when one
forecast took more CPU than MAX_CORE_SHARE of its interval, the interval stretches to match
(and the stored forecast's lifetime with it).

It shares the control worker's GIL with the dispatcher thread, which after each Redis round trip
waits for the GIL; Python hands it over only every ``sys.getswitchinterval()`` (5 ms by default),
so while a forecast ran, a pass of 0.9 ms took 2-12 ms (median, 32 cards, `scripts/bench_forecast.py
--beside`, loaded machine). :meth:`Forecaster.start` sets the process' interval to
SWITCH_INTERVAL_S, which brings that to 2.2-2.4 ms.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING

from rig.client import Client
from rig.forecast import forecast
from rig.forecast_store import FORECAST_EVERY_S, publish
from rig.lograte import Throttle
from rig.redis_writes import is_outage

if TYPE_CHECKING:
    from workers.dispatcher import Dispatcher

log = logging.getLogger(__name__)

#: The most of one core the forecast may take on the leader (CPU s per wall s).
MAX_CORE_SHARE = 0.05
#: The control worker's GIL switch interval (s) once a forecaster runs in it (Python's default: 5 ms).
SWITCH_INTERVAL_S = 0.0005
#: How often it looks whether its dispatcher leads and jobs wait while it has nothing to make
#: (s; one round trip): the first waiting job gets its estimate within about this.
IDLE_CHECK_S = 1.0
#: A failing forecast is logged at most this often (s).
LOG_EVERY_S = 60.0


class Forecaster:
    """Publishes ``dispatcher``'s forecast while it leads (see the module doc)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.client = Client(dispatcher.settings, redis_client=dispatcher.r)
        self.every = FORECAST_EVERY_S  # s between forecasts; stretched by a costly one
        self.took = 0.0  # CPU s of the last forecast
        self.failing = False  # the last step failed
        self.stop_event = threading.Event()
        self._quiet = Throttle(LOG_EVERY_S)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread, and shorten this process' GIL switch interval (see the module doc)."""
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self.run_forever, name="rig-forecaster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def run_forever(self) -> None:
        delay = IDLE_CHECK_S
        while not self.stop_event.wait(delay):
            # After a forecast (or a failed one) the next comes an interval later; until then, a look a second.
            delay = self.every if self.step() or self.failing else IDLE_CHECK_S

    def step(self) -> bool:
        """One forecast, if this dispatcher leads and jobs wait: True when one was stored. Never
        raises (a failure is logged once a minute)."""
        self.failing = False
        try:
            r, keys = self.client.r, self.client.keys
            pipe = r.pipeline(transaction=False)
            pipe.get(keys.sched_leader)
            pipe.exists(keys.pending)
            leader, waiting = pipe.execute()
            if leader != self.dispatcher.identity or not waiting:
                return False  # not ours to make; with nothing waiting, the last one expires
            began = time.thread_time()
            found = forecast(self.client)
            self.took = time.thread_time() - began
            self.every = max(FORECAST_EVERY_S, self.took / MAX_CORE_SHARE)
            publish(r, keys, found, self.every)
            return True
        except Exception as exc:  # noqa: BLE001 - a forecast must never disturb the dispatcher
            self.failing = True
            if self._quiet.due(type(exc).__name__):
                log.warning("estimated starts not updated (%s: %s); trying again in %.0f s", type(exc).__name__,
                            exc, self.every, exc_info=not is_outage(exc))  # a bug's traceback, not an outage's
            return False
