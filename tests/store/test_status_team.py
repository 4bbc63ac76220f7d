"""`rig status` for a team: per-user shares and the per-pool view (fakeredis and real Redis)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput
from rig.keys import Keys
from rig.memory import GIB
from rig.nodes import NodeRegistry
from rig.pools import encode
from tests.store.conftest import add_cards
from tests.store.test_dispatcher_team import make, submit  # noqa: F401 - make is a fixture


@pytest.fixture
def team(redis_client, key_prefix, make):  # noqa: F811 - make is the imported fixture
    ledger, dispatcher, _ = make(pools={"left": ["n1:0"]})
    # The pools are the cluster's, as node n1's rig up records them (rig.pools), not the client's.
    NodeRegistry(redis_client, Keys(key_prefix)).register("n1", ttl=30, pools=encode({"left": ["n1:0"]}))
    client = Client(load_settings(key_prefix=key_prefix, node_name="n1"), redis_client=redis_client)
    return ledger, dispatcher, client


def test_status_shows_each_users_running_held_waiting_and_recent_usage(team, redis_client, key_prefix):
    ledger, dispatcher, client = team
    redis_client.hset(client.keys.usage("bob"), mapping={"value": 10.0, "at": 0})  # long ago: decayed
    submit(ledger, 10, "alice", gpus=2)
    for _ in range(5):
        submit(ledger, 30, "bob")
    dispatcher.dispatch_pass()
    users = {u.user: u for u in client.status().users}
    assert users["alice"].running == 1 and users["alice"].held == 20 * GIB and users["alice"].waiting == 0
    bob = users["bob"]
    assert bob.running >= 1 and bob.held == bob.running * 30 * GIB and bob.running + bob.waiting == 5
    assert users["bob"].recent_gib_hours == pytest.approx(0.0, abs=1e-6)


def test_status_for_a_pool_shows_its_cards_and_its_waiting_jobs(team):
    ledger, _, client = team
    add_cards(ledger, 1, 40, node="n2", max_jobs=2, uuid="x")
    submit(ledger, 1, pool="left")
    submit(ledger, 1, pool="left")
    submit(ledger, 1)
    report = client.status(pool="left")
    assert [c.id for c in report.cards] == ["n1/0"]
    assert sum(report.pending.values()) == 2 and report.pool == "left"
    assert sum(client.status().pending.values()) == 3
    with pytest.raises(InvalidInput, match="unknown pool 'right'"):
        client.status(pool="right")


@pytest.mark.redis
def test_status_pool_flag_at_the_cli(cli_env, real_redis):
    from rig.cli.main import cli

    result = CliRunner().invoke(cli, ["status", "--pool", "nope"])
    assert result.exit_code == 2 and "unknown pool 'nope'" in result.output
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 0 and '"users"' in result.output
