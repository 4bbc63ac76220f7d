"""The Python API. The CLI is a thin shell over this.

    import rig
    job = rig.submit("python train.py", gpu_memory="12G", priority="high")
    job.wait(); print(job.state)
"""

from __future__ import annotations

import inspect
import logging
import os
import pwd
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import redis

from rig import estimates
from rig import job_env as jobenv
from rig import records as R
from rig.argnames import in_callers_words
from rig.clock import clock_for, shared_now
from rig.cluster_templates import ClusterTemplates, cluster_templates
from rig.config import Settings, load_settings
from rig.errors import (
    ConfigError,
    InvalidInput,
    InvalidRecord,
    JobGone,
    PermissionDenied,
    RedisUnavailable,
    RigError,
    SubmitInterrupted,
    Unschedulable,
    record_vanished,
)
from rig.fairshare import exceeds_alone
from rig.hashes import read_fields
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import format_memory, parse_memory
from rig.models import CardState, Job, JobState, Priority, waiting_since
from rig.nodes import NodeInfo, NodeRegistry, worker_node
from rig.placement import Request, never_fits
from rig.plain_numbers import plain_number
from rig.pools import ClusterPools, Pools, cluster_pools
from rig.redis_conn import check, connect, is_setup_error, unavailable
from rig.redis_writes import is_outage, refusal, refused_error
from rig.redis_writes import notices as redis_notices
from rig.replication import MasterDeposed, no_replica_note, replica_wait
from rig.request_rules import (
    check_flag,
    check_gpu_memory,
    check_gpus,
    check_limit,
    check_retries,
    check_text_options,
    parse_time_limit,
    resolve_workdir,
)
from rig.store import JobStore
from rig.supervision import beat_of_up
from rig.words import typed_word

if TYPE_CHECKING:
    from rig.accounting import UsageLine
    from rig.forecast import Forecast, RunningEnd
    from rig.history import History

log = logging.getLogger(__name__)



#: What a job is: a command line, or a @rig.task call (rig.pytask).
JOB_KINDS = ("command", "python")
#: Client.submit's arguments that only rig's own callers give (@rig.task, through the gateway
#: too): rig.submit and submit_many refuse them (kind='python' queued a command as a call).
INTERNAL_OPTIONS = ("kind", "extra")

#: How long submit() trusts its copy of the cards' capacities (s).
CARDS_CACHE_S = 5.0
#: Records read in one round trip by a command over many ids (Client.records).
KILL_BATCH = 500


@dataclass(frozen=True)
class Identity:
    """Who runs this process: the real uid and its login name from the password database.
    Never $USER or $LOGNAME: anyone can set those."""

    name: str
    uid: int


#: Set by the gateway (rig.gateway.server) for the request it serves: the peer's identity from
#: the kernel (SO_PEERCRED), the environment its client sent and its process's umask. Unset:
#: this process's own.
_acting: ContextVar[tuple[Identity, Mapping[str, str], int | None] | None] = ContextVar("rig_acting", default=None)


@contextmanager
def acting_as(who: Identity, environ: Mapping[str, str], umask: int | None = None) -> Iterator[None]:
    """Within: :func:`current_identity` is ``who``, the submitter's environment (what
    ``--export`` reads) is ``environ`` and its umask ``umask`` (caller_umask). The gateway
    serves each request of a peer this way."""
    token = _acting.set((who, environ, umask))
    try:
        yield
    finally:
        _acting.reset(token)


def caller_environ() -> Mapping[str, str]:
    """The submitter's environment: the gateway's peer's (acting_as), else this process's."""
    acting = _acting.get()
    return acting[1] if acting is not None else os.environ


def caller_umask() -> int | None:
    """The submitter's umask, which its jobs keep: the gateway's peer process's (acting_as),
    else this process's (rig.job_env.umask_of); None when it cannot be read."""
    acting = _acting.get()
    return acting[2] if acting is not None else jobenv.umask_of()


