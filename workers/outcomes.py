"""How an attempt's end becomes the job's next state: success, a retry, the error queue.

Policy (MISSION M15, M16):
- succeeded -> SUCCEEDED; cancelled by a person -> CANCELLED; time limit -> TIMEOUT (error queue).
- CUDA out of memory: never retried with the same declaration. With ``--oom-retry-grow`` and
  retries left it is requeued with a larger declaration (capped by the largest allowed card);
  otherwise it goes to the error queue with a suggested declaration.
- a failure a retry cannot help (rig.failures.RETRY: command not found, working folder gone, a
  @rig.task call that cannot be loaded or whose result cannot be pickled, ...): FAILED in the
  error queue at once with the reason and what to do, whatever retries are left.
- any other failure, lost jobs included: requeued while ``attempt <= max_retries``, then FAILED
  in the error queue.
- rig's own fault (rig.failures.INFRASTRUCTURE: its log keeper died under the job): requeued
  without spending a retry (attempts of uncounted classes are left out of the count, at most
  rig.failures.FREE_RETRIES_MAX of them).
Every attempt is appended to the job's ``attempts`` list with its class and evidence, and its log
file is never reused, so a retry never overwrites the evidence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from rig import estimates
from rig.clock import shared_now
from rig.durations import format_duration as duration
from rig.failures import (
    FREE_RETRIES_MAX,
    KEEPER_LOST_SUMMARY,
    Classification,
    FailureClass,
    classify,
    counted,
    read_tail,
    retry_rule,
    suggest_memory,
)
from rig.ledger import Ledger, Writes
from rig.memory import format_memory, measured
from rig.models import Job, JobState

log = logging.getLogger(__name__)

@dataclass
class AttemptEnd:
    """What is known about how one attempt ended."""

    exit_code: int | None
    cancelled: bool = False
    timed_out: bool = False
    lost: bool = False
    note: str = ""  # extra words for the reason, e.g. "its worker died"
    cancelled_by: str | None = None
    overused: int = 0  # bytes it used when rig stopped it for exceeding its declaration
    #: The failure class when the caller knows it better than the exit code and log can tell
    #: (e.g. START_FAILED: rig could not enter the working folder); None: classify.
    failure: FailureClass | None = None
    #: When it ended on the shared clock (rig.clock), measured where it ran: written as is
    #: however late Redis takes it. None: now.
    ended_at: float | None = None
    #: How long it ran (s, the runner's monotonic clock); None: ended_at - the job's started_at.
    runtime: float | None = None


@dataclass
class Decision:
    state: JobState
    error_queue: bool
    fields: dict
    classification: Classification | None


def decide(job: Job, end: AttemptEnd, largest_usable: int | Callable[[], int],
           now: float | None = None) -> Decision:
    """Pure: the next state of ``job`` after its current attempt ended as ``end``.
    ``largest_usable`` (bytes; or a function returning it, called only when a suggestion is
    made: a job that ends well never reads the cards) caps a suggested declaration."""
    now = now or end.ended_at or time.time()
    log_path = job.log_paths[-1] if job.log_paths else None
    tail = read_tail(log_path) if log_path else ""
    found = classify(exit_code=end.exit_code, cancelled=end.cancelled, timed_out=end.timed_out,
                     lost=end.lost, log_tail=tail, python_call=job.kind == "python")
    if end.failure is not None and not (end.cancelled or end.timed_out):
        words = {FailureClass.INFRASTRUCTURE: KEEPER_LOST_SUMMARY}.get(end.failure, end.failure.value.replace("_", " "))
        found = Classification(end.failure, words, found.evidence if found else ())
    if end.overused and not end.cancelled:
        found = Classification(
            FailureClass.OVER_DECLARATION,
            f"stopped by rig: used {format_memory(end.overused)} on a card, declared "
            f"{format_memory(job.gpu_memory)}", ())
    summary = found.summary if found else "exit code 0"
    if end.note:
        summary = f"{summary} ({end.note})"
    if found and found.failure is FailureClass.CANCELLED:
        summary = f"cancelled by {end.cancelled_by or 'a person'}"
    record = {
        "attempt": job.attempt, "node": job.node, "cards": job.cards, "gpu_memory": job.gpu_memory,
        "started_at": job.started_at, "ended_at": now, "exit_code": end.exit_code,
        "outcome": found.failure.value if found else "succeeded", "summary": summary,
        "evidence": list(found.evidence) if found else [], "log": log_path,
        "vram_peak": measured(job.vram_peak), "vram_mean": measured(job.vram_mean),
        "util_mean": round(job.util_mean, 1) if job.util_mean is not None else None,
        "overuse": job.overuse or None,
    }
    fields: dict = {"attempts": [*job.attempts, record], "reason": summary}
    if end.exit_code is not None:
        fields["exit_code"] = end.exit_code
    if found is None:
        # The job's result is this attempt's: an earlier attempt's failure class, evidence and
        # suggestion go (they stay in the history rows, ``attempts``).
        fields.update(failure=None, evidence=[], suggested_gpu_memory=None)
        return Decision(JobState.SUCCEEDED, False, fields, None)
    fields["failure"] = found.failure.value
    fields["evidence"] = list(found.evidence)
    if found.failure is FailureClass.CANCELLED:
        return Decision(JobState.CANCELLED, False, fields, found)
    if found.failure is FailureClass.TIMEOUT:
        # The same limit would stop it again: say how to give it more (not retried by itself).
        # Twice the limit, in whole seconds at least 1 (a 1ms limit was shown and doubled as "0s").
        limit = more = ""
        if job.time_limit:
            shown = f"{job.time_limit * 1000:g}ms" if job.time_limit < 1 else duration(job.time_limit)
            limit, more = f" ({shown})", f" --time-limit {duration(max(2 * job.time_limit, 1.0))}"
        more = more or " --time-limit DURATION"
        fields["reason"] = f"{summary}{limit}; to give it more time: `rig retry {job.id}{more}`"
        return Decision(JobState.TIMEOUT, True, fields, found)
    free = [a for a in job.attempts if isinstance(a, dict) and not counted(a.get("outcome"))]
    this_free = not retry_rule(found.failure).counted and len(free) < FREE_RETRIES_MAX
    # Attempts that spent a retry: rig's own faults (up to FREE_RETRIES_MAX) spend none.
    spent = job.attempt - min(len(free), FREE_RETRIES_MAX) - (1 if this_free else 0)
    retries_left = spent <= job.max_retries
    if found.failure is FailureClass.OVER_DECLARATION:
        suggestion = suggest_memory(job.gpu_memory, end.overused, _value(largest_usable))
        fields["suggested_gpu_memory"] = suggestion
        fields["reason"] = (f"{summary}; `rig retry {job.id} --gpu-memory {_as_flag(suggestion)}`")
        return Decision(JobState.FAILED, True, fields, found)
    if found.failure is FailureClass.CUDA_OOM:
        suggestion = suggest_memory(job.gpu_memory, None, _value(largest_usable))
        fields["suggested_gpu_memory"] = suggestion
        if job.oom_retry_grow and retries_left and suggestion > job.gpu_memory:
            fields["gpu_memory"] = suggestion
            fields["reason"] = (f"{summary}; retrying with {format_memory(suggestion)} "
                                f"(was {format_memory(job.gpu_memory)})")
            return Decision(JobState.PENDING, False, fields, found)
        fields["reason"] = (f"{summary}; not retried with the same declaration: "
                            f"`rig retry {job.id} --gpu-memory {_as_flag(suggestion)}`")
        return Decision(JobState.FAILED, True, fields, found)
    rule = retry_rule(found.failure)
    if not rule.helps:
        fields["reason"] = (f"{summary}; not retried, another attempt would fail the same way: "
                            f"{rule.advice.format(id=job.id)}")
        return Decision(JobState.FAILED, True, fields, found)
    if this_free:
        fields["reason"] = (f"attempt {job.attempt} failed: {summary}; retried, not counted against its "
                            f"{job.max_retries} retries")
        return Decision(JobState.PENDING, False, fields, found)
    if retries_left:
        fields["reason"] = f"attempt {job.attempt} failed: {summary}; retry {spent} of {job.max_retries}"
        return Decision(JobState.PENDING, False, fields, found)
    if job.max_retries:
        fields["reason"] = f"{summary}; gave up after {job.attempt} attempts"
    return Decision(JobState.FAILED, True, fields, found)


def never_started(job: Job, failure: str, reason: str, now: float | None = None) -> dict:
    """The history row (``attempts``) of an attempt that was claimed but whose process never
    started: it keeps its number (``rig log --attempt N`` says it has no log), with no log."""
    return {
        "attempt": job.attempt, "node": job.node, "cards": job.cards, "gpu_memory": job.gpu_memory,
        "started_at": None, "ended_at": now or time.time(), "exit_code": None, "outcome": failure,
        "summary": reason, "evidence": [], "log": None, "started": False,
    }


def conclude(ledger: Ledger, job: Job, token: str, end: AttemptEnd,
             expect: JobState | None = None) -> tuple[int, JobState]:
    """Apply ``decide`` through the ledger (fenced by ``token`` and by the RUNNING state, which
    is the only ``expect`` that applies: callers still pass the state they saw); wakes the
    dispatcher.

    Only a RUNNING job has an attempt to end: a stale ending (a late duplicate start message,
    an old supervisor, a health check that read the job before it was requeued) of a job that
    is not RUNNING any more, or not in that assignment, changes nothing: no attempt row (it
    would read "on None/"), no reason, no history. The ledger re-checks state and token.

    The writes that go with an ending (the run's peak and duration for later estimates, the
    dispatcher's wake-up) are done by the transition's own script, when and only when it moves
    the job (rig.ledger.Writes): no round trip of their own, and never half done (a Redis that
    refuses writes refuses the whole step, which the card runner tries again)."""
    if job.state is not JobState.RUNNING:
        log.warning("job %s: an attempt's end arrived while it is %s; nothing written (stale)",
                    job.id, job.state.value)
        return 0, job.state
    def largest() -> int:
        """The largest usable card, on the job's node if it has any (read only when needed: the
        node's cards alone, every card only when the node has none allowed)."""
        here = max((c.usable for c in ledger.cards(job.node) if c.allowed), default=0) if job.node else 0
        return here or max((c.usable for c in ledger.cards() if c.allowed), default=job.gpu_memory)

    # When it ended, as measured where it ran (rig.clock): never when Redis took the write.
    ended_at = end.ended_at if end.ended_at is not None else shared_now(ledger.r)
    decision = decide(job, end, largest, now=ended_at)
    decision.fields["stuck"] = None  # concluded once nothing of it runs: none of it is stuck any more
    decision.fields["paused_since"] = None  # nor paused
    if decision.state is JobState.PENDING:
        # A new attempt measures afresh.
        decision.fields.update(vram_peak=0, vram_sum=0, vram_samples=0, util_sum=0,
                               util_samples=0, overuse=0, overuse_stop=None)
    # The run's length as measured where it ran (monotonic), else from the shared clock.
    ran = end.runtime if end.runtime is not None else (ended_at - job.started_at if job.started_at else None)
    after = Writes()  # done by transition.lua only if it moves the job
    if decision.state is JobState.SUCCEEDED:
        if job.vram_peak:
            # What this kind of job really needs, for `--gpu-memory auto` next time.
            estimates.record_peak(after, ledger.keys, user=job.user, name=job.name,  # type: ignore[arg-type]
                                  peak=job.vram_peak, ended_at=ended_at)
        if ran is not None:
            # How long it ran, for the dispatcher's estimates of when cards free (holds,
            # backfill): by name, template, command and in the cluster's recent runs.
            estimates.record_run(after, ledger.keys, user=job.user, name=job.name,  # type: ignore[arg-type]
                                 template=job.template, command=job.command, nbytes=job.gpu_memory, gpus=job.gpus,
                                 seconds=ran, ended_at=ended_at)
    after.lpush(ledger.keys.sched_wake, "1")
    code, detail = ledger.transition(job.id, decision.state, token=token, fields=decision.fields,
                                     error_queue=decision.error_queue, expect=JobState.RUNNING, now=ended_at,
                                     read=job, then=after)
    if code == 1:
        log.info("job %s attempt %s: %s -> %s (%s)", job.id, job.attempt, detail,
                 decision.state.value, decision.fields.get("reason"))
    else:
        log.warning("job %s: not moved to %s, it is %s", job.id, decision.state.value, detail)
    return code, decision.state


def _value(largest_usable: int | Callable[[], int]) -> int:
    return largest_usable() if callable(largest_usable) else largest_usable


def _as_flag(nbytes: int) -> str:
    gib = nbytes / 2**30
    return f"{gib:.0f}G" if gib == int(gib) else f"{nbytes // 2**20}M"
