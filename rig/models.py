"""rig's data: job states, priorities, job records and card views.

Memory is always in bytes; times are Unix epoch seconds (float).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from enum import Enum
from functools import cached_property
from typing import Any

from rig import records as R
from rig.errors import InvalidInput, InvalidRecord
from rig.keys import card_id
from rig.words import typed_word


class JobState(str, Enum):
    """Life of a job. PENDING -> ASSIGNED -> RUNNING -> one terminal state; a failed attempt
    with retries left goes back to PENDING (keeping its place).

    ASSIGNED: its VRAM is reserved on its card(s) and its start is on the way to the card's
    worker. A job leaves PENDING only through the atomic reservation. FAILED and TIMEOUT jobs
    also sit in the error queue until a person retries or clears them.
    """

    PENDING = "PENDING"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @classmethod
    def parse(cls, text: str) -> JobState:
        try:
            return cls(text.strip().upper())
        except ValueError:
            names = ", ".join(s.value.lower() for s in cls)
            raise InvalidInput(f"unknown state {text!r}; choose one of: {names}") from None


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}
)
ACTIVE_STATES = (JobState.ASSIGNED, JobState.RUNNING)


class Priority(str, Enum):
    """Strict priorities. Lower rank runs first."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def queue(self) -> str:
        """The Celery queue submissions of this priority travel on."""
        return f"rig.{self.value}"

    @classmethod
    def parse(cls, text: str | Priority) -> Priority:
        if isinstance(text, Priority):
            return text
        try:
            return cls(typed_word(str(text)))
        except ValueError:
            raise InvalidInput(f"unknown priority {text!r}; choose high, medium or low") from None


_RANK = {Priority.HIGH: 0, Priority.MEDIUM: 1, Priority.LOW: 2}

#: Pending-queue score = rank * PRIORITY_BAND + job id, so ZRANGE gives strict priority, FIFO.
PRIORITY_BAND = 10**12


def new_job_instance() -> str:
    """A fresh job identity: 16 lower-case hex digits (64 random bits). The format is checked
    by records.as_job_instance."""
    import secrets

    return secrets.token_hex(8)


#: What a job loses when it goes back to the queue (its node went down before it started, a
#: placement undone, a running attempt lost, `rig retry`): its placement (node, cards, when it
#: was placed, the cards held for it and those it last held) and its attempt's process and end. The one list:
#: rig/lua/transition.lua is given it (rig.ledger.Ledger.transition), so `rig show` of a
#: requeued job never shows an old placement as if it were placed now.
REQUEUE_CLEARS = ("node", "cards", "assigned_at", "held_at", "held_cards", "last_held_cards", "pid", "proc_start",
                  "worker", "cancel_requested", "started_at", "ended_at", "exit_code")


def waiting_since(created_at: float, queued_at: float | None) -> float:
    """When a waiting job last entered the queue (epoch s): its last requeue (``queued_at``),
    else its submission (``created_at``). THE rule every "waited" reads (rig status and top, the
    web page, rig_oldest_wait_seconds, the idle_cards alert): a job that ran 14 s, was lost and
    went back has waited since then, not since it was submitted. A ``queued_at`` before
    ``created_at`` (a clock gone back) counts from ``created_at``. Its place in the queue, its
    aging and its hold time still count from submission (the dispatcher: a requeued job keeps
    its place)."""
    return max(created_at, queued_at) if queued_at else created_at


def pending_score(priority: Priority, job_id: int) -> int:
    return priority.rank * PRIORITY_BAND + job_id


