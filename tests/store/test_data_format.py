"""Nodes of one cluster run one data format (rig.data_format): rig up refuses to run beside a
live node of an older rig, or on data of a newer one, and stamps the format otherwise
(fakeredis and real Redis)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import fields

import pytest

import rig.keys
from rig.data_format import DATA_FORMAT, FIELD, refusal
from rig.keys import Keys
from rig.models import Job
from rig.nodes import NodeRegistry

#: The fingerprint (schema_fingerprint) of each format's key schema and job record, and of the
#: changes since declared compatible (an older rig reads them right). A change of rig.keys'
#: schema table or of the Job's fields fails here until it is listed: under a new DATA_FORMAT
#: when an older rig would misread the data, else under the same one.
FINGERPRINTS = {
    # 2bf4068303b9: node records carry their config's [pools] (rig.pools); an older rig ignores
    # the field, and a record without it tells nothing.
    # 17ab44445fb1: join:lock, held by a rig up while it checks the pools and registers; an
    # older rig does not take it (it only loses the protection against a simultaneous rig up).
    # f6cb4f2d5bc8: archive:host, archive:previous and archive:pass (rig.archive_cluster); an
    # older rig neither reads nor writes them: it archives as before (no host check), a move by
    # it leaves archive:host naming the old URL, which is then ignored (the host record carries
    # its URL), and rig status falls back to the reader's interval without archive:pass.
    # 8e99968e9500: a job's umask (its submitter's); an older rig ignores the field and runs the
    # job with its worker's umask, as before.
    # b908b4adfacd: a job's own retries, kept by its first `rig retry`; an older rig ignores the field
    # and its `rig retry` gives the job the retrier's max_retries, as before.
    # 557f5189fdbb: a job's processes that outlived SIGKILL (Job.stuck), said by rig show / jobs / kill;
    # an older rig ignores the field (its views say nothing of them, as before).
    # f0d123c6d27c: Job.stuck beside a job's queued_at (when it last went back to the queue,
    # stamped by transition.lua; rig.models.waiting_since falls back to created_at without it):
    # an older rig ignores both.
    # 8ed2dcf5a35d: Job.paused_since (every process of it stopped, state T), said by rig show / jobs;
    # an older rig ignores the field (its views say nothing of a pause, as before); a mark it leaves
    # uncleared at an ending is shown only while the job is RUNNING, and a newer worker clears it.
    # f846ec99d0eb: archive:checked and archive:rollback (rig.rollback: the Redis run_id last
    # checked against the archive, and the last rollback found); an older rig neither reads nor
    # writes them (it neither checks nor waits for the check), and a newer control worker checks
    # Redis itself at once, so a mixed cluster places as before.
    1: {"d9e95e666b68", "2bf4068303b9", "17ab44445fb1", "f6cb4f2d5bc8", "8e99968e9500", "b908b4adfacd",
        "557f5189fdbb", "f0d123c6d27c", "8ed2dcf5a35d", "f846ec99d0eb"},
}


def schema_fingerprint() -> str:
    """sha256 (12 hex) of rig.keys' key schema table (whitespace folded) and the Job's field names."""
    doc = rig.keys.__doc__ or ""
    table = re.sub(r"\s+", " ", doc[doc.index("Key schema"):])
    names = ",".join(f.name for f in fields(Job))
    return hashlib.sha256(f"{table}|{names}".encode()).hexdigest()[:12]


def test_the_format_number_follows_the_schema():
    assert schema_fingerprint() in FINGERPRINTS.get(DATA_FORMAT, set()), (
        f"the key schema (rig.keys) or the job record (rig.models.Job) changed (fingerprint "
        f"{schema_fingerprint()}): if a rig of format {DATA_FORMAT} would misread the new data, bump "
        "rig.data_format.DATA_FORMAT (and say what converts the old data); else add the fingerprint "
        f"under {DATA_FORMAT} in this test's FINGERPRINTS")


@pytest.fixture
def reg(redis_client, key_prefix) -> NodeRegistry:
    return NodeRegistry(redis_client, Keys(key_prefix))


def _older_node(reg: NodeRegistry, name: str, fmt: int | None) -> None:
    """A live node whose rig wrote ``fmt`` (None: a rig from before the number)."""
    reg.register(name, ttl=30)
    if fmt is None:
        reg.r.hdel(reg.keys.node(name), FIELD)
    else:
        reg.r.hset(reg.keys.node(name), FIELD, fmt)


def test_first_node_stamps_the_cluster(reg):
    assert refusal(reg.r, reg.keys, "a", reg.read()) is None
    assert reg.r.hget(reg.keys.installation, FIELD) == str(DATA_FORMAT)
    reg.register("a", ttl=30)
    assert refusal(reg.r, reg.keys, "b", reg.read()) is None  # a peer of the same rig


def test_data_of_a_newer_rig_is_refused_unchanged(reg):
    reg.r.hset(reg.keys.installation, FIELD, DATA_FORMAT + 1)
    line = refusal(reg.r, reg.keys, "a", reg.read())
    assert line and "newer rig" in line and "upgrade rig on this server" in line
    assert reg.r.hget(reg.keys.installation, FIELD) == str(DATA_FORMAT + 1)


@pytest.mark.parametrize("fmt", [None, DATA_FORMAT - 1])
def test_a_live_node_of_an_older_rig_is_named_and_nothing_changes(reg, fmt):
    reg.r.hset(reg.keys.installation, FIELD, max(0, DATA_FORMAT - 1))
    _older_node(reg, "old1", fmt)
    line = refusal(reg.r, reg.keys, "a", reg.read())
    assert line and "old1 still run an older rig" in line and "rig down" in line
    assert reg.r.hget(reg.keys.installation, FIELD) == str(max(0, DATA_FORMAT - 1))
    # Its own name is not "another node": the same node upgraded and started again.
    assert refusal(reg.r, reg.keys, "old1", reg.read()) is None


def test_once_the_older_nodes_are_stopped_the_new_rig_takes_the_data_over(reg):
    _older_node(reg, "old1", None)
    assert reg.mark_stopped("old1")
    assert refusal(reg.r, reg.keys, "a", reg.read()) is None
    assert reg.r.hget(reg.keys.installation, FIELD) == str(DATA_FORMAT)


def test_status_names_an_older_node_started_beside_newer_ones(reg):
    """An older rig cannot know to refuse: started after the newer nodes (the upgrade done in
    the wrong order), it joined and rig status said plainly `node d: up since ...`."""
    from rig.cli.render import node_title
    from rig.data_format import mixed_note

    assert refusal(reg.r, reg.keys, "a", reg.read()) is None
    reg.register("a", ttl=30)
    _older_node(reg, "d", None)
    found = {n.name: n for n in reg.read()}
    assert mixed_note(found["a"]) is None and "rig (data format" not in node_title(found["a"], "a", 0)
    title = node_title(found["d"], "d", 0)
    assert f"node d runs an older rig (data format 0; this rig: {DATA_FORMAT})" in title and "upgrade" in title
    assert reg.mark_stopped("d")
    assert mixed_note(next(n for n in reg.read() if n.name == "d")) is None


def test_a_node_rolled_back_to_a_rig_from_before_the_number_is_older_again(reg):
    """A node upgraded (this rig stamped its record), then rolled back to a rig from before the
    number: that rig's registration rewrites started_at and host but leaves the stamp, so the
    record still read format 1: a newer `rig up` beside it was not refused and `rig status` said
    nothing (seen live with the rig of 049bf76)."""
    from rig.data_format import mixed_note

    reg.register("old1", ttl=30)
    assert next(n for n in reg.read() if n.name == "old1").data_format == DATA_FORMAT
    # what the rig of 049bf76 writes when it registers (its rig.nodes.NodeRegistry.register)
    reg.r.hset(reg.keys.node("old1"), mapping={"started_at": float(reg.r.hget(reg.keys.node("old1"), "started_at")) + 5,
                                               "host": "h"})
    old = next(n for n in reg.read() if n.name == "old1")
    assert old.data_format == 0
    line = refusal(reg.r, reg.keys, "a", reg.read())
    assert line and "old1 still run an older rig (data format 0" in line
    assert "node old1 runs an older rig" in (mixed_note(old) or "")
    reg.register("old1", ttl=30)  # upgraded again
    assert next(n for n in reg.read() if n.name == "old1").data_format == DATA_FORMAT
    assert refusal(reg.r, reg.keys, "a", reg.read()) is None
