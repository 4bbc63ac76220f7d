"""What the dispatcher keeps between passes (parsed card records, parsed running jobs) never
hides a change: a record that changed is parsed again, a damaged one is refused every time."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from workers.dispatcher import Dispatcher


@pytest.fixture
def dispatcher_and_ledger(redis_client, key_prefix):
    ledger = Ledger(redis_client, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u0", model="m", total=40 * GIB),
                         max_jobs=2, reserve_fraction=0.0, allowed=True, fake=True)
    dispatcher = Dispatcher(load_settings(key_prefix=key_prefix, node_name="n1"), lambda *a: None,
                            client=redis_client)
    return dispatcher, ledger


def test_an_unchanged_card_record_is_parsed_once_and_a_changed_one_again(dispatcher_and_ledger):
    dispatcher, ledger = dispatcher_and_ledger
    first = ledger.cards(parse=dispatcher._parse_card)
    assert ledger.cards(parse=dispatcher._parse_card)[0] is first[0]
    ledger.set_healthy("n1", 0, False, "hot")
    again = ledger.cards(parse=dispatcher._parse_card)[0]
    assert again is not first[0] and not again.healthy and again.health_reason == "hot"
    assert again == ledger.cards()[0]  # the same as an uncached read


def test_a_running_job_parse_follows_its_record_and_a_damaged_one_raises_each_time(dispatcher_and_ledger):
    dispatcher, _ledger = dispatcher_and_ledger
    values = ["bob", str(10 * GIB), "[0, 1]", "", "100.5", "60", None, "3600"]
    assert dispatcher._parse_running(7, values) == ("bob", 10 * GIB, 2, 100.5, 60.0, None, 3600.0)
    started = ["bob", str(10 * GIB), "[0, 1]", "200", "100.5", "60", None, "3600"]
    assert dispatcher._parse_running(7, started)[3] == 200.0  # started_at set since: read anew
    damaged = ["bob", "ten", "[0]", "", "", None, None, None]
    for _ in range(2):
        with pytest.raises(ValueError):
            dispatcher._parse_running(8, damaged)


def test_a_stale_view_of_a_card_never_over_reserves_it(dispatcher_and_ledger):
    """The reservation script is the last check: a dispatcher that believes a full card is
    empty (any stale view) gets a refusal, and the card stays within its memory."""
    dispatcher, ledger = dispatcher_and_ledger
    started: list = []
    dispatcher.on_start = lambda *a: started.append(a)
    running = _job(ledger, 30)
    assert ledger.reserve(running, "n1", [0], 30 * GIB, user="alice")[0]
    waiting = _job(ledger, 20)
    real = ledger.cards()
    dispatcher.ledger = ledger = Ledger(ledger.r, ledger.keys)
    ledger.cards = lambda **_kw: [replace(c, reserved=0, jobs=0) for c in real]  # it looks empty
    answers = []
    reserve = ledger.reserve
    ledger.reserve = lambda *a, **kw: answers.append(reserve(*a, **kw)) or answers[-1]
    assert dispatcher.dispatch_pass() == 0 and started == []
    assert answers and all(not ok and detail.startswith("card-full") for ok, detail in answers), answers
    card = Ledger(ledger.r, ledger.keys).cards()[0]
    assert card.reserved == 30 * GIB and card.jobs == 1
    assert ledger.store.get(waiting).state is JobState.PENDING


def _job(ledger: Ledger, gib: int) -> int:
    return ledger.store.create(Job(id=0, name="t", user="alice", command=["true"], gpu_memory=gib * GIB, gpus=1,
                                   priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                   created_at=time.time())).id