@dataclass
class Job:
    """A job record as stored in Redis (one hash). Lists and dicts are stored as JSON."""

    id: int
    name: str
    user: str  # the submitting OS user's login name (from the real uid, not the environment)
    command: list[str]  # argv; a shell string is ["/bin/sh", "-c", text]
    gpu_memory: int  # bytes per card
    gpus: int
    priority: Priority
    state: JobState
    workdir: str
    created_at: float
    env: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    kind: str = "command"  # "command" or "python" (a @rig.task call)
    node: str | None = None
    cards: list[int] = field(default_factory=list)
    assigned_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None  # why it ended the way it did
    wait_reason: str | None = None  # why a PENDING job is not running yet
    attempt: int = 0
    assignments: int = 0
    log_path: str | None = None
    log_paths: list[str] = field(default_factory=list)
    pid: int | None = None
    proc_start: int | None = None
    worker: str | None = None
    cancel_requested: bool = False
    max_retries: int = 0
    #: The retries it was submitted with (``--retries``, its template's, else max_retries then):
    #: kept by its first ``rig retry``, which raises ``max_retries`` to the attempts spent plus
    #: this, so every retry by a person gives the job its own retry policy again. None until then.
    retries: int | None = None
    submit_host: str | None = None
    time_limit: float | None = None  # seconds of running time before rig stops it
    oom_retry_grow: bool = False  # after a CUDA OOM, retry with more memory
    attempts: list[dict] = field(default_factory=list)  # one entry per ended attempt
    failure: str | None = None  # FailureClass value of the last failed attempt
    evidence: list[str] = field(default_factory=list)  # log lines that decided it
    suggested_gpu_memory: int | None = None  # bytes, after a CUDA OOM
    template: str | None = None  # the preset it was submitted with
    # Measured on the card(s) during the current attempt (bytes; util in percent).
    vram_peak: int = 0
    vram_sum: int = 0
    vram_samples: int = 0
    util_sum: int = 0
    util_samples: int = 0
    overuse: int = 0  # the most it used beyond its declaration (bytes), 0 if never
    #: Its processes that outlived SIGKILL, as its card worker saw them ("pid 4242 (state D)"):
    #: its cards stay reserved until they are gone (workers.card_runner: _await_gone). None else.
    stuck: str | None = None
    #: When its card worker first found every process of it stopped (state T: ``kill -STOP``),
    #: written once that lasted workers.card_runner.PAUSED_AFTER_TICKS ticks; cleared when it
    #: runs again or ends (shared clock, epoch s). None while it runs.
    paused_since: float | None = None
    uid: int | None = None  # the submitting user's uid on the submitting host
    #: The submitting process's umask (rig.job_env.umask_of), the job's own; None in records
    #: that predate it (the job then keeps the card worker's).
    umask: int | None = None
    pool: str | None = None  # only cards of this pool (rig.pools); None: any card
    #: Expected running time (s): the median of the submitter's earlier runs of the same
    #: name, template or command, capped by the time limit (rig.estimates); None without such
    #: runs (the dispatcher then estimates from the cluster's recent runs of its size).
    expected_seconds: float | None = None
    #: The 80th percentile of the same runs (rig.estimates.CAUTIOUS_QUANTILE), capped the same
    #: way: what decides whether it may backfill in front of a held job.
    cautious_seconds: float | None = None
    #: Which of its earlier runs ``expected_seconds`` comes from: "command", "name" or
    #: "template" (rig.estimates.SOURCES); None with it.
    expected_source: str | None = None
    #: When it first held cards for itself (the dispatcher's mark); jobs may backfill in front of
    #: it on estimated ends only until backfill_estimate_delay_seconds after this.
    held_at: float | None = None
    #: When it last went back to the queue (epoch s on the shared clock: a requeue or `rig retry`,
    #: stamped by rig/lua/transition.lua); None while it never went back, and in records from
    #: before the field (older rigs ignore it). What "waited" counts from: :func:`waiting_since`.
    queued_at: float | None = None
    #: A random identity unique to this job (new_job_instance), set when it is stored. Job ids
    #: restart at 1 when Redis loses its data and two key prefixes may share one log_dir: the
    #: job's folder on disk and its processes' environment carry this, never the id alone.
    instance: str | None = None
    #: Not stored: what was wrong with the record this was read from (empty = valid). Bad
    #: fields were replaced by neutral values (see from_redis), so nothing may act on a job
    #: with problems; it can only be shown and ended.
    problems: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def vram_mean(self) -> int | None:
        return self.vram_sum // self.vram_samples if self.vram_samples else None

    @property
    def util_mean(self) -> float | None:
        return self.util_sum / self.util_samples if self.util_samples else None

    @property
    def display_command(self) -> str:
        if self.shell and len(self.command) == 3:
            return self.command[2]
        import shlex

        return shlex.join(self.command)

    @property
    def card_ids(self) -> list[str]:
        from rig.keys import card_id

        return [card_id(self.node, i) for i in self.cards] if self.node else []

    # -- (de)serialisation --------------------------------------------------------------
    _JSON_FIELDS = ("command", "env", "cards", "log_paths", "attempts", "evidence")

    def to_redis(self) -> dict[str, str]:
        """The record as Redis stores it (plain strings), without the fields that hold their
        empty default (OMITTED_WHEN_DEFAULT): every reader takes a missing one as that default,
        and each field costs a Redis hash ~60 bytes."""
        out: dict[str, str] = {}
        for f in fields(self):  # not asdict(): it deep-copies every list and dict first
            key, value = f.name, getattr(self, f.name)
            if value is None or key == "problems":
                continue
            if key in OMITTED_WHEN_DEFAULT and value == _DEFAULTS[key]:
                continue
            if key in self._JSON_FIELDS:
                out[key] = json.dumps(value)
            elif isinstance(value, Enum):
                out[key] = value.value
            elif isinstance(value, bool):
                out[key] = "1" if value else "0"
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_redis(cls, raw: dict[Any, Any], *, strict: bool = False) -> Job:
        """Parse and check a job hash (rig.records: types, ranges, sizes; see _JOB_CHECKS).

        Never raises for a bad value unless ``strict``: each bad or missing field becomes a
        line in ``problems`` ("field gpus: expected ...") and takes a neutral value (the
        field's default; for required fields: id 0, name/user '?', no command, memory 0,
        1 card, low priority, state FAILED, no workdir), so a damaged record can still be
        listed, shown and ended. With ``strict`` the first problem raises InvalidRecord.
        An empty string means "unset" for optional fields (the ledger's scripts write '').
        """
        data = {text_of(k): text_of(v) for k, v in raw.items()}
        kwargs: dict[str, Any] = {}
        found: list[tuple[str, str]] = []
        for f in fields(cls):
            if f.name == "problems":
                continue
            value, problem = _parse_field(f.name, data.get(f.name))
            if problem is not None:
                found.append((f.name, problem))
            if value is not DEFAULT:
                kwargs[f.name] = value
        job = cls(**kwargs)
        found += _consistency(job, {name for name, _ in found})
        if found and strict:
            raise InvalidRecord(f"job {data.get('id', '?')}", *found[0])
        job.problems = [f"field {name}: {text}" for name, text in found]
        return job

    @property
    def invalid_reason(self) -> str | None:
        """The reason to give a job whose record is bad: 'invalid record: field gpus: ...'
        (its first three problems); None when the record is valid."""
        if not self.problems:
            return None
        more = f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else ""
        return "invalid record: " + "; ".join(self.problems[:3]) + more

    def field_valid(self, name: str) -> bool:
        """False if the record's field ``name`` was missing or bad (and was replaced)."""
        return not any(p.startswith(f"field {name}:") for p in self.problems)


