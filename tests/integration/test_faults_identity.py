"""Redis that comes back empty (rig.testing.faults_identity): the node freezes while its jobs
run, `rig recover --stop` moves on, new jobs with reused ids really run."""

from __future__ import annotations

import pytest

from rig.testing import faults, faults_identity

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("jobs_running", [True, False], ids=["jobs-running", "idle"])
def test_redis_came_back_empty(tmp_path, jobs_running):
    result = faults_identity.redis_came_back_empty(tmp_path, jobs_running=jobs_running)
    assert result.jobs > 0
    assert result.ok, faults.table([result])
