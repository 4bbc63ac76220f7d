"""Cards that take no new jobs but still have jobs running on them (issue 11, item 2).

The rule: a job already running on a card is always supervised, concluded and released,
whatever the card's eligibility now; eligibility (``gpu_whitelist``, pools, the card still
being on the node) only governs NEW placements. So:

- ``rig up`` runs a card worker for every card rig may use *and* for every card of this node
  that a job is placed on or running on (:func:`cards_to_serve`): a card that left the
  whitelist, or that is gone from the node (restarted with fewer cards), keeps a worker until
  its jobs end. That worker adopts and supervises them as any card worker does; it starts
  nothing new (:func:`takes_new_jobs`: a start message it gets sends the job back to its place
  in the queue).
- A card that is gone from the node (not in the backend's readings any more) is marked
  ``allowed=0, gone=1`` at registration (:func:`mark_gone_cards`), so nothing new is placed
  there; one that holds nothing is forgotten then (its record removed), so `rig status` stops
  listing it. A card that comes back is registered afresh (``gone`` cleared).

Keys: the card hash (``allowed``, ``gone``, ``jobs``, ``reserved``) and its reservations hash
(rig.keys.Keys.card / card_jobs); job records through rig.store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis

from rig.keys import Keys, card_id, split_card_id
from rig.ledger import Ledger, bump_cards
from rig.models import CardState, Job, JobState
from rig.store import JobStore

#: What `rig status` says of a card that is gone from its node (and why it takes no jobs).
GONE_TEXT = "not on the node any more"
#: ... and of one left out by gpu_whitelist.
NOT_ALLOWED_TEXT = "not in whitelist"


def why_closed(card: CardState) -> str | None:
    """Why ``card`` takes no new jobs for a reason of its node's configuration (gone from the
    node, not in gpu_whitelist), or None when it may take them. Plain text, never markup."""
    if card.gone:
        return GONE_TEXT
    if not card.allowed:
        return NOT_ALLOWED_TEXT
    return None


def cards_with_jobs(client: redis.Redis, keys: Keys, node: str) -> set[int]:
    """Indexes of this node's cards that supervise a job placed or running now: the first card
    of every ASSIGNED or RUNNING job of ``node`` (the card whose worker runs it)."""
    store = JobStore(client, keys)
    ids = store.ids_in_state(JobState.RUNNING) + store.ids_in_state(JobState.ASSIGNED)
    return {j.cards[0] for j in store.get_many(ids)
            if j.node == node and j.cards and j.state in (JobState.RUNNING, JobState.ASSIGNED)}


def cards_to_serve(client: redis.Redis, keys: Keys, node: str, allowed: Iterable[int]) -> list[int]:
    """The cards of ``node`` that need a card worker: those rig may use (``allowed``), and
    those with a job placed or running on them whatever their eligibility now."""
    return sorted(set(allowed) | cards_with_jobs(client, keys, node))


#: The health reason the node's health check gives a card that needs a worker (needs_worker)
#: and has none heartbeating (workers.health); the card's worker clears it when it returns.
NO_WORKER_REASON = "its worker is not running"


def needs_worker(card: CardState) -> bool:
    """Is a missing worker of ``card`` a dead one (its jobs then handled by the health check)?
    Yes for a card rig may use, and for any card still holding a job."""
    return card.allowed or card.jobs > 0 or card.reserved > 0


def drained(client: redis.Redis, keys: Keys, node: str, index: int) -> bool:
    """Has this card's worker nothing left to do: the card takes no new job by configuration
    (outside gpu_whitelist, gone from the node) and no job is placed or running on it, no
    memory reserved? Then `rig up` stops its worker for good (rig.stack.Stack.retire_drained):
    nothing can be placed there again before the next `rig up`, which registers the cards anew."""
    raw = client.hgetall(keys.card(node, index))
    if not raw:
        # No record (Redis lost its data, the card not registered yet): proves nothing.
        return False
    card = CardState.from_redis(raw)
    return (why_closed(card) is not None and not needs_worker(card)
            and index not in cards_with_jobs(client, keys, node))


def takes_new_jobs(client: redis.Redis, keys: Keys, node: str, index: int) -> bool:
    """May a job that has not started yet start on this card now (read fresh)? No when the card
    left the whitelist or the node; its running jobs are not affected."""
    return card_open(*client.hmget(keys.card(node, index), "allowed", "gone"))


def card_open(allowed: str | None, gone: str | None) -> bool:
    """takes_new_jobs from a card's ``allowed`` and ``gone`` fields (read by the caller, e.g.
    in one pipeline with the job's record)."""
    return allowed == "1" and gone != "1"


