"""When each waiting job is expected to start: a forward simulation of the dispatcher. The one
place start times are estimated (the web page's "est. start", `rig show`, its ``--json``).

The leading dispatcher runs it every few seconds and stores it (rig.forecast_store, made by
workers.forecaster); the views read that, they never simulate.

The simulation replays the dispatcher's own rules, never a copy of them: its run order
(``Dispatcher.fair_order``: aged priority, jobs holding cards first, fair share, queue order),
its card rule (``rig.placement.place`` over the cards of the job's pool, which asks
``CardState.refusal``), its holds for blocked jobs and their backfilling (the dispatcher's
``_Holds``: ``plan_hold`` / ``may_backfill``), user limits (``rig.fairshare.over_limit``) and its
run-time estimates (``Dispatcher._read_holdings`` for the running jobs' expected ends, with their
conditional remaining time and their time limits as sure ends; ``Dispatcher.estimate`` for the
waiting ones). It is event-driven list scheduling: at ``now`` and then at each next expected end
(and at the hold times of jobs too new to hold cards yet, where the dispatcher makes their holds),
the ended reservations are freed and the waiting jobs are offered the cards in run order, as a
dispatcher pass would.

What an estimate assumes (every view labels it as an estimate: "~14:20", "in ~25 min"):

* no new submissions (a higher-priority job submitted later goes first), and no kills;
* every job runs for its expected run time (the median of earlier runs of it, or of jobs of its
  size: rig.estimates), a running one for its conditional remaining time; a time limit is a sure
  end (and caps the estimate);
* the cards stay as they are: a closed, draining or unhealthy card stays so (and the cards of a
  stopped or down node take nothing), nothing is added;
* a job whose start waits on an end nobody can estimate (no earlier runs, no time limit) gets no
  time, with that reason; so does a job that can never fit. A user's limit (max jobs or memory)
  is lifted by the expected ends of their jobs, running or simulated.

Bounded: the first FORECAST_JOBS waiting jobs by aged priority (jobs holding cards first), then
submission, are simulated; the rest are "later". At most MAX_PASSES rounds are replayed (a pass at now and at
each expected end, with a second round where the dispatcher would have one); the jobs not started
by then start "after" the next time. A round costs O(jobs x cards log cards).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from rig.clock import shared_now
from rig.errors import InvalidRecord
from rig.estimates import SOURCE_WORDS
from rig.fairshare import TeamState, UserLimit, exceeds_alone, over_limit
from rig.keys import Keys, card_id
from rig.models import PRIORITY_BAND, CardState, Job, Priority
from rig.nodes import NodeRegistry
from rig.placement import Hold, Release, Request, never_fits, place
from rig.waiting import NO_DISPATCHER, _live, nearest_minute, roughly

if TYPE_CHECKING:
    import redis

    from rig.client import Client
    from rig.pools import Pools
    from workers.dispatcher import Dispatcher, Waiting, _Lazy

#: Waiting jobs simulated: the head of the queue by aged priority, then submission.
FORECAST_JOBS = 200
#: Dispatcher rounds replayed in all (a pass at now and at each expected end, most of one round;
#: a round that started jobs while cards were held is followed by another, as in the dispatcher).
#: The jobs not started by then start no earlier than the next time ("after ~16:40"). Bounds the
#: work: about 4 ms a round for 200 jobs on 8 cards.
MAX_PASSES = 80
#: Rounds replayed in one pass (the dispatcher's MAX_ROUNDS is 50; more than a few are rare).
MAX_ROUNDS = 8

#: Hold times of new jobs are replayed on this grid (s from the forecast's ``now``): see _hold_times.
HOLD_GRID_S = 5.0

#: Reasons for no estimate (the end of "estimated start: unknown (...)").
NO_RUNS = ("no estimate: no earlier runs of similar jobs (nor a time limit) for a job that must end "
           "before it; jobs submitted with --time-limit, or a few finished runs, give one")
NO_CARD_OPEN = ("no estimate: no card that could hold it takes jobs now (closed, draining, "
                "unhealthy, or its node is not up)")


def no_card_open(pool: str | None) -> str:
    """NO_CARD_OPEN, naming the job's pool when it has one."""
    return NO_CARD_OPEN if not pool else NO_CARD_OPEN.replace("no card ", f"no card of pool '{pool}' ", 1)
