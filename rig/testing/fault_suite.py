"""Every fault-injection scenario, by name, in the order scripts/fault_scenarios.py runs them:
the faults of rig's own machinery (rig.testing.faults) and the operator's and users' slips
(supervision, identity, connections, what a job gets, @rig.task, the CLI's word)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from rig.testing import (
    faults,
    faults_auth,
    faults_cards,
    faults_cli,
    faults_clocks,
    faults_config,
    faults_connection,
    faults_disk,
    faults_identity,
    faults_jobs,
    faults_nodes,
    faults_redis_full,
    faults_sentinel,
    faults_supervision,
    faults_tasks,
)
from rig.testing.faults import ScenarioResult

Scenario = Callable[[Path], ScenarioResult]

ALL: list[tuple[str, Scenario]] = [
    *faults.SCENARIOS,
    *faults_supervision.SCENARIOS,
    *faults_identity.SCENARIOS,
    *faults_connection.SCENARIOS,
    *faults_jobs.SCENARIOS,
    *faults_disk.SCENARIOS,
    *faults_tasks.SCENARIOS,
    *faults_cli.SCENARIOS.items(),
    *faults_config.SCENARIOS,
    *faults_cards.SCENARIOS,
    *faults_redis_full.SCENARIOS,
    *faults_nodes.SCENARIOS,
    *faults_clocks.SCENARIOS,
    *faults_auth.SCENARIOS,
    *faults_sentinel.SCENARIOS,
]


def run(names: list[str] | None = None, root: Path | None = None) -> list[ScenarioResult]:
    """Run the named scenarios (all when None), each in its own folder under ``root``."""
    root = root or Path(tempfile.mkdtemp(prefix="rig-faults-"))
    return [fn(root / name) for name, fn in ALL if not names or name in names]