def mark_gone_cards(client: redis.Redis, keys: Keys, node: str, present: Iterable[int]) -> tuple[list[int], list[int]]:
    """After a registration of ``node`` with the cards ``present``: clear ``gone`` on those,
    and mark every other card of the node gone (``allowed=0, gone=1``: no new placement);
    one that holds no job is removed from the ledger at once. Returns (gone and kept because
    jobs still hold them, removed)."""
    here = set(present)
    for index in here:
        _write(client, keys.card(node, index), lambda pipe, key: pipe.hdel(key, "gone"))
    kept: list[int] = []
    removed: list[int] = []
    for cid in sorted(client.smembers(keys.cards)):
        name, index = split_card_id(cid)
        if name != node or index in here:
            continue
        if forget_if_idle(client, keys, node, index):
            removed.append(index)
        else:
            # Nobody can measure a card that is not there: no reading is shown for it from now.
            _write(client, keys.card(node, index),
                   lambda pipe, key: pipe.hset(key, mapping={"allowed": "0", "gone": "1", **NO_READING}))
            kept.append(index)
    return kept, removed


#: A card record's reading fields, emptied (rig.models.CardState reads "" as no reading).
NO_READING = {"used": "", "utilization": "", "temperature": ""}


def worker_retired(client: redis.Redis, keys: Keys, node: str, index: int) -> None:
    """After `rig up` stopped a drained card's worker for good (rig.stack.Stack.retire_drained):
    a card gone from the node leaves the ledger, as an idle one does at registration; one
    outside gpu_whitelist keeps its record but no reading, since nothing measures it any more
    (its last one would be shown as current for ever: a breaker's finding)."""
    if card_is_gone(client, keys, node, index) and forget_if_idle(client, keys, node, index):
        return
    _write(client, keys.card(node, index), lambda pipe, key: pipe.hset(key, mapping=NO_READING))


def _write(client: redis.Redis, key: str, write: Callable[[Any, str], object]) -> None:
    """``write`` a card record and move its version (rig.ledger.CARD_VERSION), in one transaction."""
    pipe = client.pipeline(transaction=True)
    write(pipe, key)
    bump_cards(pipe, [key])
    pipe.execute()


def forget_if_idle(client: redis.Redis, keys: Keys, node: str, index: int, attempts: int = 5) -> bool:
    """Remove a gone card's record (and its start lists) when nothing holds it (no reservation, no job counted, no
    ASSIGNED/RUNNING job on it), in one WATCHed transaction: a reservation made meanwhile
    leaves it in place. Returns whether it was removed."""
    card, holds = keys.card(node, index), keys.card_jobs(node, index)
    for _ in range(attempts):
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(card, holds)
                jobs, reserved = pipe.hmget(card, "jobs", "reserved")
                if pipe.hlen(holds) or _positive(jobs) or _positive(reserved):
                    return False
                if index in cards_with_jobs(client, keys, node):
                    return False
                pipe.multi()
                # Its start lists hold only stale starts now (no job is placed on it): they go too.
                pipe.delete(card, holds, keys.card_starts(node, index), keys.card_taking(node, index))
                pipe.srem(keys.cards, card_id(node, index))
                pipe.execute()
                return True
            except redis.WatchError:
                continue
    return False


def _positive(value: str | None) -> bool:
    """A counter above zero; a damaged one counts as in use (never forget what may be held)."""
    try:
        return int(value or 0) > 0
    except ValueError:
        return True


def card_is_gone(client: redis.Redis, keys: Keys, node: str, index: int) -> bool:
    """Is this card marked gone from its node (it cannot be read: its worker only supervises)?"""
    return client.hget(keys.card(node, index), "gone") == "1"


def send_back_unstarted(ledger: Ledger, job: Job, node: str, index: int) -> int:
    """A job claimed on a card that takes no new jobs any more, not started: back to its place
    in the queue (its attempt not counted, its reservation given back), to start on a card
    that may take it. Returns the ledger's code (1: moved)."""
    gone = card_is_gone(ledger.r, ledger.keys, node, index)
    why = "is gone from its node" if gone else "left gpu_whitelist"
    code, _ = ledger.transition(
        job.id, JobState.PENDING, token=str(job.assignments), expect=JobState.RUNNING,
        fields={"attempt": max(0, job.attempt - 1),
                "reason": f"requeued: card {card_id(node, index)} {why} before the job started"})
    ledger.r.lpush(ledger.keys.sched_wake, "1")
    return code
