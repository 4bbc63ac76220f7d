"""Nodes that apply other rules to users' jobs are said at `rig up` (rig.policy): the leading
dispatcher places, orders and limits by its own node's settings, so with two nodes of one
cluster configured apart (a user limit on one, another scheduler_type on the other) the rules
changed with the lead, without a word."""

from __future__ import annotations

from rig.config import load_settings
from rig.gpus.fake import FakeGpuBackend
from rig.keys import Keys
from rig.nodes import NodeInfo, NodeRegistry
from rig.policy import NODE_FIELD, differences, encode
from rig.registration import register_node


def _info(name: str, settings, state: str = "up", presumed: bool = False) -> NodeInfo:  # noqa: ANN001
    return NodeInfo(name=name, alive=state == "up", state=state, since=1.0, started_at=1.0,
                    presumed_down=presumed, policy=None if settings is None else encode(settings))


def test_differences_name_each_setting_with_both_values():
    here = load_settings(scheduler_type="first-fit", user_limits={"alice": {"max_jobs": 2}}, admins=["bob"])
    there = load_settings()
    line = differences("b", here, [_info("a", there), _info("c", there, "stopped")])
    assert line is not None and "\n" not in line
    assert line.startswith("warning: node(s) a run with other rules than this node's config (")
    assert "scheduler_type first-fit here, multi-factor on a" in line
    assert 'user_limits {"alice":{"max_jobs":2}} here, {} on a' in line
    assert 'admins ["bob"] here, [] on a' in line
    assert "fair_share" not in line  # the same on both
    assert "give every node the same settings" in line


def test_differences_name_the_alert_settings_and_record_the_webhook_as_a_digest():
    """A tester ran two nodes, one with RIG_ALERT_WEBHOOK and [alerts] thresholds of its own, one
    with neither: the alert check ran on either node's control worker, so reserved_idle fired
    twice without a resolve between, failure_rate's firing reached the webhook only as its
    'resolved' (the other node found it, posting nowhere), and rig up said nothing."""
    secret = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    here = load_settings(alert_webhook=secret, alerts={"max_queue": 2})
    there = load_settings()
    assert "XXXXSECRET" not in encode(here)  # the URL is its secret: a digest is recorded
    assert encode(load_settings(alert_webhook=secret)) != encode(load_settings(alert_webhook=secret + "2"))
    line = differences("b", here, [_info("a", there)])
    assert line is not None and "\n" not in line and "XXXXSECRET" not in line
    assert "alert_webhook sha256:" in line and "here, unset on a" in line
    assert '"max_queue":2' in line and '"max_queue":50' in line
    assert "the leading dispatcher's node checks the alerts" in line
    assert "posts each change to its own webhook, or to none" in line
    assert "dispatcher leads" not in line  # the jobs' rules are the same on both
    assert differences("b", here, [_info("a", load_settings(alert_webhook=secret, alerts={"max_queue": 2}))]) is None


def test_no_warning_for_the_same_rules_a_stopped_node_its_own_record_or_an_older_rig():
    here = load_settings(scheduler_type="first-fit")
    other = load_settings()
    assert differences("b", here, [_info("a", load_settings(scheduler_type="first-fit"))]) is None
    assert differences("b", here, [_info("a", other, "stopped"), _info("d", other, "down")]) is None
    assert differences("b", here, [_info("a", other, "silent", presumed=True)]) is None
    assert differences("a", here, [_info("a", other)]) is None  # its own earlier record
    assert differences("b", here, [_info("a", None)]) is None  # an older rig records none
    damaged = NodeInfo(name="a", alive=True, state="up", since=1.0, started_at=1.0, policy="{not json")
    assert differences("b", here, [damaged]) is None


def test_rig_up_beside_a_node_with_other_rules_warns_in_one_line(redis_client, key_prefix, tmp_path):
    from rig.stack import Stack, UpOptions

    a = load_settings(key_prefix=key_prefix, node_name="a", fake_gpus="1x24G", home=tmp_path / "a",
                      user_limits={"alice": {"max_jobs": 2}})
    register_node(a, redis_client, FakeGpuBackend("1x24G"))
    assert redis_client.hget(Keys(key_prefix).node("a"), NODE_FIELD) == encode(a)
    stack = Stack(a.model_copy(update={"node_name": "b", "user_limits": {}}), UpOptions())
    stack._client = redis_client  # only its check is called: no process is started
    said: list[str] = []
    stack.say = said.append  # type: ignore[method-assign]
    stack._check_policy()
    assert len(said) == 1 and 'user_limits {} here, {"alice":{"max_jobs":2}} on a' in said[0]
    NodeRegistry(redis_client, stack.keys).mark_stopped("a")
    said.clear()
    stack._check_policy()  # a stopped node is compared when it comes back
    assert said == []
