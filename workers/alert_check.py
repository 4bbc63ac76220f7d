"""The alert check, run by the leading dispatcher's control worker only (rig.alerts).

Beat's periodic task reaches whichever control worker of the cluster takes it; each used to
judge by its own node's ``[alerts]`` thresholds and post to its own ``alert_webhook``, so with
two nodes configured apart a condition fired on one and "resolved" on the other while it held,
and a webhook saw "firing" twice with no "resolved" between. Here one control worker checks at
a time: the one whose dispatcher holds the leader lock, the one whose settings already place,
order and limit every job (rig.policy). The check moves with the lead when that node stops or
dies (the lock lapses, another dispatcher takes it) and stays put otherwise, so one set of
thresholds and one webhook judge and announce every change while a node leads. It needs no beat
on the leader's node (``rig up --only beat`` elsewhere, or no beat at all: the thread keeps its
own time) and the webhook's URL never leaves the node that has it in its config.

Its own thread beside the dispatcher (as workers.forecaster): an evaluation reads every card
and up to PENDING_SCAN waiting jobs, and must never delay a start; a failure is logged at most
once a minute, and the next interval tries again.

The "Redis refuses writes" alert (rig.redis_writes.FullWatch) follows the same rule, kept in
this process's memory (a full Redis refuses rig.alerts' bookkeeping): every node's checker
watches, the leading one fires, and the one that fired resolves. It used to be checked by every
node's local health loop and said by the first node by name, to that node's webhook: another
rule and, with nodes configured apart, another webhook than every other alert's.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from rig.alerts import AlertManager, AlertRules, deliver
from rig.client import Client
from rig.lograte import Throttle
from rig.redis_writes import FullWatch, is_outage

if TYPE_CHECKING:
    from workers.dispatcher import Dispatcher

log = logging.getLogger(__name__)

#: A failing check is logged at most this often (s).
LOG_EVERY_S = 60.0


class AlertChecker:
    """Runs rig.alerts.AlertManager every ``alert_interval`` s while ``dispatcher`` leads, by
    the dispatcher's settings (its node's ``[alerts]`` and ``alert_webhook``)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        settings = dispatcher.settings
        self.client = Client(settings, redis_client=dispatcher.r)
        self.every = settings.alert_interval  # s between checks
        self.manager = AlertManager(self.client, AlertRules(**settings.alerts.model_dump()),
                                    webhook_url=settings.alert_webhook, logger=log)
        self.stop_event = threading.Event()
        self._quiet = Throttle(LOG_EVERY_S)
        self.full = FullWatch(settings.node_name)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="rig-alert-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def run_forever(self) -> None:
        while not self.stop_event.wait(self.every):
            self.step()

    def leads(self) -> bool:
        """THE rule of which node checks alerts: the one whose dispatcher holds the leader lock;
        where no dispatcher holds it, the one whose dispatcher led at its last leader check.
        That second clause is for a Redis refusing writes: the lock is renewed by a write, so it
        lapses (LEADER_TTL_MS) and none can take it, while the last leader's dispatcher, whose
        checks fail, still says it led (Dispatcher.leading) and every other one says it did not.
        (A leader that stalled past the TTL, lost the lock and has not checked since, when Redis
        then refuses writes, would speak beside the new one: both say they led.) A Redis that
        refused writes before any dispatcher led has no speaker: `rig up` and `rig status` say
        it. Reads only."""
        leader = self.client.r.get(self.client.keys.sched_leader)
        if leader is None:
            return bool(self.dispatcher.leading)
        return leader == self.dispatcher.identity

    def step(self) -> int | None:
        """One check, if this dispatcher leads (leads): how many changes it announced, or None
        when it did not check (another leads, or the check failed). Before it, on every node,
        the "Redis refuses writes" alert (_check_writes). Never raises."""
        try:
            leading = self.leads()
        except Exception as exc:  # noqa: BLE001 - an alert check must never disturb the worker
            self._skipped(exc)
            return None
        self._check_writes(leading)
        try:
            if not leading:
                return None  # the leading dispatcher's control worker checks
            return len(self.manager.run())
        except Exception as exc:  # noqa: BLE001 - an alert check must never disturb the worker
            self._skipped(exc)
            return None

    def _check_writes(self, leading: bool) -> None:
        """The "Redis refuses writes" alert: fired by the leading node (leads), resolved by the
        node that fired it, delivered to this node's webhook. Before the check that writes:
        that one fails while Redis refuses writes, this one is what says so."""
        try:
            deliver(self.full.check(self.client.r, speaks=leading), self.manager.webhook_url, log)
        except Exception as exc:  # noqa: BLE001 - an alert check must never disturb the worker
            self._skipped(exc)

    def _skipped(self, exc: Exception) -> None:
        if self._quiet.due(type(exc).__name__):
            log.warning("alert check skipped (%s: %s); trying again in %.0f s", type(exc).__name__, exc,
                        self.every, exc_info=not is_outage(exc))  # a bug's traceback, not an outage's
