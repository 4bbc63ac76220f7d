"""Templates are the cluster's, as pools are (rig.cluster_templates): a breaker's direct client
(one with the Redis password) with another config submitted `--template` by its own templates,
not the node's, and `rig templates` listed its own (fakeredis and real Redis)."""

from __future__ import annotations

import pytest

from rig.cluster_templates import NODE_FIELD, cluster_templates, encode
from rig.config import Template, load_settings
from rig.errors import InvalidInput
from rig.gpus.fake import FakeGpuBackend
from rig.keys import Keys
from rig.memory import GIB
from rig.nodes import NodeInfo
from rig.policy import differences
from rig.policy import encode as encode_policy
from rig.registration import register_node
from tests.store.test_cluster_pools import _submitter

NODE_TEMPLATES = {"nightly": {"gpu_memory": "16G", "priority": "low", "time_limit": "6h"}}


@pytest.fixture
def node(redis_client, key_prefix, tmp_path):
    """Node vm registered as `rig up` does, its config's templates NODE_TEMPLATES (and the shipped ones)."""
    settings = load_settings(key_prefix=key_prefix, node_name="vm", fake_gpus="2x24G", templates=NODE_TEMPLATES,
                             home=tmp_path / "node")
    register_node(settings, redis_client, FakeGpuBackend("2x24G"))
    return settings


def test_the_node_records_its_templates(node, redis_client, key_prefix):
    assert redis_client.hget(Keys(key_prefix).node("vm"), NODE_FIELD) == encode(node.templates)


def test_a_direct_client_submits_by_the_nodes_templates_not_its_own(node, redis_client, key_prefix, tmp_path):
    client = _submitter(redis_client, key_prefix, tmp_path,
                        templates={"nightly": {"gpu_memory": "1G"}, "mine": {"gpu_memory": "2G"}})
    job = client.submit(["true"], template="nightly").record
    assert job.gpu_memory == 16 * GIB and job.priority.value == "low" and job.time_limit == 6 * 3600
    with pytest.raises(InvalidInput, match=r"^unknown template 'mine'; known: .*nightly.*, from node vm's config"):
        client.submit(["true"], template="mine")
    assert set(client.templates()) == set(node.templates) and "mine" not in client.templates()
    [many] = client.submit_many([{"command": ["true"], "template": "nightly"}])
    assert many.record.gpu_memory == 16 * GIB


def test_an_older_node_that_records_none_leaves_the_clients_own(node, redis_client, key_prefix, tmp_path):
    redis_client.hdel(Keys(key_prefix).node("vm"), NODE_FIELD)  # as a rig from before the field
    client = _submitter(redis_client, key_prefix, tmp_path, templates={"mine": {"gpu_memory": "2G"}})
    assert client.submit(["true"], template="mine").record.gpu_memory == 2 * GIB
    assert client.cluster_templates().node is None and "this client's config" in client.cluster_templates().whose


def _info(name: str, started: float, templates: str | None) -> NodeInfo:
    return NodeInfo(name=name, alive=True, state="up", since=started, started_at=started, templates=templates)


def test_the_node_started_last_decides_and_a_damaged_record_tells_nothing():
    own = {"own": Template(gpu_memory="1G")}
    a, b = encode({"a": Template(gpu_memory="2G")}), encode({"b": Template(gpu_memory="3G")})
    assert set(cluster_templates([_info("a", 1.0, a), _info("b", 2.0, b)], own).templates) == {"b"}
    found = cluster_templates([_info("a", 1.0, a), _info("b", 2.0, '{"b": {"margin": 0.1}}')], own)
    assert (set(found.templates), found.node) == ({"a"}, "a")
    assert cluster_templates([_info("b", 2.0, "not json")], own).templates == own


def test_rig_up_warns_when_a_node_up_has_other_templates():
    here = load_settings(templates={"nightly": {"gpu_memory": "8G"}})
    there = load_settings(templates=NODE_TEMPLATES)
    other = NodeInfo(name="a", alive=True, state="up", since=1.0, started_at=1.0, policy=encode_policy(there))
    line = differences("b", here, [other])
    assert line is not None and "\n" not in line and "templates {" in line
    assert "every submission uses the templates of the node started last" in line
    assert differences("b", there, [other]) is None


def test_rig_templates_lists_the_clusters_and_says_whose_when_redis_is_away(monkeypatch, tmp_path):
    """`rig templates` asks the client (the cluster's templates); with Redis unreachable it still
    lists this config's, saying in one stderr line that the cluster's may differ."""
    from click.testing import CliRunner

    from rig.cli.main import cli

    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RIG_TEMPLATES", '{"mine": {"gpu_memory": "2G"}}')
    done = CliRunner().invoke(cli, ["templates"])
    assert done.exit_code == 0, done.output
    assert "mine" in done.stdout and "these are this config's templates; the cluster's" in done.stderr
