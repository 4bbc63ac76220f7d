"""@rig.task slips and failures a retry cannot help, on a real node (rig.testing.faults_tasks)."""

from __future__ import annotations

import pytest

from rig.testing.faults_tasks import task_slips

pytestmark = pytest.mark.slow


def test_task_slips(tmp_path):
    result = task_slips(tmp_path)
    print(result.notes)
    assert result.problems == []
    assert (result.lost, result.duplicated, result.leaked, result.orphans) == (0, 0, 0, 0)