#: Fields left out of a stored record while they hold their default (Job.to_redis). Never a
#: field a Lua script reads without a default of its own (they read 'assignments' and 'attempt'
#: as 0 when missing, 'cards' as []).
OMITTED_WHEN_DEFAULT = frozenset({
    "env", "shell", "kind", "cards", "attempt", "assignments", "log_paths", "cancel_requested",
    "oom_retry_grow", "attempts", "evidence", "vram_peak", "vram_sum", "vram_samples", "util_sum",
    "util_samples", "overuse"})
_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
    for f in fields(Job) if f.name in OMITTED_WHEN_DEFAULT}

#: Fields written once at submit and read only with the whole record (Job.from_redis), never
#: by a script or an HMGET: kept out of the job hash, so that it holds short values only and
#: Redis keeps it in its compact encoding (hash-max-listpack-value, 64 bytes by default).
#: ``command`` and ``workdir`` go into one packed string per job (Keys.job_spec); ``env``, the
#: largest and the same for all of a sweep's jobs, into a packed string per distinct
#: environment of a user (Keys.env_blob), counted by the jobs that name it (``env_ref``).
#: rig.packed packs them; JobStore writes and joins them.
SPEC_FIELDS = ("command", "workdir")
ENV_FIELD = "env"
#: The job hash's field naming its environment's blob (not a Job field).
ENV_REF = "env_ref"
#: The spec's field holding the job's own variables, those not in its blob: the blob holds what
#: all of a user's jobs in one submission share (rig.store.shared_environments), so a sweep
#: whose jobs differ in a seed shares one blob and each job's spec carries its seed.
ENV_EXTRA = "env_extra"


