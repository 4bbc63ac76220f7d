"""One rule for "may this card take a job now": Python (CardState.refusal, which the dispatcher
plans with) and the reservation script (reserve.lua through lib_card.lua) give the same answer
for every card record, on fakeredis and real Redis. Before, a card without `allowed` was
eligible in Python and refused by the script, so every pass retried it for ever."""

from __future__ import annotations

import time

import pytest

from rig.keys import Keys
from rig.ledger import Ledger
from rig.lua import source
from rig.memory import GIB
from rig.models import Job, JobState, Priority

GOOD = {"node": "n1", "index": "0", "uuid": "u", "model": "m", "total": str(100 * GIB),
        "usable": str(80 * GIB), "reserved": "0", "jobs": "0", "max_jobs": "2", "allowed": "1",
        "healthy": "1", "fake": "1", "foreign": "0"}
DROP = object()

#: (name, changes to a good record, bytes asked, the refusal both must give: None = takes it)
CASES = [
    ("good", {}, 10 * GIB, None),
    ("exactly-full", {"reserved": str(70 * GIB)}, 10 * GIB, None),
    ("over-memory", {"reserved": str(75 * GIB)}, 10 * GIB, "full"),
    ("foreign-use", {"foreign": str(75 * GIB)}, 10 * GIB, "full"),
    ("over-job-cap", {"jobs": "2"}, GIB, "busy"),
    ("no-max-jobs-means-1", {"max_jobs": DROP, "jobs": "1"}, GIB, "busy"),
    ("no-reserved-means-0", {"reserved": DROP, "jobs": DROP, "foreign": DROP}, GIB, None),
    ("empty-reserved-means-0", {"reserved": ""}, GIB, None),
    ("not-allowed", {"allowed": "0"}, GIB, "not-allowed"),
    ("unhealthy", {"healthy": "0"}, GIB, "unhealthy"),
    ("no-allowed", {"allowed": DROP}, GIB, "invalid"),
    ("no-healthy", {"healthy": DROP}, GIB, "invalid"),
    ("garbage-allowed", {"allowed": "yes"}, GIB, "invalid"),
    ("garbage-healthy", {"healthy": "x"}, GIB, "invalid"),
    ("no-usable", {"usable": DROP}, GIB, "invalid"),
    ("garbage-usable", {"usable": "lots"}, GIB, "invalid"),
    ("float-usable", {"usable": "8e10"}, GIB, "invalid"),
    ("hex-usable", {"usable": "0x10000000000"}, GIB, "invalid"),
    ("spaced-usable", {"usable": f" {80 * GIB}"}, GIB, "invalid"),
    ("huge-usable", {"usable": str(2**80)}, GIB, "invalid"),
    ("negative-usable", {"usable": "-1"}, GIB, "invalid"),
    ("garbage-reserved", {"reserved": "1.5"}, GIB, "invalid"),
    ("garbage-jobs", {"jobs": "many"}, GIB, "invalid"),
    ("zero-max-jobs", {"max_jobs": "0"}, GIB, "invalid"),
    ("no-total", {"total": DROP}, GIB, "invalid"),
    ("negative-reserved", {"reserved": str(-10 * GIB)}, 85 * GIB, None),
    ("unhealthy-and-full", {"healthy": "0", "reserved": str(80 * GIB)}, GIB, "unhealthy"),
]


@pytest.mark.parametrize(("changes", "nbytes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_python_and_the_reservation_script_agree_on_every_card_record(redis_client, key_prefix, changes,
                                                                      nbytes, expected):
    ledger = Ledger(redis_client, Keys(key_prefix))
    record = {k: v for k, v in {**GOOD, **changes}.items() if v is not DROP}
    holds = _reservations_behind(record)
    key = ledger.keys.card("n1", 0)
    redis_client.hset(key, mapping=record)
    if holds:
        redis_client.hset(ledger.keys.card_jobs("n1", 0), mapping=holds)
    redis_client.sadd(ledger.keys.cards, "n1/0")

    [card] = ledger.cards()
    python = card.refusal(nbytes)
    # The dispatcher's own test (rig.placement.fits) is the same rule.
    assert (card.eligible and card.free >= nbytes and card.jobs < card.max_jobs) == (python is None)
    if python == "invalid":
        assert card.health_reason.startswith("invalid record: field "), card.health_reason

    job = ledger.store.create(Job(id=0, name="t", user="u", command=["true"], gpu_memory=nbytes, gpus=1,
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                  created_at=time.time()))
    ok, detail = ledger.reserve(job.id, "n1", [0], nbytes)
    lua = None if ok else detail.split(":", 1)[0].removeprefix("card-")
    assert (python, lua) == (expected, expected)
    if not ok:  # a refusal changed nothing
        assert redis_client.hgetall(key) == record
        assert redis_client.hgetall(ledger.keys.card_jobs("n1", 0)) == holds


def _reservations_behind(record: dict) -> dict[str, str]:
    """The card's reservations hash its counters stand for (the script puts counters that
    disagree with it back: lib_card.lua's card_recount, tests/store/test_card_counters.py): job
    id -> bytes, as many as `jobs` (one when only `reserved` is set, and `jobs` made 1), summing
    to `reserved`. Nothing for counters that are not plain integers (the rule refuses those)."""
    try:
        reserved, jobs = int(record.get("reserved") or 0), int(record.get("jobs") or 0)
    except ValueError:
        return {}
    if jobs == 0 and reserved != 0:
        record["jobs"], jobs = "1", 1
    return {str(900 + i): str(reserved if i == 0 else 0) for i in range(jobs)}


def test_every_script_is_whole_after_its_snippets_are_put_in():
    for name in ("reserve", "claim", "transition", "reclaim", "observe", "unqueue"):
        assert "--#include" not in source(name)
    assert source("reserve").count("local function leave_queues") == 1
    assert "local function card_refusal" in source("reserve")
