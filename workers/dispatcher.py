"""The dispatcher: offers waiting jobs to the cards in priority order and starts each one that
fits through the atomic reservation, which also pushes its start onto that card's start list
(reserve.lua; the card's worker takes it from there: workers.start_list).

Order: priority (high, medium, low) after aging (a job moves up one level for every
``aging_seconds`` it has waited, so low-priority work cannot starve); within a priority, fair
share: the user with the least recent usage (rig.fairshare: decayed GiB-hours, a running job
counting from the moment it is placed) goes next, so when several users compete their starts
alternate; within one user, ``queue_order``: largest request (memory x cards) first by default
— first-fit-decreasing packs better (scripts/sim_policies.py: 1.20 x the lower bound against
1.24 for FIFO on the mixed traces) and the small jobs still start beside the big ones — or FIFO. A job over its user's limit (placed-or-running jobs, reserved
GiB) waits with that reason. A job with ``pool`` only sees that pool's cards (rig.pools).

No starvation of big jobs, with backfill (EASY): a job that cannot start now may let jobs behind
it start on any card that fits them — until it has waited long enough (at once for high
priority, ``hold_after_seconds`` for medium, twice that for low). From then on it holds the
card(s) expected to have room for it first; its shadow time comes from the expected ends of the
jobs on them (rig.estimates: their own history, or recent runs of their size, and for a job
already running its conditional remaining time; never later than a time limit's end). It keeps
those cards from pass to pass (its record's ``last_held_cards``) while rig.placement.keeps_hold says
they are about as good as the best plan. A job behind it may still start on a held card if it ends by the shadow time — surely (its time limit)
or, for backfill_estimate_delay_seconds after the hold began, by its cautious estimate — or if
it leaves room for the held job (counting the expected ends of jobs there before the hold, only
the sure ends of later ones); where the shadow time is unknown, nothing starts on the held card.
(Holding without backfill cost packing: 1.26 x the lower bound instead of 1.17 on the mixed
trace, measured with the offline reference in rig/testing/trace.py.) A job that could never fit
any allowed card of its pool is ended FAILED with the reason; so is a job whose record is
invalid.

Each pass reads at most LOOKAHEAD waiting jobs per priority from the global queue plus, when
several users wait, the head of every user's queue (USER_LOOKAHEAD each, fewer when there are
many users: USERS_BUDGET in all, at least one each), so a second user's jobs are seen behind a
first user's thousand; only the fields placement needs; and, when a round needs them, the
reservations now held (at most cards x max_task_per_gpu jobs); each kind of record in one
Redis command (rig.hashes). Ids left in a queue whose job is no longer PENDING are taken out as
they are met. When no card has room for anything, the pass ends after the cards are read.

What a pass costs does not grow with cards x jobs read (issue 15; figures in docs/PERFORMANCE.md,
"Cluster scale"): the cards as a round sees them (_View) are indexed by room per pool
(rig.card_index.RoomIndex, carried from view to view through each start's changes), which
answers which request sizes could be placed at all (rig.placement.Capacity's answer), so a job
that fits nowhere costs O(1), and which cards take a request, so place looks at those only;
hold plans come from per-size sorted options (HoldPlanner, its per-node heaps carried through
starts too, each card's release steps worked out once for every request size); a request that
found no cards in a round is not placed again with the same closed held cards (cards only lose
room within a round); which held cards are closed to a job is worked out once per (rank, size,
backfill ends) over the held cards only, and again for a held card only when a job starts on it;
and the wait sentence's body
(rig.waiting.explain_body) is remembered by what it reads (rig.waiting.body_key), so a job
waiting pass after pass for the same reason is worded once, and jobs alike share one body; a
body is worded over the view's cards sorted once (rig.placement.CardWalk), less its held cards,
not by walks over every card. A start changes the view; the token of the new view's cards is
derived from the old one's (and a round's first view's from the last round's last view's).
A pass's rounds decide at one instant (the first round's clock reading, for up to
PASS_INSTANT_S): the round after the starts (another round runs after any start while holds exist
or jobs wait beyond the heads read) then takes from the rounds before what depends only on now and
on inputs that did not change: each node's hold plan options (HoldPlanner's memo, kept while the
node's rig.placement.option_inputs are equal) and never_fits' answers (kept while the cards'
sizes are). Decisions and sentences are the same as without these shortcuts (tests/unit/test_placement_scale.py,
test_card_index.py, test_wait_walk.py, tests/store/test_dispatcher_shortcuts.py; a frozen-clock comparison with the
code before them found every start and every stored reason equal).

Kept between passes (issue 15): the cards and their reservations, by version. Every write of a
card record or of its reservations moves the card's version (rig.ledger.CARD_VERSION) in the
same script or transaction, and a round reads back only the cards whose version moved
(rig/lua/read_cards.lua, one script call: record and reservations together). The placed jobs'
fields (for fair share and the holds' shadow times) are read again only when their card's
reservations of them change, while they have not started (the claim sets started_at without
touching a card), and when this dispatcher places them; their estimate is worked out again only
when those fields or the cluster's recent runs change (an estimate new runs leave equal keeps its
entry, and so its ends), and their expected and sure ends only once the clock passes the first
moment either could move (_end_steady_until; the rest of what depends on now, their age and
fair-share charge, every round). A kept card may be stale, as one read a moment ago may:
reserve.lua checks the card itself, and a refused reservation makes the next round read every
card again. A version gone backwards or vanished (Redis emptied or rolled back), a failed pass
(Redis may have restarted) and every FULL_READ_S read everything again. Card records and placed jobs' fields are also parsed once
per content (a changed record is a new key).

A pass that changed nothing is repeated, not worked out again (issue 15, branch idlepass): a
round that started, ended and marked nothing keeps what it decided from (_Repeat) and the first
moment at which the clock alone could change one of its decisions or sentences: a waiting job's
next aging step or hold time, a held job's backfill budget running out, a backfill's estimated
end (now + its estimate) passing a shadow time, a running job's expected end moving (its age
passing the next run time of its kind: until then its end is its start plus the median of the
longer runs, a fixed moment; once it has outlived them all, or its time limit, it moves with the
clock and nothing is repeated) and two users' fair-share usage crossing (no sooner than their
gap over how fast it can close). The next round that reads the same cards (the very objects
kept by version), waiting jobs (every field a decision reads), users, recent runs, unstarted
placed jobs, usage and nodes before that moment gives _note the same reasons in the same order
and ends: what is written (a changed reason, a re-stamp every REFRESH_S) is what a full round
writes (tests/store/test_dispatcher_repeat.py runs both side by side with the clock moving).
The cards' reservations are compared too (a record alike may hold other jobs). FULL_READ_S's
full read keeps this memo (_full_read): the next pass compares it with the cards, reservations
and every placed job's fields read afresh, so an idle cluster is not worked out in full each
FULL_READ_S, and a write that moved no version is still seen then (test_dispatcher_full_read.py).
Sentences name a hold's expected time as an absolute time, so they do not move with the clock.

Runs as a thread in the control worker. Several dispatchers may run (several nodes): one holds
the leader lock at a time; the reservation script keeps the ledger safe regardless.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import json
import logging
import math
import os
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import redis

from rig import estimates, hashes, jobtrace
from rig import records as R
from rig.card_index import RoomIndex
from rig.clock import shared_now
from rig.config import Settings
from rig.errors import InvalidRecord
from rig.failures import FailureClass
from rig.fairshare import MIN_CHARGE_S, TeamState, decay, exceeds_alone, gib_hours, over_limit
from rig.hashes import fields_of, queue_fields
from rig.keys import Keys, card_id, split_card_id
from rig.ledger import Ledger
from rig.lua import source
from rig.models import PRIORITY_BAND, CardState, Job, JobState, Priority
from rig.nodes import NodeInfo, NodeRegistry
from rig.placement import (
    CardWalk,
    Hold,
    HoldPlanner,
    Release,
    Request,
    leaves_room,
    may_backfill,
    never_fits,
    place,
    placeable,
    plan_hold,
)
from rig.pools import Pools
from rig.redis_conn import connect
from rig.redis_writes import is_outage
from rig.rollback import unchecked
from rig.store import JobStore
from rig.waiting import (
    REFRESH_S,
    NodeStates,
    WaitFacts,
    body_key,
    card_token,
    cards_token,
    explain_body,
    explain_tail,
    held_part,
    nodes_token,
)

log = logging.getLogger(__name__)

#: Jobs read from the head of the pending queue per priority, per pass.
LOOKAHEAD = 32
#: Jobs read from the head of each waiting user's queue per priority, per pass.
USER_LOOKAHEAD = 16
#: Jobs read from all users' queues together per priority, per pass (each user at least 1).
USERS_BUDGET = 128
#: Rounds (read, place, start) in one pass; the next pass follows within IDLE_PASS_S.
MAX_ROUNDS = 50
#: Added to a backfilled job's time limit for the time its start takes (s).
START_SLACK_S = 1.0
#: Leader lock lifetime (ms); renewed every pass, passes happen at least once a second.
LEADER_TTL_MS = 5000
#: A pass runs at least this often even without a nudge (s).
IDLE_PASS_S = 1.0
#: Wait sentence bodies remembered across passes (rig.waiting.body_key -> body); then the older half goes.
EXPLAINED_CACHE = 50_000
#: Card records whose parse is remembered (_parse_card); then all are forgotten.
CARD_PARSE_CACHE = 20_000
#: Placed or running jobs' records whose parse is remembered (_parse_running); then all are forgotten.
RUNNING_PARSE_CACHE = 100_000
#: A pass reads every card, reservation and placed job again at least this often (s), whatever
#: the versions say: the backstop for a write that moved no version (a person's redis-cli; Redis
#: rolled back to a snapshot and changed since until a version came back to the one held).
FULL_READ_S = 30.0
#: A pass's rounds decide at the instant its first round read the shared clock while the pass is
#: younger than this (s; then a round reads it again): the rounds after a start decide with the
#: same ``now`` as the starts, so what depends only on now and unchanged inputs (hold plans'
#: options, HoldPlanner's memo) is carried from round to round instead of worked out again.
PASS_INSTANT_S = 1.0
#: Hold plan options remembered between rounds (HoldPlanner's memo: request sizes per pool); then
#: all are forgotten.
PLAN_MEMO_SIZES = 64
#: Cards per read_cards.lua call (two keys each): a bounded script, as rig.hashes.BATCH.
CARDS_BATCH = 1000
#: The fields of a placed or running job that _read_holdings reads (_parse_running parses them).
RUNNING_FIELDS = ("user", "gpu_memory", "cards", "started_at", "assigned_at", "expected_seconds",
                  "cautious_seconds", "time_limit")

OnStart = Callable[[int, str, str, int], None]  # job id, token, node, first card

#: Take the leader lock (2) or renew it when held by us (1); 0 when another dispatcher leads.
_LEAD_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 2 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class Dispatcher:
    #: Repeat a pass that changed nothing without working it out again while its inputs and the
    #: clock's rules allow (_repeats); False: every pass is worked out in full (tests compare both).
    repeat_idle: bool = True
    #: A round's shortcuts that give the plain rule's answers (a request that found no cards is not
    #: placed again with the same closed held cards; a start's cards found by position; a placed
    #: job's expected and sure ends kept until the first moment they could move); False: the
    #: plain way (tests/store/test_dispatcher_shortcuts.py compares both).
    shortcuts: bool = True

    def __init__(self, settings: Settings, on_start: OnStart | None = None, client: redis.Redis | None = None,
                 check_rollback: Callable[[], bool] | None = None):
        """``on_start``: told of each start placed (its start is on the card's list already):
        for tests and benchmarks. ``check_rollback``: runs rig.rollback.check (True once done,
        False when this node cannot); with it, the dispatcher places nothing after a Redis
        restart until Redis was checked (rig.rollback.unchecked)."""
        self.settings = settings
        self.check_rollback = check_rollback
        #: Redis may have restarted since it was last known checked (at start, after an error).
        self._maybe_restarted = check_rollback is not None
        self._run_seen: str | None = None  # the Redis server's run_id at the last pass (_led)
        self._said_unchecked = False
        self.keys = Keys(settings.key_prefix)
        self.r = client or connect(settings.redis_url)
        self.store = JobStore(self.r, self.keys)
        self.ledger = Ledger(self.r, self.keys)
        self.on_start = on_start
        self.identity = f"{settings.node_name}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self._notes: dict[int, str] = {}  # job id -> wait reason, written at the end of a round
        #: job id -> the hold fields to write (held_at: when it began to hold cards; held_cards:
        #: the cards it holds, where they changed), in one round trip before the round's next
        #: reservation and at its end, so every mark precedes any start, as one by one.
        self._marks: dict[int, dict[str, Any]] = {}
        self._nodes: list[NodeInfo] | None = None  # read once per round, when a wait is explained
        self._node_states: NodeStates | None = None  # rig.waiting.NodeStates of _nodes
        self._nodes_token: Hashable = ()  # rig.waiting.nodes_token of _nodes
        #: Wait sentence bodies by what they read (rig.waiting.body_key): jobs that wait pass after
        #: pass for the same reasons are worded once, not once each per pass.
        self._explained: dict[Hashable, tuple[str, bool]] = {}
        #: never_fits by (pool, request) -> (the stand-in of what it reads of the pool's cards, its
        #: answer): kept while the cards' sizes do not change (a start never changes them).
        self._never: dict[tuple[str | None, Request], tuple[Hashable, str | None]] = {}
        self._never_inputs: dict[str | None, tuple[list[CardState], Hashable]] = {}  # per round: pool -> its cards, stand-in
        self._versions = itertools.count()  # tokens of the card views a start makes, and interned ones
        self._interned: dict[Hashable, int] = {}  # large tokens -> small stand-ins (_intern)
        self._prior = estimates.Prior(())  # the cluster's recent runs, read with the round's holdings
        self._backfill_ends: dict[int, tuple[float | None, float | None]] = {}  # per round: backfill_end
        self._read_all = False  # the last _read_waiting saw every waiting job
        #: A card record's fields -> its CardState, shared between passes: never changed in place
        #: (a start makes new instances, dataclasses.replace), so an unchanged record is not checked again.
        self._card_parses: dict[frozenset, CardState] = {}
        self._running_parses: dict[tuple, tuple | Exception] = {}  # (job id, *fields) -> _parse_running's
        #: Kept between passes (_read_cards): card set id -> (its version (rig.ledger.CARD_VERSION),
        #: its CardState, its reservations: job id -> bytes), as last read; a pass re-reads a card
        #: only when its version moved.
        #: card id -> (its version, its record parsed, its reservations, the record as read_cards.lua sent it)
        self._kept: dict[str, tuple[str, CardState, dict[int, int], tuple]] = {}
        #: Reservations by card id (CardState.id) as of the last _read_cards.
        self._reservations: dict[str, dict[int, int]] = {}
        #: Placed or running job id -> its RUNNING_FIELDS as last read: read again when a card's
        #: reservations of it change, while it has no started_at (claim.lua sets it without
        #: touching a card), when this dispatcher places it, and at every full read.
        self._kept_jobs: dict[int, list] = {}
        self._full_read_at = -math.inf  # time.monotonic() of the last full read
        self._read_script: Any = None  # rig/lua/read_cards.lua, registered on first use
        self._scripts: dict[str, Any] = {}  # scripts called by SHA in pipelines (_script_sha)
        self._card_ids: list[str] = []  # the card set as _read_cards last read it, and the keys of
        self._card_keys: list[str] = []  # each card's record and reservations, in that order
        self._prior_read: tuple = ()  # the recent runs self._prior was made from (read every round)
        #: Placed job id -> [its kept fields (the list itself), their parse, its Estimate, the
        #: estimates.Prior it was last found under]: made again when the fields change or a new
        #: Prior (other recent runs) gives another estimate (an equal one keeps the entry, only its
        #: Prior is updated); what depends on now, every round.
        self._running_estimates: dict[int, list] = {}
        #: placed job id -> (its _running_estimates entry, the settings, the clock when worked out,
        #: until when its ends stay put (_end_steady_until), its _read_holdings info): kept while
        #: the entry and settings are the very same objects and the clock is within that span
        self._ends_kept: dict[int, tuple[list, Settings, float, float, tuple]] = {}
        self._reserved_since_read = False  # a reservation was made after the last _read_cards
        self._first_view: _View | None = None  # the last round's view before its first start
        #: The last round's last view's tokens and cards (_View._big, _View.cards): the next round's
        #: first view's tokens are made from them (_View._prior).
        self._last_tokens: tuple[dict[bool, tuple], list[CardState]] | None = None
        #: The last pass that changed nothing, what it decided from and until when (_Repeat): a
        #: pass that finds the same inputs before that moment decides the same (_repeats).
        self._repeat: _Repeat | None = None
        #: The repeat memo outlived a full read (_full_read): what that read dropped (the placed
        #: jobs' fields) is read and compared at the next _repeats, as a full round would read it.
        self._recheck_placed = False
        #: Per round: every (job id, reason) _note was given, in order (a job may be given two: the
        #: hold loop's and the run-order loop's; _note's rule makes the order matter).
        self._decided: list[tuple[int, str]] = []
        self._marked = False  # per round: held_at marks were written
        #: Per round: the ids of the waiting jobs it started or ended (no longer waiting: their
        #: records take no hold marks, _mark_lapsed).
        self._gone: set[int] = set()
        #: Per round: job id -> what its wait sentence reads besides the cards (_note_wait), worded
        #: at the round's end against its last view (_word_waits).
        self._waits: dict[int, tuple] = {}
        self._users_read: list[str] = []  # pending users as the last _read_waiting read them
        #: What the last _read_holdings read beside the kept cards and jobs (recent runs, unstarted
        #: jobs' fields, users' usage), and until when its answer stays the same as the clock moves.
        self._holdings_read: tuple = ()
        self._holdings_steady = math.inf
        #: pool -> HoldPlanner's memo (request bytes -> node -> (now, its option_inputs, its
        #: options)): a round's first planner takes the options of each node whose inputs and now
        #: are those of an earlier round's (the round after a start, within the pass's instant).
        self._plan_memo: dict[str | None, dict[int, dict[str, tuple[float, tuple, list]]]] = {}
        self._thread: threading.Thread | None = None
        self._leading = False  # the last leader check's outcome (_led)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="rig-dispatcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def run_forever(self) -> None:
        delay = 0.2
        woken = False
        while not self.stop_event.is_set():
            try:
                # The wake-ups pushed meanwhile are drained (DEL) in the leader check's round trip,
                # which rides in the pass's first reads while this dispatcher led at the last check.
                if self._maybe_restarted and not self._checked():
                    self.stop_event.wait(IDLE_PASS_S)  # the check is another node's: look again
                    continue
                if self._leading:
                    self.dispatch_pass(check_lead=woken)
                elif self._lead(drain_wake=woken):
                    self.dispatch_pass()
                if self._leading:
                    # Block until nudged (submit, job end, kill) or a second passes, then drain.
                    woken = self.r.blpop([self.keys.sched_wake], timeout=IDLE_PASS_S) is not None
                else:
                    # Standing by: only the leader takes nudges off the list. One taken here would
                    # be lost to the leader, whose next pass then waits for its idle second.
                    woken = False
                    self.stop_event.wait(IDLE_PASS_S)
                jobtrace.mark(None, "wake")
                delay = 0.2
            except Exception as exc:  # noqa: BLE001 - the dispatcher must outlive one bad pass
                self.forget()  # Redis may have restarted (empty, or rolled back): read it all again
                self._maybe_restarted = self.check_rollback is not None
                if is_outage(exc):  # unreachable, or refusing writes (full): nothing was changed
                    log.warning("dispatcher: Redis unavailable, retrying in %.1f s: %s", delay, exc)
                    self.stop_event.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                log.exception("dispatcher pass failed")
                self.stop_event.wait(1.0)
        self._resign()

    @property
    def leading(self) -> bool:
        """Did this dispatcher lead at its last leader check that Redis answered? (A check that
        failed changes nothing: while Redis refuses writes, the last leader still says True.)"""
        return self._leading

    def _checked(self) -> bool:
        """Was Redis checked for a rollback since it started (rig.rollback.unchecked)? Checks it
        now where this node reads the cluster's archive; says once when it must wait."""
        if unchecked(self.r, self.keys, self.settings.archive_interval) and not (
                self.check_rollback is not None and self.check_rollback()):
            if not self._said_unchecked:
                log.warning("dispatcher: Redis restarted and was not yet checked against the archive for jobs "
                            "that already finished (an older copy of its data): placing nothing until the "
                            "archiving node's pass checks it (rig.rollback)")
                self._said_unchecked = True
            return False
        self._maybe_restarted = self._said_unchecked = False
        return True

    def _lead(self, drain_wake: bool = False) -> bool:
        """Take or renew the leader lock, in one round trip (with ``drain_wake``, the pending
        wake-ups are deleted in the same one)."""
        pipe = self.r.pipeline(transaction=False)
        queued = self._queue_lead(pipe, drain_wake)
        replies = pipe.execute()
        return self._led(int(replies[queued - 1]), replies[queued - 2] if self.check_rollback else None)

    def _queue_lead(self, pipe: Any, drain_wake: bool) -> int:
        """Queue on ``pipe`` the leader check (and, with ``drain_wake``, the wake-ups' DEL before
        it; with check_rollback, INFO server just before it); returns how many commands were
        queued: the check's reply is the last of them, INFO's the one before."""
        if drain_wake:
            pipe.delete(self.keys.sched_wake)
        if self.check_rollback is not None:
            pipe.execute_command("INFO", "server")
        pipe.eval(_LEAD_SCRIPT, 1, self.keys.sched_leader, self.identity, LEADER_TTL_MS)
        return 1 + int(drain_wake) + int(self.check_rollback is not None)

    def _led(self, outcome: int, info: Any = None) -> bool:
        """Take the leader check's outcome (2 taken, 1 renewed, 0 another leads): self._leading.
        ``info`` (INFO server, same round trip): a run_id not seen before is a Redis (re)started
        since the last pass, maybe from an older copy: False then, this pass places nothing,
        and run_forever checks Redis (_checked) before the next."""
        if outcome == 2:
            log.info("dispatcher %s is now the leader", self.identity)
        self._leading = outcome > 0
        run = info.get("run_id") if isinstance(info, dict) else None
        if run is not None and run != self._run_seen:
            self._run_seen = run
            self._maybe_restarted = True
        return self._leading and not self._maybe_restarted

    def _resign(self) -> None:
        try:
            if self.r.get(self.keys.sched_leader) == self.identity:
                self.r.delete(self.keys.sched_leader)
        except redis.RedisError:
            pass

    # -- one pass -------------------------------------------------------------------------
    def waiting_in_order(self, now: float | None = None) -> list[Waiting]:
        """The head of each priority's queue (and of each user's), in run order without fair
        share: aged priority, then id."""
        now = now or shared_now(self.r)
        jobs = self._read_waiting()
        return sorted(jobs, key=lambda j: (self.effective_rank(j, now), j.id))

    def _read_waiting(self, prefetched: tuple[set, list[str], list] | None = None) -> list[Waiting]:
        """The queue heads' jobs (global and per user, _queue_heads), parsed; ``prefetched``: the
        pending users and the heads _first_reads read for the users it guessed (read again here
        when the guess was wrong)."""
        if prefetched is None:
            found = self.r.smembers(self.keys.pending_users)
            guessed, replies = None, []
        else:
            found, guessed, replies = prefetched
        users = self._users_read = sorted(found)
        if len(users) <= 1:
            users = []  # one user's queue head is the global head
        # Every waiting user's head is read: with many users, fewer jobs each (at least one),
        # so no user is left unseen and a pass stays bounded.
        per_user = _per_user(users)
        if users != guessed:
            pipe = self.r.pipeline(transaction=False)
            self._queue_heads(pipe, users)
            replies = pipe.execute()
        source: dict[int, str] = {}  # id -> the user queue it was read from ('' = global)
        # Shorter replies than asked for: every waiting job was read (no need for another round
        # to see the jobs behind the ones this round starts).
        self._read_all = all(len(band) < (LOOKAHEAD if position % (len(users) + 1) == 0 else per_user)
                             for position, band in enumerate(replies))
        for position, band in enumerate(replies):
            owner = "" if position % (len(users) + 1) == 0 else users[position % (len(users) + 1) - 1]
            for jid in band:
                if owner or int(jid) not in source:  # a user's queue names it best
                    source[int(jid)] = owner
        ids = sorted(source)
        jobs = []
        for jid, values in zip(ids, self._read_fields([self.keys.job(j) for j in ids], Waiting.FIELDS), strict=True):
            try:
                job = Waiting.parse_cached(jid, values)
            except InvalidRecord as exc:
                self._fail_invalid(jid, f"field {exc.field}: {exc.problem}", source[jid])
                continue
            if job is not None and source[jid] and source[jid] != job.user:
                self._fail_invalid(jid, f"field user: {job.user!r}, but it waits in {source[jid]!r}'s queue",
                                   source[jid])
            elif job is not None:
                jobs.append(job)
            else:  # not PENDING (or gone) yet still queued: out of the queues, or it blocks them
                self.ledger.unqueue(jid, source[jid] or values[Waiting.FIELDS.index("user")] or "?")
        return jobs

    def _queue_heads(self, pipe: Any, users: list[str]) -> None:
        """Queue on ``pipe`` the reads of the queue heads: per priority, the global queue's first
        LOOKAHEAD and each of ``users``' first _per_user(users) (``users`` empty: the global
        queue alone), in the order _read_waiting takes their replies."""
        per_user = _per_user(users)
        for prio in Priority:
            low = prio.rank * PRIORITY_BAND
            pipe.zrangebyscore(self.keys.pending, low, low + PRIORITY_BAND - 1, start=0, num=LOOKAHEAD)
            for user in users:
                pipe.zrangebyscore(self.keys.pending_user(user), low, low + PRIORITY_BAND - 1,
                                   start=0, num=per_user)

    def _script_sha(self, name: str) -> str:
        """The SHA-1 of rig/lua/``name``.lua, registered on this client (loaded on first call)."""
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.r.register_script(source(name))
        return script.sha

    def _load_scripts(self) -> None:
        """SCRIPT LOAD every script this dispatcher calls by SHA (Redis restarted, or flushed)."""
        for script in self._scripts.values():
            self.r.script_load(script.script)

    def _execute_scripts(self, queue: Callable[[Any], None]) -> list:
        """Run the commands ``queue`` puts on a pipeline, its scripts called by EVALSHA
        (_script_sha), in one round trip: redis-py's own script objects make a pipeline ask
        SCRIPT EXISTS first, a round trip of its own, every time. A script Redis no longer has is
        loaded and the commands are queued and run again (reads, or writes that leave the same
        values when run twice); any other error is raised."""
        for attempt in range(2):
            pipe = self.r.pipeline(transaction=False)
            queue(pipe)
            replies = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
                self._load_scripts()
                continue
            break
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _read_fields(self, keys: Sequence[str], fields: Sequence[str]) -> list[list[Any]]:
        """rig.hashes.read_fields (rig/lua/read_hashes.lua, at most rig.hashes.BATCH keys a call)
        in one round trip without its SCRIPT EXISTS (_execute_scripts)."""
        if not keys:
            return []
        sha = self._script_sha("read_hashes")

        def queue(pipe: Any) -> None:
            for start in range(0, len(keys), hashes.BATCH):
                batch = list(keys[start:start + hashes.BATCH])
                pipe.evalsha(sha, len(batch), *batch, *fields)
        return fields_of(self._execute_scripts(queue))

    def _first_reads(self, check_lead: bool | None = None) -> tuple[list[CardState], tuple | None]:
        """A round's cards (_read_cards) and what _read_waiting needs before the heads' fields, in
        one round trip where they took four: the card set, the cards whose version moved
        (read_cards.lua), the pending users and the heads of the queues of the users read last
        time go in one pipeline (then _read_waiting(prefetched) reads the heads' fields, one more).
        A card set that changed (or one too large for one script call, or none kept yet), or
        pending users other than the last ones, are read again as before: the same reads, one
        round trip more. ``check_lead`` (not None): run_forever's leader check (_lead, draining
        the wake-ups when True) rides in the same pipeline, before the reads; when another
        dispatcher leads, ([], None) and self._leading is False."""
        if time.monotonic() - self._full_read_at >= FULL_READ_S:
            self._full_read()
        ids = self._card_ids
        fold = 0 < len(ids) <= CARDS_BATCH
        guessed = self._users_read if len(self._users_read) > 1 else []
        pipe = self.r.pipeline(transaction=False)
        leading = self._queue_lead(pipe, check_lead) if check_lead is not None else 0
        pipe.smembers(self.keys.cards)
        if fold:
            pipe.evalsha(self._script_sha("read_cards"), len(self._card_keys), *self._card_keys,
                         *[self._kept[cid][0] if cid in self._kept else "" for cid in ids])
        pipe.smembers(self.keys.pending_users)
        self._queue_heads(pipe, guessed)
        replies = replies_all = pipe.execute(raise_on_error=False)
        if leading:
            outcome, replies = replies[leading - 1], replies[leading:]
            if isinstance(outcome, Exception):
                raise outcome
            if not self._led(int(outcome), replies_all[leading - 2] if self.check_rollback else None):
                return [], None
        card_set = replies.pop(0)
        script_reply = replies.pop(0) if fold else None
        for reply in (card_set, *replies):
            if isinstance(reply, Exception):
                raise reply
        if fold and not isinstance(script_reply, Exception) and sorted(card_set) == ids:
            cards = self._read_cards(prefetched=(ids, script_reply))
        else:  # NOSCRIPT (loaded by the script object's call) or another card set: read as before
            cards = self._read_cards()
        return cards, (replies[0], guessed, replies[1:])

    def forget(self) -> None:
        """Drop what is kept between passes (cards, reservations, placed jobs): the next pass
        reads them all. After a failed pass (Redis may have restarted empty or rolled back)
        and after a refused reservation (what was kept may be stale)."""
        self._kept.clear()
        self._kept_jobs.clear()
        self._ends_kept.clear()
        self._reservations = {}
        self._repeat = None
        self._recheck_placed = False
        self._plan_memo.clear()

    def _full_read(self) -> None:
        """FULL_READ_S's backstop: forget what is kept (every card, reservation and placed job is
        read again), but not the repeat memo: the next _repeats compares it with all of that read
        afresh (the cards by content, their reservations, every placed job's fields), so a pass
        that finds everything as it was is still repeated (it was worked out in full: the idle
        p95 at 512 cards), and one that finds a write that moved no version is not."""
        memo = self._repeat
        self.forget()
        self._repeat, self._recheck_placed = memo, memo is not None
        self._full_read_at = time.monotonic()

    def _read_cards(self, prefetched: tuple[list[str], list] | None = None) -> list[CardState]:
        """Every registered card, sorted by node then index (as Ledger.cards), with the
        reservations of each in self._reservations: one round trip for the ids, one script call
        (rig/lua/read_cards.lua) that sends back only the cards whose version
        (rig.ledger.CARD_VERSION) moved since they were kept, record and reservations read
        together. A version that went backwards or vanished (Redis emptied or rolled back), and
        every FULL_READ_S, reads everything again. A kept card may be stale by the time it is
        used, as a card read a moment ago may: reserve.lua checks the card itself. ``prefetched``:
        the card ids and read_cards.lua's replies _first_reads read for the kept card set."""
        self._reserved_since_read = False
        if prefetched is not None:  # _first_reads read them, the full read's rule applied
            ids, replies = prefetched
        else:
            ids = sorted(self.r.smembers(self.keys.cards))
            if time.monotonic() - self._full_read_at >= FULL_READ_S:
                self._full_read()
            if ids != self._card_ids:  # the cards' keys, made again only when the set of cards changes
                self._card_ids, self._card_keys = ids, []
                for cid in ids:
                    node, index = split_card_id(cid)
                    self._card_keys += [self.keys.card(node, index), self.keys.card_jobs(node, index)]
            if self._read_script is None:
                self._read_script = self.r.register_script(source("read_cards"))
            replies = []
            for start in range(0, len(ids), CARDS_BATCH):  # called, not pipelined: a pipeline holding a
                batch = ids[start:start + CARDS_BATCH]     # script asks SCRIPT EXISTS first, every time
                replies += self._read_script(keys=self._card_keys[2 * start:2 * (start + len(batch))],
                                             args=[self._kept[cid][0] if cid in self._kept else "" for cid in batch])
        kept: dict[str, tuple[str, CardState, dict[int, int], tuple]] = {}
        moved: set[int] = set()  # placed jobs whose reservations changed: their fields are read again
        for cid, entry in zip(ids, replies, strict=True):
            if len(entry) == 1:
                kept[cid] = self._kept[cid]
                continue
            version, flat, held = entry
            before = self._kept.get(cid)
            if before is not None and before[0] and not _later(version, before[0]):
                # Backwards or gone while the card is still listed: Redis lost or rolled back
                # its data, and other cards may be back at the versions held with other content.
                log.info("dispatcher: card %s's version went from %s to %r; reading every card again",
                         cid, before[0], version)
                self.forget()
                self._full_read_at = time.monotonic()
                return self._read_cards()
            if not flat:
                continue  # listed but no record (not registered yet, or removed meanwhile)
            # The record as sent back is a key too (one tuple, not a dict and a frozenset: the
            # full read every FULL_READ_S parses every card); the same record in another field
            # order misses here and finds the same object by its fields.
            card = self._card_parses.get(flat_key := tuple(flat))
            if card is None and before is not None:
                card = _reparsed(before[1], before[3], flat_key)
            if card is None:
                card = self._parse_card(dict(zip(flat[::2], flat[1::2], strict=True)))
            self._card_parses[flat_key] = card  # (cleared with the parses, CARD_PARSE_CACHE)
            reservations = {int(k): int(v) for k, v in zip(held[::2], held[1::2], strict=True)}
            if before is not None and before[2] != reservations:
                moved.update(reservations, before[2])
            kept[cid] = (version, card, reservations, flat_key)
        self._kept = kept
        for jid in moved:
            self._kept_jobs.pop(jid, None)
        cards = sorted((entry[1] for entry in kept.values()), key=lambda c: (c.node, c.index))
        # Under each record's own node and index, as a read of its reservations hash by the
        # record's fields found them (a damaged record's are '?' and -1, where nothing is).
        self._reservations = {card.id: held if card.id == cid else {} for cid, (_v, card, held, _r) in kept.items()}
        return cards

    def _parse_card(self, raw: dict[Any, Any]) -> CardState:
        """CardState.from_redis(raw), remembered for the same fields and values: at 512 cards
        the checks of every record were ~1/6 of an idle pass, and most records do not change."""
        key = frozenset(raw.items())
        card = self._card_parses.get(key)
        if card is None:
            if len(self._card_parses) >= CARD_PARSE_CACHE:
                self._card_parses.clear()
            card = self._card_parses[key] = CardState.from_redis(raw)
        return card

    def _fail_invalid(self, job_id: int, problem: str, queue_user: str = "") -> None:
        self._gone.add(job_id)
        log.warning("job %s: invalid record, ended: %s", job_id, problem)
        try:
            self.ledger.transition(job_id, JobState.FAILED, fields={"reason": f"invalid record: {problem}"},
                                   error_queue=True, expect=JobState.PENDING)
        except Exception as exc:  # noqa: BLE001 - a record too broken to end must not stop the pass
            if is_outage(exc):
                raise  # Redis' fault, not the record's: it stays queued, the next pass tries again
            log.exception("job %s: could not end the invalid record; removing it from the queues", job_id)
            self.r.zrem(self.keys.pending, job_id)
        if queue_user:  # its user field was bad: the transition used another queue's name
            self.r.zrem(self.keys.pending_user(queue_user), job_id)
            if not self.r.zcard(self.keys.pending_user(queue_user)):
                self.r.srem(self.keys.pending_users, queue_user)

    def _read_holdings(self, cards: list[CardState], now: float) -> tuple[dict[str, list[Release]], TeamState]:
        """What the cards' reservations say: per card, when each is expected to end (for
        holds), and per user, placed-or-running jobs, reserved bytes and recent usage."""
        if self._reserved_since_read or any(c.id not in self._reservations for c in cards):
            self._read_cards()  # this round's own reservations, or cards not read by this dispatcher
        held = [(card, self._reservations.get(card.id, {})) for card in cards]
        recent_users = self.r.zrevrange(self.keys.recent_runtime_users, 0, estimates.RECENT_USERS - 1)
        ids = sorted({jid for _card, jobs in held for jid in jobs})
        kept = self._kept_jobs
        # Read again: jobs not kept (new, or their reservations moved) and jobs not started yet.
        stale = [jid for jid in ids if jid not in kept or not kept[jid][3]]
        pipe = self.r.pipeline(transaction=False)
        estimates.queue_recent(pipe, self.keys, recent_users)
        queue_fields(pipe, [self.keys.job(jid) for jid in stale], RUNNING_FIELDS)
        read = pipe.execute()
        recent = tuple(v for values in read[:len(recent_users)] for v in values)
        if recent != self._prior_read:  # the same runs make the same Prior: kept, with what it worked out
            self._prior = estimates.Prior(estimates.decode_recent(list(recent)))
            self._prior_read = recent
            if not self.shortcuts:
                self._running_estimates.clear()
        prior = self._prior
        kept.update(zip(stale, fields_of(read[len(recent_users):]), strict=True))
        if len(kept) > len(ids):  # jobs no card holds any more
            self._kept_jobs = kept = {jid: kept[jid] for jid in ids}
        known = self._running_estimates
        if len(known) > len(ids):
            self._running_estimates = known = {jid: known[jid] for jid in ids if jid in known}
        info: dict[int, tuple[str, int, int, float, float, float]] = {}
        steady = math.inf  # until when every end worked out here stays what it is now (epoch s)
        ends = self._ends_kept
        if len(ends) > len(ids) or not self.shortcuts:
            self._ends_kept = ends = {jid: ends[jid] for jid in ids if jid in ends} if self.shortcuts else {}
        settings = self.settings
        for jid in ids:
            values = kept[jid]
            try:
                found = known.get(jid)
                if found is None or found[0] is not values:
                    parsed = self._parse_running(jid, values)
                    found = known[jid] = [values, parsed, self._running_estimate(parsed), prior]
                elif found[3] is not prior:
                    # New recent runs: an estimate they leave equal keeps its entry (the very
                    # object), so its ends kept below stay good (the same function of equal values).
                    estimate = self._running_estimate(found[1])
                    if estimate == found[2]:
                        found[3] = prior
                    else:
                        found = known[jid] = [values, found[1], estimate, prior]
                end_kept = ends.get(jid)
                if end_kept is not None and end_kept[0] is found and end_kept[1] is settings \
                        and end_kept[2] <= now < end_kept[3]:
                    # Its end and sure end as worked out at an earlier round, before the first
                    # moment they could move (_end_steady_until): the same absolute times.
                    info[jid] = end_kept[4]
                    steady = min(steady, end_kept[3])
                    continue
                user, memory, ncards, stamp, _expected, _cautious, limit = found[1]
                began = now if stamp is None else stamp
                if not 0.0 < began <= now + 3600:  # a damaged stamp: its end is unknown, never "inf ago"
                    raise ValueError(began)
                end, sure = self._end_after(found[2], now - began, limit, now)
                info[jid] = (user, memory, ncards, began, end, sure)
                moment = self._end_steady_until(found[2], began, limit, now)
                steady = min(steady, moment)
                if stamp is not None and self.shortcuts:  # (one begun "now" moves with the clock)
                    ends[jid] = (found, settings, now, moment, info[jid])
            except (ValueError, TypeError):
                info[jid] = ("?", 0, 1, now, math.inf, math.inf)
                steady = now  # counted as begun now, whenever now is
        releases: dict[str, list[Release]] = {}
        team = TeamState()
        counted: set[int] = set()
        #: user -> [the least, the most] its usage can grow per second from now (GiB-hours/s; a
        #: job younger than MIN_CHARGE_S is charged a constant until then), and until when it
        #: stays what it is (epoch s)
        rates: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, math.inf])
        # One walk of the cards' jobs, each job's info looked up once (2,000+ a round at 512 cards);
        # a job is counted at its first card, in card order (the usage sums' order, as before).
        loads = team.loads
        for card, jobs in held:
            made = releases[card.id] = []
            for jid, nbytes in jobs.items():
                user, memory, ncards, began, end, sure = info[jid]
                made.append(Release(end, nbytes, sure, began))
                if jid in counted:
                    continue
                counted.add(jid)
                (loads.get(user) or team.load(user)).add_job(memory, ncards, now - began)
                rate = gib_hours(memory, ncards, 1.0)
                user_rates = rates[user]
                user_rates[1] += rate
                if now - began >= MIN_CHARGE_S:
                    user_rates[0] += rate
                user_rates[2] = min(user_rates[2], max(now, began + MIN_CHARGE_S) if rate else math.inf)
        usage_read: tuple = ()
        if self.settings.fair_share:
            pending = frozenset(self.r.smembers(self.keys.pending_users))
            users = sorted(set(team.loads) | pending)
            pipe = self.r.pipeline(transaction=False)
            for user in users:
                pipe.hmget(self.keys.usage(user), "value", "at")
            half_life = self.settings.fair_share_half_life_hours * 3600
            usage_read = (tuple(users), pending, tuple(map(tuple, pipe.execute())))
            for user, (value, at) in zip(users, usage_read[2], strict=True):
                try:
                    stored = decay(float(value or 0), float(at or now), now, half_life)
                except ValueError:
                    continue
                team.load(user).usage += stored
                if half_life > 0 and stored and now > float(at or now):  # decaying: at most this fast
                    rates[user][0] -= stored * math.log(2) / half_life
                    rates[user][2] = now
                elif half_life > 0 and stored:  # stamped ahead of now: decays from then
                    rates[user][2] = min(rates[user][2], float(at))
            steady = min(steady, _order_steady_until(team, rates, users, now))
        # A repeat compares what the next round would read again: the unstarted jobs (a started one
        # is kept while its card's reservations are the same, which _repeats compares).
        unstarted = tuple(jid for jid in stale if not kept[jid][3])
        self._holdings_read = (recent_users, recent, unstarted, tuple(map(tuple, (kept[j] for j in unstarted))),
                               usage_read)
        self._holdings_steady = steady
        return releases, team

    def _holdings_unchanged(self) -> bool:
        """Does Redis hold what the last _read_holdings read beside the kept cards and placed jobs
        (the recent runs, the unstarted placed jobs' fields, the users' usage)? One round trip."""
        recent_users, recent, stale, values, usage_read = self._holdings_read
        pipe = self.r.pipeline(transaction=False)
        pipe.zrevrange(self.keys.recent_runtime_users, 0, estimates.RECENT_USERS - 1)
        estimates.queue_recent(pipe, self.keys, recent_users)
        batches = queue_fields(pipe, [self.keys.job(jid) for jid in stale], RUNNING_FIELDS)
        if usage_read:
            pipe.smembers(self.keys.pending_users)
            for user in usage_read[0]:
                pipe.hmget(self.keys.usage(user), "value", "at")
        read = pipe.execute()
        if read[0] != recent_users or tuple(v for vs in read[1:1 + len(recent_users)] for v in vs) != recent:
            return False
        rest = read[1 + len(recent_users):]
        if tuple(map(tuple, fields_of(rest[:batches]))) != values:
            return False
        if usage_read and (frozenset(rest[batches]) != usage_read[1]
                           or tuple(map(tuple, rest[batches + 1:])) != usage_read[2]):
            return False
        return True

    def _placed_unchanged(self, placed: Mapping[int, list]) -> bool:
        """Does Redis hold ``placed``'s fields (placed job id -> its RUNNING_FIELDS as a round read
        them) for every one of those jobs? One script call per rig.hashes.BATCH jobs."""
        ids = list(placed)
        return self._read_fields([self.keys.job(jid) for jid in ids], RUNNING_FIELDS) == [placed[j] for j in ids]

    def _running_estimate(self, parsed: tuple) -> estimates.Estimate:
        """estimate_of a placed job from its _parse_running fields (under this round's Prior)."""
        user, memory, ncards, _stamp, expected, cautious, limit = parsed
        return self.estimate_of(user, memory, ncards, expected, cautious, limit)

    def _end_steady_until(self, found: estimates.Estimate, began: float, time_limit: float | None,
                          now: float) -> float:
        """Until when (epoch s) _end_after's answer for a job begun at ``began`` whose run time is
        estimated ``found`` stays the same absolute (end, sure end) as at ``now``; ``now`` when it
        moves with the clock already (it outlived its time limit).
        The expected end is its start plus the median of the samples longer than its age: it moves
        only when its age passes the next sample; once it outlived them all, at the next tick
        (estimates.outlived_remaining)."""
        age = now - began
        if age < 0:
            return now
        if found.samples:
            start = bisect.bisect_right(found.samples, age)
            if start == len(found.samples):  # as long again as it will have run at the next tick
                moment = estimates.next_tick(now)
            else:
                moment = began + found.samples[start]
        elif found.expected == math.inf:
            moment = math.inf
        elif found.expected > age:
            moment = began + found.expected
        else:
            moment = estimates.next_tick(now)
        if time_limit:
            sure = began + self.surely_within(time_limit)
            if sure <= now:
                return now
            moment = min(moment, sure)
        return moment

    def _parse_running(self, job_id: int, values: list) -> tuple[str, int, int, float | None, float | None,
                                                                 float | None, float | None]:
        """A placed or running job's fields as _read_holdings reads them (user, gpu_memory,
        cards, started_at or else assigned_at, expected_seconds, cautious_seconds,
        time_limit) parsed: (user, bytes per card, number of cards, start stamp (epoch s;
        None when neither is set), expected s, cautious s, time limit s). Remembered for the
        same id and values between passes (2,048 running jobs were parsed every pass). Raises
        ValueError or TypeError for a damaged record, each time."""
        key = (job_id, *values)
        found = self._running_parses.get(key)
        if found is None:
            user, memory, card_list, started, assigned, expected, cautious, limit = values
            try:
                found = (user or "?", int(memory or 0), max(1, len(json.loads(card_list or "[]"))),
                         float(started or assigned) if started or assigned else None,
                         _number(expected), _number(cautious), _number(limit))
            except (ValueError, TypeError) as exc:
                found = exc
            if len(self._running_parses) >= RUNNING_PARSE_CACHE:
                self._running_parses.clear()
            self._running_parses[key] = found
        if isinstance(found, Exception):
            raise ValueError(f"job {job_id}: {found}")
        return found

    def hold_after(self, job: Waiting, now: float) -> float:
        """Seconds a blocked job waits before it holds cards: at once for high priority,
        hold_after_seconds for medium, twice that for low (after aging)."""
        return self.settings.hold_after_seconds * self.effective_rank(job, now)

    def sure_end(self, job: Waiting, now: float) -> float | None:
        """When ``job``, started now, has surely ended (epoch s); None without a time limit."""
        return now + self.surely_within(job.time_limit) if job.time_limit else None

    def surely_within(self, time_limit: float) -> float:
        """Seconds after its start by which a job with ``time_limit`` has surely ended: the
        limit is enforced, then its process tree gets kill_grace_seconds (+ START_SLACK_S)."""
        return time_limit + self.settings.kill_grace_seconds + START_SLACK_S

    def estimate(self, job: Waiting) -> estimates.Estimate:
        """``job``'s run time: see estimate_of."""
        return self.estimate_of(job.user, job.gpu_memory, job.gpus, job.expected_seconds,
                                job.cautious_seconds, job.time_limit)

    def estimate_of(self, user: str, nbytes: int, gpus: int, expected: float | None, cautious: float | None,
                    time_limit: float | None) -> estimates.Estimate:
        """A job's run time (rig.estimates): its own history (``expected`` and ``cautious``, the
        median and 80th percentile submit stored), else the cluster's recent runs of its size
        read this round; capped by its time limit."""
        return self._prior.estimate(user=user, nbytes=nbytes, gpus=gpus,
                                    own=() if expected is None else (expected,), own_cautious=cautious,
                                    time_limit=time_limit)

    def release_estimate(self, job: Waiting, now: float) -> float:
        """When a job started now is expected to free its cards (epoch s; inf if unknown)."""
        return now + self.estimate(job).expected

    def running_end(self, user: str, nbytes: int, gpus: int, age: float, expected: float | None,
                    cautious: float | None, time_limit: float | None, now: float) -> tuple[float, float]:
        """(when a job that has run ``age`` s is expected to free its cards, when it surely has),
        epoch s, >= now, inf if unknown: its conditional remaining time (rig.estimates.remaining),
        never later than its time limit's sure end; the sure end only with a time limit."""
        return self._end_after(self.estimate_of(user, nbytes, gpus, expected, cautious, time_limit), age,
                               time_limit, now)

    def _end_after(self, found: estimates.Estimate, age: float, time_limit: float | None,
                   now: float) -> tuple[float, float]:
        """running_end of a job whose run time is estimated ``found``."""
        end = now + found.remaining(age, now)
        sure = math.inf
        if time_limit:
            sure = max(now, now - age + self.surely_within(time_limit))
            end = min(end, sure)
        return max(end, now), sure

    def backfill_end(self, job: Waiting, now: float, held_since: float) -> float | None:
        """When ``job``, started now, is taken to end for backfilling in front of a job holding
        cards since ``held_since`` (epoch s): its cautious estimated end
        (rig.estimates.CAUTIOUS_QUANTILE of its own runs or of runs of its size) while that job
        has held for less than backfill_estimate_delay_seconds, or its sure end (time limit)
        if earlier; after that only the sure end; None when neither (it may backfill only by
        leaving room)."""
        sure, estimated = self.backfill_ends(job, now)
        budget = self.settings.backfill_estimate_delay_seconds
        if estimated is None or budget <= 0 or now > held_since + budget:
            return sure
        return estimated if sure is None else min(sure, estimated)

    def backfill_ends(self, job: Waiting, now: float) -> tuple[float | None, float | None]:
        """(sure end, cautious estimated end) of ``job`` started now, as backfill_end takes them
        (epoch s, None when unknown): the same for every hold this round, worked out once per job."""
        ends = self._backfill_ends.get(job.id)
        if ends is None:
            found = self.estimate(job)
            ends = self._backfill_ends[job.id] = (
                self.sure_end(job, now), now + found.cautious + START_SLACK_S if found.backfills else None)
        return ends

    def effective_rank(self, job: Waiting | Job, now: float) -> int:
        """Priority rank after aging (0 = high)."""
        waited = max(0.0, now - job.created_at)
        return max(0, job.priority.rank - int(waited // self.settings.aging_seconds))

    def fair_order(self, jobs: list[Waiting], team: TeamState, now: float) -> Iterator[Waiting]:
        """``jobs`` in run order: aged priority; within one, the user with the least recent
        usage first (re-read after every job, so starts made meanwhile count), then each
        user's jobs in ``queue_order`` (largest request first, or FIFO). Without fair share:
        aged priority, then ``queue_order``."""
        by_rank: dict[int, list[Waiting]] = defaultdict(list)
        for job in jobs:
            by_rank[self.effective_rank(job, now)].append(job)
        if self.settings.queue_order == "largest-first":
            def key(j: Waiting) -> tuple:
                return (-j.gpu_memory * j.gpus, j.id)
        else:
            def key(j: Waiting) -> tuple:
                return (j.id,)
        for rank in sorted(by_rank):
            # Jobs that already hold cards (blocked past their hold time) come first, the first
            # to hold first (in one pass, the higher own priority first): neither fair share,
            # queue order nor aging (a medium job aged to the rank of a high one holding since
            # before it) may put other jobs on those cards ahead.
            holding = sorted((j for j in by_rank[rank] if j.held_at), key=holding_order)
            yield from holding
            group = sorted((j for j in by_rank[rank] if not j.held_at), key=key)
            if not self.settings.fair_share:
                yield from group
                continue
            queues: dict[str, deque[Waiting]] = defaultdict(deque)
            for job in group:
                queues[job.user].append(job)
            # A heap of users by (recent usage, their next job): O(jobs log users). Only the user
            # just served can have changed (the caller charges a start to that user).
            heap = [(team.load(u).usage, key(q[0]), u) for u, q in queues.items()]
            heapq.heapify(heap)
            while heap:
                _usage, _key, user = heapq.heappop(heap)
                yield queues[user].popleft()
                if queues[user]:
                    heapq.heappush(heap, (team.load(user).usage, key(queues[user][0]), user))

    def dispatch_pass(self, check_lead: bool | None = None) -> int:
        """Start every waiting job that fits now without delaying a job ahead of it.
        Returns how many were started. ``check_lead`` (not None): take the leader check first,
        in the first round trip (_first_reads); nothing is done when another dispatcher leads."""
        started = 0
        pools = self.settings.pool_map
        instant: tuple[float, float] | None = None  # (the pass's now, time.monotonic() when read)
        for _round in range(MAX_ROUNDS):  # a reservation refused again and again must not spin
            if self.stop_event.is_set():
                break
            cards, heads = self._first_reads(check_lead if _round == 0 else None)
            if heads is None:
                return started  # another dispatcher leads
            eligible = {c.id for c in cards if c.eligible}
            waiting = self._read_waiting(prefetched=heads)
            if not waiting:
                return started
            if cards and not any(c.eligible and c.free > 0 and c.jobs < c.max_jobs for c in cards) \
                    and all(j.wait_reason for j in waiting):
                # Every card full or closed: nothing can start, and every job read has its reason
                # (one that arrived meanwhile is explained by a full round: a tester found jobs
                # behind a whitelist naming no card with no reason in `rig jobs`).
                return started
            if instant is None or time.monotonic() - instant[1] >= PASS_INSTANT_S:
                instant = (shared_now(self.r), time.monotonic())
            now = instant[0]  # every round of the pass at one instant (PASS_INSTANT_S)
            if _round == 0 and self._repeats(cards, waiting, now):
                return started  # the last pass's decisions stand: its reasons re-stamped when due
            # The reservations held now (who holds what, when each is expected to end) are read
            # only when needed: for fair share between several users, user limits, or holds. A
            # pass over one user's queue with room for everything reads none of it.
            snapshot = _Lazy(lambda cards=cards, now=now: self._read_holdings(cards, now))
            limits = {u: self.settings.user_limit(u) for u in {j.user for j in waiting}}
            if any(lim.max_jobs or lim.max_bytes for lim in limits.values()) or (
                    self.settings.fair_share and len(limits) > 1):
                snapshot.get()
            holds = _Holds(self, snapshot, now)
            if sum(map(len, self._plan_memo.values())) > PLAN_MEMO_SIZES:
                self._plan_memo.clear()
            view = self._first_view = _View(cards, pools, snapshot, now, self._intern, last=self._first_view,
                                            plan_memo=self._plan_memo if self.shortcuts else None)
            if not view._big:  # its tokens from the last round's last view's (changed cards' parts replaced)
                view._prior = self._last_tokens
            self._nodes = self._node_states = None
            self._backfill_ends = {}
            self._never_inputs = {}
            if len(self._never) > EXPLAINED_CACHE:
                self._never.clear()
            self._marks.clear()  # a round that failed before writing them: its holds are planned anew
            self._decided = []
            self._marked = False
            self._gone.clear()
            self._waits.clear()
            smallest = min(j.gpu_memory for j in waiting)
            progressed = refused = False

            # Jobs past their hold time that cannot start now hold their cards first, in run
            # order, and are marked (held_at): from then on they go first in their rank, so no
            # job placed ahead of them can keep taking the cards they wait for.
            blocked: set[int] = set()  # found unable to start before this round started anything
            for job in self.fair_order(waiting, snapshot.team, now):
                if now - job.created_at < self.hold_after(job, now) or job.pool not in (None, *pools.members):
                    continue
                if over_limit(job.user, snapshot.team.load(job.user), job.gpu_memory, job.gpus, limits[job.user]):
                    continue  # it could not start anyway: no cards held for it
                mine = view.mine(job.pool)
                request = Request(job.gpu_memory, job.gpus)
                if mine and (not view.could_place(job.pool, request)
                             or not placeable(holds.fitting_open(job, request, view), request)) \
                        and not self._never_fits(job.pool, mine, request):
                    blocked.add(job.id)
                    hold = holds.plan(job, view, request)
                    self._note_wait(job, request, 0, hold, holds, view, now)  # the main loop may stop early
                    self._mark_holding(job, hold, now)
            started_before = started
            # (pool, request, stand-in of the held cards closed to the job) that place found no
            # cards for this round: within a round cards only lose room (each start takes some)
            # and a held card closed to a job stays closed (_Holds.started_on), so the same
            # request with the same closed cards finds none in any later view either.
            nowhere: set[tuple[str | None, Request, Hashable]] = set()
            for position, job in enumerate(self.fair_order(waiting, snapshot.team, now)):
                request = Request(job.gpu_memory, job.gpus)
                if job.pool is not None and job.pool not in pools.members:
                    self._end_unschedulable(job, f"pool {job.pool!r} is no longer configured")
                    progressed = True
                    continue
                mine = view.mine(job.pool)
                impossible = self._never_fits(job.pool, mine, request) if cards else None
                if impossible:
                    where = f"in pool {job.pool!r}: " if job.pool else ""
                    self._end_unschedulable(job, where + impossible)
                    progressed = True
                    continue
                alone = exceeds_alone(limits[job.user], job.gpu_memory, job.gpus)
                if alone:
                    self._end_unschedulable(job, alone)
                    progressed = True
                    continue
                limit = over_limit(job.user, snapshot.team.load(job.user), job.gpu_memory, job.gpus,
                                   limits[job.user])
                if limit:
                    self._waits.pop(job.id, None)  # over its limit since it was found blocked
                    self._note(job, self._explain(WaitFacts(request=request, cards=mine, limit=limit, now=now), view,
                                                  not view.could_place(job.pool, request)))
                    continue
                if job.id in blocked and started == started_before:
                    placement = None  # nothing changed since it was found blocked
                elif not view.could_place(job.pool, request):
                    placement = None  # no node of its pool has the room, held or not
                else:
                    fitting, closed_token = holds.fitting_open_with_token(job, request, view)
                    if self.shortcuts and (job.pool, request, closed_token) in nowhere:
                        placement = None
                    else:
                        placement = place(fitting, request, self.settings.scheduler_type, smallest_waiting=smallest)
                        if placement is None:
                            nowhere.add((job.pool, request, closed_token))
                if placement is None:
                    hold = holds.of(job.id)
                    if hold is None and now - job.created_at >= self.hold_after(job, now):
                        hold = holds.plan(job, view, request)
                        self._mark_holding(job, hold, now)
                    self._note_wait(job, request, position, hold, holds, view, now)
                    if eligible and holds.close_all(eligible, job):
                        break  # every card is held for a job ahead and nothing can backfill
                    continue
                self._write_marks()
                ok, detail = self.ledger.reserve(job.id, placement.node, list(placement.cards), job.gpu_memory,
                                                 user=job.user)
                if not ok and detail.startswith("bad-record:"):
                    self._fail_invalid(job.id, f"field {detail.partition(':')[2]}: not what it was when read",
                                       job.user)
                    progressed = True
                    continue
                if not ok:
                    log.info("job %s: reservation refused (%s); re-reading the cards", job.id, detail)
                    self.forget()  # what was kept may be stale: every card is read again
                    progressed = refused = True
                    break
                self._reserved_since_read = True
                self._gone.add(job.id)
                self._kept_jobs.pop(job.id, None)  # placed anew: its fields are read again
                self._waits.pop(job.id, None)  # found blocked at the round's first view, started since
                self._notes.pop(job.id, None)
                log.info("job %s: placed on %s/%s (token %s)", job.id, placement.node,
                         list(placement.cards), detail)
                if self.on_start is not None:
                    self.on_start(job.id, detail, placement.node, placement.cards[0])
                cards = _with_reservation(cards, placement.node, placement.cards, job.gpu_memory,
                                          view.positions if self.shortcuts else None)
                view = view.after_start(cards, [card_id(placement.node, i) for i in placement.cards])
                holds.started_on(card_id(placement.node, i) for i in placement.cards)
                if snapshot.loaded:  # else a later read sees this reservation in Redis
                    releases, team = snapshot.get()
                    end = self.release_estimate(job, now)
                    sure = self.sure_end(job, now) or math.inf
                    for index in placement.cards:
                        releases.setdefault(card_id(placement.node, index), []).append(Release(end, job.gpu_memory, sure, now))
                    team.load(job.user).add_job(job.gpu_memory, job.gpus, 0.0)
                started += 1
                progressed = True
                if not any(c.eligible and c.free > 0 and c.jobs < c.max_jobs for c in cards):
                    break  # every card is full now: the jobs behind wait, their reasons as they were
            self._word_waits(view, now)
            self._last_tokens = (view._big, view.cards)
            if not refused:  # (a refused reservation ends the round early: the next one decides)
                self._mark_lapsed(waiting, holds, now)
            self._write_marks()
            self._flush_notes()
            self._repeat, self._recheck_placed = None, False
            if _round == 0 and not progressed and not self._marked and self.repeat_idle:
                self._repeat = self._repeat_of(cards, waiting, now, snapshot, holds)
            if not progressed or (self._read_all and not refused and not holds.by_card):
                # Nothing changed, or every waiting job was seen and either started or has its
                # reason, and no hold was planned (a start may make one stale: its holder over
                # its limit, a better card to hold): another round would read the same (a job
                # stored meanwhile, or an end, wakes the next pass).
                return started
        return started

    def _repeat_of(self, cards: list[CardState], waiting: list[Waiting], now: float, snapshot: _Lazy,
                   holds: _Holds) -> _Repeat | None:
        """What a round that changed nothing (no start, no end, no held_at mark) decided from, and
        the first moment at which the clock alone could change a decision or a sentence of it:
        a job's aging step or hold time, a held job's backfill budget running out, a backfill's
        estimated end passing a shadow time (_Holds.steady_until), a running job's expected end
        moving (its age passing a sample of its kind, or outliving them) and users' fair-share
        usage crossing (_read_holdings). None when that moment is now."""
        until = holds.steady_until
        if snapshot.loaded:
            until = min(until, self._holdings_steady)
        for job in waiting:
            until = min(until, self._rank_steady_until(job, now))
        if until <= now:
            return None
        return _Repeat(settings=self.settings, at=now, until=until, cards=cards, users=self._users_read,
                       reservations=self._reservations, placed=dict(self._kept_jobs) if snapshot.loaded else {},
                       waiting=[_decides(job) for job in waiting], holdings=snapshot.loaded,
                       nodes=self._nodes_token if self._nodes is not None else None, reasons=list(self._decided))

    def _rank_steady_until(self, job: Waiting, now: float) -> float:
        """The next moment (epoch s) at which ``job``'s aged rank or whether it is past its hold
        time (hold_after) may change: its next aging step, or its hold time for any rank."""
        moment = math.inf
        if self.effective_rank(job, now) > 0:
            waited = max(0.0, now - job.created_at)
            moment = job.created_at + (waited // self.settings.aging_seconds + 1) * self.settings.aging_seconds
        for rank in range(len(Priority)):
            at = job.created_at + self.settings.hold_after_seconds * rank
            if at > now:
                moment = min(moment, at)
        return moment

    def _repeats(self, cards: list[CardState], waiting: list[Waiting], now: float) -> bool:
        """Does this round find what the last one that changed nothing decided from (_repeat_of):
        the very same cards and reservations (the kept ones: no version moved, no full read since),
        the same waiting jobs read (every field a decision reads), the same users, recent runs,
        unstarted placed jobs and usage, the same nodes, and the clock before the first moment a
        time rule could change a decision? Then a full round would decide the same, word the same
        sentences and start nothing: the reasons are only re-stamped when due (_note's rule), and
        True. Costs the reads, not the cluster: O(waiting jobs read)."""
        memo = self._repeat
        if memo is None or memo.settings is not self.settings or not memo.at <= now < memo.until:
            return False
        if len(cards) != len(memo.cards) or any(a is not b for a, b in zip(cards, memo.cards, strict=True)):
            return False
        if self._reservations != memo.reservations:  # (a card's record alike with other jobs on it)
            return False
        if self._users_read != memo.users or [_decides(job) for job in waiting] != memo.waiting:
            return False
        if memo.holdings and not self._holdings_unchanged():
            return False
        if self._recheck_placed:  # a full read dropped the placed jobs' fields: read, compared
            if memo.holdings and not self._placed_unchanged(memo.placed):
                return False
            self._kept_jobs, self._recheck_placed = dict(memo.placed), False
        if memo.nodes is not None and self._intern(nodes_token(NodeRegistry(self.r, self.keys).read())) != memo.nodes:
            return False
        by_id = {job.id: job for job in waiting}
        for job_id, reason in memo.reasons:  # as the round gave them: _note decides what is written
            self._note(by_id[job_id], reason, now)
        self._flush_notes()
        return True

    def _mark_holding(self, job: Waiting, hold: Hold | None, now: float) -> None:
        """Remember that ``job`` holds cards (holding_marks): from the next pass on it goes
        first in its rank, its backfill delay budget counts from its first hold, and its next
        hold prefers the cards it holds now. ``hold`` None marks nothing yet: a later plan of
        the round may still hold cards for it (whether it holds none is _mark_lapsed's)."""
        if hold is None:
            return
        marks = holding_marks(job, hold, now)
        if marks:
            self._marks[job.id] = marks

    def _mark_lapsed(self, waiting: Iterable[Waiting], holds: _Holds, now: float) -> None:
        """At a round's end, clear the ``held_cards`` of each job read that still waits and
        holds no cards this round (holding_marks with no hold): its record says which cards it
        holds now, as the alerts read it (rig.alerts: held cards are not idle). ``held_at``
        stays (its place among holders). Writes only for jobs whose record names cards:
        O(jobs read) in memory, no Redis command for the rest."""
        held, gone = holds.by_job, self._gone
        for job in waiting:
            if job.held_cards and job.id not in held and job.id not in gone:
                marks = holding_marks(job, None, now)
                if marks:
                    self._marks[job.id] = marks

    def _write_marks(self) -> None:
        """Write the held_at marks _mark_holding collected, in one round trip (one HSET each)."""
        if not self._marks:
            return
        self._marked = True
        pipe = self.r.pipeline(transaction=False)
        batch = JobStore(pipe, self.keys)
        for job_id, marks in self._marks.items():
            batch.update(job_id, **{name: ",".join(value) if name in CARD_LIST_MARKS else value
                                    for name, value in marks.items()})
        self._marks.clear()
        pipe.execute()

    def _end_unschedulable(self, job: Waiting, why: str) -> None:
        self._gone.add(job.id)
        self.ledger.transition(job.id, JobState.FAILED, fields={"reason": f"unschedulable: {why}",
                                                                "failure": FailureClass.UNSCHEDULABLE.value},
                               error_queue=True, expect=JobState.PENDING)
        log.warning("job %s: unschedulable: %s", job.id, why)

    def _note_wait(self, job: Waiting, request: Request, ahead: int, hold: Hold | None, holds: _Holds,
                   view: _View, now: float) -> None:
        """Note why ``job`` waits, from what this round knows at its turn: the cards of its pool
        closed to it by other jobs' holds, its own hold, its place in the run order and the
        nodes' states (read once per round). Worded at the round's end (_word_waits), against
        the cards as the round leaves them: a start later in the round only takes room (the
        job fits there no more than it did), and the sentence is read after the round, when the
        cards are those. One wording per body for jobs alike, not one per start (each start made
        a new view, and every job behind it was worded again: O(starts x jobs x cards))."""
        if self._nodes is None:
            self._nodes = NodeRegistry(self.r, self.keys).read()
            self._nodes_token = self._intern(nodes_token(self._nodes))
            self._node_states = NodeStates.of(self._nodes)  # (the round never changes a NodeInfo read)
        closed, token = holds.closed_with_token(job, request, view)
        self._waits.pop(job.id, None)  # noted again: its place is this later one
        self._waits[job.id] = (job, request, ahead, hold, closed, token)

    def _word_waits(self, view: _View, now: float) -> None:
        """Word the waits _note_wait collected with rig.waiting.explain (the one place waits are
        worded), against ``view`` (the round's last), in the order they were noted."""
        for job, request, ahead, hold, closed, token in self._waits.values():
            nowhere = not view.could_place(job.pool, request)
            facts = WaitFacts(
                request=request, cards=view.mine(job.pool), nodes=self._nodes, held=closed, own_hold=hold,
                ahead=ahead, dispatcher=True, pool=job.pool, strategy=self.settings.scheduler_type, now=now,
                fits_nowhere=nowhere, walk=view.walk(job.pool), node_states=self._node_states)
            self._note(job, self._explain(facts, view, nowhere, token))
        self._waits.clear()

    def _explain(self, facts: WaitFacts, view: _View, fits_nowhere: bool, held: Hashable | None = None) -> str:
        """rig.waiting.explain(facts), its body remembered by rig.waiting.body_key: worded once
        per change and once for all jobs alike, the tail (jobs ahead, own hold) per job."""
        key = body_key(facts, view.token(fits_nowhere), self._nodes_token if facts.nodes else (), held)
        found = self._explained.get(key) if key is not None else None
        if found is None:
            found = explain_body(facts)
            if len(self._explained) >= EXPLAINED_CACHE:
                # The older half goes (most are one-off: the views between a round's starts);
                # what the passes keep asking for stays. Stand-ins are never reused, so a key
                # made with a forgotten one just misses.
                for old in (self._explained, self._interned):
                    for stale in list(itertools.islice(old, len(old) // 2)):
                        del old[stale]
            if key is not None:
                self._explained[key] = found
        body, counts_ahead = found
        return body + explain_tail(facts, counts_ahead)

    def _intern(self, token: Hashable) -> int:
        """A small stand-in for a large token (all cards as explain reads them, a set of held
        cards): hashed once here rather than at every sentence looked up. Never reused for
        another token (a counter), so a stand-in forgotten with the sentences cannot mislead."""
        found = self._interned.get(token)
        if found is None:
            found = self._interned[token] = next(self._versions)
        return found

    def _never_fits(self, pool: str | None, mine: list[CardState], request: Request) -> str | None:
        """rig.placement.never_fits, once per pool and request while what it reads of the cards
        (their sizes and whether they are gone: a start leaves them as they were) does not change,
        across rounds and passes."""
        inputs = self._never_inputs.get(pool)
        if inputs is None:  # the round's first view's cards: a start later in it changes none of this
            # What never_fits reads of each card (could_take's gone, its node, usable and total
            # bytes, id): the same stand-in, the same answer, in any round.
            inputs = self._never_inputs[pool] = (
                mine, self._intern(tuple((c.id, c.node, c.gone, c.usable, c.total) for c in mine)))
        key = (pool, request)
        found = self._never.get(key)
        if found is None or found[0] != inputs[1]:
            found = self._never[key] = (inputs[1], never_fits(mine, request))
        return found[1]

    def _note(self, job: Waiting, reason: str, now: float | None = None) -> None:
        """Set a waiting job's reason (written with the round's others, in one pipeline). An
        unchanged reason is re-stamped every REFRESH_S, so readers (rig.waiting.why_waiting)
        can tell a current reason from one no dispatcher confirms any more. The last note of a
        job in a round wins (an earlier one is not written because the later one is stored
        already: main alternated between a job's two sentences). ``now``: the shared clock, when
        the caller has just read it (epoch s)."""
        self._decided.append((job.id, reason))
        if reason != job.wait_reason or (
                (shared_now(self.r) if now is None else now) - (job.wait_reason_at or 0.0) >= restamp_after(job.id)):
            self._notes[job.id] = reason
        else:
            self._notes.pop(job.id, None)

    def _flush_notes(self) -> None:
        """Write the reasons _note kept, stamped now: one rig/lua/write_reasons.lua call per
        rig.hashes.BATCH jobs, in one round trip (a pipelined HSET per job cost ~8 us of the
        client's CPU each, hundreds a pass)."""
        if not self._notes:
            return
        now = shared_now(self.r)
        notes = list(self._notes.items())
        self._notes.clear()
        sha = self._script_sha("write_reasons")

        def queue(pipe: Any) -> None:
            for start in range(0, len(notes), hashes.BATCH):
                batch = notes[start:start + hashes.BATCH]
                pipe.evalsha(sha, len(batch), *[self.keys.job(job_id) for job_id, _reason in batch], now,
                             *[reason for _job_id, reason in batch])
        self._execute_scripts(queue)


def _reparsed(card: CardState, record: tuple, changed: tuple) -> CardState | None:
    """CardState.from_redis of the flat record ``changed`` (field, value, ...), from ``card``,
    the parse of ``record``, when the two list the same fields in the same order: only the
    values that differ are checked again (CardState.with_fields: a job's start or end changes
    three fields of 20, and ~140 records a starting pass at 512 cards were parsed in full). None
    when the fields differ or a check finds a problem: parse it whole."""
    if len(record) != len(changed) or record[::2] != changed[::2]:
        return None
    return card.with_fields({changed[i]: changed[i + 1] for i in range(0, len(changed), 2)
                             if record[i + 1] != changed[i + 1]})


def restamp_after(job_id: int) -> float:
    """How old (s) a waiting job's unchanged reason may get before a pass stamps it again:
    between REFRESH_S / 2 and REFRESH_S, spread by the job's id, so the hundreds of reasons one
    pass wrote are stamped again over several later passes, not all in one (that pass was the
    idle p95 at 512 cards). Readers trust a stamp for STALE_AFTER_S (rig.waiting)."""
    return REFRESH_S * (0.5 + ((job_id * 0.6180339887) % 1.0) / 2.0)


class _Holds:
    """The cards held during one dispatcher round for jobs that could not start (EASY's
    reservations), with the aged rank of each holder: a hold binds only jobs behind its holder
    in the run order (EASY: a reservation never binds the jobs ahead of it): of a lower
    priority, or of the same one unless they held cards before it (``ahead_of``), and only
    where they could delay the holder (rig.placement.may_backfill). A job holds at most one
    set of cards, and no card is held twice (plans exclude held cards)."""

    def __init__(self, dispatcher: Dispatcher, snapshot: _Lazy, now: float) -> None:
        self.dispatcher = dispatcher
        self.snapshot = snapshot
        self.now = now
        self.by_card: dict[str, Hold] = {}
        self.by_job: dict[int, Hold] = {}
        self.rank: dict[str, int] = {}
        self.held_since: dict[int, float] = {}  # held job id -> when it first held cards
        self.holder_order: dict[int, tuple] = {}  # held job id -> its holding_order (this round's: now)
        #: aged rank -> the holding_order of each held card's holder, sorted, and those cards in
        #: that order: who is behind whom (a slice, not a walk: hundreds of holders each pass)
        self._holder_orders: dict[int, list[tuple]] = {}
        self._holder_cards: dict[int, list[str]] = {}
        self.order: list[str] = []  # held card ids, in the order their holds were planned
        #: The held cards a job started on this round, in order (their room and releases, what
        #: closed_to reads of them, changed then), and where each held card is in ``order``.
        self._started: list[str] = []
        self._place_in_order: dict[str, int] = {}
        #: (pool, rank, request, backfill ends) -> [closed cards, holds looked at (a length of
        #: ``order``), interned held_token, its parts, starts on held cards looked at (a length
        #: of ``_started``)]: what closed_to answers depends on nothing else, so jobs alike share
        #: one answer; a hold planned later is looked at once for it, a held card started on once
        #: again (into a copy: an answer given out before that start stays as it was given).
        self._closed: dict[tuple, list] = {}
        #: held card id -> (its card, its releases list, their number, {request bytes: leaves_room})
        self._rooms: dict[str, tuple[CardState, Sequence[Release], int, dict[int, bool]]] = {}
        self._parts: dict[str, tuple] = {}  # held card id -> its rig.waiting.held_part (a hold never changes)
        #: The first moment (epoch s) the clock alone may change what this round's holds decided:
        #: a backfill's end (now + its estimate) passing a shadow time, a budget running out.
        self.steady_until = math.inf

    def of(self, job_id: int) -> Hold | None:
        return self.by_job.get(job_id)

    def closed_to(self, job: Waiting, request: Request, view: _View) -> dict[str, Hold]:
        """The held cards of ``job``'s pool that it may not take now (card id -> hold): held for
        another job of the same or a higher aged rank, where ``job`` could delay it. Never
        changed by the caller (shared by jobs alike)."""
        return self.closed_with_token(job, request, view)[0]

    def closed_with_token(self, job: Waiting, request: Request, view: _View) -> tuple[dict[str, Hold], Hashable]:
        """closed_to, and a stand-in for its rig.waiting.held_token."""
        if not self.by_card:
            return {}, ()
        rank = self.dispatcher.effective_rank(job, self.now)
        key = (job.pool, rank, request, self.dispatcher.backfill_ends(job, self.now))
        found = self._closed.get(key)
        if found is None:
            found = self._closed[key] = [{}, 0, None, frozenset(), len(self._started)]
        closed, seen, token, parts, started = found
        if started < len(self._started):
            # Jobs started on held cards since: those of them looked at already are looked at again.
            again = [cid for cid in dict.fromkeys(self._started[started:]) if self._place_in_order[cid] < seen]
            closed = found[0] = {cid: hold for cid, hold in closed.items() if cid not in again}
            self._close(closed, job, rank, request, view.by_id, again)
            found[4] = len(self._started)
            token = found[2] = None
        if seen < len(self.order) or token is None:
            before = len(closed)
            self._close(closed, job, rank, request, view.by_id, self.order[seen:])
            if token is None or len(closed) != before:
                found[3] = parts = self._parts_of(closed)
                found[2] = token = self.dispatcher._intern(parts)
            found[1] = len(self.order)
        own = self.by_job.get(job.id)
        # Its own held cards, and those held for holders behind it, are open to it: the shared
        # answer was for a job holding none. (No card is held twice.) Copied and set-subtracted,
        # not rebuilt card by card: with hundreds of holders, each pass did.
        drop = closed.keys() & (*(own.cards if own is not None else ()), *self._behind(job, rank))
        if drop:
            mine = dict(closed)
            for cid in drop:
                del mine[cid]
            # Its token: the shared answer's and the parts taken out (the set they stand for is the
            # one less the other: equal keys, equal sets), not a new set of every part hashed
            # again for each holder (hundreds a round, each with hundreds of held cards closed).
            return mine, self.dispatcher._intern((token, frozenset(self._parts[cid] for cid in drop)))
        return closed, token

    def _behind(self, job: Waiting, rank: int) -> list[str]:
        """The cards held for jobs of ``job``'s aged ``rank`` that are behind it among its holders
        (it held cards first: holding_order); none for a job holding none since before this round."""
        orders = self._holder_orders.get(rank)
        if not job.held_at or not orders:
            return []
        return self._holder_cards[rank][bisect.bisect_right(orders, holding_order(job)):]

    def _parts_of(self, closed: dict[str, Hold]) -> frozenset:
        """What stands for rig.waiting.held_token(closed): the set of its cards' parts
        (rig.waiting.held_part, worded once per held card and round; each names its card, so
        the parts of a subset are the subset of the parts), so the order in which a pass
        happened to close them (fair share may reorder users between passes) does not matter."""
        for cid in closed.keys() - self._parts.keys():
            self._parts[cid] = held_part(cid, closed[cid], self.now)
        return frozenset(map(self._parts.__getitem__, closed))

    def ahead_of(self, job: Waiting, holder: int) -> bool:
        """Is ``job`` ahead of the job ``holder`` holds for among the holders of one rank (it
        held cards first: holding_order)? Then that hold does not bind it, even where it was
        planned for a job behind it in the same round (the job ahead could start then)."""
        return bool(job.held_at) and holding_order(job) < self.holder_order[holder]

    def started_on(self, card_ids: Iterable[str]) -> None:
        """A job started on these cards: answers that read them (held ones) are out of date."""
        self._started.extend(cid for cid in card_ids if cid in self.by_card)

    def _close(self, closed: dict[str, Hold], job: Waiting, rank: int, request: Request,
               by_id: Mapping[str, CardState], held: list[str]) -> None:
        """Add to ``closed`` those of the ``held`` cards closed to ``job`` (closed_to, worked out
        for them only); ``job``'s own holds count as another's."""
        pools = self.dispatcher.settings.pool_map
        releases: Mapping[str, Sequence[Release]] | None = None  # the round's, read when first needed
        ends: dict[int, float | None] = {}  # held job id -> this job's end as backfill in front of it
        by_card, rank_of, held_since = self.by_card, self.rank, self.held_since
        for cid in held:
            if rank_of[cid] > rank:
                continue
            hold = by_card[cid]
            card = by_id.get(cid)
            if card is None or (job.pool is not None and not pools.contains(job.pool, card.node, card.index)):
                continue
            if releases is None:
                releases = self.snapshot.get()[0]
            since = held_since.get(hold.job_id, self.now)
            if hold.job_id not in ends:
                ends[hold.job_id] = end = self.dispatcher.backfill_end(job, self.now, since)
                budget = self.dispatcher.settings.backfill_estimate_delay_seconds
                if budget > 0 and self.now <= since + budget and self.dispatcher.backfill_ends(job, self.now)[1]:
                    self.steady_until = min(self.steady_until, since + budget)  # then only sure ends
                if end is not None and end <= hold.until < math.inf:
                    # Its end moves with the clock, the shadow time does not: it stops ending in
                    # time when the clock has moved by the margin.
                    self.steady_until = min(self.steady_until, self.now + (hold.until - end))
            if not may_backfill(card, releases.get(cid, ()), hold, request, ends[hold.job_id], since,
                                room=self._leaves_room):
                closed[cid] = hold

    def _leaves_room(self, card: CardState, releases: Sequence[Release], hold: Hold, request: Request,
                     held_since: float | None) -> bool:
        """rig.placement.leaves_room, remembered per held card and request size while the card (the
        very object) and its releases (the same list, as long) stay: groups of jobs alike ask it
        of every held card (a card's hold and holder's start never change in a round)."""
        kept = self._rooms.get(card.id)
        if kept is None or kept[0] is not card or kept[1] is not releases or kept[2] != len(releases):
            kept = self._rooms[card.id] = (card, releases, len(releases), {})
        answers = kept[3]
        found = answers.get(request.nbytes)
        if found is None:
            found = answers[request.nbytes] = leaves_room(card, releases, hold, request, held_since)
        return found

    def open_to(self, job: Waiting, mine: list[CardState], request: Request,
                view: _View | None = None) -> list[CardState]:
        """The cards of ``mine`` that ``job`` may take now (its own held cards included). With
        ``view`` (the dispatcher's round), ``mine`` are that view's cards of the job's pool and
        the answer is shared by jobs alike; without (rig.forecast's simulated cards, any subset),
        it is worked out for these cards alone."""
        if view is not None:
            closed = self.closed_to(job, request, view)
        else:
            closed = {}
            self._close(closed, job, self.dispatcher.effective_rank(job, self.now), request,
                        {c.id: c for c in mine}, self.order)
            behind = set(self._behind(job, self.dispatcher.effective_rank(job, self.now)))
            closed = {cid: h for cid, h in closed.items() if h.job_id != job.id and cid not in behind}
        return [c for c in mine if c.id not in closed] if closed else mine

    def fitting_open(self, job: Waiting, request: Request, view: _View) -> list[CardState]:
        """The cards of ``job``'s pool in the round's ``view`` that take ``request`` now and that it
        may take (open_to less the cards that do not fit, which place never picks): from the
        view's index, O(log cards + fitting) instead of a walk over the pool."""
        return self.fitting_open_with_token(job, request, view)[0]

    def fitting_open_with_token(self, job: Waiting, request: Request,
                                view: _View) -> tuple[list[CardState], Hashable]:
        """fitting_open, and the stand-in of the held cards closed to ``job`` (closed_with_token's:
        equal stand-ins, equal sets of closed cards)."""
        fitting = view.fitting(job.pool, request.nbytes)
        if not self.by_card:
            return fitting, ()
        closed, token = self.closed_with_token(job, request, view)
        return ([c for c in fitting if c.id not in closed] if closed else fitting), token

    def plan(self, job: Waiting, cards: _View | Sequence[CardState], request: Request) -> Hold | None:
        """Hold cards for ``job`` (rig.placement.plan_hold) outside those held already: from the
        round's view (its HoldPlanner), or from a list of cards (rig.forecast's simulation)."""
        # A job that holds cards already prefers them (rig.placement.keeps_hold): a hold that
        # followed every reordering of equal blockers' estimates moved every few seconds.
        prefer = job.last_held_cards if job.held_at else ()
        if isinstance(cards, _View):
            hold = cards.planner(job.pool).plan(request, job.id, exclude=self.by_card, prefer=prefer)
        else:
            hold = plan_hold(cards, self.snapshot.get()[0], request, self.now, job.id, exclude=self.by_card,
                             prefer=prefer)
        if hold:
            if hold.until <= self.now:
                self.steady_until = self.now  # its shadow time is now, whenever now is
            self.by_card.update(dict.fromkeys(hold.cards, hold))
            for cid in hold.cards:
                self._place_in_order[cid] = len(self.order)
                self.order.append(cid)
            self.by_job[job.id] = hold
            self.held_since[job.id] = job.held_at or self.now
            order = self.holder_order[job.id] = holding_order(job, self.now)
            rank = self.dispatcher.effective_rank(job, self.now)
            self.rank.update(dict.fromkeys(hold.cards, rank))
            orders = self._holder_orders.setdefault(rank, [])
            held = self._holder_cards.setdefault(rank, [])
            for cid in hold.cards:
                at = bisect.bisect_right(orders, order)
                orders.insert(at, order)
                held.insert(at, cid)
        return hold

    def close_all(self, eligible: set[str], job: Waiting) -> bool:
        """Is every eligible card held, with no known end, for a job ahead of ``job`` (nothing
        behind it can backfill anywhere)?"""
        rank = self.dispatcher.effective_rank(job, self.now)
        return eligible <= set(self.by_card) and all(
            h.until == math.inf and not (self.rank[cid] == rank and self.ahead_of(job, h.job_id))
            for cid, h in self.by_card.items())


class _View:
    """The cards of one dispatcher round as its jobs see them, until a start changes them (then
    a new view): each pool's cards, what they could place (rig.placement.Capacity), hold plans
    (HoldPlanner) and the token wait sentences are remembered by, each worked out once per pool
    on first use instead of once per job."""

    def __init__(self, cards: list[CardState], pools: Pools, snapshot: _Lazy, now: float,
                 intern: Callable[[Hashable], int], positions: dict[str, int] | None = None,
                 last: _View | None = None, by_id: dict[str, CardState] | None = None,
                 pool_positions: dict[str | None, dict[str, int]] | None = None,
                 plan_memo: dict[str | None, dict] | None = None) -> None:
        """``last``: the previous round's first view; when it saw the very same card records (the
        dispatcher keeps unchanged cards between passes: the same CardState objects), its tokens
        are this view's, not worked out again (O(cards)). ``positions``, ``by_id`` and
        ``pool_positions``: given by after_start (the round's first view's, or derived from the
        view before). ``plan_memo``: the dispatcher's HoldPlanner memo per pool (a round's first
        view only)."""
        self.cards = cards
        self.by_id = by_id if by_id is not None else {c.id: c for c in cards}
        self.positions = positions if positions is not None else {c.id: i for i, c in enumerate(cards)}
        #: pool -> card id -> its position in mine(pool): the same in every view of a round
        self._pool_positions = pool_positions if pool_positions is not None else {}
        self.pools = pools
        self.snapshot = snapshot
        self.now = now
        self._intern = intern
        #: rig.waiting.cards_token of the cards (with and without temperatures), worked out on
        #: first use: equal across views and passes that see the same cards, so what was worded
        #: for them is found again.
        self._big: dict[bool, tuple] = {}
        #: The previous round's last view's tokens and cards (set by the dispatcher, _big not
        #: shared): this view's token is that one's with the parts of the cards that differ replaced.
        self._prior: tuple[dict[bool, tuple], list[CardState]] | None = None
        if last is not None and len(last.cards) == len(cards) and all(
                a is b for a, b in zip(last.cards, cards, strict=True)):
            self._big = last._big  # shared: a token either works out serves both
        self._tokens: dict[bool, Hashable] = {}
        #: After a start: the view before it and the positions of the cards the start changed
        #: (this view's token is that view's with those cards' parts replaced: O(changed)).
        self._before: tuple[_View, list[int]] | None = None
        self._mine: dict[str | None, list[CardState]] = {}
        self._index: dict[str | None, RoomIndex] = {}
        self._walks: dict[str | None, CardWalk] = {}
        self._planners: dict[str | None, HoldPlanner] = {}
        self._plan_memo = plan_memo

    def mine(self, pool: str | None) -> list[CardState]:
        """The cards a job of ``pool`` may use (all of them without a pool)."""
        found = self._mine.get(pool)
        if found is None:
            found = self._mine[pool] = [c for c in self.cards if self.pools.contains(pool, c.node, c.index)]
            if pool not in self._pool_positions:
                self._pool_positions[pool] = {c.id: i for i, c in enumerate(found)}
        return found

    def index(self, pool: str | None) -> RoomIndex:
        """The pool's cards by room (rig.card_index): made once per round and pool, then carried
        from view to view through each start's changes."""
        found = self._index.get(pool)
        if found is None:
            found = self._index[pool] = RoomIndex(self.mine(pool))
        return found

    def could_place(self, pool: str | None, request: Request) -> bool:
        """Could some node of the pool take ``request`` now, holds aside? (False: place is None;
        rig.placement.Capacity's answer, from the index.)"""
        return self.index(pool).could_place(request)

    def walk(self, pool: str | None) -> CardWalk:
        """The pool's cards as wait sentences read them (rig.placement.CardWalk), made once per
        view and pool: a round words its waits against its last view, hundreds over one walk."""
        found = self._walks.get(pool)
        if found is None:
            found = self._walks[pool] = CardWalk(self.mine(pool), index=self.index(pool))
        return found

    def fitting(self, pool: str | None, nbytes: int) -> list[CardState]:
        """The pool's cards that take ``nbytes`` per card now (what place looks at)."""
        return self.index(pool).fitting(nbytes)

    def planner(self, pool: str | None) -> HoldPlanner:
        found = self._planners.get(pool)
        if found is None:
            memo = self._plan_memo.setdefault(pool, {}) if self._plan_memo is not None else None
            found = self._planners[pool] = HoldPlanner(self.mine(pool), self.snapshot.get()[0], self.now, memo=memo)
        return found

    def after_start(self, cards: list[CardState], changed: list[str]) -> _View:
        """The view once a job started on ``changed`` (card ids), whose records ``cards`` carry:
        its pools' cards and indexes are this view's with those cards replaced (O(changed) steps
        and list copies, not a walk over every card per start)."""
        by_id = dict(self.by_id)
        for cid in changed:
            by_id[cid] = cards[self.positions[cid]]
        view = _View(cards, self.pools, self.snapshot, self.now, self._intern, self.positions, by_id=by_id,
                     pool_positions=self._pool_positions)
        view._before = (self, [self.positions[cid] for cid in changed])
        for pool, mine in self._mine.items():
            where = self._pool_positions[pool]
            changes = [(where[cid], by_id[cid]) for cid in changed if cid in where]
            if changes:
                mine = list(mine)
                for position, card in changes:
                    mine[position] = card
            view._mine[pool] = mine
            index = self._index.get(pool)
            if index is not None:
                view._index[pool] = index.after(changes) if changes else index
            planner = self._planners.get(pool)
            if planner is not None:
                view._planners[pool] = planner.after(mine, [card for _position, card in changes])
        return view

    def token(self, fits_nowhere: bool) -> Hashable:
        """A small stand-in for the cards as explain reads them."""
        if fits_nowhere not in self._tokens:
            self._tokens[fits_nowhere] = self._intern(self._cards_token(fits_nowhere))
        return self._tokens[fits_nowhere]

    def _cards_token(self, fits_nowhere: bool) -> tuple:
        # Back along the starts to a view whose token is known (or the round's first), then
        # forward, replacing the parts each start changed: a loop, as a round may start thousands.
        chain: list[_View] = []
        view: _View | None = self
        while view is not None and fits_nowhere not in view._big:
            chain.append(view)
            view = view._before[0] if view._before is not None else None
        for view in reversed(chain):
            if view._before is None:
                prior = view._prior
                if prior is not None and fits_nowhere in prior[0] and len(prior[1]) == len(view.cards):
                    parts = list(prior[0][fits_nowhere])
                    for position, (was, card) in enumerate(zip(prior[1], view.cards, strict=True)):
                        if was is not card:
                            parts[position] = card_token(card, fits_nowhere=fits_nowhere)
                    view._big[fits_nowhere] = tuple(parts)
                else:
                    view._big[fits_nowhere] = cards_token(view.cards, fits_nowhere=fits_nowhere)
                continue
            before, changed = view._before
            parts = list(before._big[fits_nowhere])
            for position in changed:
                parts[position] = card_token(view.cards[position], fits_nowhere=fits_nowhere)
            view._big[fits_nowhere] = tuple(parts)
        return self._big[fits_nowhere]


@dataclass(frozen=True)
class _Repeat:
    """A dispatcher round that changed nothing: what it decided from and the reasons it gave,
    valid from ``at`` until ``until`` (epoch s) for the same inputs (Dispatcher._repeats)."""

    settings: Settings
    at: float
    until: float
    cards: list[CardState]  # the kept CardState objects (the same objects while no version moves)
    users: list[str]  # the pending users read
    reservations: dict[str, dict[int, int]]  # card id -> {job id: bytes} as the round read them
    placed: dict[int, list]  # placed job id -> its fields as the round read them ({}: not read)
    waiting: list[tuple]  # _decides of each waiting job read, in the order read
    holdings: bool  # the round read the reservations (_read_holdings): their inputs are compared
    nodes: Hashable | None  # the interned nodes_token the sentences read, None when none was worded
    reasons: list[tuple[int, str]]  # (job id, reason) as the round gave them to _note, in order


def _decides(job: Waiting) -> tuple:
    """Every field of a waiting job that a round's decisions and sentences read (all but its
    stored reason and that reason's stamp, which only say whether to write it again)."""
    return (job.id, job.gpu_memory, job.gpus, job.priority, job.created_at, job.user, job.pool,
            job.expected_seconds, job.time_limit, job.held_at, job.cautious_seconds, job.held_cards,
            job.last_held_cards)


def _order_steady_until(team: TeamState, rates: Mapping[str, list[float]], users: Iterable[str],
                        now: float) -> float:
    """The first moment (epoch s) at which two users' fair-share usage could cross (fair_order
    sorts users by it), from each user's usage now, the least and most it can grow per second
    and until when it stays as it is (``rates``: user -> [low, high] GiB-hours/s, epoch s): the
    first crossing is between neighbours in today's order, no sooner than their gap over how
    fast it can close. Users tied now stay tied while neither's usage moves."""
    def rate(user: str) -> tuple[float, float, float]:
        low, high, still = rates.get(user, (0.0, 0.0, math.inf))
        return low, high, still

    ordered = sorted((team.load(u).usage, u) for u in users)
    moment = math.inf
    for (low_usage, low), (high_usage, high) in itertools.pairwise(ordered):
        closing = rate(low)[1] - rate(high)[0]
        if high_usage == low_usage:
            moment = min(moment, rate(low)[2], rate(high)[2])
        elif closing > 0:
            moment = min(moment, now + (high_usage - low_usage) / closing)
    return moment


class _Lazy:
    """The reservations snapshot of one dispatcher round, read on first use."""

    def __init__(self, read: Callable[[], tuple[dict[str, list[Release]], TeamState]]) -> None:
        self._read = read
        self._value: tuple[dict[str, list[Release]], TeamState] | None = None

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get(self) -> tuple[dict[str, list[Release]], TeamState]:
        if self._value is None:
            self._value = self._read()
        return self._value

    @property
    def team(self) -> TeamState:
        """Users' loads if read, else an empty state (every user at zero: FIFO by queue order)."""
        return self._value[1] if self._value is not None else TeamState()


@dataclass(frozen=True)
class Waiting:
    """What the dispatcher needs of a waiting job (read with one HMGET, not the whole record)."""

    FIELDS = ("state", "gpu_memory", "gpus", "priority", "created_at", "wait_reason", "user", "pool",
              "expected_seconds", "time_limit", "held_at", "assignments", "attempt", "wait_reason_at",
              "cautious_seconds", "held_cards", "last_held_cards")

    id: int
    gpu_memory: int
    gpus: int
    priority: Priority
    created_at: float
    wait_reason: str | None
    user: str = "?"
    pool: str | None = None
    expected_seconds: float | None = None
    time_limit: float | None = None
    held_at: float | None = None  # when it first held cards (blocked past its hold time)
    cautious_seconds: float | None = None  # the 80th percentile of its own runs (with expected_seconds)
    wait_reason_at: float | None = None  # when the dispatcher last wrote or confirmed wait_reason
    #: The cards it holds as of the last round that read it (card ids; the record's
    #: ``held_cards``, comma-separated; empty while it holds none): rig.alerts reads them.
    held_cards: tuple[str, ...] = ()
    #: The cards of its last hold, kept when that hold lapses (the record's ``last_held_cards``):
    #: its next hold keeps them while rig.placement.keeps_hold says so.
    last_held_cards: tuple[str, ...] = ()

    #: (job id, the values read) -> the parse of a valid record: most jobs a pass reads are the
    #: ones it read the pass before, unchanged (at most PARSE_CACHE entries, then it restarts).
    _parsed: ClassVar[dict[tuple, Waiting | None]] = {}
    PARSE_CACHE: ClassVar[int] = 20_000

    @classmethod
    def parse_cached(cls, job_id: int, values: list) -> Waiting | None:
        """``parse``, remembered for the same id and values (an invalid record raises each time)."""
        key = (job_id, *values)
        try:
            return cls._parsed[key]
        except KeyError:
            pass
        parsed = cls.parse(job_id, values)
        if len(cls._parsed) >= cls.PARSE_CACHE:
            cls._parsed.clear()
        cls._parsed[key] = parsed
        return parsed

    @classmethod
    def parse(cls, job_id: int, values: list) -> Waiting | None:
        """None for a job no longer PENDING (or gone); InvalidRecord for a PENDING record whose
        fields are not what submit() writes."""
        (state, memory, gpus, priority, created, reason, user, pool, expected, limit, held, assignments, attempt,
         reason_at, cautious, held_cards, last_held) = values
        if state != JobState.PENDING.value:
            return None
        raw = {"gpu_memory": memory, "gpus": gpus or 1, "priority": priority, "created_at": created or 0,
               "user": user or "?", "pool": pool or None, "expected_seconds": expected or None,
               "held_at": held or None, "cautious_seconds": cautious or None, "time_limit": limit or None,
               "assignments": assignments or None, "attempt": attempt or None}
        out = {}
        for name, check in _WAITING_CHECKS:
            value = raw[name]
            try:
                out[name] = None if value is None else check(value)
            except R.BadField as exc:
                raise InvalidRecord(f"job {job_id}", name, str(exc)) from None
        del out["assignments"], out["attempt"]  # checked only: the reservation script counts on them
        try:
            stamped = float(reason_at) if reason_at else None
        except ValueError:
            stamped = None  # rig's own bookkeeping: a bad stamp only makes the reason re-written
        # rig's own bookkeeping too: a damaged list is only a preference lost (the hold is planned
        # afresh), never a reason to end the job.
        return cls(job_id, wait_reason=reason, wait_reason_at=stamped, held_cards=_card_list(held_cards),
                   last_held_cards=_card_list(last_held), **out)


#: The longest ``held_cards`` text a waiting job's record is read with (characters): more than
#: any real hold's (R.MAX_GPUS card ids); a longer one is ignored.
MAX_HELD_CARDS_TEXT = 8192


def _card_list(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of card ids as a hold mark stores it; () for none or a damaged one."""
    return tuple(text.split(",")) if text and len(text) <= MAX_HELD_CARDS_TEXT else ()


def holding_marks(job: Waiting, hold: Hold | None, now: float) -> dict[str, Any]:
    """The Waiting fields a hold of ``job`` at ``now`` (epoch s) changes: ``held_at`` at its
    first hold (it then goes first in its rank: holding_order), ``held_cards`` (the cards it
    holds now) and ``last_held_cards`` (those its next hold prefers: rig.placement.keeps_hold)
    whenever its cards differ from them (both stored comma-separated: CARD_LIST_MARKS).
    ``hold`` None: the job, still waiting, holds no cards at the round's end: ``held_cards`` is
    emptied where it named any, so it never names cards once held (rig.alerts reads it);
    ``held_at`` (its place among holders: holding_order) and ``last_held_cards`` stay. {} when
    nothing changes, so an unchanged job costs no write. THE rule for both the dispatcher's
    writes (_write_marks) and the forecast's replayed holds (``dataclasses.replace(job, **marks)``)."""
    if hold is None:
        return {"held_cards": ()} if job.held_cards else {}
    marks: dict[str, Any] = {}
    if not job.held_at:
        marks["held_at"] = now
    if hold.cards != job.held_cards:
        marks["held_cards"] = hold.cards
    if hold.cards != job.last_held_cards:
        marks["last_held_cards"] = hold.cards
    return marks


#: The hold marks (holding_marks) that are lists of card ids, stored comma-separated.
CARD_LIST_MARKS = frozenset({"held_cards", "last_held_cards"})


def holding_order(job: Waiting, now: float | None = None) -> tuple[float, int, int]:
    """Where a job holding cards goes among the holders of its (aged) rank: the first to hold
    first (``held_at``, epoch s; ``now`` for one that begins to hold in this round), then the
    higher own priority, then the lower id. THE order of holders (fair_order, _Holds)."""
    held = job.held_at or now
    assert held is not None, "holding_order of a job that holds nothing"
    return (held, job.priority.rank, job.id)


def _per_user(users: list[str]) -> int:
    """How many jobs of each user's queue head a pass reads per priority: USER_LOOKAHEAD, fewer
    with many users (USERS_BUDGET in all, at least one each), so no user is left unseen."""
    return max(1, min(USER_LOOKAHEAD, USERS_BUDGET // max(1, len(users))))


def _later(version: str, held: str) -> bool:
    """Is card version ``version`` after ``held`` (both rig.ledger.CARD_VERSION values; '' when
    unset, which is after nothing)? A damaged one counts as later: it is read again, not trusted."""
    try:
        return float(version) > float(held)
    except ValueError:
        return version != ""


def _number(text: str | None) -> float | None:
    """A stored number, or None when unset (0 is a number: a run that took no time)."""
    return None if text is None or text == "" else float(text)


def _priority(text: object) -> Priority:
    try:
        return Priority(text)
    except ValueError:
        raise R.BadField(f"expected high, medium or low, got {R.show(text)}") from None


def _whole(low: int, high: int, what: str) -> Callable[[str], int]:
    """A check for a whole number in [low, high]: plain digits take the fast path; anything
    else goes through rig.records for its one-line message."""
    def check(text: str) -> int:
        if text.isdigit() and len(text) < 20:
            value = int(text)
            if low <= value <= high:
                return value
        return R.as_int(text, low, high, what)
    return check


def _real(low: float, high: float, what: str) -> Callable[[str], float]:
    """A check for a finite number in [low, high] (see _whole)."""
    def check(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            value = math.nan
        if low <= value <= high:  # False for NaN
            return value
        return R.as_float(text, low, high, what)
    return check


#: How Waiting.parse checks each field read (None = unset, never checked).
_WAITING_CHECKS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("gpu_memory", _whole(1, R.MAX_GPU_MEMORY, "a size in bytes")),
    ("gpus", _whole(1, R.MAX_GPUS, "a number of cards")),
    ("priority", _priority),
    ("created_at", _real(0.0, R.MAX_TIMESTAMP, "a time in epoch seconds")),
    ("user", lambda t: t if t == "?" else R.as_user(t)),
    ("pool", lambda t: R.as_word(t, 63)),
    ("expected_seconds", _real(0.0, R.MAX_TIME_LIMIT, "a duration in seconds")),
    ("held_at", _real(0.0, R.MAX_TIMESTAMP, "a time in epoch seconds")),
    ("cautious_seconds", _real(0.0, R.MAX_TIME_LIMIT, "a duration in seconds")),
    ("time_limit", _real(0.001, R.MAX_TIME_LIMIT, "a duration in seconds")),
    ("assignments", _whole(0, R.MAX_ID, "a whole number")),
    ("attempt", _whole(0, R.MAX_ID, "a whole number")),
)


def _with_reservation(cards: list[CardState], node: str, indexes: tuple[int, ...], nbytes: int,
                      positions: Mapping[str, int] | None = None) -> list[CardState]:
    """``cards`` with a reservation of ``nbytes`` (and one job) on ``node``'s cards ``indexes``:
    a new list, the reserved cards new records. ``positions`` (card id -> its place in ``cards``,
    one entry per card: no two cards alike) finds them without a walk over every card."""
    if positions is not None and len(positions) == len(cards):
        found = list(cards)
        for index in indexes:
            at = positions.get(card_id(node, index))
            if at is not None:
                card = cards[at]
                found[at] = replace(card, reserved=card.reserved + nbytes, jobs=card.jobs + 1)
        return found
    chosen = set(indexes)
    return [
        replace(c, reserved=c.reserved + nbytes, jobs=c.jobs + 1)
        if c.node == node and c.index in chosen else c
        for c in cards
    ]