def _enum_check(enum: type[Enum]) -> Callable[[Any], Any]:
    def check(text: Any) -> Any:
        try:
            return enum(text)
        except ValueError:
            names = ", ".join(str(m.value) for m in enum)  # type: ignore[attr-defined]
            raise R.BadField(f"expected one of {names}, got {R.show(text)}") from None

    return check


def _one_of(*values: str) -> Callable[[Any], str]:
    def check(text: Any) -> str:
        if text not in values:
            raise R.BadField(f"expected one of {', '.join(values)}, got {R.show(text)}")
        return str(text)

    return check


_TIME = (0.0, R.MAX_TIMESTAMP, "a time in epoch seconds")
_COUNT = (0, 2**63 - 1, "a whole number")

#: How each field of a job hash is checked. A field without an entry must be text (at most
#: MAX_TEXT_CHARS): a new non-text field needs an entry here.
_JOB_CHECKS: dict[str, Callable[[Any], Any]] = {
    "id": lambda t: R.as_int(t, 1, R.MAX_ID, "a job id"),
    "name": R.as_name,
    "user": R.as_user,
    "uid": lambda t: R.as_int(t, 0, R.MAX_UID, "a uid"),
    "umask": lambda t: R.as_int(t, 0, 0o777, "a umask (0 to 511)"),
    "command": R.as_argv,
    "gpu_memory": lambda t: R.as_int(t, 1, R.MAX_GPU_MEMORY, "a size in bytes"),
    "gpus": lambda t: R.as_int(t, 1, R.MAX_GPUS, "a whole number of cards"),
    "priority": _enum_check(Priority),
    "state": _enum_check(JobState),
    "workdir": R.as_abs_path,
    "created_at": lambda t: R.as_float(t, *_TIME),
    "assigned_at": lambda t: R.as_float(t, *_TIME),
    "started_at": lambda t: R.as_float(t, *_TIME),
    "ended_at": lambda t: R.as_float(t, *_TIME),
    "env": R.as_env,
    "shell": R.as_bool,
    "cancel_requested": R.as_bool,
    "oom_retry_grow": R.as_bool,
    "kind": _one_of("command", "python"),
    "node": R.as_word,
    "cards": R.as_card_list,
    "exit_code": lambda t: R.as_int(t, -(2**31), 2**31 - 1, "an exit code"),
    "attempt": lambda t: R.as_int(t, 0, R.MAX_ID),
    "assignments": lambda t: R.as_int(t, 0, R.MAX_ID),
    "log_path": R.as_abs_path,
    "log_paths": lambda t: R.as_text_list(t, paths=True),
    "pid": lambda t: R.as_int(t, 2, R.MAX_PID, "a process id"),
    "proc_start": lambda t: R.as_int(t, *_COUNT),
    "worker": R.as_word,
    "max_retries": lambda t: R.as_int(t, 0, 10_000, "a number of retries"),
    "retries": lambda t: R.as_int(t, 0, 10_000, "a number of retries"),
    "submit_host": R.as_word,
    "time_limit": lambda t: R.as_float(t, 0.001, R.MAX_TIME_LIMIT, "a duration in seconds"),
    "attempts": R.as_attempts,
    "failure": lambda t: R.as_word(t, 64),
    "evidence": lambda t: R.as_text_list(t, limit=100),
    "suggested_gpu_memory": lambda t: R.as_int(t, 1, R.MAX_GPU_MEMORY, "a size in bytes"),
    "template": lambda t: R.as_text(t, 128),
    "pool": lambda t: R.as_text(t, 63),
    "expected_seconds": lambda t: R.as_float(t, 0.0, R.MAX_TIME_LIMIT, "a duration in seconds"),
    "held_at": lambda t: R.as_float(t, 0.0, R.MAX_TIMESTAMP, "a time in epoch seconds"),
    "queued_at": lambda t: R.as_float(t, *_TIME),
    "cautious_seconds": lambda t: R.as_float(t, 0.0, R.MAX_TIME_LIMIT, "a duration in seconds"),
    "expected_source": lambda t: R.as_word(t, 16),
    "instance": lambda t: R.as_job_instance(t),
    "vram_peak": lambda t: R.as_int(t, *_COUNT),
    "vram_sum": lambda t: R.as_int(t, *_COUNT),
    "vram_samples": lambda t: R.as_int(t, *_COUNT),
    "util_sum": lambda t: R.as_int(t, *_COUNT),
    "util_samples": lambda t: R.as_int(t, *_COUNT),
    "overuse": lambda t: R.as_int(t, *_COUNT),
    "stuck": lambda t: R.as_text(t, 512),
    "paused_since": lambda t: R.as_float(t, *_TIME),
}

