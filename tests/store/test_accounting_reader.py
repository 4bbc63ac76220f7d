"""History's reader of finished jobs for rig usage (rig.history.AccountingReader) parses only
the fields accounting reads; the accounting of what it reads is accounting_of(Job.from_redis)
of the same HMGET, record for record, over random, damaged and hostile records, and what
History.usage adds up from Redis is the straightforward per-job computation."""

from __future__ import annotations

import json
import random

from rig.accounting import DAY, accounting_of
from rig.config import load_settings
from rig.history import ACCOUNTING_FIELDS, AccountingReader, History
from rig.keys import Keys
from rig.memory import GIB
from rig.models import TERMINAL_STATES, Job, JobState
from tests.store.test_archive import NOW, ledger  # noqa: F401 - fixture

NUMBERS = ["0", "1", "-1", "12.0", " 7 ", "1e400", "nan", "inf", "-inf", "1" * 41, "0x10", "1_000", "true",
           "3.5", "2e9", "99999999999999999999", "", "abc", "٣"]
TEXTS = ["ann", "", " ", "a b", "x" * 200, "é", "\x00", "(none)", "n1", "bob\n", "-", "ann"]


def attempts_text(rng: random.Random) -> str:
    """A JSON list of attempts, mostly well formed, often damaged (types, values, shapes)."""
    roll = rng.random()
    if roll < 0.1:
        return rng.choice(["", "[]", "{}", "[1]", "null", "not json", "[{}]", '[{"cards": [-1]}]', '[{"cards": "x"}]',
                           '[{"started_at": true, "ended_at": 5}]', '[{"node": 3}]', '[{"evidence": [1]}]',
                           '[{"started_at": "5", "ended_at": 9}]', '[{"started_at": NaN, "ended_at": 9}]'])
    out = []
    begin = NOW - rng.uniform(0, 30 * DAY)
    for n in range(rng.choice([0, 1, 1, 2, 3])):
        stop = begin + rng.choice([rng.uniform(0, 7200), -5.0, 0.0])
        attempt = {"attempt": n + 1, "node": rng.choice(["n1", "n2", "", None]),
                   "cards": rng.choice([None, [], [0], [0, 1], [0, 1, 2, 3]]),
                   "started_at": rng.choice([begin, None, int(begin)]), "ended_at": rng.choice([stop, stop, None]),
                   "gpu_memory": rng.choice([None, 0, rng.randint(1, 80) * GIB, 1.5 * GIB]),
                   "vram_mean": rng.choice([None, 0, rng.randint(0, 80) * GIB])}
        if rng.random() < 0.05:
            attempt[rng.choice(list(attempt))] = rng.choice(["x", True, [1], {"a": 1}])
        out.append(attempt)
        begin = stop + rng.uniform(0, 600)
    return json.dumps(out)


def value(rng: random.Random, name: str) -> str | None:
    """One field of a record: absent, empty, valid or damaged."""
    roll = rng.random()
    if roll < 0.08:
        return None
    if roll < 0.14:
        return ""
    hostile = roll < 0.3
    if name == "attempts":
        return attempts_text(rng)
    if name == "state":
        return rng.choice([*(s.value for s in JobState), "succeeded", "DONE", "FAILED "]) if hostile else \
            rng.choice([s.value for s in TERMINAL_STATES])
    if name in ("created_at", "started_at", "ended_at"):
        return rng.choice(NUMBERS) if hostile else repr(NOW - rng.uniform(0, 40 * DAY))
    if name in ("id", "gpus", "gpu_memory"):
        good = {"id": str(rng.randint(1, 10**6)), "gpus": str(rng.randint(1, 8)),
                "gpu_memory": str(rng.randint(1, 80) * GIB)}[name]
        return rng.choice(NUMBERS) if hostile else good
    if name == "instance":
        return rng.choice(["", "zz", "0" * 40, "ab" * 20, "ABCDEF", "g1"]) if hostile else rng.choice(["b1", "a2f3"])
    if name == "failure":
        return rng.choice(TEXTS) if hostile else rng.choice(["cuda_oom", "timeout", "nonzero_exit"])
    return rng.choice(TEXTS) if hostile else rng.choice(["ann", "bob", "train", "n1", "a100", "finetune"])


def the_slow_way(values: list, since: float | None) -> Job | None:
    """What History read before the reader: Job.from_redis of the HMGET, then the filters."""
    raw = {k: v for k, v in zip(ACCOUNTING_FIELDS, values, strict=True) if v is not None}
    if not raw:
        return None
    job = Job.from_redis(raw)
    if job.state not in TERMINAL_STATES or (since is not None and (job.ended_at or 0) < since):
        return None
    return job


def test_the_reader_gives_from_redis_accounting_on_random_and_hostile_records():
    rng = random.Random(15)
    reader = AccountingReader()  # one reader for all: its memory of checked values must not leak
    kept = 0
    for n in range(6000):
        values = [value(rng, name) for name in ACCOUNTING_FIELDS]
        if n % 3 == 0:
            values = [v.encode() if isinstance(v, str) else v for v in values]  # a client without decoding
        if n % 97 == 0:
            values = [None] * len(ACCOUNTING_FIELDS)  # the job is gone
        since = rng.choice([None, NOW - 7 * DAY, NOW - 30 * DAY, 0.0])
        slow, fast = the_slow_way(values, since), reader.job(values, since)
        assert (slow is None) == (fast is None), values
        if slow is not None:
            kept += 1
            assert accounting_of(fast) == accounting_of(slow), values
            assert fast.state is slow.state
    assert kept > 1000


def test_history_reads_redis_jobs_as_the_per_job_path_does(ledger, tmp_path, key_prefix):  # noqa: F811
    """Records in Redis' terminal indexes, damaged ones included, and an index entry whose
    record is gone: History's accounting equals accounting_of(Job.from_redis(HGETALL))."""
    rng = random.Random(16)
    r, keys = ledger.store.r, Keys(key_prefix)
    for jid in range(1, 400):
        values = [value(rng, name) for name in ACCOUNTING_FIELDS]
        record = {k: v for k, v in zip(ACCOUNTING_FIELDS, values, strict=True) if v is not None}
        record["id"] = str(jid)
        if jid % 50:  # every 50th: in an index, record gone
            r.hset(keys.job(jid), mapping=record)
        r.zadd(keys.state_index(rng.choice(list(TERMINAL_STATES)).value), {str(jid): jid})
    reader = History(ledger.store, load_settings(key_prefix=key_prefix, home=tmp_path))
    for since in (None, NOW - 7 * DAY, NOW - 20 * DAY):
        expected = []
        for jid in range(1, 400):
            raw = r.hgetall(keys.job(jid))
            if not raw:
                continue
            job = Job.from_redis({k: v for k, v in raw.items() if k in ACCOUNTING_FIELDS})
            if job.state in TERMINAL_STATES and (since is None or (job.ended_at or 0) >= since):
                expected.append(accounting_of(job))
        assert reader._live_accounting(since) == expected  # noqa: SLF001
    reader.close()


def test_history_uses_only_public_names_of_models():
    """The reader follows Job.from_redis through rig.models' public field_value, not copies of
    its private tables (a private import would let the two drift apart unnoticed)."""
    import ast
    import pathlib

    import rig.history
    tree = ast.parse(pathlib.Path(rig.history.__file__).read_text())
    private = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "rig.models"
               for a in node.names if a.name.startswith("_")]
    assert private == []
