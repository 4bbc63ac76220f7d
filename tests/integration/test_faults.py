"""The fault-injection suite (rig.testing.fault_suite: rig's own faults and the operator's and
users' slips): each scenario must count zero lost, duplicated, leaked and orphaned, and meet
its own expectations (classes, attempts, one beat, what the operator was told).

The scenarios mostly wait (for workers to start, for a lease to lapse, for a beat to miss): one
uses ~a quarter of a core over its run. So the selected ones run side by side, each in a fresh
process of its own (environment, clocks and signal handlers are per process), and each test
reports its own. Each scenario already owns its key prefix, homes, ports and gateway socket.
``RIG_FAULT_PARALLEL=1`` runs them one at a time.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

from rig.testing import fault_suite, faults

pytestmark = pytest.mark.slow

NAMES = [name for name, _ in fault_suite.ALL]
#: How many scenarios run at once (each is mostly waiting; 2 cores take 3 well).
PARALLEL = max(1, int(os.environ.get("RIG_FAULT_PARALLEL", "3")))
#: The longest first, so the last to finish is a short one (measured: tens of seconds each).
LONGEST_FIRST = ("password-change-storm", "redis-full-down", "name-taken-over-adopts",
                 "card-leaves-whitelist", "clock-skewed-nodes", "card-leaves-pool")


def same_terminal(columns: str | None, lines: str | None) -> None:
    """The pool's process sees the terminal size variables the suite has: a spawned Python
    finds COLUMNS=80 / LINES=24 set, and `rig status` would lay out its lines for 80 columns."""
    for name, value in (("COLUMNS", columns), ("LINES", lines)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_scenario(name: str, folder: str) -> faults.ScenarioResult:
    """One scenario, in the pool's fresh process."""
    return dict(fault_suite.ALL)[name](Path(folder))


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Every selected scenario started at once on the pool; a test waits for its own."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    order = sorted(selected, key=lambda n: (n not in LONGEST_FIRST,
                                            LONGEST_FIRST.index(n) if n in LONGEST_FIRST else 0,
                                            NAMES.index(n)))
    root = tmp_path_factory.mktemp("faults")
    pool = ProcessPoolExecutor(max_workers=PARALLEL, mp_context=multiprocessing.get_context("spawn"),
                               max_tasks_per_child=1, initializer=same_terminal,
                               initargs=(os.environ.get("COLUMNS"), os.environ.get("LINES")))
    started = {name: pool.submit(run_scenario, name, str(root / name)) for name in order}
    yield started
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", NAMES)
def test_scenario(name: str, outcomes: dict[str, Future]) -> None:
    result = outcomes[name].result()
    assert result.jobs > 0
    assert result.ok, faults.table([result])
