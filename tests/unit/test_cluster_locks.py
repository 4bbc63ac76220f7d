"""The locks that keep one beat and one dispatcher active across nodes are per cluster: two
clusters (key prefixes) on one Redis never share them. No Redis needed."""

from __future__ import annotations

from redbeat.schedulers import RedBeatConfig

from rig.celery_config import make_celery
from rig.config import load_settings
from rig.keys import Keys


def test_beat_lock_lives_under_the_key_prefix_and_expires_quickly():
    a = RedBeatConfig(make_celery(load_settings(key_prefix="clusterA:")))
    b = RedBeatConfig(make_celery(load_settings(key_prefix="clusterB:")))
    assert a.lock_key.startswith("clusterA:") and b.lock_key.startswith("clusterB:")
    assert a.lock_key != b.lock_key
    # A dead node's beat lock frees within this many seconds, then another beat takes it.
    assert 0 < int(a.lock_timeout) <= 10


def test_dispatcher_and_health_locks_are_per_prefix_and_node_checks_per_node():
    a, b = Keys("clusterA:"), Keys("clusterB:")
    assert a.sched_leader != b.sched_leader and a.health_lock != b.health_lock
    assert a.node_health_lock("n1") != a.node_health_lock("n2")
    assert a.node_alive("n1").startswith("clusterA:")
