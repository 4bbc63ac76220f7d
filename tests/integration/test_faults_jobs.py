"""What a job gets and leaves on a real node (rig.testing.faults_jobs)."""

from __future__ import annotations

import pytest

from rig.testing import faults, faults_jobs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", [faults_jobs.operator_environment, faults_jobs.log_flood],
                         ids=["operator-environment", "log-flood"])
def test_scenario(tmp_path, scenario):
    result = scenario(tmp_path)
    assert result.jobs > 0
    assert result.ok, faults.table([result])