#: Fields every job record has; the rest have defaults.
_REQUIRED = frozenset({"id", "name", "user", "command", "gpu_memory", "gpus", "priority", "state",
                       "workdir", "created_at"})


#: Fields every job record has (a missing or bad one is a problem and takes its fallback).
REQUIRED_FIELDS = _REQUIRED

#: What field_value gives an optional field that is missing, empty or bad: the Job keeps the
#: field's default.
DEFAULT: Any = object()


def field_value(name: str, text: str | None) -> Any:
    """The value Job.from_redis gives field ``name`` of a record whose stored text is ``text``
    (None: absent): the checked value; a required field's fallback when it is missing, empty
    or bad; DEFAULT for an optional field missing, empty or bad. Pure: the same text always
    gives the same value (readers of many records may keep results)."""
    return _parse_field(name, text)[0]


def _parse_field(name: str, text: str | None) -> tuple[Any, str | None]:
    """(field_value's value, the problem to report or None). The one rule for a field's value."""
    required = name in _REQUIRED
    if text is None or text == "":
        return (_fallback(name, text), "missing") if required else (DEFAULT, None)
    try:
        return _JOB_CHECKS.get(name, R.as_text)(text), None
    except R.BadField as exc:
        return (_fallback(name, text) if required else DEFAULT), str(exc)


def _fallback(name: str, text: str | None) -> Any:
    """The neutral value a bad or missing required field takes (display only: a job with
    problems is never run)."""
    if name == "name":
        return R.printable(text) if text else "?"
    return {"id": 0, "user": "?", "command": [], "gpu_memory": 0, "gpus": 1,
            "priority": Priority.LOW, "state": JobState.FAILED, "workdir": "",
            "created_at": 0.0}[name]


def _consistency(job: Job, bad: set[str]) -> list[tuple[str, str]]:
    """Checks across fields (only between fields that are valid on their own)."""
    found = []
    if job.shell and not bad & {"shell", "command"} and (
            len(job.command) != 3 or job.command[:2] != ["/bin/sh", "-c"]):
        # The shell flag only changes how the command is shown: it must match what runs.
        found.append(("command", f"a shell job's command must be ['/bin/sh', '-c', TEXT], "
                                 f"got {R.show(job.command)}"))
    if job.cards and not bad & {"cards", "gpus"} and len(job.cards) != job.gpus:
        found.append(("cards", f"the job asks for {job.gpus} card(s) but holds {len(job.cards)}"))
    return found


