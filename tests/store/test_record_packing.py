"""How a job record is kept in Redis (rig.models.SPEC_FIELDS, rig.packed, JobStore): a compact
hash, the command and folder in a packed spec, the environment in a blob shared by one user's
jobs and freed with the last of them; a missing or damaged part makes the record invalid (the
job is never run without its command or environment)."""

from __future__ import annotations

import pytest

from rig import packed
from rig.archive import Archive, default_url
from rig.archiving import Archiver
from rig.keys import Keys
from rig.ledger import Ledger
from rig.models import ENV_REF, JobState
from tests.store.test_archive import DAY, NOW, finished


@pytest.fixture
def ledger(redis_client, key_prefix) -> Ledger:
    return Ledger(redis_client, Keys(key_prefix))


def test_a_users_jobs_share_one_environment_blob_freed_with_the_last(ledger, tmp_path, key_prefix):
    r, keys = ledger.store.r, ledger.keys
    a, b = finished(ledger, ended=NOW - 3 * DAY), finished(ledger, ended=NOW - 60)
    other = finished(ledger, ended=NOW - 3 * DAY, user="bob")
    ref = r.hget(keys.job(a.id), ENV_REF)
    assert ref == r.hget(keys.job(b.id), ENV_REF) != r.hget(keys.job(other.id), ENV_REF)
    assert r.hget(keys.env_refs, ref) == "2"
    assert "env" not in r.hgetall(keys.job(a.id)) and "command" not in r.hgetall(keys.job(a.id))
    assert ledger.store.get(a.id).env == {"A": "1"} and ledger.store.get(a.id).command == ["python", "train.py"]

    with Archive(default_url(tmp_path), key_prefix) as archive:
        move = Archiver(r, keys, archive, after_seconds=DAY, keep=0)
        assert move.run(NOW).archived == 2  # a and bob's
        assert r.hget(keys.env_refs, ref) == "1" and r.exists(keys.env_blob(ref))  # b still names it
        assert not r.exists(keys.job_spec(a.id))
        assert not r.exists(keys.env_blob(r.hget(keys.job(b.id), ENV_REF) + "x"))
        assert move.run(NOW + 2 * DAY).archived == 1  # b
        assert not r.exists(keys.env_blob(ref)) and not r.hexists(keys.env_refs, ref)
        assert archive.get(b.id).env == {"A": "1"}  # the archive keeps the whole record


def test_a_missing_environment_or_spec_makes_the_record_invalid_never_empty(ledger):
    r, keys = ledger.store.r, ledger.keys
    job = finished(ledger, ended=NOW)
    r.delete(keys.env_blob(r.hget(keys.job(job.id), ENV_REF)))
    got = ledger.store.get(job.id)
    assert got.field_valid("command") and not got.field_valid("env")
    assert "missing or damaged" in got.invalid_reason
    assert ledger.store.get(job.id, without=("env",)).problems == []  # ending it needs no environment
    r.set(keys.job_spec(job.id), "z1:not-base85-{}")
    assert not ledger.store.get(job.id).field_valid("command")
    r.delete(keys.job_spec(job.id))
    assert "field command: missing" in ledger.store.get(job.id).problems


def test_a_record_written_whole_into_the_hash_is_read_as_before(ledger):
    r, keys = ledger.store.r, ledger.keys
    job = finished(ledger, ended=NOW, state=JobState.FAILED, failure="cuda_oom")
    r.hset(keys.job(job.id), mapping={"command": '["echo", "by hand"]', "env": '{"B": "2"}', "workdir": "/x"})
    got = ledger.store.get(job.id)
    assert (got.command, got.env, got.workdir, got.problems) == (["echo", "by hand"], {"B": "2"}, "/x", [])


def test_unpack_refuses_what_is_not_packed_and_bombs():
    assert packed.unpack(packed.pack({"a": [1, 2]})) == {"a": [1, 2]}
    for bad in ("", "{}", "z1:@@@", None, "z1:" + "0" * 10):
        with pytest.raises(ValueError):
            packed.unpack(bad)
    import base64
    import zlib

    bomb = packed.TAG + base64.b85encode(zlib.compress(b"0" * (packed.MAX_UNPACKED + 10))).decode()
    with pytest.raises(ValueError, match="unpacks beyond"):
        packed.unpack(bomb)


def test_a_sweep_whose_jobs_differ_in_one_variable_shares_one_blob(ledger):
    from rig.memory import GIB
    from rig.models import Job, Priority

    r, keys = ledger.store.r, ledger.keys
    base = {f"VAR_{k}": "x" * 20 for k in range(30)}
    jobs = [Job(id=0, name="s", user="ann", command=["python", "t.py"], gpu_memory=GIB, gpus=1,
                priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/w", env={**base, "SEED": str(i)}, created_at=NOW)
            for i in range(20)]
    made = ledger.store.create_many([(j, None) for j in jobs])
    refs = {r.hget(keys.job(j.id), ENV_REF) for j in made}
    assert len(refs) == 1 and r.hget(keys.env_refs, refs.pop()) == "20"  # one blob, not 20 copies
    assert [ledger.store.get(j.id).env for j in made] == [{**base, "SEED": str(i)} for i in range(20)]
    alone = ledger.store.create_many([(Job(id=0, name="o", user="ann", command=["true"], gpu_memory=GIB, gpus=1,
                                           priority=Priority.LOW, state=JobState.PENDING, workdir="/", created_at=NOW,
                                           env={"ONLY": "1"}), None)])[0]
    assert ledger.store.get(alone.id).env == {"ONLY": "1"}
