"""What the dispatcher keeps between passes (cards and their reservations by version, placed
jobs' fields, parses) never hides a change for long and never oversubscribes a card: a card
whose version moved is read again, a version gone backwards or vanished reads everything
again, a refused reservation too, and reserve.lua checks the card itself."""
from __future__ import annotations

import time

import pytest

from rig.config import load_settings
from rig.draining import mark_gone_cards
from rig.gpus.base import GpuReading
from rig.ledger import CARD_VERSION, Ledger, bump_cards
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher


@pytest.fixture
def dispatcher_and_ledger(redis_client, key_prefix, make_ledger):
    ledger = make_ledger(1, 40, max_jobs=2)
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


def test_a_stale_kept_card_never_over_reserves_it_and_is_read_again(dispatcher_and_ledger):
    """The reservation script is the last check: a dispatcher whose kept card is stale (here a
    reservation written without moving the card's version, as no rig writer does) believes
    the full card empty, gets a refusal, stays within the card's memory, and reads every card
    again, so the next try sees the truth."""
    dispatcher, ledger = dispatcher_and_ledger
    started: list = []
    dispatcher.on_start = lambda *a: started.append(a)
    assert dispatcher.dispatch_pass() == 0  # nothing waits: the empty card is kept
    running = _job(ledger, 30)
    r, keys = ledger.r, ledger.keys
    r.hset(keys.card_jobs("n1", 0), str(running), 30 * GIB)  # behind the version's back
    r.hset(keys.card("n1", 0), mapping={"reserved": 30 * GIB, "jobs": 1})
    waiting = _job(ledger, 20)
    answers = []
    reserve = dispatcher.ledger.reserve
    dispatcher.ledger.reserve = lambda *a, **kw: answers.append(reserve(*a, **kw)) or answers[-1]
    assert dispatcher.dispatch_pass() == 0 and started == []
    assert len(answers) == 1 and not answers[0][0] and answers[0][1].startswith("card-full"), answers
    card = ledger.cards()[0]
    assert card.reserved == 30 * GIB and card.jobs == 1
    assert ledger.store.get(waiting).state is JobState.PENDING
    assert dispatcher._read_cards()[0].reserved == 30 * GIB  # read again after the refusal
    assert dispatcher.dispatch_pass() == 0 and len(answers) == 1  # and not tried again


def test_a_card_changed_by_another_process_is_seen_by_the_next_pass(dispatcher_and_ledger, redis_client):
    """Another process's ledger (its own connection) ends the job filling the card and marks
    another card unhealthy: the next pass reads both cards again and starts the waiting job on
    the freed one; an unchanged card is not read again."""
    dispatcher, ledger = dispatcher_and_ledger
    add_cards(ledger, 2, 40, max_jobs=2, first=1)
    placed: list = []
    dispatcher.on_start = lambda *a: placed.append(a)
    other = Ledger(redis_client, ledger.keys)
    fillers = [_job(ledger, 30) for _ in range(3)]
    tokens = [other.reserve(jid, "n1", [i], 30 * GIB, user="alice")[1] for i, jid in enumerate(fillers)]
    waiting = _job(ledger, 20)
    assert dispatcher.dispatch_pass() == 0 and not placed
    kept = dict(dispatcher._kept)
    other.transition(fillers[1], JobState.SUCCEEDED, token=tokens[1])  # frees n1/1
    other.set_healthy("n1", 2, False, "hot")
    assert dispatcher.dispatch_pass() == 1
    assert placed[0][0] == waiting and placed[0][2:] == ("n1", 1)
    assert dispatcher._kept["n1/0"] is kept["n1/0"]  # unchanged: not read again
    assert dispatcher._kept["n1/2"][1].health_reason == "hot"


