"""A node's own processes under faults (rig.testing.faults_supervision), through the real
`rig up --daemon`: a SIGKILLed supervisor leaves no worker behind and no second fleet, `rig down`
after it stops what is left, a private Redis whose restart fails comes back by itself. And
item 8: a folder named rig/workers/celery where the operator stands does not break `rig up`."""

from __future__ import annotations

import pytest

from rig.testing import faults, faults_supervision

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [name for name, _ in faults_supervision.SCENARIOS])
def test_scenario(name, tmp_path):
    result = dict(faults_supervision.SCENARIOS)[name](tmp_path)
    assert result.jobs > 0
    assert result.ok, faults.table([result])