NO_CARDS = "no estimate: no cards are registered (is `rig up` running?)"


def later_words() -> str:
    """A job beyond the simulated head: the first of them has exactly FORECAST_JOBS jobs ahead of
    it (it was told "more than 200")."""
    return (f"later ({FORECAST_JOBS} or more jobs ahead of it by priority and age; only the first "
            f"{FORECAST_JOBS} are estimated)")


LATER = later_words()  # as worded with the shipped FORECAST_JOBS
#: What every time shown says it is: the ends of the jobs ahead come from their time limits or
#: earlier runs (each job's own is its StartEstimate.run_text).
#: "No higher-priority submissions" was no assumption for a high-priority job (there is none
#: higher); what every estimate assumes is that nothing submitted later is put ahead of it
#: (a higher priority, or fair share within its own).
CAVEAT = "an estimate from the run times expected of the jobs ahead, assumes nothing submitted later goes first"


@dataclass(frozen=True)
class StartEstimate:
    """A waiting job's estimated start: ``at`` (epoch s, Redis' clock; ``now`` when it could
    start at the dispatcher's next pass), or None with ``why_none`` saying why there is no time.
    ``later``: not simulated (beyond the first FORECAST_JOBS jobs). ``after`` (epoch s): not
    started within MAX_PASSES simulated passes, the last of them at that time. ``not_yet``: the
    stored forecast (rig.forecast_store) has no word on it yet, ``why_none`` says why."""

    job_id: int
    at: float | None
    why_none: str | None = None
    later: bool = False
    after: float | None = None
    not_yet: bool = False
    #: The run time the simulation assumed for it (s: its estimate, capped by its time limit), and
    #: where that came from (rig.estimates.SOURCE_WORDS' keys: "limit" when the limit set it);
    #: None when unknown.
    run: float | None = None
    run_source: str | None = None
    #: It could start at ``at`` (the forecast's own now) only once the jobs it waits for were
    #: freed, and they were already expected to have ended then (running past their expected or
    #: sure end: Dispatcher.running_end says "now"): the dispatcher's next pass cannot start it.
    overrun: bool = False

    def overdue(self, now: float, made_at: float | None) -> bool:
        """Is it overdue at ``now``: expected to start by now, but not at the dispatcher's next
        pass after the forecast was made (``made_at``, epoch s)? Then what it waits for runs
        longer than expected (a tester saw "now" for a blocked job on every full card). The
        part of :func:`start_words`' rule that says so."""
        if self.at is None:
            return False
        return self.overrun or (made_at is not None and made_at < self.at <= now)

    def short(self, now: float, made_at: float | None = None) -> str:
        """For a table cell (`rig jobs`, the web page): ``now``, ``~14:20``, ``overdue``,
        ``after ~16:40``, ``later``, ``not yet``, ``unknown`` (:func:`start_words`)."""
        return start_words(self, now, made_at)[0]

    def sentence(self, now: float, made_at: float | None = None) -> str:
        """For `rig show`: ``~14:20 (in ~25 min; an estimate ...)`` or why there is none
        (:func:`start_words`)."""
        return start_words(self, now, made_at)[1]

    def as_dict(self, now: float, made_at: float | None = None) -> dict[str, object]:
        """For ``--json`` and the web page: the raw time and the words."""
        short, sentence = start_words(self, now, made_at)
        return {"estimated_start": self.at, "estimated_start_text": sentence,
                "estimated_start_short": short, "expected_run": self.run,
                "expected_run_source": self.run_source, "expected_run_text": self.run_text()}

    def run_text(self) -> str | None:
        """``~30 min (its time limit)``: the run time assumed and where it came from; None if unknown."""
        if self.run is None:
            return None
        words = SOURCE_WORDS.get(self.run_source or "", self.run_source or "an estimate")
        return f"~{_span(self.run)} (from {words})"


