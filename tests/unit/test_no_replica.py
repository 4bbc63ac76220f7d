"""Under Sentinel with no replica connected (finding 8 of issue 15): a write does not wait out
replica_wait_seconds every time (it warns at once), and `rig status`, the page's data and
/metrics say that no replica confirms writes. A real master without replica and one sentinel."""

from __future__ import annotations

import time

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.metrics import make_registry
from rig.replication import no_replica_note
from tests.unit.test_server_kind import servers  # noqa: F401 - the module's servers

pytestmark = pytest.mark.slow


@pytest.fixture
def alone(servers, tmp_path, key_prefix) -> Client:  # noqa: F811 - the fixture
    url = f"sentinel://127.0.0.1:{servers['sentinel']}/rigm/0"
    return Client(load_settings(redis_url=url, home=tmp_path / "home", key_prefix=key_prefix,
                                replica_wait_seconds=5.0))


def test_a_write_without_replica_warns_at_once(alone: Client):
    began = time.monotonic()
    assert alone.replicas is not None and alone.replicas.confirm() is False
    assert time.monotonic() - began < 1.0  # not replica_wait_seconds (5 s)


def test_status_and_metrics_say_no_replica_confirms_writes(alone: Client):
    note = no_replica_note(alone.r, alone.settings.redis_url)
    assert note is not None and note.startswith("no replica confirms writes")
    assert note in alone.status().notices  # the page's data shows the same notices
    assert make_registry(alone).get_sample_value("rig_redis_replicas") == 0.0
    assert no_replica_note(alone.r, "redis://127.0.0.1:1/0") is None  # only under Sentinel


def test_rig_up_warns_of_one_sentinel_and_no_live_replica(servers):  # noqa: F811 - the fixture
    """Finding 7: the lines rig up prints (on the terminal of --daemon too: rig.stack.redis_warnings)."""
    from rig.stack import redis_warnings

    lines = redis_warnings(f"sentinel://127.0.0.1:{servers['sentinel']}/rigm/0")
    assert any(line.startswith("redis_url lists one sentinel") for line in lines)
    assert any("know no live replica of 'rigm' (0 known, none up)" in line for line in lines)


def test_a_replica_sentinel_calls_down_is_not_live():
    from rig.sentinel_url import live_replicas

    replicas = [{"name": "a", "flags": "slave"}, {"name": "b", "flags": "slave,s_down"},
                {"name": "c", "flags": {"slave", "o_down"}}, {"name": "d", "flags": "slave,disconnected"}]
    assert [r["name"] for r in live_replicas(replicas)] == ["a"]
