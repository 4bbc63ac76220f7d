"""A black-holed Redis connection (half-open: no FIN, no reply) costs each caller at most one
reply timeout, then everything recovers on fresh connections (rig.testing.faults_connection)."""

from __future__ import annotations

import pytest

from rig.testing.faults_connection import redis_black_holed

pytestmark = pytest.mark.slow


def test_redis_black_holed(tmp_path):
    result = redis_black_holed(tmp_path)
    print(result.notes)
    assert result.problems == []
    assert (result.lost, result.duplicated, result.leaked, result.orphans) == (0, 0, 0, 0)
