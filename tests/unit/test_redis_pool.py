"""rig's own Redis connections in a process rig up started: one pool for every client of the
process, of at most RIG_REDIS_POOL_LIMIT connections; a thread that finds them all busy waits,
and past POOL_WAIT_S gets one line that names the bound (rig.redis_conn, rig.connections)."""

from __future__ import annotations

import threading

import pytest
import redis

from rig import connections, redis_conn
from rig.config import load_settings
from tests.conftest import REDIS_URL


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(redis_conn.POOL_LIMIT_ENV, "2")
    monkeypatch.setenv("RIG_ROLE", "card")
    monkeypatch.setenv("RIG_CARD_INDEX", "3")
    monkeypatch.setenv("RIG_NODE_NAME", "pool test")
    monkeypatch.setattr(redis_conn, "_SHARED_POOLS", {})
    monkeypatch.setattr(redis_conn, "POOL_WAIT_S", 0.5)
    yield
    for pool in redis_conn._SHARED_POOLS.values():
        pool.disconnect()


def test_clients_of_a_bounded_process_share_one_pool_and_wait_for_a_free_connection(bounded, real_redis):
    a, b = redis_conn.connect(REDIS_URL), redis_conn.connect(REDIS_URL)
    assert a.connection_pool is b.connection_pool
    assert a.connection_pool.max_connections == 2
    held = [a.connection_pool.get_connection(), b.connection_pool.get_connection()]
    # Both busy: a third command waits; it runs once one comes back.
    answered = threading.Event()
    threading.Thread(target=lambda: a.ping() and answered.set(), daemon=True).start()
    assert not answered.wait(0.2)
    a.connection_pool.release(held.pop())
    assert answered.wait(5)
    # Named for CLIENT LIST: rig:<node>:<role><index> (spaces are not allowed in a name).
    assert a.client_getname() == "rig:pool_test:card3"


def test_a_pool_that_stays_busy_says_which_bound_and_where(bounded, real_redis):
    client = redis_conn.connect(REDIS_URL)
    held = [client.connection_pool.get_connection() for _ in range(2)]
    with pytest.raises(redis_conn.PoolExhausted, match=r"all 2 Redis connections of this process .*"
                       r"RIG_REDIS_POOL_LIMIT=2\) stayed busy for 0.5 s"):
        client.ping()
    for conn in held:
        client.connection_pool.release(conn)
    assert client.ping()


def test_a_process_rig_up_did_not_start_is_not_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(redis_conn.POOL_LIMIT_ENV, raising=False)
    client = redis_conn.connect(REDIS_URL)
    assert type(client.connection_pool) is redis.ConnectionPool
    assert client.connection_pool is not redis_conn.connect(REDIS_URL).connection_pool


def test_node_bound_is_the_sum_of_each_process_bound():
    settings = load_settings(max_task_per_gpu=4)
    card = connections.rig_pool_limit("card", settings) + connections.celery_limit(4)
    assert card == 9 + 11
    assert connections.node_bound(settings, 8) == 8 * card + (12 + 11) + (3 + 2 + 1) + (4 + 16) + 8
    assert connections.node_bound(settings, 0, beat=False, flower=False, gateway=False) == 12 + 11
    assert connections.rig_pool_limit("rig-up", settings) is None


def test_flower_keeps_enough_publishing_connections_for_its_workers_page():
    """Flower's workers page asks 8 inspect calls at once, each on a connection of its broker
    pool: with the workers' 2 it never listed them (tests/integration/test_flower_truth.py)."""
    assert connections.broker_pool_limit("flower") >= 8
    assert connections.broker_pool_limit("card") == connections.BROKER_POOL_LIMIT