@dataclass(frozen=True)
class Forecast:
    """Start estimates of the waiting jobs, worded at ``now`` (epoch s, Redis' clock).

    ``made_at``: when the simulation ran (== ``now`` for one just computed; earlier for one read
    from the store, None when there is none). ``complete``: every job waiting then was simulated
    (none is "later"). ``newest_id``: the highest job id handed out when it ran; a job above it
    is newer than the forecast."""

    now: float
    starts: Mapping[int, StartEstimate]
    made_at: float | None = None
    complete: bool = False
    newest_id: int = 0

    def of(self, job_id: int) -> StartEstimate:
        """The estimate of ``job_id``: 'later' for a job beyond the simulated head."""
        return self.starts.get(job_id) or StartEstimate(job_id, None, later=True)

    def row(self, job_id: int) -> dict[str, object]:
        """``job_id``'s estimate for ``--json`` and the web page (StartEstimate.as_dict), with
        ``estimated_at`` (epoch s: when it was made, or None); a time shown says how old it is."""
        estimate = self.of(job_id)
        out = estimate.as_dict(self.now, self.made_at)
        out["estimated_at"] = self.made_at
        if self.made_at is not None and (estimate.at is not None or estimate.after is not None):
            out["estimated_start_text"] = f"{out['estimated_start_text']} (as of {_ago(self.now - self.made_at)})"
        return out


def start_words(estimate: StartEstimate, now: float, made_at: float | None = None) -> tuple[str, str]:
    """THE rule of what an estimated start says, as (table cell, sentence): `rig jobs` and the
    web page show the first, `rig show` the second, both worded from one decision here, so the
    two never disagree on the same forecast. ``now``: the reader's (epoch s, Redis' clock);
    ``made_at``: when the forecast was made (None: just made, at ``now``).

    - not estimated yet / later (beyond the head simulated) / after ~T (beyond the rounds
      replayed) / unknown (why): no time;
    - overdue (StartEstimate.overdue): it was to start after the forecast's first pass, by
      now, and still waits; or that first pass could start it only by freeing jobs already past
      their expected end. Each forecast made while the same jobs run on says so (a remake
      moves a passed time to "now", which is where "now" and "overdue" used to alternate);
    - now: the forecast's first pass starts it (``at`` no later than ``made_at``): it waits
      for the dispatcher's next pass;
    - else ~T, in so long."""
    e = estimate
    if e.not_yet:
        return "not yet", f"not estimated yet ({e.why_none})"
    if e.later:
        return "later", later_words()
    if e.after is not None:
        return (f"after ~{_clock(e.after, now)}",
                f"after ~{_clock(e.after, now)} ({roughly(e.after - now)}: only the dispatcher's next "
                f"{MAX_PASSES} rounds are replayed; {CAVEAT})")
    if e.at is None:
        return "unknown", f"unknown ({e.why_none})"
    if e.overdue(now, made_at):
        return "overdue", (f"overdue: expected ~{_clock(e.at, now)}, but what it waits for is running longer "
                           "than expected; it starts once that ends")
    if e.at <= (now if made_at is None else made_at):
        return "now", "now (waiting for the dispatcher's next pass)"
    return f"~{_clock(e.at, now)}", f"~{_clock(e.at, now)} ({roughly(e.at - now)}; {CAVEAT})"


def _ago(seconds: float) -> str:
    """``12 s ago``, ``3 min ago``: the age of a forecast (s)."""
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s ago" if seconds < 90 else f"{seconds / 60:.0f} min ago"