def test_versions_gone_backwards_or_vanished_read_everything_again(dispatcher_and_ledger):
    """Redis emptied or rolled back: a card's version that went backwards, or vanished, makes
    the pass read every card again, including one whose version happens to be the one kept
    but whose content is not what was kept (rolled back, then changed as often)."""
    dispatcher, ledger = dispatcher_and_ledger
    add_cards(ledger, 1, 40, max_jobs=2, first=1)
    r, keys = ledger.r, ledger.keys
    for foreign, damage in ((5 * GIB, "backwards"), (7 * GIB, "vanished")):
        before = dispatcher._read_cards()[1].foreign
        # Card 1 changed behind its version's back (what a rollback can look like) ...
        r.hset(keys.card("n1", 1), "foreign", foreign)
        assert dispatcher._read_cards()[1].foreign == before  # its version did not move: kept
        # ... and card 0's version went backwards, or is gone.
        if damage == "backwards":
            r.hset(keys.card("n1", 0), CARD_VERSION, 1)
        else:
            r.hdel(keys.card("n1", 0), CARD_VERSION)
        assert dispatcher._read_cards()[1].foreign == foreign, damage
        ledger.set_healthy("n1", 0, True)  # a version again for the next round


def test_a_full_read_every_full_read_s_whatever_the_versions(dispatcher_and_ledger):
    dispatcher, ledger = dispatcher_and_ledger
    dispatcher._read_cards()
    ledger.r.hset(ledger.keys.card("n1", 0), "foreign", 3 * GIB)  # no version moved
    assert dispatcher._read_cards()[0].foreign == 0
    dispatcher._full_read_at -= 31.0  # FULL_READ_S later
    assert dispatcher._read_cards()[0].foreign == 3 * GIB


def test_every_writer_of_a_card_moves_its_version(dispatcher_and_ledger):
    """One rule (lib_card.lua's card_bump) for the Lua scripts and the Python writers: each
    write of a card or of its reservations moves its version; none creates a missing card."""
    _dispatcher, ledger = dispatcher_and_ledger
    r, keys = ledger.r, ledger.keys

    def version() -> int:
        return int(r.hget(keys.card("n1", 0), CARD_VERSION))

    first = version()
    jid, held = _job(ledger, 10), _job(ledger, 1)
    steps = [
        lambda: ledger.record_reading("n1", GpuReading(index=0, uuid="u0", model="m", total=40 * GIB, used=GIB)),
        lambda: ledger.set_healthy("n1", 0, True),
        lambda: ledger.set_foreign("n1", 0, GIB),
        lambda: ledger.reserve(jid, "n1", [0], 10 * GIB, user="alice"),
        lambda: ledger.observe("n1", 0, jid, 12 * GIB, 50, 10 * GIB),
        lambda: ledger.transition(jid, JobState.FAILED, token=1),
        lambda: (r.hset(keys.card_jobs("n1", 0), "999", GIB), ledger.reclaim("n1", 0, 999)),
        lambda: mark_gone_cards(r, keys, "n1", [0]),
        lambda: ledger.reserve(held, "n1", [0], GIB, user="alice"),
        lambda: mark_gone_cards(r, keys, "n1", []),  # gone, kept: a job holds it
    ]
    for n, step in enumerate(steps, 1):
        step()
        assert version() == first + n, n
    add_cards(ledger, 1, 40, max_jobs=2)
    assert version() == first + len(steps) + 2  # registration and its reading
    pipe = r.pipeline(transaction=True)
    bump_cards(pipe, [keys.card("n1", 9)])
    pipe.execute()
    assert not r.exists(keys.card("n1", 9))  # no such card: a version alone does not make one


def test_a_damaged_version_never_stops_a_reservation_half_way(dispatcher_and_ledger):
    _dispatcher, ledger = dispatcher_and_ledger
    ledger.r.hset(ledger.keys.card("n1", 0), CARD_VERSION, "not a number")
    jid = _job(ledger, 10)
    assert ledger.reserve(jid, "n1", [0], 10 * GIB, user="alice")[0]
    card = ledger.cards()[0]
    assert card.reserved == 10 * GIB and card.jobs == 1
    assert ledger.r.hget(ledger.keys.card("n1", 0), CARD_VERSION) == "1"


def _job(ledger: Ledger, gib: int) -> int:
    return ledger.store.create(Job(id=0, name="t", user="alice", command=["true"], gpu_memory=gib * GIB, gpus=1,
                                   priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                   created_at=time.time())).id
