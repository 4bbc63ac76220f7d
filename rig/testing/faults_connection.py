"""Fault scenario: Redis black-holed, not closed (a half-open connection).

Every rig process talks to Redis through a black-hole proxy (rig.testing.blackhole) in front of
a private redis-server. The proxy stops forwarding both ways without closing anything, then
heals for new connections only (the stalled ones stay stalled, as after a real partition). Three
paths run into it at once, each timed:

- a Ledger call (``Ledger.cards()``) raises redis.TimeoutError after one reply timeout;
- a dispatcher pass (``Dispatcher.dispatch_pass()``) raises redis.TimeoutError after one
  reply timeout (its loop logs it and retries);
- a card worker's finish path (``CardRunner._finish``) keeps retrying and records the job's
  ending once Redis answers again, at most one reply timeout plus its backoff after the heal.

Then everything works again on fresh connections: the ledger reads, a pass places a job, the
finished job is SUCCEEDED with its reservation given back. Without socket timeouts each of the
three hangs for ever (the scenario reports it as hung instead of waiting).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis

from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import TERMINAL_STATES, Job, JobState, Priority
from rig.redis_conn import REPLY_TIMEOUT_S, connect
from rig.testing.blackhole import BlackHoleProxy
from rig.testing.faults import ScenarioResult, _private_redis
from workers.card_runner import CardRunner
from workers.dispatcher import Dispatcher
from workers.outcomes import AttemptEnd

#: Slack on top of the documented bound for thread scheduling on a loaded 2-core machine (s).
SLACK_S = 3.0
#: A card worker's retry backoff after Redis errors grows to at most this (s; card_runner).
FINISH_BACKOFF_S = 5.0


class _Timed(threading.Thread):
    """Runs ``fn`` once in the background; records how long it took and what it raised."""

    def __init__(self, name: str, fn) -> None:  # noqa: ANN001
        super().__init__(name=name, daemon=True)
        self.fn, self.error, self.seconds, self.result = fn, None, None, None

    def run(self) -> None:
        began = time.monotonic()
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - recorded, judged by the scenario
            self.error = exc
        self.seconds = time.monotonic() - began


def redis_black_holed(workdir: Path) -> ScenarioResult:
    """See the module docstring. Rows: lost (the finished job not ended), leaked (bytes still
    reserved at the end), problems (a path that hung or took longer than documented)."""
    workdir.mkdir(parents=True, exist_ok=True)
    real_url, server = _private_redis(workdir)
    target = urlsplit(real_url)
    proxy = BlackHoleProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    result = ScenarioResult("redis_black_holed", jobs=2, faults="proxy stops forwarding both ways, "
                            "nothing closed; heals for new connections only")
    began = time.monotonic()
    runner = None
    try:
        settings = load_settings(key_prefix="bh:", redis_url=proxy.url(), home=workdir / "home",
                                 node_name="n1", kill_grace_seconds=1.0)
        keys = Keys(settings.key_prefix)
        direct = Ledger(redis.Redis.from_url(real_url, decode_responses=True), keys)  # no proxy
        direct.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                             max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
        finishing = _running_job(direct)
        waiting = _job(direct)  # the dispatcher places it after the heal

        ledger = Ledger(connect(settings.redis_url), keys)
        dispatcher = Dispatcher(settings, on_start=lambda *a: None, client=connect(settings.redis_url))
        runner = CardRunner(settings, "n1", 0, "card0@n1")
        token = str(direct.store.get(finishing).assignments)
        # Every client has a live pooled connection through the proxy before the cut.
        ledger.cards()
        dispatcher.r.ping()
        runner.r.ping()

        proxy.cut()
        cut_at = time.monotonic()
        paths = [
            _Timed("ledger call", ledger.cards),
            _Timed("dispatcher pass", dispatcher.dispatch_pass),
            _Timed("card worker finish", lambda: runner._finish(finishing, token, AttemptEnd(exit_code=0))),
        ]
        for path in paths:
            path.start()
        bound = REPLY_TIMEOUT_S + SLACK_S
        for path in paths[:2]:
            path.join(bound)
            if path.is_alive():
                result.problems.append(f"{path.name} still blocked {bound:.0f} s into the black hole (hung)")
            elif not isinstance(path.error, redis.TimeoutError | redis.ConnectionError):
                result.problems.append(f"{path.name} ended with {path.error!r}, not a Redis timeout")
            else:
                result.notes.append(f"{path.name}: {type(path.error).__name__} after {path.seconds:.1f} s")
        time.sleep(max(0.0, cut_at + REPLY_TIMEOUT_S + 1.0 - time.monotonic()))
        proxy.heal()
        healed_at = time.monotonic()
        finish = paths[2]
        finish_bound = REPLY_TIMEOUT_S + FINISH_BACKOFF_S + SLACK_S
        finish.join(finish_bound)
        if finish.is_alive():
            result.problems.append(f"card worker finish still blocked {finish_bound:.0f} s after the heal (hung)")
            runner.shutdown.set()
        else:
            result.notes.append(f"card worker finish: done {time.monotonic() - healed_at:.1f} s after the heal "
                                f"({finish.seconds:.1f} s in all), {finish.result}")
        result.notes.append(f"stalled connections left behind: {proxy.stalled()}")

        # Recovery on fresh connections.
        try:
            cards = ledger.cards()
            started = dispatcher.dispatch_pass()
            if len(cards) != 1 or started != 1:
                result.problems.append(f"after the heal: {len(cards)} card(s) read, {started} job(s) placed")
        except redis.RedisError as exc:
            result.problems.append(f"after the heal Redis still fails: {exc!r}")
        done = direct.store.get(finishing)
        if done.state not in TERMINAL_STATES:
            result.lost += 1
            result.problems.append(f"the finished job is {done.state.value}, not ended")
        elif done.state is not JobState.SUCCEEDED:
            result.problems.append(f"the finished job ended {done.state.value}, not SUCCEEDED")
        placed = direct.store.get(waiting)
        held = direct.holdings("n1", 0)
        result.leaked = sum(v for k, v in held.items() if k != waiting or placed.state is not JobState.ASSIGNED)
    finally:
        if runner is not None:
            runner.shutdown.set()
        proxy.close()
        server.terminate()
        server.wait(10)
    result.seconds = time.monotonic() - began
    return result


def _job(ledger: Ledger) -> int:
    job = ledger.store.create(Job(id=0, name="bh", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                  created_at=time.time()))
    return job.id


def _running_job(ledger: Ledger) -> int:
    job_id = _job(ledger)
    ok, token = ledger.reserve(job_id, "n1", [0], GIB)
    assert ok and ledger.claim(job_id, token, "card0@n1")[0]
    return job_id


SCENARIOS = [("redis_black_holed", redis_black_holed)]