def _span(seconds: float) -> str:
    """``40 s``, ``30 min``, ``2.5 h``: a run time (s) as the views say it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _clock(at: float, now: float) -> str:
    """``14:20`` today, ``Wed 14:20`` within a week, else ``2026-12-09 14:20`` (local time), to
    the nearest minute (rig.waiting.nearest_minute, the one rule)."""
    at = nearest_minute(at)
    day = time.localtime(at)
    if day[:3] == time.localtime(now)[:3]:
        return time.strftime("%H:%M", day)
    return time.strftime("%a %H:%M" if at - now < 6 * 86400 else "%Y-%m-%d %H:%M", day)


def simulate(dispatcher: Dispatcher, cards: Sequence[CardState], releases: Mapping[str, Sequence[Release]],
             team: TeamState, waiting: Sequence[Waiting], now: float,
             running_loads: Mapping[int, tuple[float, str, int]] | None = None) -> dict[int, StartEstimate]:
    """Each of ``waiting``'s estimated start (see the module doc), by replaying ``dispatcher``'s
    passes from ``now`` (epoch s) at every expected end. ``cards``: as the ledger has them
    (reservations of the running jobs included); ``releases``: card id -> when each reservation
    on it is expected to end (Dispatcher._read_holdings); ``team``: every user's load (changed
    here: the simulated starts are charged to it); ``running_loads``: running job id -> (its
    expected end, user, bytes in all), so its end lifts its user's limit (read only where limits
    are set: :func:`read_running_loads`). Nothing is read or written in Redis."""
    from workers.dispatcher import _Lazy

    pools = dispatcher.settings.pool_map
    state = {c.id: c for c in cards}
    ends: dict[str, list[Release]] = {cid: list(rs) for cid, rs in releases.items()}
    running = dict(running_loads or {})  # job id -> (expected end, user, bytes): its end lifts a limit
    out: dict[int, StartEstimate] = {}
    pending: dict[int, Waiting] = {}
    for job in waiting:  # a job that can never fit is ended by the dispatcher: no time, ever
        never = _never(dispatcher, pools, cards, job)
        if never:
            out[job.id] = StartEstimate(job.id, None, never)
        else:
            pending[job.id] = job
    snapshot = _Lazy(lambda: (ends, team))
    limits: dict[str, UserLimit] = {}
    t = now
    rounds = 0
    # The first pass at now sees the cards as the ledger has them, as the dispatcher's next pass
    # does: a job already past its expected end (Dispatcher.running_end: "now") is freed only in
    # a second pass at now, and a job that starts only then is marked ``overrun`` (overdue,
    # never "now": it waits for a job that runs longer than expected).
    overrun = False  # this is that second pass
    while pending:
        if rounds >= MAX_PASSES:  # the budget ran out: the rest start at t or after
            out.update({j.id: StartEstimate(j.id, None, after=t) for j in pending.values()})
            return out
        first = t == now and not overrun
        for cid, rs in ends.items():  # the reservations expected to have ended by t are freed
            gone = [r for r in rs if (r.at < t if first else r.at <= t)]
            if gone:
                if cid in state:
                    card = state[cid]
                    state[cid] = replace(card, reserved=max(0, card.reserved - sum(r.nbytes for r in gone)),
                                         jobs=max(0, card.jobs - len(gone)))
                ends[cid] = [r for r in rs if not (r.at < t if first else r.at <= t)]
        for jid, (end, user, nbytes) in list(running.items()):  # ended: its user's limit counts it no more
            if end < t if first else end <= t:
                load = team.load(user)
                load.jobs, load.nbytes = max(0, load.jobs - 1), max(0, load.nbytes - nbytes)
                del running[jid]
        before = len(out)
        # Rounds at one time, as a dispatcher pass has them: after a round that started jobs
        # while cards were held, the holds are planned afresh (holders first) and may open.
        again = True
        for _round in range(MAX_ROUNDS):
            rounds += 1
            again = bool(pending) and _one_round(dispatcher, pools, state, ends, team, pending, out, running,
                                                 snapshot, limits, t)
            if not again or rounds >= MAX_PASSES:
                break
        if overrun:
            for jid in list(out)[before:]:  # started in this pass (out keeps its order of insertion)
                if out[jid].at == t:
                    out[jid] = replace(out[jid], overrun=True)
        if again and rounds >= MAX_PASSES:  # cut within the rounds at t: they may start at t
            out.update({j.id: StartEstimate(j.id, None, after=t) for j in pending.values()})
            return out
        if first and pending and (any(r.at <= t for rs in ends.values() for r in rs)
                                  or any(end <= t for end, _user, _nbytes in running.values())):
            overrun = True  # the second pass at now, with the ends already due freed
            continue
        overrun = False
        upcoming = [r.at for rs in ends.values() for r in rs if r.at > t and r.at != math.inf]
        if not pending or not upcoming:
            break
        t = min(upcoming + _hold_times(dispatcher, pending.values(), now, t))
    for job in pending.values():
        out[job.id] = StartEstimate(job.id, None, _why_none(dispatcher, pools, state, team, job))
    return out


def _one_round(dispatcher: Dispatcher, pools: Pools, state: dict[str, CardState], ends: dict[str, list[Release]],
               team: TeamState, pending: dict[int, Waiting], out: dict[int, StartEstimate],
               running: dict[int, tuple[float, str, int]], snapshot: _Lazy, limits: dict[str, UserLimit],
               t: float) -> bool:
    """One round of a dispatcher pass at ``t`` over the simulated state (a round of
    Dispatcher.dispatch_pass without its Redis: holds first, then every job in run order that
    fits starts). True when another round would follow: it started a job while cards were held."""
    from workers.dispatcher import _Holds

    settings = dispatcher.settings
    strategy = settings.scheduler_type
    holds = _Holds(dispatcher, snapshot, t)
    dispatcher._backfill_ends = {}  # noqa: SLF001 - its per-round cache: a simulated pass is a round
    cards = list(state.values())
    jobs = list(pending.values())

    members = {pool: {c.id for c in cards if pools.contains(pool, c.node, c.index)}
               for pool in {j.pool for j in jobs}}

    seen: dict[object, list[CardState]] = {}  # per pool, and per (pool, request); cleared at each start

    def mine(job: Waiting) -> list[CardState]:
        if job.pool not in seen:
            seen[job.pool] = [c for c in cards if c.id in members[job.pool]]
        return seen[job.pool]

    def roomy(job: Waiting, request: Request) -> list[CardState]:
        key = (job.pool, request)
        if key not in seen:
            seen[key] = _roomy(mine(job), request)
        return seen[key]

    def limited(job: Waiting) -> bool:
        if job.user not in limits:
            limits[job.user] = settings.user_limit(job.user)
        return over_limit(job.user, team.load(job.user), job.gpu_memory, job.gpus, limits[job.user]) is not None

    # Jobs past their hold time that cannot start hold their cards first, as the dispatcher's do.
    blocked: set[int] = set()  # found unable to start before this round started anything
    for job in dispatcher.fair_order(jobs, team, t):
        request = Request(job.gpu_memory, job.gpus)
        own = mine(job)
        if t - job.created_at < dispatcher.hold_after(job, t) or limited(job) or not own:
            continue
        room = roomy(job, request)
        if not room or place(holds.open_to(job, room, request), request, strategy) is None:
            blocked.add(job.id)
            _replay_hold(pending, job, holds.plan(job, own, request), t)  # first in its rank from now on
    jobs = list(pending.values())
    smallest = min(j.gpu_memory for j in jobs)
    started = False
    for job in dispatcher.fair_order(jobs, team, t):
        request = Request(job.gpu_memory, job.gpus)
        own = mine(job)
        if not own or limited(job):
            continue
        room = roomy(job, request)
        placement = None  # as the dispatcher: nothing changed since it was found blocked
        if room and (job.id not in blocked or started):
            placement = place(holds.open_to(job, room, request), request, strategy, smallest_waiting=smallest)
        if placement is None:
            if holds.of(job.id) is None and t - job.created_at >= dispatcher.hold_after(job, t):
                _replay_hold(pending, job, holds.plan(job, own, request), t)
            continue
        run = dispatcher.estimate(job)
        sure = dispatcher.sure_end(job, t) or math.inf
        end = min(t + run.expected, sure)
        for index in placement.cards:
            cid = card_id(placement.node, index)
            card = state[cid]
            state[cid] = replace(card, reserved=card.reserved + job.gpu_memory, jobs=card.jobs + 1)
            ends.setdefault(cid, []).append(Release(end, job.gpu_memory, sure, t))
        team.load(job.user).add_job(job.gpu_memory, job.gpus, 0.0)
        running[job.id] = (end, job.user, job.gpu_memory * job.gpus)
        out[job.id] = StartEstimate(job.id, t)
        del pending[job.id]
        started = True
        cards = list(state.values())
        seen.clear()
        if not any(c.eligible and c.free > 0 and c.jobs < c.max_jobs for c in cards):
            break  # every card is full: the jobs behind wait for the next end
    return started and bool(holds.by_card)


def _replay_hold(pending: dict[int, Waiting], job: Waiting, hold: Hold | None, t: float) -> None:
    """What the dispatcher writes of a hold of ``job`` at ``t`` (workers.dispatcher.holding_marks:
    when it began to hold, the cards it holds, which its next hold prefers), in ``pending``."""
    from workers.dispatcher import holding_marks

    marks = holding_marks(job, hold, t)
    if marks:
        pending[job.id] = replace(job, **marks)


def _hold_times(dispatcher: Dispatcher, pending: Collection[Waiting], now: float, t: float) -> list[float]:
    """When jobs not holding cards yet reach their hold time after ``t`` (epoch s), on a grid of
    HOLD_GRID_S from ``now``: a dispatcher pass then may hold cards for them, before the next end,
    which changes who goes first when cards free (holders first). Without these passes the first
    forecast after a burst of submissions differed from the next, made once the holds were there.
    The grid bounds the extra passes (a burst over a minute costs a dozen of MAX_PASSES)."""
    if len(pending) < 2:
        return []  # a hold decides only who goes first: alone, nothing to decide
    out = set()
    for job in pending:
        if not job.held_at:
            due = job.created_at + dispatcher.hold_after(job, t)
            if due > t:
                out.add(now + math.ceil((due - now) / HOLD_GRID_S) * HOLD_GRID_S)
    return sorted(out)


def _roomy(cards: Sequence[CardState], request: Request) -> list[CardState]:
    """The cards of ``cards`` that could take ``request`` now (CardState.refusal), of the nodes
    with enough of them; [] when none has. ``place`` uses only these, and whether a held card is
    open to a job is decided card by card, so asking it of these alone gives the same placement
    for a fraction of the work (most jobs of a busy queue have room on few cards)."""
    per_node: dict[str, list[CardState]] = {}
    for c in cards:
        if c.refusal(request.nbytes) is None:
            per_node.setdefault(c.node, []).append(c)
    return [c for node_cards in per_node.values() if len(node_cards) >= request.gpus for c in node_cards]


def _never(dispatcher: Dispatcher, pools: Pools, cards: Sequence[CardState], job: Waiting) -> str | None:
    """Why ``job`` can never start on ``cards``, as the dispatcher ends it, or None (with no
    card registered at all, as there, nothing is final)."""
    if job.pool is not None and job.pool not in pools.members:
        return f"never: pool {job.pool!r} is not configured"
    if not cards:
        return None
    own = [c for c in cards if pools.contains(job.pool, c.node, c.index)]
    never = never_fits(own, Request(job.gpu_memory, job.gpus)) or exceeds_alone(
        dispatcher.settings.user_limit(job.user), job.gpu_memory, job.gpus)
    return f"never: {never}" if never else None


def _why_none(dispatcher: Dispatcher, pools: Pools, state: Mapping[str, CardState], team: TeamState,
              job: Waiting) -> str:
    """Why the simulation found no start for ``job`` (after the last estimable end)."""
    settings = dispatcher.settings
    request = Request(job.gpu_memory, job.gpus)
    own = [c for c in state.values() if pools.contains(job.pool, c.node, c.index)]
    if not own:
        return NO_CARDS
    if not any(c.eligible for c in own):
        return no_card_open(job.pool)
    limit = over_limit(job.user, team.load(job.user), job.gpu_memory, job.gpus, settings.user_limit(job.user))
    if limit:
        return f"no estimate: {limit}, and none of them has an estimated end"
    if not _big_enough_open(own, request):
        return no_card_open(job.pool)
    return NO_RUNS


def _big_enough_open(cards: Sequence[CardState], request: Request) -> bool:
    """Does some node have ``request.gpus`` cards that take jobs and are big enough for it?"""
    per_node: dict[str, int] = {}
    for c in cards:
        if c.eligible and c.usable >= request.nbytes:
            per_node[c.node] = per_node.get(c.node, 0) + 1
    return any(n >= request.gpus for n in per_node.values())


def forecast(client: Client) -> Forecast:
    """Every simulated waiting job's estimated start, from what Redis holds now (read only: the
    dispatcher's reads, none of its writes). With no dispatcher running, no job gets a time:
    each says so (rig.waiting.NO_DISPATCHER). The leading dispatcher runs this every few
    seconds and stores it (rig.forecast_store); the views read that, they never run this."""
    from workers.dispatcher import Dispatcher, Waiting

    r, keys = client.r, client.keys
    dispatcher = Dispatcher(client.settings, on_start=_never_start, client=r)
    # The head of each priority's queue, as the dispatcher reads it: a low-priority job aged
    # past the others is among the simulated ones even behind FORECAST_JOBS younger ones.
    # The last id handed out is read first: a job submitted after it is newer than this forecast.
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.next_job_id)
    for prio in Priority:
        low = prio.rank * PRIORITY_BAND
        pipe.zrangebyscore(keys.pending, low, low + PRIORITY_BAND - 1, start=0, num=FORECAST_JOBS)
    newest, *bands = pipe.execute()
    ids = [int(i) for band in bands for i in band]
    pipe = r.pipeline(transaction=False)
    pipe.exists(keys.sched_leader)
    for jid in ids:
        pipe.hmget(keys.job(jid), *Waiting.FIELDS)
    leader, *values = pipe.execute()
    now = shared_now(r)
    out: dict[int, StartEstimate] = {}
    waiting: list[Waiting] = []
    for jid, raw in zip(ids, values, strict=True):
        try:
            job = Waiting.parse(jid, raw)
        except InvalidRecord as exc:
            out[jid] = StartEstimate(jid, None, f"never: its record is invalid (field {exc.field}: {exc.problem}); "
                                                "the dispatcher ends it")
            continue
        if job is not None:
            waiting.append(job)
    # The first FORECAST_JOBS in run order before fair share (aged priority, holders first, then
    # submission); the rest are "later".
    complete = len(waiting) <= FORECAST_JOBS and all(len(band) < FORECAST_JOBS for band in bands)
    waiting = sorted(waiting, key=lambda j: (dispatcher.effective_rank(j, now), not j.held_at, j.id))[:FORECAST_JOBS]
    made = partial(Forecast, now, made_at=now, complete=complete, newest_id=int(newest or 0))
    if not leader:
        out.update({j.id: StartEstimate(j.id, None, NO_DISPATCHER) for j in waiting})
        return made(out)
    if waiting:
        # Cards of a node that is stopped or down take no jobs, even before the health pass
        # closes them: the same rule as the wait's explanation (rig.waiting), so the two agree.
        # They stay cards (a job that only they could hold waits for them; it is not "never").
        nodes = {n.name: n for n in NodeRegistry(r, keys).read()}
        cards = [c if _live(nodes.get(c.node)) else replace(c, healthy=False) for c in client.ledger.cards()]
        releases, team = dispatcher._read_holdings(cards, now)  # noqa: SLF001 - the dispatcher's own view
        settings = client.settings
        limited = settings.max_jobs_per_user or settings.max_gpu_memory_per_user not in (None, "", "0") \
            or settings.user_limits
        loads = read_running_loads(r, keys, dispatcher, cards, now) if limited else None
        out.update(simulate(dispatcher, cards, releases, team, waiting, now, loads))
        pipe = r.pipeline(transaction=False)
        for job in waiting:
            pipe.hget(keys.job(job.id), "expected_source")
        for job, own_source in zip(waiting, pipe.execute(), strict=True):
            seconds, source = assumed_run(dispatcher, job, own_source)
            if job.id in out:
                out[job.id] = replace(out[job.id], run=seconds, run_source=source)
    return made(out)


def assumed_run(dispatcher: Dispatcher, job: Waiting, own_source: str | None = None) -> tuple[float | None, str | None]:
    """(s, source): the run time the simulation takes for ``job`` (Dispatcher.estimate, which
    caps it by the time limit) and where it came from: "limit" when the limit set it, else
    rig.estimates' source ("history", the job's own runs, as ``own_source`` names them when the
    submission stored it). (None, None) when unknown. Needs the dispatcher's round read
    (Dispatcher._read_holdings) for the cluster's recent runs."""
    found = dispatcher.estimate(job)
    if not found.known:
        return None, None
    return found.expected, _source(found.source, job.time_limit is not None and found.expected >= job.time_limit,
                                   own_source)


