"""The CLI fault scenarios (rig.testing.faults_cli) on a real node: each row clean."""

from __future__ import annotations

import pytest

from rig.testing.faults_cli import SCENARIOS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_cli_scenario(name, tmp_path):
    result = SCENARIOS[name](tmp_path / name)
    assert result.ok, result
    assert any(note.startswith("told: ") for note in result.notes), result