def identity_of(uid: int) -> Identity:
    """The login name of ``uid`` from the password database (the uid as text without one)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Identity(name, uid)


def current_identity() -> Identity:
    """The calling user (see Identity): the gateway's peer while it serves one (acting_as),
    else this process's real uid. Without a passwd entry (some containers) the uid, as text,
    stands for the name."""
    acting = _acting.get()
    if acting is not None:
        return acting[0]
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Identity(name, uid)


@dataclass
class WorkerInfo:
    name: str
    role: str
    node: str
    card: int | None
    pid: int
    jobs: int
    seen_at: float


@dataclass
class StatusReport:
    """What `rig status` shows: cards, waiting jobs per priority, live workers, job counts."""

    cards: list[CardState]
    running: dict[str, list[Job]]  # card id -> jobs holding it
    pending: dict[Priority, int]
    oldest_wait: dict[Priority, float | None]  # seconds
    workers: list[WorkerInfo]
    counts: dict[JobState, int]
    notices: list[str] = field(default_factory=list)
    nodes: list[NodeInfo] = field(default_factory=list)  # every node, with its liveness
    users: list[UserUsage] = field(default_factory=list)  # who holds and waits for what
    pool: str | None = None  # the pool this report is limited to (cards and waiting jobs)
    #: With ``pool``: why it shows no card (Pools.no_card), else None.
    pool_empty: str | None = None
    #: While Redis refuses writes: why ("Redis full"); heartbeats are refused (rig.refused_beats).
    beats_refused: str | None = None
    #: Finished jobs moved to the archive (counts: those still in Redis); None: no archive read.
    archived: int | None = None
    #: Where they are: the archive's URL (no password), read with ``archived``; None: not read.
    archive: str | None = None
    #: The shared clock when ``oldest_wait`` was measured (None: unknown): a view drawn later
    #: (`rig top` redraws between reads) adds the time since, as its waiting jobs' ages do.
    taken_at: float | None = None

    def takes_jobs(self, card: CardState) -> bool:
        """Can ``card`` take a job now, as reports say it (``takes_jobs``): eligible, and its
        node neither stopped nor down (nor silent past its heartbeat's life). A node's cards
        keep their own records when it stops; another node's health pass closes them, and a
        lone node stopped by `rig down` has none: its cards read as taking jobs."""
        node = next((n for n in self.nodes if n.name == card.node), None)
        gone = node is not None and (node.state in ("stopped", "down") or node.presumed_down)
        return card.eligible and not gone


@dataclass
class UserUsage:
    """One user's share right now: jobs placed or running, memory held (bytes, summed over
    cards), jobs waiting, and recent usage (GiB-hours, decayed as fair share counts it)."""

    user: str
    running: int = 0
    held: int = 0
    waiting: int = 0
    recent_gib_hours: float = 0.0


class Client:
    """Talks to rig's Redis. Cheap to create; connects on first use."""

    def __init__(self, settings: Settings | None = None, *, redis_client: redis.Redis | None = None):
        self.settings = settings or load_settings()
        self.keys = Keys(self.settings.key_prefix)
        self.r = redis_client or connect(self.settings.redis_url)
        clock_for(self.r)  # what this process renders ages against: Redis' clock (rig.clock)
        self.store = JobStore(self.r, self.keys)
        self.ledger = Ledger(self.r, self.keys,
                             usage_half_life_s=self.settings.fair_share_half_life_hours * 3600)
        self._celery = None
        self._cards_cache: tuple[float, list[CardState]] | None = None
        self.last_auto_note: str | None = None
        #: Under Sentinel: a submission is acknowledged once a replica has it (rig.replication).
        self.replicas = replica_wait(self.r, self.keys, self.settings.redis_url, self.settings.replica_wait_seconds)
        #: The warning of the last submission no replica confirmed in time (None: confirmed).
        self.last_durability_note: str | None = None
        self._history: History | None = None

    # -- plumbing -------------------------------------------------------------------------
    def ping(self) -> None:
        check(self.r, self.settings.redis_url)

    @property
    def celery(self):  # noqa: ANN201 - Celery is imported lazily: it is slow to import
        if self._celery is None:
            from rig.celery_config import make_celery

            self._celery = make_celery(self.settings)
        return self._celery

    def wake_dispatcher(self) -> None:
        """Nudge the dispatcher. Only a nudge (it looks at the queue every second anyway): a
        Redis that cannot take it now (unreachable, full) is no error of the caller's."""
        try:
            self.r.lpush(self.keys.sched_wake, "1")
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            log.debug("dispatcher not nudged: %s", exc)

    def _guard(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.InvalidResponse) as exc:
            raise unavailable(self.settings.redis_url, exc) from None  # auth errors included
        except redis.ResponseError as exc:
            # A refused write (full, read-only replica, MISCONF) changed nothing: rig's own
            # error, saying what to do (rig.redis_writes), never redis-py's.
            if is_setup_error(exc):  # no such database: this Redis cannot be rig's
                raise unavailable(self.settings.redis_url, exc) from None
            if refusal(exc) is None:
                raise
            raise refused_error(self.settings.redis_url, exc, self.r) from None

    # -- submitting -----------------------------------------------------------------------
    @in_callers_words
    def submit(
        self,
        command: str | list[str] | tuple[str, ...],
        *,
        gpu_memory: str | int | None = None,
        gpus: int = 1,
        priority: str | Priority | None = None,
        name: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        shell: bool | None = None,
        kind: str = "command",
        extra: dict[str, Any] | None = None,
        retries: int | None = None,
        time_limit: str | float | None = None,
        oom_retry_grow: bool | None = None,
        template: str | None = None,
        pool: str | None = None,
        export: str | None = None,
        _batch: dict[Any, Any] | None = None,
    ) -> JobHandle:
        """Queue a job; returns a handle at once. A string command runs through ``/bin/sh -c``.
        ``pool`` restricts it to the cards of one configured pool (rig.pools).

        Raises InvalidInput for a malformed request, Unschedulable when no allowed card could
        ever hold it, RedisUnavailable when rig's Redis cannot be reached. Nothing is written
        unless the request is accepted.
        """
        if kind not in JOB_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(JOB_KINDS)}, got {kind!r}")
        if (extra is not None or kind == "python") and (
                not isinstance(extra, dict) or set(extra) != {"payload"}
                or not isinstance(extra["payload"], str) or kind != "python"):
            # The record's other fields (its owner, state, ...) are rig's to write, never a caller's.
            raise InvalidInput("extra may only carry a @rig.task call's payload ({'payload': base64 text}, "
                               "kind 'python')")
        shell = check_flag(shell, "shell")
        oom_retry_grow = check_flag(oom_retry_grow, "oom_retry_grow")
        check_text_options({"--name": name, "--template": template, "--pool": pool, "--workdir": workdir})
        argv, is_shell = _normalise_command(command, shell)
        argv = _checked("the command", R.as_argv, argv)
        # An empty name is refused below, as any empty option is (`--name "$NAME"` with NAME
        # unset ran under the program's name in silence); only a name left out is defaulted.
        job_name = (_default_name(argv, is_shell) if name is None else name).strip()
        margin = None
        if template is not None:
            presets = self._templates_memo(_batch if _batch is not None else {})
            preset = presets.templates.get(template)
            if preset is None:
                known = ", ".join(sorted(presets.templates)) or "none"
                raise InvalidInput(f"unknown template {template!r}; known: {known}, from {presets.whose} "
                                   f"(`rig templates`)")
            gpu_memory = gpu_memory if gpu_memory is not None else preset.gpu_memory
            priority = preset.priority if priority is None else priority
            retries = retries if retries is not None else preset.retries
            time_limit = time_limit if time_limit is not None else preset.time_limit
            oom_retry_grow = oom_retry_grow if oom_retry_grow is not None else preset.oom_retry_grow
            margin = preset.margin
        if gpu_memory is None:
            sets_none = f" (template {template!r} sets none)" if template is not None else ""
            raise InvalidInput(f"--gpu-memory is required{sets_none}: how much GPU memory the job needs, e.g. 12G")
        self.last_auto_note = None
        # How the declared size came from what was typed, when it is not that (a template's
        # margin, `auto`): a refusal quoting "needs 24.0 GiB" says so, else `--gpu-memory 20G`
        # read as if rig had misread it.
        sized_by: str | None = None
        if isinstance(gpu_memory, str) and typed_word(gpu_memory) == "auto":
            nbytes, self.last_auto_note = self._guard(self.auto_memory, job_name, margin)
            sized_by = self.last_auto_note
        else:
            nbytes = parse_memory(gpu_memory)
            if margin and margin != 1.0:
                # The size given is a size a card has (else a margin made a huge one overflow:
                # OverflowError); then the product, named as the template made it.
                check_gpu_memory(nbytes)
                nbytes = check_gpu_memory(_round_up(int(nbytes * margin)),
                                          f"template {template!r}: {gpu_memory} x margin {margin:g} =")
                sized_by = (f"{format_memory(nbytes)} per card is {gpu_memory} x margin {margin:g} of "
                            f"template {template!r}")
        sized_note = f" ({sized_by})" if sized_by else ""
        check_gpu_memory(nbytes)  # rig.request_rules: the rule templates are checked with too
        gpus = check_gpus(gpus)
        # "" is a slip (`--priority "$PRIO"` with PRIO unset), refused as any unknown word: never
        # the default priority in silence
        prio = Priority.parse(self.settings.default_priority if priority is None else priority)
        # submit_many (``_batch``, its memo: the same caller, environment and folders for every
        # request) checks each distinct folder and environment once, not once per job.
        memo: dict[Any, Any] = _batch if _batch is not None else {}
        wd = memo.get(("workdir", workdir))
        if wd is None:
            wd = memo[("workdir", workdir)] = resolve_workdir(workdir, self.settings.command_workdir)
        max_retries = self.settings.max_retries if retries is None else retries
        max_retries = check_retries(max_retries, shown=retries)
        limit = parse_time_limit(time_limit)
        # What the job's environment holds is decided in rig.job_env: the submitter's
        # variables rig passes on, then --env (a value of None: the submitter's own value).
        given = jobenv.given_env(env)
        env_key = ("env", repr(export), tuple(given.items()))
        if env_key not in memo:
            refused = jobenv.refuse_rig_owned(given)  # before resolving: rig's own are refused either way
            if refused:
                raise InvalidInput(refused)
            environ = caller_environ()
            try:
                asked = jobenv.resolve_names(given, environ)
                passed = jobenv.exported(environ, export)  # --export ALL (default) | NONE | names
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            _checked("--env", R.as_env, asked)
            # What is left to refuse is the size of the whole (your variables count too).
            memo[env_key] = _checked("the job's environment (your variables as --export passes them, and --env)",
                                     R.as_env, {**passed, **asked},
                                     "; pass fewer: --export NONE, or --export NAME,NAME")
        job_env = dict(memo[env_key])
        if not job_name:
            raise InvalidInput("--name must not be empty")
        job_name = _checked("--name", R.as_name, job_name)
        _checked("--workdir", R.as_abs_path, str(wd))
        who = current_identity()
        _checked(f"your login name {who.name!r} cannot be recorded", R.as_user, who.name)
        self._refuse_over_limit_alone(who.name, Request(nbytes, gpus), sized_note)

        # The cluster's pools, not this process's config (rig.pools); read only for a pool job.
        pools = self._pool_of(pool, memo) if pool is not None else Pools({})

        def _do() -> Job:
            self._refuse_never_fits(self._cards_for_admission(), Request(nbytes, gpus), pool, pools, sized_note)
            # submit_many reads every job's own runs in one round trip (own_estimates).
            own = None if _batch is not None else self.own_estimate(job_name, limit, template=template, command=argv)
            return Job(
                id=0, name=job_name, user=who.name, uid=who.uid, umask=caller_umask(), command=argv, shell=is_shell,
                gpu_memory=nbytes, gpus=gpus, priority=prio, state=JobState.PENDING,
                workdir=str(wd), env=job_env, created_at=shared_now(self.r), kind=kind,
                max_retries=max_retries, submit_host=socket.gethostname(), time_limit=limit,
                oom_retry_grow=bool(oom_retry_grow), template=template, pool=pool,
                expected_seconds=own.expected if own else None,
                cautious_seconds=own.cautious if own else None,
                expected_source=own.source if own else None,
            )

        job = self._guard(_do)
        if _batch is not None:
            return job, extra  # type: ignore[return-value] - submit_many's internal use
        job = self._guard(self.store.create, job, extra)
        self._stored([job])
        return JobHandle(self, job.id, job)

    @in_callers_words
    def submit_many(self, requests: list[dict[str, Any]]) -> list[JobHandle]:
        """Queue several jobs at once: each request is submit()'s arguments as a dict
        (``{"command": [...], "gpu_memory": "4G", ...}``). Every request is checked first; if
        one is refused (InvalidInput, Unschedulable) nothing is written. Then all are stored in
        one Redis transaction, in order (their ids are consecutive). For sweeps: several times
        the rate of submit() in a loop."""
        if not isinstance(requests, (list, tuple)):
            raise InvalidInput(f"submit_many takes a list of dicts of submit()'s arguments, got {type(requests).__name__}")
        built = []
        memo: dict[Any, Any] = {}
        for number, request in enumerate(requests):
            if not isinstance(request, Mapping):
                raise InvalidInput(f"request {number}: expected a dict of submit()'s arguments")
            request = dict(request)
            check_request_keys(number, request)
            try:
                command = request.pop("command")
            except KeyError:
                raise InvalidInput(f"request {number}: no command") from None
            try:
                built.append(self.submit(command, _batch=memo, **request))
            except RigError as exc:
                raise type(exc)(f"request {number}: {exc}") from None
            except TypeError as exc:
                raise InvalidInput(f"request {number}: {exc}") from None
        self._guard(self._own_estimates, [job for job, _ in built])
        jobs = self._guard(self.store.create_many, built)
        self._stored(jobs)
        return [JobHandle(self, job.id, job) for job in jobs]

    def _own_estimates(self, jobs: list[Job]) -> None:
        """Fill each new job's own estimate (own_estimate's), read for all in one round trip."""
        owns = estimates.read_own_many(self.r, self.keys,
                                       [(job.user, job.name, job.template, job.command) for job in jobs])
        for job, own in zip(jobs, owns, strict=True):
            found = estimates.own_estimate(own, job.time_limit)
            job.expected_seconds = found.expected if found else None
            job.cautious_seconds = found.cautious if found else None
            job.expected_source = found.source if found else None

    def own_estimate(self, name: str, time_limit: float | None, user: str | None = None, *,
                     template: str | None = None,
                     command: Sequence[str] | str = "") -> estimates.Estimate | None:
        """A job's run time from the caller's earlier successful runs of the same command, name
        or template (rig.estimates: their median and 80th percentile, capped by the time limit),
        or None without such runs: the dispatcher then estimates it from the cluster's recent
        runs of its size (a declared time limit is not an estimate of the run time)."""
        user = user or current_identity().name
        own = estimates.read_own(self.r, self.keys, user=user, name=name, template=template, command=command)
        return estimates.own_estimate(own, time_limit)

    def auto_memory(self, name: str, margin: float | None = None, user: str | None = None) -> tuple[int, str]:
        """``--gpu-memory auto``: the largest measured peak of the last 5 successful runs of
        the caller's (``user``'s) jobs with this name, times auto_memory_margin, rounded up to
        256 MiB. Returns the bytes and a sentence saying how they were chosen."""
        user = user or current_identity().name
        peaks = estimates.recent_peaks(self.r, self.keys, user=user, name=name, count=5)
        if not peaks:
            ran = estimates.read_own(self.r, self.keys, user=user, name=name, template=None, command=[])["name"]
            if ran:  # it ran, and measured nothing: fake cards, a CPU-only job, no NVML reading
                raise InvalidInput(f"--gpu-memory auto: the {len(ran)} earlier run(s) of {name!r} measured no GPU "
                                   "memory in use; give a size such as 12G")
            raise InvalidInput(
                f"--gpu-memory auto: no measured run of a job named {name!r} yet; give a size such as 12G")
        margin = margin or self.settings.auto_memory_margin
        nbytes = _round_up(int(max(peaks) * margin))
        note = (f"--gpu-memory auto: {format_memory(nbytes)} (peak {format_memory(max(peaks))} over the "
                f"last {len(peaks)} run(s) of {name!r} x {margin})")
        return nbytes, note

    def _cards_for_admission(self) -> list[CardState]:
        """The registered cards, cached briefly: capacities change only when a node
        (re)registers, and reading them for every one of 1,000 submissions costs more than the
        submission itself. Only used to refuse jobs that could never run."""
        now = time.monotonic()
        if self._cards_cache is None or now - self._cards_cache[0] > CARDS_CACHE_S:
            self._cards_cache = (now, self.ledger.cards())
        return self._cards_cache[1]

    def _confirm_replicated(self, jobs: list[Job]) -> None:
        """Under Sentinel, wait until a replica has the stored jobs before their ids are given
        out (rig.replication). None in time: if the (possibly new) master still holds them they
        stand, with a warning in ``last_durability_note`` and the log; if a fail-over came in
        between and lost them, RedisUnavailable says so (never an id of a job that is gone)."""
        self.last_durability_note = None
        if self.replicas is None or not jobs:
            return
        replicas = self.replicas

        def confirm() -> bool | None:
            try:
                return replicas.confirm()
            except MasterDeposed:
                return None  # written to a master the sentinels replaced: it drops them

        confirmed = self._guard(confirm)
        if confirmed:
            return
        ids = ", ".join(str(job.id) for job in jobs[:10]) + (" ..." if len(jobs) > 10 else "")
        lost = confirmed is None
        if not lost:
            pipe = self.r.pipeline(transaction=False)
            for job in jobs:
                pipe.hget(self.keys.job(job.id), "instance")
            lost = any(found != job.instance for found, job in zip(self._guard(pipe.execute), jobs, strict=True))
        if lost:
            raise RedisUnavailable.said(
                self.settings.redis_url, f"job(s) {ids} were lost in a Redis fail-over before a replica had them: "
                "nothing of this submission is queued; submit again")
        self.last_durability_note = self.replicas.unconfirmed_note(f"job(s) {ids}")
        log.info("%s", self.last_durability_note)  # the CLI and the gateway show it to the submitter

    def _stored(self, jobs: list[Job]) -> None:
        """What a submit call does once its jobs are stored: under Sentinel, wait for a replica
        (``_confirm_replicated``). Nothing else: no Celery message (rig.notify), the transaction
        that stored them woke the dispatcher. A Ctrl-C meanwhile says their ids (they will run)."""
        try:
            self._confirm_replicated(jobs)
        except KeyboardInterrupt:
            raise SubmitInterrupted([job.id for job in jobs]) from None

    def flush(self, timeout: float = 5.0) -> bool:
        """True: a submit call leaves nothing to send (rig.notify). Kept for callers of the
        older API."""
        return True

    # -- reading --------------------------------------------------------------------------
    @property
    def history(self) -> History:
        """Jobs in Redis and in the archive, read as one (rig.history)."""
        if self._history is None:
            from rig.history import History

            self._history = History(self.store, self.settings)
        return self._history

    def get(self, job_id: int | str, instance: str | None = None) -> Job:
        """The job's record: from Redis, else from the archive once it moved there; with
        ``instance`` (a prefix of it), that very job where the id was given again."""
        return self._guard(self.history.get, R.parse_job_id(job_id), instance)

    def other_instance(self, job: Job) -> Job | None:
        """The archived job with ``job``'s id and another instance (ids restarted after Redis
        lost its data), or None (rig.history.History.other_instance)."""
        return self._guard(self.history.other_instance, job)

    def get_instance(self, job_id: int | str, instance: str | None) -> Job:
        """The record of job ``job_id``, which must be that very job when ``instance`` is given:
        after Redis lost its data, ids restart and an old id names another job. Raises JobGone
        (a JobNotFound, exit 4) then, saying so."""
        job = self.get(job_id)
        if instance is not None and job.instance != instance:
            raise JobGone(job.id, f"job {job.id} is gone: rig's Redis lost its data (it was restarted empty, "
                              f"flushed or replaced) and the id {job.id} now belongs to another job "
                              f"('{job.name}' by {job.user}); `rig status` says what the node did with it")
        return job

    def job(self, job_id: int | str) -> JobHandle:
        job = self.get(job_id)
        return JobHandle(self, job.id, job)

    @in_callers_words
    def jobs(self, state: JobState | str | None = None, *, limit: int = 50, user: str | None = None,
             since: float | None = None) -> list[Job]:
        """Newest first, archived jobs included; with ``user``, only the jobs that login name
        submitted; with ``since`` (epoch s), only those submitted then or later."""
        st, limit = jobs_filter(state, limit)
        return self._guard(self.history.list, st, limit=limit, user=user, since=since)

    def usage(self, *, since: float | None = None, by: str = "user") -> tuple[list[UsageLine], UsageLine]:
        """Accounting (rig.accounting) of the jobs that ended at or after ``since`` (epoch s),
        archived or not: one line per value of ``by`` (user, name, template, pool, node) and the
        total."""
        from rig.accounting import GROUPS

        if by not in GROUPS:
            raise InvalidInput(f"cannot group by {by!r}; choose one of: {', '.join(GROUPS)}")
        # The archive's part from its per-day sums (rig.history.History.usage), not row by row.
        return self._guard(self.history.usage, since, by)

    def waiting(self, *, limit: int = 50) -> list[Job]:
        """The first ``limit`` waiting jobs in queue order (priority, then submission; fair
        share may still reorder a priority's jobs between users)."""
        return self._guard(lambda: self.store.get_many(self.store.pending_head(limit)))

    def why_waiting(self, job: Job) -> str | None:
        """For a PENDING job, a sentence a person understands (rig.waiting: the one
        explanation); for an ASSIGNED one slow to start, why it has not started
        (rig.starting); None for other states."""
        from rig.starting import why_not_started
        from rig.waiting import why_waiting

        if job.state is JobState.ASSIGNED:
            return self._guard(lambda: why_not_started(self, job))
        return why_waiting(self, job)

    def waiting_words(self, jobs: Iterable[Job]) -> dict[int, str]:
        """What `rig jobs` and `rig top` say of each waiting job of ``jobs`` (job id -> why it
        waits): rig.waiting.waiting_words, never a stored sentence no dispatcher keeps true."""
        from rig.waiting import waiting_words

        return self._guard(waiting_words, self, list(jobs))

    def jobs_ahead(self, job_ids: Iterable[int]) -> dict[int, int]:
        """How many jobs are ahead of each of ``job_ids`` in the queue: its rank in the pending
        queue, the count `rig show` gives ("N job(s) ahead of it", rig.waiting.why_waiting). A
        job not in the queue (placed, ended) is left out. One round trip for all of them."""
        ids = list(job_ids)
        if not ids:
            return {}

        def read() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            for jid in ids:
                pipe.zrank(self.keys.pending, str(jid))
            return pipe.execute()

        return {jid: int(rank) for jid, rank in zip(ids, self._guard(read), strict=True) if rank is not None}

    def running_end(self, job: Job) -> RunningEnd:
        """A placed or running job's expected end, as the dispatcher works it out (rig.forecast.running_end)."""
        from rig.forecast import running_end

        return self._guard(running_end, self, job)

    def start_estimates(self, job_ids: Iterable[int] | None = None) -> Forecast:
        """The estimated start of each of ``job_ids`` (all the stored forecast holds when None),
        as the leading dispatcher last worked it out (rig.forecast: its passes replayed at every
        expected end; rig.forecast_store: remade every few seconds, read here in one round trip)."""
        from rig.forecast_store import read

        return self._guard(lambda: read(self.r, self.keys, job_ids))

    def first_look(self, job_id: int) -> str | None:
        """What rig-submit says of a job it just queued (rig.waiting.first_look)."""
        from rig.waiting import first_look

        return first_look(self, job_id)

    def status(self, pool: str | None = None) -> StatusReport:
        """Cards, queues, workers, nodes and users; with ``pool``, only that pool's cards and
        the waiting jobs submitted to it."""
        pools = self._pool_of(pool, {}) if pool is not None else Pools({})

        def _do() -> StatusReport:
            cards = [c for c in self.ledger.cards() if pools.contains(pool, c.node, c.index)]
            holders = {cid: sorted(jobs) for cid, jobs in self.ledger.holdings_of(cards).items()}
            all_ids = {jid for ids in holders.values() for jid in ids}
            by_id = {j.id: j for j in self.store.get_many(sorted(all_ids))}
            running = {cid: [by_id[i] for i in ids if i in by_id] for cid, ids in holders.items()}
            now = shared_now(self.r)
            if pool is None:
                pending = self.store.pending_counts()
                oldest: dict[Priority, float | None] = {}
                for prio in Priority:
                    since = self.store.waiting_since_earliest(prio)
                    oldest[prio] = max(0.0, now - since) if since is not None else None
            else:
                pending, oldest = self._pool_queue(pool, now)
            node_names = {c.node for c in cards}
            every_node = NodeRegistry(self.r, self.keys).read()
            nodes = [n for n in every_node if pool is None or n.name in node_names]
            from rig.authwatch import annotate as annotate_auth  # why a silent node is silent

            annotate_auth(self.r, nodes, max(60.0, 2 * self.settings.health.timeout))
            from rig.refused_beats import annotate as annotate_refused  # not silent: refused

            beats_refused = annotate_refused(self.r, nodes)
            notices = redis_notices(self.r, url=self.settings.redis_url)  # Redis full; an evicting policy; no persistence
            alone = no_replica_note(self.r, self.settings.redis_url)  # under Sentinel, no replica
            if alone:
                notices.append(alone)
            from rig.archive import safe_url

            archived = archive = None
            try:
                archived = self.history.archived_count()
                archive = safe_url(self.history.location())  # where the history is (README, Archive)
            except ConfigError as exc:  # the rest of the status is still true: say it, go on
                notices.append(f"the archive cannot be read: {exc}")
            from rig.archive_cluster import late
            from rig.rollback import note as rollback_note

            from rig.rollback import waiting_line as rollback_wait

            if (line := rollback_note(self.r, self.keys)) is not None:  # Redis went back to an older copy
                notices.append(line)
            if (line := rollback_wait(self.r, self.keys, self.settings.archive_interval)) is not None:
                notices.append(line)  # placement held back until that check

            workers = self.workers(every_node)
            control_up = any(w.role == "control" for w in workers)  # they run the archiving passes
            if (line := late(self.r, self.keys, now, self.settings.archive_interval,
                             control_up=control_up)) is not None:
                notices.append(line)
            return StatusReport(beats_refused=beats_refused,
                cards=cards, running=running, pending=pending, oldest_wait=oldest, taken_at=now,
                workers=workers, counts=self.store.count_by_state(),
                nodes=nodes, users=self._users(running, now), pool=pool,
                pool_empty=pools.no_card(pool) if pool is not None and not cards else None,
                notices=notices, archived=archived, archive=archive,
            )

        return self._guard(_do)

    def _pool_queue(self, pool: str, now: float) -> tuple[dict[Priority, int], dict[Priority, float | None]]:
        """Waiting jobs submitted to ``pool``, per priority, and the oldest one's wait (s).
        Reads every waiting job's pool field: O(waiting), in one round trip."""
        ids = self.r.zrange(self.keys.pending, 0, -1)
        counts = {p: 0 for p in Priority}
        oldest: dict[Priority, float | None] = {p: None for p in Priority}
        # One script call per 2,000 jobs (rig.hashes), not one pipelined command each.
        for job_pool, prio, created, queued in read_fields(self.r, [self.keys.job(jid) for jid in ids],
                                                           ("pool", "priority", "created_at", "queued_at")):
            if job_pool != pool or prio not in {p.value for p in Priority}:
                continue
            p = Priority(prio)
            counts[p] += 1
            try:
                waited = now - waiting_since(float(created), float(queued) if queued else None)
            except (TypeError, ValueError):
                continue
            oldest[p] = max(oldest[p] or 0.0, waited)
        return counts, oldest

    def _users(self, running: dict[str, list[Job]], now: float) -> list[UserUsage]:
        """Per user: jobs holding cards, memory held, jobs waiting, recent usage (GiB-hours)."""
        from rig.fairshare import decay

        users: dict[str, UserUsage] = {}
        seen: set[int] = set()
        for jobs in running.values():
            for job in jobs:
                if job.id in seen:
                    continue
                seen.add(job.id)
                u = users.setdefault(job.user, UserUsage(job.user))
                u.running += 1
                u.held += job.gpu_memory * max(1, len(job.cards))
        for name in self.r.smembers(self.keys.pending_users):
            users.setdefault(name, UserUsage(name))
        names = sorted(users)
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.zcard(self.keys.pending_user(name))
            pipe.hmget(self.keys.usage(name), "value", "at")
        replies = pipe.execute()
        half_life = self.settings.fair_share_half_life_hours * 3600
        for name, waiting, (value, at) in zip(names, replies[::2], replies[1::2], strict=True):
            users[name].waiting = int(waiting)
            try:
                users[name].recent_gib_hours = decay(float(value or 0), float(at or now), now, half_life)
            except ValueError:
                pass
        return [users[n] for n in names]

    def workers(self, nodes: Sequence[NodeInfo] | None = None) -> list[WorkerInfo]:
        """Workers whose heartbeat has not expired and counts: not those of a node none of whose
        workers' beats count (``NodeInfo.workers`` 0: its ``rig up`` no longer runs on this
        host, SIGKILLed with them, and their last beats outlive them by up to health.timeout;
        rig status said "workers alive: 12" under "node b: DOWN" with b's 3 dead ones).
        Nor one that names another rig up than its node's (rig.supervision.beat_of_up).
        ``nodes``: every node as NodeRegistry.read gave it (read here when None)."""
        import json

        names = sorted(self.r.smembers(self.keys.workers))
        if not names:
            return []
        values = self.r.mget([self.keys.worker(n) for n in names])
        if nodes is None:
            nodes = NodeRegistry(self.r, self.keys).read()
        beats_void = {n.name for n in nodes if n.workers == 0}
        ups = {n.name: (n.pid, n.pid_start) for n in nodes}
        alive = []
        for name, value in zip(names, values, strict=True):
            node = worker_node(name)
            if value is None or node in beats_void or not beat_of_up(value, *ups.get(node or "", (None, None))):
                continue  # its node's rig up no longer runs here, or it is a former rig up's
            data = json.loads(value)
            alive.append(WorkerInfo(
                name=name, role=data.get("role", "?"), node=data.get("node", "?"),
                card=data.get("card"), pid=int(data.get("pid", 0)), jobs=int(data.get("jobs", 0)),
                seen_at=float(data.get("seen_at", 0)),
            ))
        return alive

    # -- control --------------------------------------------------------------------------
    def kill(self, job_id: int | str, *, wait: bool = True, timeout: float | None = None,
             admin: str | None = None) -> Job:
        """Stop a job: a waiting one is cancelled at once; a running one's whole process tree
        is stopped by its worker (SIGTERM, then SIGKILL after kill_grace_seconds) and its VRAM
        freed. Returns the job as it is afterwards.

        ``admin``: who asks, for a caller rig trusts as an admin whatever user this process
        runs as (Flower's Terminate: its login is an admin login, workers/remote_control.py);
        the record names them as the one who cancelled it. Otherwise the caller's own identity,
        under the ownership rule (check_control)."""
        job = self.get(job_id)
        if job.state.terminal:
            return job
        if admin is None:
            self.check_control(job, "kill")
        by = admin or current_identity().name
        self._guard(self.store.update, job.id, cancelled_by=by)
        code, _ = self._guard(
            self.ledger.transition, job.id, JobState.CANCELLED,
            fields={"reason": f"cancelled by {by}"}, mode="cancel",
        )
        if code == 1:
            self.wake_dispatcher()
            return self.get(job.id)
        if code == 2:
            self.r.publish(self.keys.kill_channel, str(job.id))
            if wait:
                limit = timeout if timeout is not None else self.settings.kill_grace_seconds + 20
                return self.wait(job.id, timeout=limit)
        return self.get(job.id)

    def records(self, job_ids: Sequence[int]) -> dict[int, Job | RigError]:
        """Each job's record for a command over many ids (`rig kill` of a sweep): read from
        Redis KILL_BATCH at a time in one round trip each (without their environments), an id
        Redis does not hold read as :meth:`get` reads it (the archive, or JobNotFound), a
        record that fails its checks as the error. Outages raise."""
        found: dict[int, Job | RigError] = {}
        for start in range(0, len(job_ids), KILL_BATCH):
            chunk = list(job_ids[start:start + KILL_BATCH])
            raws = self._guard(self.store.raws, chunk, env=False)
            for jid, raw in zip(chunk, raws, strict=True):
                try:
                    found[jid] = Job.from_redis(raw) if raw else self.get(jid)
                except RedisUnavailable:
                    raise
                except RigError as exc:
                    found[jid] = exc
        return found

    def cancel_waiting(self, jobs: Sequence[Job], *, admin: str | None = None) -> list[int]:
        """Cancel the waiting (PENDING) ``jobs`` as :meth:`kill` does, without a read before
        each and with one nudge of the dispatcher for all: one script call a job. The caller
        checked who may (check_control). Returns the ids cancelled; a job that moved meanwhile
        (placed, started, ended) is left to :meth:`kill`."""
        by = admin or current_identity().name
        now = shared_now(self.r)
        cancelled: list[int] = []
        for job in jobs:
            code, _ = self._guard(
                self.ledger.transition, job.id, JobState.CANCELLED,
                fields={"reason": f"cancelled by {by}", "cancelled_by": by}, mode="cancel",
                expect=JobState.PENDING, now=now, read=job,
            )
            if code == 1:
                cancelled.append(job.id)
        if cancelled:
            self.wake_dispatcher()
        return cancelled

    def is_admin(self, who: Identity | None = None) -> bool:
        """Root, and the users named in the ``admins`` setting, may control anyone's jobs."""
        who = who or current_identity()
        return who.uid == 0 or who.name in self.settings.admins

    def check_control(self, job: Job, action: str) -> None:
        """Raise PermissionDenied unless the caller submitted ``job`` or is an admin.

        The caller is this process's real user, or the gateway's peer as the kernel names it
        (acting_as): users without Redis' password reach rig only through the gateway, so
        for them this is the barrier (rig.gateway). Whoever holds the password can write
        Redis and is trusted like an admin (docs/SECURITY.md)."""
        from rig.ownership import refusal

        who = current_identity()
        refused = refusal(job, who, admin=self.is_admin(who), action=action)
        if refused is not None:
            raise refused

    def forget_node(self, name: str, *, force: bool = False,
                    failed: dict[int, str] | None = None) -> list[str]:
        """Forget a node that is gone for good (rig.nodes.NodeRegistry.forget): admins only,
        refused while it is up or has jobs, and, unless ``force``, while it is merely stopped
        (rig.forget: the refusal says which waiting jobs it would fail). Waiting jobs no card
        left could ever hold are FAILED (class unschedulable), their ids and reasons put in
        ``failed``. Returns the ids of the cards removed with it."""
        from rig.config import NODE_NAME
        from rig.errors import NodeInUse
        from rig.forget import fail_unrunnable, plan

        who = current_identity()
        if not self.is_admin(who):
            raise PermissionDenied(f"only an admin may forget a node, and {who.name} is none "
                                   "(root, or a user named in `admins` / RIG_ADMINS)")
        if not NODE_NAME.fullmatch(name):
            raise InvalidInput(f"{name!r} is not a node name; `rig status` lists the nodes")
        registry = NodeRegistry(self.r, self.keys)
        pools = self.cluster_pools().pools
        ahead = self._guard(plan, self.ledger, pools, name)
        info = next((n for n in self._guard(registry.read) if n.name == name), None)
        if info is not None and info.state == "stopped" and not force:
            # Jobs still running there refuse even --force: say that, not "--force forgets it".
            self._guard(registry.forget, name, check_only=True)
            raise NodeInUse(ahead.refusal(info))
        cards = self._guard(registry.forget, name)
        done = self._guard(fail_unrunnable, self.ledger, pools, name, who.name, sorted(ahead.fail))
        if failed is not None:
            failed.update(done)
        return cards

    def _refuse_over_limit_alone(self, user: str, request: Request, note: str = "") -> None:
        """Raise Unschedulable when ``request`` alone is over ``user``'s limit (this client's
        settings: max_gpu_memory_per_user, [user_limits]), as a submission and `rig retry
        --gpu-memory` are refused. ``note`` ends the line (how the size was made)."""
        alone = exceeds_alone(self.settings.user_limit(user), request.nbytes, request.gpus)
        if alone:
            raise Unschedulable(f"job can never run: {alone}{note}")

    @staticmethod
    def _refuse_never_fits(every: Sequence[CardState], request: Request, pool: str | None, pools: Pools,
                           note: str = "") -> None:
        """Raise Unschedulable when ``request`` could never run on the cards of ``pool``
        (``pools``: the cluster's) among ``every`` registered card: what a submission and `rig
        retry --gpu-memory` are refused by (rig.placement.never_fits). Nothing is refused
        while no card is registered. ``note`` ends the line (how the size was made)."""
        cards = [c for c in every if pools.contains(pool, c.node, c.index)]
        if cards or pool is None:
            reason = never_fits(cards, request) if cards else None
            if reason:
                where = f" in pool {pool!r}" if pool else ""
                raise Unschedulable(f"job can never run{where}: {reason}{note}")
        elif every:
            raise Unschedulable(f"job can never run: {pools.no_card(pool)}")

    def cluster_pools(self) -> ClusterPools:
        """The pools the cluster's nodes serve (rig.pools.cluster_pools): what --pool is judged
        by, wherever this client runs; this process's own [pools] do not count."""
        return cluster_pools(self._guard(NodeRegistry(self.r, self.keys).read))

    def _pool_of(self, pool: str, memo: dict[Any, Any]) -> Pools:
        """The cluster's pools, once ``pool`` is known to be one of them (else InvalidInput, one
        line naming the known ones). ``memo``: a submit_many batch reads them once."""
        found = memo.get("cluster_pools")
        if found is None:
            found = memo["cluster_pools"] = self.cluster_pools()
        try:
            found.check(pool)
        except ValueError as exc:
            raise InvalidInput(f"--pool: {exc}") from None
        return found.pools

    def cluster_templates(self) -> ClusterTemplates:
        """The templates submissions use (rig.cluster_templates): the cluster's, recorded by the
        node started last, wherever this client runs; its own config's only while no node has
        recorded any."""
        return cluster_templates(self._guard(NodeRegistry(self.r, self.keys).read), self.settings.templates)

    def _templates_memo(self, memo: dict[Any, Any]) -> ClusterTemplates:
        """cluster_templates, read once per submit_many batch (``memo``)."""
        found = memo.get("cluster_templates")
        if found is None:
            found = memo["cluster_templates"] = self.cluster_templates()
        return found

    def templates(self) -> dict:
        """The submission presets in force (name -> rig.config.Template): cluster_templates'."""
        return self.cluster_templates().templates

    def errors(self, *, limit: int = 100, newest_first: bool = False) -> list[Job]:
        """The error queue (jobs that failed for good or timed out), oldest first (newest first
        with ``newest_first``: the web page's, where new failures must not hide behind old ones)."""
        return self._guard(lambda: self.store.get_many(self.store.error_ids(limit, newest_first=newest_first)))

    @in_callers_words
    def retry(self, job_id: int | str, *, gpu_memory: str | int | None = None,
              time_limit: str | float | None = None) -> Job:
        """Send a job from the error queue back to its place in the queue, optionally with a
        new memory declaration or time limit (a job that timed out would only be stopped
        again). Its earlier attempts and logs are kept."""
        job = self.get(job_id)
        self.check_control(job, "retry")
        if not self._guard(self.store.in_error_queue, job.id):
            again = f"to run it again, submit it again (`rig show {job.id}` gives its command)"
            if job.state is JobState.CANCELLED:  # by a person: retry is for failures (M15), not for undoing a kill
                how = job.reason if (job.reason or "").startswith("cancelled") else "cancelled"
                raise InvalidInput(f"job {job.id} was {how}; `rig retry` only sends back failed jobs "
                                   f"(`rig errors`): {again}")
            if job.state.terminal:  # cleared from the error queue (then archived), or it succeeded
                raise InvalidInput(f"job {job.id} is {job.state.value}, not in the error queue, the only jobs "
                                   f"`rig retry` sends back: {again}")
            raise InvalidInput(
                f"job {job.id} is {job.state.value}, not in the error queue; `rig errors` lists those")
        if job.problems:
            bad, _, problem = job.problems[0].removeprefix("field ").partition(": ")
            raise InvalidRecord(f"job {job.id} cannot be retried, resubmit it", bad, problem)
        pools = Pools({})
        if job.pool is not None:
            found = self.cluster_pools()
            if job.pool not in found.pools.members:  # it would only be failed again: nothing is changed
                raise Unschedulable(f"job {job.id} cannot be retried, it could never run: its pool {job.pool!r} "
                                    f"is none of the cluster's pools now ({found.known}); resubmit it with "
                                    "another --pool (or none)")
            pools = found.pools
        fields: dict[str, Any] = {
            "reason": f"retried by {current_identity().name}", "cancelled_by": None, "overuse_stop": None,
            "vram_peak": 0, "vram_sum": 0, "vram_samples": 0, "util_sum": 0, "util_samples": 0,
            "overuse": 0,
        }
        if gpu_memory is not None:
            # As a submission is judged: a size some card has, on the cards of the job's pool
            # (all cards were asked: a pool job retried with more than its pool's cards have
            # was "waiting again", then failed unschedulable at once).
            nbytes = check_gpu_memory(parse_memory(gpu_memory))
            self._refuse_over_limit_alone(job.user, Request(nbytes, job.gpus))
            self._refuse_never_fits(self._guard(self.ledger.cards), Request(nbytes, job.gpus), job.pool, pools)
            fields["gpu_memory"] = nbytes
        if time_limit is not None:
            fields["time_limit"] = limit = parse_time_limit(time_limit)
            # Its own estimate was capped by the old limit: made again under the new one.
            own = self._guard(self.own_estimate, job.name, limit, job.user, template=job.template,
                              command=job.command)
            fields.update(expected_seconds=own.expected if own else None,
                          cautious_seconds=own.cautious if own else None,
                          expected_source=own.source if own else None)
        # A retried job gets its own retry budget again (what it was submitted with: --retries,
        # its template's, else max_retries then), on top of the attempts it already used; never
        # the retrier's max_retries (a `--retries 0` job was re-run 3 times by its second retry).
        own = job.max_retries if job.retries is None else job.retries
        fields["retries"] = own
        fields["max_retries"] = job.attempt + own
        code, state = self._guard(self.ledger.transition, job.id, JobState.PENDING, mode="retry",
                                  fields=fields)
        if code != 1:
            raise InvalidInput(f"job {job.id} could not be retried (it is {state})")
        self.wake_dispatcher()
        return self.get(job.id)

    def clear_error(self, job_id: int | str) -> Job:
        """Take a job out of the error queue; it stays in its final state."""
        job = self.get(job_id)
        self.check_control(job, "clear")
        if not self._guard(self.store.clear_error, job.id):
            raise InvalidInput(f"job {job.id} is not in the error queue")
        return job

    def wait(self, job_id: int | str, *, timeout: float | None = None,
             on_change: Callable[[Job], None] | None = None, instance: str | None = None,
             say: Callable[[str], None] | None = None) -> Job:
        """Block until the job reaches a terminal state; returns it. Raises TimeoutError.
        ``on_change`` is called with the job each time its state (or attempt) changes. With
        ``instance`` (Job.instance, known since submit), a record that now belongs to another
        job (Redis lost its data and the id was given again) raises JobGone instead of
        reporting that job's result. A lost connection to Redis is tried again for up to
        rig.reconnect.WATCH_RECONNECT_S seconds, with one line to ``say`` (default: the log)
        when it is lost and one when it is back, before RedisUnavailable is raised."""
        from rig.reconnect import RideOut

        ride = RideOut(say)
        jid = int(job_id)
        seen: tuple[JobState, int] | None = None
        known = False  # the record was read once: its disappearance means Redis lost it
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        try:
            ride.call(self._guard, pubsub.subscribe, self.keys.events_channel)
            while True:
                try:
                    job = ride.call(self.get_instance, jid, instance)
                except JobGone:
                    raise
                except RigError as exc:
                    if known and instance is not None and getattr(exc, "job_id", None) is not None:
                        raise record_vanished(jid, "being waited for") from None
                    raise
                known = True
                if on_change is not None and (job.state, job.attempt) != seen:
                    seen = (job.state, job.attempt)
                    on_change(job)
                if job.state.terminal:
                    return job
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"job {jid} is still {job.state.value} after {timeout} s")
                # Wake on any event for this job; re-read at least once a second regardless.
                step = 1.0 if remaining is None else min(1.0, remaining)
                end = time.monotonic() + step
                while time.monotonic() < end:
                    msg = ride.call(self._guard, pubsub.get_message, timeout=max(0.0, end - time.monotonic()))
                    if msg and str(msg.get("data", "")).split(" ", 1)[0] == str(jid):
                        break
        finally:
            try:
                pubsub.close()
            except redis.RedisError:
                pass

    def in_error_queue(self, job_id: int | str) -> bool:
        """Is the job in the error queue (`rig errors`)?"""
        return bool(self._guard(self.store.in_error_queue, int(job_id)))

    def error_count(self) -> int:
        """How many jobs the error queue holds (errors() shows at most its limit)."""
        return self._guard(self.store.error_count)

    def nodes(self) -> list[NodeInfo]:
        """Every node that registered, with its liveness now (rig.nodes)."""
        return self._guard(NodeRegistry(self.r, self.keys).read)

    def result_of(self, job_id: int | str) -> str | None:
        """A ``@rig.task`` job's stored result (base64 of its pickle), None before it ends
        well. Its owner's and admins' only (check_control)."""
        job = self.get(job_id)
        self.check_control(job, "read the result of")
        result = self._guard(self.history.stored_field, job, "result")
        if result is None and self.history.unread is not None:
            from rig.history import ArchiveUnread

            # None would read as the function's return value: refuse in one line instead.
            raise ArchiveUnread(f"job {job.id}'s result is not in Redis and the archive could not be read: "
                                f"{self.history.unread}")
        return result

    def open_log(self, job_id: int, path: str, instance: str | None = None) -> BinaryIO:
        """One of the job's log files, opened for reading with this process's own rights
        (``instance``: the gateway's check of whose log it is; the path is the record's here)."""
        return open(path, "rb")  # noqa: SIM115 - the caller closes it

    def log_exists(self, job_id: int, path: str, instance: str | None = None) -> bool:
        return os.path.exists(path)

    @in_callers_words
    def read_log(self, job_id: int | str, attempt: int | None = None) -> str:
        """The output of one attempt (the latest by default), "" when it has none here."""
        path = self.log_path(job_id, attempt)
        if path is None or not self.log_exists(int(job_id), str(path)):
            return ""
        with self.open_log(int(job_id), str(path)) as fh:
            return fh.read().decode(errors="replace")

    def log_path(self, job_id: int | str, attempt: int | None = None) -> Path | None:
        job = self.get(job_id)
        paths = job.log_paths or ([job.log_path] if job.log_path else [])
        if not paths:
            return None
        if attempt is None:
            return Path(paths[-1])
        if not 1 <= attempt <= len(paths):
            raise InvalidInput(f"job {job.id} has {len(paths)} attempt(s); pick --attempt 1..{len(paths)}")
        return Path(paths[attempt - 1])


