"""The fault-injection suite (rig.testing.fault_suite: rig's own faults and the operator's and
users' slips): each scenario must count zero lost, duplicated, leaked and orphaned, and meet
its own expectations (classes, attempts, one beat, what the operator was told)."""

from __future__ import annotations

import pytest

from rig.testing import fault_suite, faults

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [name for name, _ in fault_suite.ALL])
def test_scenario(name, tmp_path):
    result = dict(fault_suite.ALL)[name](tmp_path)
    assert result.jobs > 0
    assert result.ok, faults.table([result])