def _source(source: str, by_limit: bool, own_source: str | None) -> str:
    """Where an estimate came from, as SOURCE_WORDS names it: "limit" when the time limit set it
    (``by_limit``), the job's own runs by the name submit stored (``own_source``) for "history"."""
    if by_limit:
        return "limit"
    return own_source if source == "history" and own_source else source


@dataclass(frozen=True)
class RunningEnd:
    """A placed or running job's expected end, as the dispatcher works it out for the holds
    (Dispatcher.running_end: its conditional remaining time from rig.estimates, never later than
    its time limit's sure end). ``at``: epoch s, None when unknown (no runs to go by, no time
    limit); ``source``: a key of rig.estimates.SOURCE_WORDS ("limit" when the limit set it);
    ``now``: when it was worked out (epoch s, Redis' clock), the moment its words are said at."""

    at: float | None
    source: str | None
    now: float

    def sentence(self) -> str:
        """For `rig show`: ``expected to end ~14:20 (in ~25 min; an estimate from earlier runs
        of this command)``, or ``unknown (...)``."""
        if self.at is None:
            return "unknown (no earlier runs to go by, and no time limit)"
        words = SOURCE_WORDS.get(self.source or "", self.source or "earlier runs")
        return f"expected to end ~{_clock(self.at, self.now)} ({roughly(self.at - self.now)}; an estimate from {words})"

    def as_dict(self) -> dict[str, object]:
        """For ``--json``: the raw time (epoch s), its source and the sentence."""
        return {"expected_end": self.at, "expected_end_source": self.source,
                "expected_end_text": self.sentence()}


