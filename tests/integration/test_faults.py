"""The fault-injection suite (rig.testing.faults): each scenario must count zero lost,
duplicated, leaked and orphaned, and meet its own expectations (classes, attempts, one beat)."""

from __future__ import annotations

import pytest

from rig.testing import faults

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", [name for name, _ in faults.SCENARIOS])
def test_scenario(name, tmp_path):
    result = dict(faults.SCENARIOS)[name](tmp_path)
    assert result.jobs > 0
    assert result.ok, faults.table([result])
