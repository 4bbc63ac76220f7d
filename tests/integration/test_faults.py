"""The fault-injection suite (rig.testing.fault_suite: rig's own faults and the operator's and
users' slips): each scenario must count zero lost, duplicated, leaked and orphaned, and meet
its own expectations (classes, attempts, one beat, what the operator was told).

The scenarios mostly wait (for workers to start, for a lease to lapse, for a beat to miss): one
uses ~a quarter of a core over its run. So the selected ones run side by side, each in a fresh
process of its own (environment, clocks and signal handlers are per process), and each test
reports its own. Each scenario already owns its key prefix, homes, ports and gateway socket.

They start as soon as the session has collected its tests (tests/conftest.py calls
:func:`start_early`), ``RIG_FAULT_BACKGROUND`` (2) at a time while the rest of the suite runs,
and this module's tests run last (the same conftest orders them), when ``RIG_FAULT_PARALLEL``
(3) run at a time. ``RIG_FAULT_BACKGROUND=0`` starts them only when this module's first test
runs; ``RIG_FAULT_PARALLEL=1`` runs them one at a time.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

from rig.testing import fault_suite, faults
from tests.conftest import FAULT_TESTS

pytestmark = pytest.mark.slow

NAMES = [name for name, _ in fault_suite.ALL]
#: How many scenarios run at once once the rest of the suite is done (each is mostly waiting;
#: 2 cores take 3 well).
PARALLEL = max(1, int(os.environ.get("RIG_FAULT_PARALLEL", "3")))
#: How many run at once while the rest of the suite runs beside them (0: none until this module).
BACKGROUND = max(0, min(PARALLEL, int(os.environ.get("RIG_FAULT_BACKGROUND", "2"))))
#: The longest first, so the last to finish is a short one (measured: tens of seconds each).
LONGEST_FIRST = ("password-change-storm", "redis-full-down", "clock-skewed-nodes",
                 "card-leaves-pool", "node-lost", "card-leaves-node", "forget-stopped-node",
                 "config-slips", "supervisor-sigkill", "password-changed", "redis_black_holed",
                 "name-taken-over-adopts", "random-failures", "down-after-crash",
                 "card-leaves-whitelist")


def same_start(environ: dict[str, str], cwd: str) -> None:
    """Each pool process starts from the suite's environment and working folder as they were
    when the pool was made: a process spawned later (one per scenario) would otherwise take a
    test's monkeypatched RIG_* variables or its folder (whose rig.toml a scenario's settings then
    read: CI failed once on a test's bad [templates]); the terminal size variables included (a
    spawned Python finds COLUMNS=80 / LINES=24 set, and `rig status` would lay out 80 columns)."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)


def run_scenario(name: str, folder: str) -> faults.ScenarioResult:
    """One scenario, in the pool's fresh process."""
    return dict(fault_suite.ALL)[name](Path(folder))


class Scenarios:
    """The selected scenarios on a pool of PARALLEL fresh processes, the longest first, at most
    ``limit`` at a time (raised by :meth:`full_speed`). ``futures[name]`` is each one's result."""

    def __init__(self, names: set[str], root: Path, limit: int) -> None:
        self.root = root
        self.futures: dict[str, Future] = {name: Future() for name in names}
        self._pending = deque(sorted(names, key=lambda n: (n not in LONGEST_FIRST,
                                                           LONGEST_FIRST.index(n) if n in LONGEST_FIRST else 0,
                                                           NAMES.index(n))))
        self._limit = limit
        self._running = 0
        self._closed = False
        self._changed = threading.Condition()
        self._pool = ProcessPoolExecutor(max_workers=PARALLEL, mp_context=multiprocessing.get_context("spawn"),
                                         max_tasks_per_child=1, initializer=same_start,
                                         initargs=(dict(os.environ), os.getcwd()))
        self._feeder = threading.Thread(target=self._feed, name="fault-scenarios", daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        while True:
            with self._changed:
                while self._pending and not self._closed and self._running >= self._limit:
                    self._changed.wait()
                if self._closed or not self._pending:
                    return
                name = self._pending.popleft()
                self._running += 1
            self._pool.submit(run_scenario, name, str(self.root / name)).add_done_callback(
                lambda done, name=name: self._ended(name, done))

    def _ended(self, name: str, done: Future) -> None:
        error = done.exception()
        if error is None:
            self.futures[name].set_result(done.result())
        else:
            self.futures[name].set_exception(error)
        with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def full_speed(self) -> None:
        with self._changed:
            self._limit = PARALLEL
            self._changed.notify_all()

    def close(self) -> None:
        """Start no more; wait for the running ones (each ends within its own timeouts)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._feeder.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for future in self.futures.values():
            if not future.done():
                future.set_exception(RuntimeError("not run: the session ended first"))


_early: dict[str, Scenarios] = {}


def selected(items: list[pytest.Item]) -> set[str]:
    """The scenario names of this module's selected tests."""
    return {item.callspec.params["name"] for item in items
            if item.nodeid.startswith(FAULT_TESTS) and hasattr(item, "callspec")
            and not item.get_closest_marker("skip")}



def start_early(session: pytest.Session) -> None:
    """Called once the session has collected: start the selected scenarios now, BACKGROUND at a
    time, so they run while the rest of the suite does."""
    names = selected(session.items)
    if not names or not BACKGROUND or session.config.option.collectonly:
        return
    factory: pytest.TempPathFactory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    scenarios = Scenarios(names, factory.mktemp("faults"), BACKGROUND)
    _early["scenarios"] = scenarios
    session.config.add_cleanup(scenarios.close)


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Every selected scenario's result; a test waits for its own."""
    scenarios = _early.pop("scenarios", None)
    if scenarios is None:
        scenarios = Scenarios(selected(request.session.items), tmp_path_factory.mktemp("faults"), PARALLEL)
    scenarios.full_speed()
    yield scenarios.futures
    scenarios.close()


@pytest.mark.parametrize("name", NAMES)
def test_scenario(name: str, outcomes: dict[str, Future]) -> None:
    result = outcomes[name].result()
    assert result.jobs > 0
    assert result.ok, faults.table([result])