def text_of(value: Any) -> str:
    """A Redis reply's value as text (bytes decoded as UTF-8)."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class CardState:
    """One card as the ledger sees it. Memory in bytes.

    Invariants kept by the ledger's scripts: ``reserved <= usable`` and ``jobs <= max_jobs``.
    Whether it takes a job is decided by :meth:`refusal`, the one rule, which rig/lua/lib_card.lua
    mirrors for the reservation itself (tests/store/test_card_rule.py checks they agree).
    """

    node: str
    index: int
    total: int
    usable: int
    reserved: int = 0
    jobs: int = 0
    max_jobs: int = 1
    allowed: bool = True  # in gpu_whitelist
    healthy: bool = True
    model: str = "unknown"
    uuid: str = ""
    used: int | None = None  # actually used, from NVML
    utilization: int | None = None  # percent
    temperature: int | None = None  # Celsius
    updated_at: float | None = None
    fake: bool = False
    health_reason: str = ""
    foreign: int = 0  # bytes used by processes rig did not start
    #: No longer on its node (``rig up`` found fewer cards): never placed on (``allowed`` is 0
    #: too); kept while jobs still run on it (rig.draining).
    gone: bool = False
    #: Not stored: what was wrong with the record this was read from (empty = valid). A card
    #: with problems takes no job (refusal 'invalid') and shows the first as its health_reason.
    problems: list[str] = field(default_factory=list, compare=False, repr=False)

    @property
    def taken(self) -> int:
        return self.reserved + self.foreign

    @cached_property
    def id(self) -> str:
        """``node/index`` (rig.keys.card_id); worked out once per instance (node and index never
        change: a changed card is a new instance, dataclasses.replace), as the dispatcher asks
        it thousands of times a pass."""
        return card_id(self.node, self.index)

    @property
    def free(self) -> int:
        """Reservable bytes left (what rig reserved and what others use are both taken). THE
        rule of free capacity for every report (status, --json, metrics, top, alerts): 0 on a
        card closed by the node's configuration (outside gpu_whitelist, gone from the node),
        which no job may take, so no total ever counts it."""
        if not self.allowed or self.gone:
            return 0
        return max(0, self.usable - self.reserved - self.foreign)

    @property
    def checked_healthy(self) -> bool:
        """Healthy as reports show it: a card gone from its node cannot be checked, never
        healthy (its stored ``healthy`` is from before it went)."""
        return self.healthy and not self.gone

    @property
    def eligible(self) -> bool:
        """Allowed and healthy, its record valid (a bad record leaves it unhealthy)."""
        return self.allowed and self.healthy

    def refusal(self, nbytes: int) -> str | None:
        """Why this card cannot take a job of ``nbytes`` (per card) now, or None when it can.
        THE rule; reserve.lua refuses with the same word (``card-<word>:<key>``) through
        rig/lua/lib_card.lua, which mirrors it field by field:

        - 'invalid': the record is damaged or incomplete (see from_redis; a card without
          ``allowed`` or ``healthy`` is refused, never taken as allowed or healthy);
        - 'not-allowed': not in gpu_whitelist; 'unhealthy': failed its health check;
        - 'full': ``reserved + foreign + nbytes > usable``; 'busy': ``jobs + 1 > max_jobs``.
        """
        if self.problems:
            return "invalid"
        if not self.allowed:
            return "not-allowed"
        if not self.healthy:
            return "unhealthy"
        if self.reserved + self.foreign + nbytes > self.usable:
            return "full"
        if self.jobs + 1 > self.max_jobs:
            return "busy"
        return None

    @classmethod
    def from_redis(cls, raw: dict[Any, Any]) -> CardState:
        """Parse and check a card hash. Never raises: a card whose record is bad is returned
        unhealthy (it takes no jobs) with the first problem as its health_reason, its bad
        fields at neutral values (capacity 0, node '?', index -1)."""
        data = {text_of(k): text_of(v) for k, v in raw.items()}
        problems: list[str] = []
        card = cls(**{name: _card_field(name, data.get(name), rule, problems)
                      for name, rule in _CARD_FIELDS.items()})
        if problems:
            card.healthy = False
            card.health_reason = "invalid record: " + problems[0]
            card.problems = problems
        return card

    def with_fields(self, changed: Mapping[Any, Any]) -> CardState | None:
        """What from_redis gives for this card's record with ``changed`` fields (name -> new
        value; None where a field went) and every other field as it was: only the changed
        fields checked again (each field's value depends on its own text alone). None when
        this card's record had a problem or a changed field has one: parse the whole record then
        (its problems in from_redis's order). Fields that are not a card's (its version) are
        ignored, as from_redis ignores them."""
        if self.problems:
            return None
        problems: list[str] = []
        updates = {}
        for key, value in changed.items():
            name = text_of(key)
            rule = _CARD_FIELDS.get(name)
            if rule is not None:
                updates[name] = _card_field(name, None if value is None else text_of(value), rule, problems)
                if problems:
                    return None
        return replace(self, **updates)


def _card_field(name: str, text: str | None, rule: tuple[Callable[[Any], Any], Any, bool],
                problems: list[str]) -> Any:
    """One field of a card record as from_redis reads it: its checked value, or its default
    (a problem added when it is required and missing, or bad)."""
    check, default, required = rule
    if text is None or text == "":
        if required:
            problems.append(f"field {name}: missing")
        return default
    try:
        return check(text)
    except R.BadField as exc:
        problems.append(f"field {name}: {exc}")
        return default


def _whole(low: int, high: int, what: str = "a whole number") -> Callable[[Any], int]:
    # Plain base-10 digits only, as rig writes them (HSET, HINCRBY): the ledger's script
    # (lib_card.lua) reads these fields with the same syntax and the same ranges.
    def check(text: Any) -> int:
        if not (isinstance(text, str) and len(text) <= 40 and _PLAIN_INT.fullmatch(text)):
            raise R.BadField(f"expected {what} from {low} to {high}, got {R.show(text)}")
        return R.as_int(text, low, high, what)
    return check


_PLAIN_INT = re.compile(r"-?[0-9]+")
_SIZE = _whole(0, R.MAX_GPU_MEMORY, "a size in bytes")
# reserved/foreign are kept by HINCRBY: let the ledger's own checks judge them
_SIGNED = _whole(-R.MAX_GPU_MEMORY, R.MAX_GPU_MEMORY, "a size in bytes")
#: A card record's fields as CardState.from_redis reads them: name -> (check, default, required),
#: in the order their problems are listed.
_CARD_FIELDS: dict[str, tuple[Callable[[Any], Any], Any, bool]] = {
    "node": (R.as_word, "?", True),
    "index": (_whole(0, R.MAX_CARD_INDEX), -1, True),
    "total": (_SIZE, 0, True),
    "usable": (_SIZE, 0, True),
    "reserved": (_SIGNED, 0, False),
    "jobs": (_whole(-(2**31), 2**31), 0, False),
    "max_jobs": (_whole(1, 1_000_000), 1, False),
    # Required: register_card always writes both. A record without them is refused
    # (fail safe) with a reason `rig status` shows, never taken as allowed and healthy.
    "allowed": (R.as_bool, False, True),
    "healthy": (R.as_bool, False, True),
    "model": (lambda t: R.as_text(t, 256), "unknown", False),
    "uuid": (lambda t: R.as_text(t, 256), "", False),
    "used": (_SIGNED, None, False),
    "utilization": (_whole(0, 100), None, False),
    "temperature": (_whole(-300, 1000), None, False),
    "updated_at": (lambda t: R.as_float(t, *_TIME), None, False),
    "fake": (R.as_bool, False, False),
    "health_reason": (R.as_text, "", False),
    "foreign": (_SIGNED, 0, False),
    "gone": (R.as_bool, False, False),
}