def running_end(client: Client, job: Job, now: float | None = None) -> RunningEnd:
    """``job``'s (placed or running) expected end as the dispatcher works it out (read only:
    the cluster's recent runs as a round reads them, then Dispatcher.running_end, as
    :func:`read_running_loads` does for every running job)."""
    from workers.dispatcher import Dispatcher

    r = client.r
    now = shared_now(r) if now is None else now
    dispatcher = Dispatcher(client.settings, on_start=_never_start, client=r)
    dispatcher._read_holdings([], now)  # noqa: SLF001 - the round's read of the cluster's recent runs
    began = job.started_at or job.assigned_at or now
    ncards = max(1, len(job.cards) or job.gpus)
    end, sure = dispatcher.running_end(job.user, job.gpu_memory, ncards, now - began, job.expected_seconds,
                                       job.cautious_seconds, job.time_limit, now)
    if end == math.inf:
        return RunningEnd(None, None, now)
    found = dispatcher.estimate_of(job.user, job.gpu_memory, ncards, job.expected_seconds, job.cautious_seconds,
                                   job.time_limit)
    return RunningEnd(end, _source(found.source, end >= sure, job.expected_source), now)


def read_running_loads(r: redis.Redis, keys: Keys, dispatcher: Dispatcher, cards: Sequence[CardState],
                       now: float) -> dict[int, tuple[float, str, int]]:
    """Each running job's (expected end, user, bytes in all), for the user limits: the job ids
    the cards' reservations name, their ends as the dispatcher works them out
    (Dispatcher.running_end); a job whose record is damaged is left out (its end is unknown)."""
    pipe = r.pipeline(transaction=False)
    for card in cards:
        pipe.hkeys(keys.card_jobs(card.node, card.index))
    ids = sorted({int(jid) for held in pipe.execute() for jid in held})
    pipe = r.pipeline(transaction=False)
    for jid in ids:
        pipe.hmget(keys.job(jid), "user", "gpu_memory", "cards", "started_at", "assigned_at",
                   "expected_seconds", "cautious_seconds", "time_limit")
    out: dict[int, tuple[float, str, int]] = {}
    for jid, (user, memory, card_list, started, assigned, expected, cautious, limit) in zip(
            ids, pipe.execute(), strict=True):
        try:
            began = float(started or assigned or now)
            ncards = max(1, len(json.loads(card_list or "[]")))
            end, _sure = dispatcher.running_end(user or "?", int(memory or 0), ncards, now - began,
                                               _number(expected), _number(cautious), _number(limit), now)
        except (ValueError, TypeError):
            continue
        out[jid] = (end, user or "?", int(memory or 0) * ncards)
    return out


def _number(text: str | None) -> float | None:
    return None if text is None or text == "" else float(text)


def _never_start(*_args: object) -> None:
    raise AssertionError("the forecast never starts a job")