class JobHandle:
    """A submitted job. ``state`` and ``record`` read Redis afresh each time."""

    def __init__(self, client: Client, job_id: int, job: Job | None = None) -> None:
        self.client = client
        self.id = int(job_id)
        self._job = job
        #: This job's identity: a record with another one is another job that reused the id.
        self.instance = job.instance if job is not None else None

    def __repr__(self) -> str:
        return f"<rig job {self.id}>"

    def __int__(self) -> int:
        return self.id

    def __eq__(self, other: object) -> bool:
        """Two handles of one job (its id and instance) are equal, whichever client made them."""
        if not isinstance(other, JobHandle):
            return NotImplemented
        return (self.id, self.instance) == (other.id, other.instance)

    def __hash__(self) -> int:
        return hash((self.id, self.instance))

    def __reduce__(self) -> tuple[Any, tuple[int, str | None]]:
        """A handle pickles as its job (id and instance), not its client's Redis connection
        (which cannot pickle: a handle given to multiprocessing raised "Can't pickle local
        object 'on_connect.<locals>.connect_func'"); unpickled, it reads through the default
        client of the process it is in."""
        return _handle_here, (self.id, self.instance)

    @property
    def record(self) -> Job:
        self._job = self.client.get_instance(self.id, self.instance)
        return self._job

    @property
    def state(self) -> JobState:
        return self.record.state

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job ends (at most ``timeout`` s: TimeoutError). Ctrl-C stops the
        waiting, not the job: one stderr line says so, then KeyboardInterrupt goes on."""
        timeout = plain_number(timeout)  # type: ignore[assignment] - numpy's numbers too
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                    or not timeout >= 0):
            raise InvalidInput(f"timeout must be a number of seconds, 0 or more (None: until the job ends); "
                               f"got {timeout!r}")
        try:
            self._job = self.client.wait(self.id, timeout=timeout, instance=self.instance)
        except KeyboardInterrupt:
            import sys

            print(f"rig: job {self.id} goes on (only the waiting stopped); .kill() or `rig kill {self.id}` "
                  "stops it", file=sys.stderr)
            raise
        except TimeoutError as exc:
            why = self._why_not_started()
            if why:  # `job 7 is still PENDING after 3 s: no rig node is up (...); it starts when one is back`
                raise TimeoutError(f"{exc}: {why}") from None
            raise
        return self._job

    def _why_not_started(self) -> str | None:
        """Why the job still waits or has not started (rig show's sentence), None when it runs
        or that cannot be read now: a wait that timed out says it, not just the state."""
        try:
            job = self.client.get_instance(self.id, self.instance)
            return self.client.why_waiting(job)
        except (RigError, redis.RedisError):  # Redis gone meanwhile: the timeout is still the news
            return None

    def kill(self) -> Job:
        return self.client.kill(self.id)

    def log(self, attempt: int | None = None) -> str:
        """The job's output (stdout and stderr) of one attempt, the latest by default."""
        return self.client.read_log(self.id, attempt)

    @property
    def result(self) -> Any:
        """For a ``@rig.task`` call: the function's return value, waiting for the job to end
        (``get(timeout)`` to bound the wait). A failed job raises RemoteError; a command's job
        (rig.submit) raises InvalidInput at once, as get() does."""
        return self.get()

    def get(self, timeout: float | None = None) -> Any:
        """For a ``@rig.task`` call: wait (at most ``timeout`` s) and return the function's
        return value. If the job failed, raise RemoteError carrying the remote traceback.

        A command's job (rig.submit) has no return value: InvalidInput at once, without waiting
        (its None read as a value the command returned, whether it succeeded or failed)."""
        import base64
        import pickle

        if (self._job or self.record).kind != "python":
            raise InvalidInput(f"job {self.id} runs a command, which has no return value (.result and .get() "
                               f"are for @rig.task calls): use .wait(), then .record.state and .record.exit_code, "
                               f"or `rig log {self.id}`")
        job = self.wait(timeout)
        if job.state is JobState.SUCCEEDED:
            raw = self.client.result_of(self.id)
            if raw:
                return pickle.loads(base64.b64decode(raw))
        try:
            output = self.log()
        except RigError:  # its log unreadable here (another node's, gone): the job's end still is
            output = ""
        start = output.rfind("Traceback (most recent call last)")
        if start >= 0 and job.state is not JobState.SUCCEEDED:
            raise RemoteError(self.id, job, output[start:].strip())
        # A call's result, even None, is a non-empty pickle: a SUCCEEDED call without one ended
        # its process before it returned (rig.call stores the result only after the return).
        raise RemoteError(self.id, job, "", output=output[-4000:].strip(),
                          note=NO_RESULT if job.state is JobState.SUCCEEDED else "")


#: RemoteError's note for a SUCCEEDED @rig.task call that stored no result.
NO_RESULT = (", but stored no result: the function ended its process before it returned (sys.exit(0), "
             "os._exit(0) or an exec); let it return its value instead")


class RemoteError(RigError):
    """A ``@rig.task`` call failed on its card; ``traceback`` is the traceback it printed ("" when
    it printed none: killed, timed out, stopped before the call), ``output`` then the end of
    what it printed (never shown as a traceback)."""

    def __init__(self, job_id: int, job: Job, traceback: str, output: str = "", note: str = "") -> None:
        reason = job.reason or f"see `rig log {job_id}`"
        message = f"job {job_id} ended {job.state.value}: {reason}{note}"
        if traceback:
            message += f"\n--- remote traceback (job {job_id}) ---\n{traceback}"
        elif output:
            message += f"\n--- end of its output, no traceback (job {job_id}) ---\n{output}"
        super().__init__(message)
        self.job = job
        self.traceback = traceback
        self.output = output


# -- module-level convenience ---------------------------------------------------------------
_default: Client | None = None


def default_client() -> Client:
    global _default
    if _default is None:
        from rig.gateway.choice import make_client  # straight to Redis, or through the gateway

        _default = make_client(load_settings())
    return _default


def submit(command: str | list[str], **kwargs: Any) -> JobHandle:
    """``rig.submit("python train.py", gpu_memory="12G", priority="high")``."""
    check_request_keys(None, {"command": command, **kwargs})
    return default_client().submit(command, **kwargs)


def submit_many(requests: list[dict[str, Any]]) -> list[JobHandle]:
    """Queue several jobs in one transaction with the default client (see Client.submit_many)."""
    return default_client().submit_many(requests)


def jobs_filter(state: object, limit: object) -> tuple[JobState | None, int]:
    """Client.jobs' ``state`` (a JobState, its name, or None) and ``limit`` (check_limit), as
    JobState and int; refused in one line otherwise (``state=3`` was an AttributeError)."""
    if state is not None and not isinstance(state, JobState | str):
        raise InvalidInput(f"state must be a JobState or its name (e.g. 'running'), got {state!r}")
    return (JobState.parse(state) if isinstance(state, str) else state), check_limit(limit)


def _handle_here(job_id: int, instance: str | None) -> JobHandle:
    """An unpickled JobHandle (JobHandle.__reduce__): the same job, through this process's client."""
    handle = JobHandle(default_client(), job_id)
    handle.instance = instance
    return handle


def get_job(job_id: int | str) -> JobHandle:
    return default_client().job(job_id)


# -- helpers --------------------------------------------------------------------------------
def _normalise_command(command: Any, shell: bool | None) -> tuple[list[str], bool]:
    if isinstance(command, str):
        text = command.strip()
        if not text:
            raise InvalidInput("the command is empty; give it after `--` or with --cmd \"...\"")
        if shell is False:
            import shlex

            return shlex.split(text), False
        return ["/bin/sh", "-c", text], True
    argv = _plain_argv(command)
    if not argv or not argv[0].strip():
        raise InvalidInput("the command is empty; give it after `--` or with --cmd \"...\"")
    return argv, False


def plain_command(command: object) -> str | list[str]:
    """A command as given from Python, as rig keeps it: a string as it is (run by /bin/sh), a
    list or tuple as a list of text (see _argument), a path as that program alone; None as an
    empty list (refused as empty by the caller). Another type is refused in one line."""
    return command if isinstance(command, str) else _plain_argv(command)


def _plain_argv(command: object) -> list[str]:
    if isinstance(command, os.PathLike):
        command = [command]
    if command is not None and not isinstance(command, (list, tuple)):
        raise InvalidInput(f"the command must be a string or a list of strings, got {type(command).__name__}")
    return [_argument(number, a) for number, a in enumerate(command or [])]


def _argument(number: int, value: object) -> str:
    """One item of a command given as a list, as the program sees it: text, a path or a number
    (``["python", "t.py", "--lr", 3e-4]``) written as text. bytes or a bool are refused (``str()``
    made ``b"x.py"`` the argument ``b'x.py'``), and so is anything else."""
    value = plain_number(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidInput(f"the command's item {number} must be text (a number or a path is written as text); "
                           f"got {type(value).__name__} {value!r:.40}")
    return str(value)


def check_request_keys(number: int | None, request: Mapping[str, Any]) -> None:
    """The keys of a submit_many request (``number``) or rig.submit's keyword arguments (None)
    are submit()'s keyword arguments (its signature decides): a slip (``gpu_mem``) is one line
    naming the closest one, not Python's TypeError about ``Client.submit()``, which the caller
    never called."""
    import difflib

    known = [n for n in inspect.signature(Client.submit).parameters
             if n != "self" and not n.startswith("_") and n not in INTERNAL_OPTIONS]
    own = sorted(str(key) for key in request if key in INTERNAL_OPTIONS)
    if own:
        where = "" if number is None else f"request {number}: "
        raise InvalidInput(f"{where}{own[0]!r} is rig's own: it is set by @rig.task for a Python call; "
                           f"submit a command here, or decorate the function with @rig.task and call .delay()")
    unknown = sorted(str(key) for key in request if key not in known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the keys are {', '.join(known)}"
        where = "" if number is None else f"request {number}: "
        raise InvalidInput(f"{where}no option {unknown[0]!r} ({hint})")


def _default_name(argv: list[str], is_shell: bool) -> str:
    """A name for a job submitted without --name: the first word of the command that names
    what runs, printable (a `-c` script's first line, never its control characters)."""
    # A program's name only: never an argument's text, a NAME=value or a -c script (`sh -c 'TOKEN=x
    # ./run'`, `env KEY=secret cmd`): a job's name is shown to every user, its command only to its
    # owner (rig.gateway.privacy).
    words = argv[2].split() if is_shell else [w.split()[0] for w in argv if w.split()]
    for number, word in enumerate(words):
        base = os.path.basename(word)
        if "=" in word or base.startswith("-"):
            continue
        if base in _WRAPPERS:
            if number + 1 < len(words) and words[number + 1] == "-c":
                return base  # `python -c CODE`, `sh -c SCRIPT`: the script is not a name
            continue
        if base:
            return _printable_name(base)
    return _printable_name(os.path.basename(words[0])) if words and "=" not in words[0] else "job"


#: Programs that run another: a job's name is the program they run.
_WRAPPERS = frozenset({"python", "python3", "sh", "bash", "env", "nohup", "exec", "time", "nice"})


def _printable_name(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    cleaned = "".join(ch if ch.isprintable() else "?" for ch in first).strip()[:64]
    return cleaned or "job"


def _round_up(nbytes: int, step: int = 256 * 2**20) -> int:
    """Up to a whole 256 MiB: declarations people can read."""
    return -(-nbytes // step) * step


def _checked(what: str, check: Callable[[Any], Any], value: Any, then: str = "") -> Any:
    """``check(value)`` (a rig.records check), its complaint as one InvalidInput line
    (``then``: what to do, after it)."""
    try:
        return check(value)
    except R.BadField as exc:
        raise InvalidInput(f"{what}: {exc}{then}") from None
