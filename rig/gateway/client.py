"""rig's Python API over the gateway's socket, for a user who holds no Redis credentials.

:class:`GatewayClient` has the methods of rig.client.Client that the CLI, ``rig top``,
``rig.submit`` and ``@rig.task`` use, with the same arguments, results and errors; the
gateway runs them as the caller (the kernel says who that is). What the caller may not read
of other users' jobs arrives hidden (rig.gateway.privacy). Which client a process gets is
decided in rig.gateway.choice.
"""

from __future__ import annotations

import base64
import io
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rig import errors as E
from rig import job_env as jobenv
from rig.argnames import in_callers_words
from rig.cli.logview import Look
from rig.client import (
    Client,
    Identity,
    JobHandle,
    StatusReport,
    caller_environ,
    check_request_keys,
    jobs_filter,
    plain_command,
)
from rig.config import Settings, Template
from rig.errors import InvalidInput, JobGone, RigError
from rig.gateway import wire
from rig.gateway.paths import live_supervisor
from rig.models import Job, JobState
from rig.ownership import refusal
from rig.request_rules import resolve_workdir

if TYPE_CHECKING:
    from rig.forecast import Forecast, RunningEnd

#: Seconds to connect, and to wait for one answer (a submit_many of thousands takes a while).
CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 120.0
#: Seconds a client waits for a gateway that does not answer while the node's rig up runs (it
#: restarts a gateway that died after 1 s, or more when it keeps dying): rig.gateway.paths.
RESTART_WAIT_S = 3.0
#: Seconds a submission interrupted (Ctrl-C) once the gateway had the whole request still waits
#: for its answer, to say which job(s) it queued (a second Ctrl-C stops that wait).
INTERRUPTED_ANSWER_WAIT_S = 10.0
#: The operations that queue jobs: a Ctrl-C after their request went out says their ids.
SUBMITTING_OPS = frozenset({"submit", "submit_many"})
#: How often it tries again meanwhile: another process's socket appearing is no event to await.
RESTART_POLL_S = 0.1


class GatewayUnavailable(E.RigError):
    """No gateway answers at the socket (rig is not up on this node, or it is another path)."""

    exit_code = 5


def _not_answering(path: Path, exc: OSError, supervisor: int) -> str:
    """The line for a gateway that did not answer in RESTART_WAIT_S while the pid in its rig up's
    mark ran. A pid /proc hides from this user (hidepid: root's rig up) may be that rig up or
    another process that took the pid after it died: nobody here can tell, so it is not said to
    be rig up (the mark of a SIGKILLed rig up stays, and that process may run for days)."""
    from workers.process_tree import runs_unseen

    why = f"({exc.strerror or exc})"
    if runs_unseen(supervisor):
        return (f"rig's gateway at {path} is not answering {why}; the pid of the rig up that marks it ({supervisor}) "
                "runs, hidden from this user (/proc hidepid): that rig up, restarting its gateway or failing to "
                "start it (gateway.out in the node's system_log_dir says why), or another process that took the "
                "pid after rig up died; try again in a moment, and if it still does not answer an admin checks "
                "that rig is up on this node (`rig status`)")
    return (f"rig's gateway at {path} is not answering {why} though the node's rig up runs (pid {supervisor}): "
            "the gateway is restarting, or fails to start (its gateway.out in the node's system_log_dir says "
            "why); try again in a moment")


def _queued_ids(op: str, raw: Any) -> list[int]:  # noqa: ANN401
    """The ids of the jobs in the still encoded answer ``raw`` of a submitting ``op`` (``submit``:
    ``{"job": Job, ...}``, ``submit_many``: ``[Job, ...]``, as rig.gateway.wire encodes them), read
    without wire.decode, whose first use imports rig's classes; [] where it has none."""
    try:
        jobs = [raw["__m"]["job"]] if op == "submit" else raw
        ids = [job["f"]["id"] for job in jobs]
    except (KeyError, TypeError):
        return []
    return ids if all(isinstance(i, int) and not isinstance(i, bool) for i in ids) else []


def _rebuild_error(error: Any) -> RigError:  # noqa: ANN401
    """The gateway's error as the same class of rig.errors (RigError for one it does not know)."""
    name = error.get("type") if isinstance(error, dict) else None
    message = str(error.get("message", "the gateway refused the request")) if isinstance(error, dict) else str(error)
    cls = getattr(E, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, RigError)):
        cls = RigError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    return exc


class GatewayClient:
    """Talks to rig through the gateway at ``path``. Cheap to create; connects on first use,
    again after the gateway restarted. Thread-safe (one request at a time per client)."""

    via_gateway = True

    def __init__(self, settings: Settings, path: Path) -> None:
        self.settings = settings
        self.path = path
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.last_auto_note: str | None = None
        self.last_durability_note: str | None = None
        #: Why the node could not read the archive for the last answer (a listing: `rig jobs`,
        #: `rig usage`), else None: rig.history.archive_warning says it in one line.
        self.archive_unread: str | None = None
        self._who: tuple[Identity, bool] | None = None
        self._compared = False  # the gateway's installation checked against this caller's settings

    # -- plumbing -------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        deadline: float | None = None
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(str(self.path))
                break
            except OSError as exc:
                sock.close()
                if isinstance(exc, PermissionError):  # it may well be up: the socket or a folder shuts you out
                    raise GatewayUnavailable(
                        f"you may not connect to rig's gateway at {self.path} (Permission denied): the socket or a "
                        "folder on its way shuts other users out; an admin makes the socket mode 0666 and its "
                        "folders passable (`chmod o+x`), or set RIG_GATEWAY_SOCKET to the node's socket") from None
                supervisor = live_supervisor(self.path)
                if supervisor is None:
                    raise GatewayUnavailable(
                        f"rig's gateway does not answer at {self.path} ({exc.strerror or exc}): rig is not up on "
                        "this node, or listens elsewhere; an admin starts it with `rig up` (`rig up --only gateway` "
                        "on a machine without cards), or set RIG_GATEWAY_SOCKET to its socket") from None
                # The node's rig up runs: its gateway is starting or restarting. Wait a moment.
                deadline = deadline or time.monotonic() + RESTART_WAIT_S
                if time.monotonic() >= deadline:
                    raise GatewayUnavailable(_not_answering(self.path, exc, supervisor)) from None
                time.sleep(RESTART_POLL_S)
        _check_server(sock, self.path)
        sock.settimeout(REPLY_TIMEOUT_S)
        return sock

    def call(self, op: str, **args: Any) -> Any:  # noqa: ANN401
        """One request; the gateway's answer, or its error raised as rig's error class."""
        try:
            frame = wire.pack({"op": op, "args": wire.encode(args)})
        except wire.WireError as exc:
            raise InvalidInput(str(exc)) from None  # too large: nothing was sent
        with self._lock:
            for attempt in (1, 2):
                if self._sock is None:
                    self._sock = self._connect()
                sent = False
                try:
                    self._sock.sendall(frame)
                    sent = True
                    answer = wire.receive(self._sock)
                except KeyboardInterrupt:
                    self._interrupted(op, sent)
                    raise
                except (OSError, wire.WireError) as exc:
                    self.close_locked()
                    if attempt == 2 or isinstance(exc, TimeoutError):
                        raise GatewayUnavailable(f"rig's gateway at {self.path} stopped answering ({exc}); "
                                                 "`rig status` once it is back") from None
                    continue  # a connection the gateway dropped (restart, idle): once more
                if answer is None:
                    self.close_locked()
                    if attempt == 2:
                        raise GatewayUnavailable(f"rig's gateway at {self.path} closed the connection")
                    continue
                break
        if not answer.get("ok"):
            raise _rebuild_error(answer.get("error"))
        unread = answer.get("archive_unread")  # a listing without the archive (rig.history)
        self.archive_unread = unread if isinstance(unread, str) else None
        try:
            return wire.decode(answer.get("result"))
        except KeyboardInterrupt:
            # The first decode imports rig's classes (a tenth of a second without .pyc files):
            # where a Ctrl-C after a submission lands most, its jobs queued all the same.
            if op in SUBMITTING_OPS and (ids := _queued_ids(op, answer.get("result"))):
                raise E.SubmitInterrupted(ids) from None
            raise

    def _interrupted(self, op: str, sent: bool) -> None:
        """Ctrl-C during a request (the lock held). A submission the gateway had whole goes on
        there: its answer is awaited a moment longer, and SubmitInterrupted names the queued
        job(s), as the direct client says them (rig.client), instead of a bare interrupt while
        they run unseen. Returns (the caller re-raises the interrupt) when nothing was queued or
        that is not known; the connection is closed either way (an answer may be half read)."""
        answer = None
        if sent and op in SUBMITTING_OPS and self._sock is not None:
            try:
                self._sock.settimeout(INTERRUPTED_ANSWER_WAIT_S)
                answer = wire.receive(self._sock)
            except (KeyboardInterrupt, OSError, wire.WireError):
                answer = None
        self.close_locked()
        if isinstance(answer, dict) and answer.get("ok") and (ids := _queued_ids(op, answer.get("result"))):
            raise E.SubmitInterrupted(ids) from None

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def ping(self) -> dict[str, Any]:
        answer = self.call("ping")
        if not self._compared:
            self._compared = True
            for line in installation_mismatch(answer, self.path):
                print(f"rig: warning: {line}", file=sys.stderr)
        return answer

    def wake_dispatcher(self) -> None:
        """The gateway's submit already woke it."""

    # -- submitting -----------------------------------------------------------------------
    @in_callers_words
    def submit(self, command: str | list[str] | tuple[str, ...], *, workdir: str | os.PathLike[str] | None = None,
               env: Mapping[str, str | None] | None = None, export: str | None = None,
               **options: Any) -> JobHandle:
        """Client.submit through the gateway: the caller's working folder, its ``--env NAME``
        values and its exported environment are read here, in the caller's process."""
        command = plain_command(command)
        wd = str(resolve_workdir(workdir, self.settings.command_workdir))
        environ = self._exported(export)
        resolved = self._env(env)
        answer = self.call("submit", command=command, environ=environ,
                           options={**options, "workdir": wd, "env": resolved, "export": "ALL"})
        self.last_auto_note = answer.get("auto_note")
        self.last_durability_note = answer.get("durability_note")  # rig.replication
        job: Job = answer["job"]
        return JobHandle(self, job.id, job)  # type: ignore[arg-type]

    @in_callers_words
    def submit_many(self, requests: list[dict[str, Any]]) -> list[JobHandle]:
        out = []
        environ_by_mode: dict[str | None, dict[str, str]] = {}
        for number, request in enumerate(requests):
            if not isinstance(request, Mapping):
                raise InvalidInput(f"request {number}: expected a dict of submit()'s arguments")
            check_request_keys(number, request)
            request = dict(request)
            mode = request.pop("export", None)
            if mode not in environ_by_mode:
                environ_by_mode[mode] = self._exported(mode)
            request["workdir"] = str(resolve_workdir(request.get("workdir"), self.settings.command_workdir))
            request["env"] = {**environ_by_mode[mode], **self._env(request.get("env"))}
            request["export"] = "NONE"  # what it exports is in env already
            if "command" in request:
                request["command"] = plain_command(request["command"])
            out.append(request)
        return [JobHandle(self, j.id, j) for j in self.call("submit_many", requests=out)]  # type: ignore[arg-type]

    @staticmethod
    def _exported(mode: str | None) -> dict[str, str]:
        try:
            return jobenv.exported(caller_environ(), mode)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    @staticmethod
    def _env(env: Mapping[str, str | None] | None) -> dict[str, str]:
        given = jobenv.given_env(env)
        refused = jobenv.refuse_rig_owned(given)
        if refused:
            raise InvalidInput(refused)
        try:
            return jobenv.resolve_names(given, caller_environ())
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    # -- reading --------------------------------------------------------------------------
    def get(self, job_id: int | str, instance: str | None = None) -> Job:
        """As rig.client.Client.get: ``instance`` (a prefix) picks among jobs given one id."""
        if instance is None:
            return self.call("get", job_id=_id(job_id))
        return self.call("get", job_id=_id(job_id), pick=instance)

    def other_instance(self, job: Job) -> Job | None:
        """Not asked through the gateway (no such operation): no hint, never a made-up one."""
        return None

    def get_instance(self, job_id: int | str, instance: str | None) -> Job:
        return self.call("get", job_id=_id(job_id), instance=instance)

    def job(self, job_id: int | str) -> JobHandle:
        job = self.get(job_id)
        return JobHandle(self, job.id, job)  # type: ignore[arg-type]

    @in_callers_words
    def jobs(self, state: JobState | str | None = None, *, limit: int = 50, user: str | None = None,
             since: float | None = None) -> list[Job]:
        state, limit = jobs_filter(state, limit)  # Client.jobs' rule, said here as there
        # ``user`` and ``since`` are sent only when given: a gateway older than the filter still lists jobs.
        extra = {k: v for k, v in (("user", user), ("since", since)) if v is not None}
        return self.call("jobs", state=state.value if isinstance(state, JobState) else state, limit=limit, **extra)

    def usage(self, *, since: float | None = None, by: str = "user") -> tuple[list[Any], Any]:
        lines, total = self.call("usage", since=since, by=by)
        return lines, total

    def waiting(self, *, limit: int = 50) -> list[Job]:
        return self.call("waiting", limit=limit)

    def why_waiting(self, job: Job) -> str | None:
        return self.call("why_waiting", job_id=job.id)

    def start_estimates(self, job_ids: Iterable[int] | None = None) -> Forecast:
        if job_ids is None:
            return self.call("start_estimates")
        try:
            return self.call("start_estimates", job_ids=[int(j) for j in job_ids])
        except InvalidInput as exc:  # a gateway older than the stored forecast: it computes all of them
            if "wrong arguments for start_estimates" not in str(exc):
                raise
            return self.call("start_estimates")

    def waiting_words(self, jobs: Iterable[Job]) -> dict[int, str]:
        pending = [j for j in jobs if j.state is JobState.PENDING]
        if not pending:
            return {}
        try:
            found = self.call("waiting_words", job_ids=[j.id for j in pending])
        except InvalidInput as exc:  # a gateway older than this client: the stored sentences, or places
            if "has no operation" not in str(exc):
                raise
            from rig.waiting import queued_words

            ahead = self.jobs_ahead(j.id for j in pending if not j.wait_reason)
            return {j.id: j.wait_reason or queued_words(ahead[j.id]) for j in pending
                    if j.wait_reason or j.id in ahead}
        return {int(k): str(v) for k, v in found.items()}

    def jobs_ahead(self, job_ids: Iterable[int]) -> dict[int, int]:
        ids = [int(j) for j in job_ids]
        if not ids:
            return {}
        try:
            found = self.call("jobs_ahead", job_ids=ids)
        except InvalidInput as exc:  # a gateway older than this client: no place known, no reason made up
            if "has no operation" not in str(exc):
                raise
            return {}
        return {int(k): int(v) for k, v in found.items()}

    def running_end(self, job: Job) -> RunningEnd | None:
        """None from a gateway older than this client (it cannot say)."""
        from rig.forecast import RunningEnd

        try:
            at, source, now = self.call("running_end", job_id=job.id)
        except InvalidInput as exc:
            if "has no operation" not in str(exc):
                raise
            return None
        return RunningEnd(at, source, now)

    def first_look(self, job_id: int) -> str | None:
        return self.call("first_look", job_id=job_id)

    def status(self, pool: str | None = None) -> StatusReport:
        return self.call("status", pool=pool)

    def errors(self, *, limit: int = 100) -> list[Job]:
        return self.call("errors", limit=limit)

    def in_error_queue(self, job_id: int | str) -> bool:
        return self.call("in_error_queue", job_id=_id(job_id))

    def error_count(self) -> int:
        return self.call("error_count")

    def nodes(self) -> list[Any]:
        return self.call("nodes")

    def templates(self) -> dict[str, Template]:
        return {name: Template.model_validate(data) for name, data in self.call("templates").items()}

    def result_of(self, job_id: int | str) -> str | None:
        return self.call("result", job_id=_id(job_id))

    # The same rules as the direct client's, over this client's get, log_exists and open_log.
    log_path = Client.log_path
    read_log = Client.read_log

    def log_exists(self, job_id: int, path: str, instance: str | None = None) -> bool:
        """``instance`` (a prefix): a log of that very job where its id was given again."""
        return bool(self.call("log_exists", job_id=job_id, path=path, **_picked(instance)))

    def open_log(self, job_id: int, path: str, instance: str | None = None) -> _RemoteLog:
        """The log file as the gateway reads it (the caller's own rights may not reach it);
        ``instance`` (a prefix): of that very job where its id was given again."""
        return _RemoteLog(self, job_id, path, instance)

    # -- control --------------------------------------------------------------------------
    def kill(self, job_id: int | str, *, wait: bool = True, timeout: float | None = None) -> Job:
        job = self.call("kill", job_id=_id(job_id))
        if wait and not job.state.terminal:
            limit = timeout if timeout is not None else self.settings.kill_grace_seconds + 20
            return self.wait(job.id, timeout=limit)
        return job

    def records(self, job_ids: Sequence[int]) -> dict[int, Job | E.RigError]:
        """Client.records through the gateway: one ``get`` each (the gateway has no batch
        read); an error is that id's, outages raise."""
        found: dict[int, Job | E.RigError] = {}
        for jid in job_ids:
            try:
                found[jid] = self.get(jid)
            except (E.RedisUnavailable, GatewayUnavailable):
                raise
            except E.RigError as exc:
                found[jid] = exc
        return found

    def cancel_waiting(self, jobs: Sequence[Job]) -> list[int]:
        """Client.cancel_waiting through the gateway: its ``kill`` of each (which checks who
        may); the ids that ended CANCELLED. One that moved meanwhile is left to :meth:`kill`."""
        cancelled: list[int] = []
        for job in jobs:
            after = self.kill(job.id, wait=False)
            if after.state is JobState.CANCELLED:
                cancelled.append(job.id)
        return cancelled

    def retry(self, job_id: int | str, *, gpu_memory: str | int | None = None,
              time_limit: str | float | None = None) -> Job:
        # time_limit only when given: a gateway of an older rig takes no such argument
        more = {} if time_limit is None else {"time_limit": time_limit}
        try:
            return self.call("retry", job_id=_id(job_id), gpu_memory=gpu_memory, **more)
        except InvalidInput as exc:  # such a gateway: its TypeError's words, which name no way out
            if not (more and "wrong arguments for retry" in str(exc) and "time_limit" in str(exc)):
                raise
            raise InvalidInput(f"rig's gateway at {self.path} runs an older rig, which cannot give a job a new "
                               "time limit: an admin updates rig on the node; meanwhile `rig retry "
                               f"{_id(job_id)}` without --time-limit runs it again under its old limit") from None

    def clear_error(self, job_id: int | str) -> Job:
        return self.call("clear_error", job_id=_id(job_id))

    def forget_node(self, name: str, *, force: bool = False, failed: dict[int, str] | None = None) -> list[str]:
        answer = self.call("forget_node", name=name, force=force)
        if failed is not None:
            failed.update({int(k): v for k, v in answer["failed"].items()})
        return answer["cards"]

    def _me(self) -> tuple[Identity, bool]:
        """This caller as the gateway knows it (the kernel's uid), and whether it is an admin."""
        if self._who is None:
            me = self.ping()
            self._who = (Identity(me["user"], me["uid"]), bool(me["admin"]))
        return self._who

    def is_admin(self, who: Identity | None = None) -> bool:
        me, admin = self._me()
        return admin if who is None or who == me else False

    def check_control(self, job: Job, action: str) -> None:
        """Client.check_control, by the same rule (rig.ownership); the gateway checks again."""
        me, admin = self._me()
        refused = refusal(job, me, admin=admin, action=action)
        if refused is not None:
            raise refused

    def wait(self, job_id: int | str, *, timeout: float | None = None,
             on_change: Callable[[Job], None] | None = None, instance: str | None = None,
             say: Callable[[str], None] | None = None) -> Job:
        """Client.wait, polling the gateway (a few requests a second); a lost Redis (or
        gateway) is ridden out as there (rig.reconnect.RideOut)."""
        from rig.reconnect import RideOut

        ride = RideOut(say)
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[JobState, int] | None = None
        delay = 0.05
        while True:
            try:
                job = ride.call(self.get_instance, job_id, instance)
            except JobGone:
                raise
            now = (job.state, job.attempt)
            if now != seen:
                seen = now
                delay = 0.05
                if on_change is not None:
                    on_change(job)
            if job.state.terminal:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.state.value} after {timeout} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


class _RemoteLog(io.RawIOBase):
    """A log file read through the gateway, chunk by chunk from where the last read ended (a
    file that grows, as `rig log -f` follows it). For `rig log -f`'s follower it also has
    ``look`` and ``read_at`` (rig.cli.logview.CutFollower): each look is one request that
    brings, with the bytes, the file's size, identity and the keeper's note, so a cut or a log
    made again is seen as when the follower reads the file itself."""

    def __init__(self, client: GatewayClient, job_id: int, path: str, instance: str | None = None) -> None:
        super().__init__()
        self.client, self.job_id, self.path, self.offset = client, job_id, path, 0
        self.picked = _picked(instance)  # the instance argument, only when given (older gateways)
        self.facts = True  # the gateway answers log_look (False: too old, read as before)
        self.note = ""  # the keeper's note in words at the last look (rig.logspace.describe_note)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = LOG_READ if size is None or size < 0 else min(size, LOG_READ)
        chunks = []
        while True:
            data = self._read(self.offset, want)
            self.offset += len(data)
            chunks.append(data)
            if size is not None and size >= 0 or len(data) < want:
                return b"".join(chunks)

    def _read(self, pos: int, size: int) -> bytes:
        return base64.b64decode(self.client.call("log_read", job_id=self.job_id, path=self.path,
                                                 offset=pos, size=min(size, LOG_READ), **self.picked))

    def read_at(self, pos: int, size: int) -> bytes:
        """Up to ``size`` bytes (at most LOG_READ) from ``pos``, for the follower's look back
        after a cut; b"" while the log is gone (it looks again at its next poll)."""
        offset = self.offset
        look = self.look(pos, 0, None, size)
        self.offset = offset
        if look is None:
            return self._read(pos, size)
        return look.data

    def look(self, pos: int, back: int, probe: tuple[int, int] | None, want: int) -> Look | None:
        """One look at the log from ``pos`` (rig.gateway.server.Gateway.op_log_look); None from a
        gateway older than that: the follower then reads on as before, from where it is."""
        if not self.facts:
            return None
        try:
            answer = self.client.call("log_look", job_id=self.job_id, path=self.path, offset=pos, back=back,
                                      probe=list(probe) if probe else None, size=min(want, LOG_READ),
                                      **self.picked)
        except InvalidInput as exc:
            if "has no operation 'log_look'" not in str(exc):
                raise
            self.facts, self.offset = False, pos
            return None
        if not isinstance(answer, dict):
            raise GatewayUnavailable(f"rig's gateway at {self.client.path} answered a log look with "
                                     f"{type(answer).__name__}; is it rig's gateway?")
        if answer.get("gone"):
            return Look(gone=True)
        self.note = str(answer.get("note") or "")
        data = base64.b64decode(answer.get("data") or "")
        self.offset = pos + len(data)  # read on from here if the gateway turns out old later
        return Look(size=int(answer["size"]), cap_cut=int(answer.get("cap_cut") or 0),
                    before=base64.b64decode(answer.get("before") or ""),
                    probe=base64.b64decode(answer.get("probe") or ""), data=data,
                    ident=(int(answer["dev"]), int(answer["ino"])),
                    made_again=int(answer["made_again"]) if "made_again" in answer else None)

    def note_words(self) -> str:
        """The keeper's note beside the log in words (rig.logspace.describe_note), "" for a whole
        log, a gone one, or from a gateway too old to say (cut_note then uses the job's record)."""
        offset = self.offset
        look = self.look(offset, 0, None, 1)
        self.offset = offset  # read() goes on from where it was
        return self.note if look is not None and not look.gone else ""

    def readinto(self, buffer) -> int:  # noqa: ANN001
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _picked(instance: str | None) -> dict[str, str]:
    """The ``instance`` argument of a log request, sent only when given: a gateway older than it
    refuses an argument it does not know, and reads the live job's logs as before."""
    return {} if instance is None else {"instance": instance}


#: The most one log request asks for (bytes; the gateway's LOG_CHUNK).
LOG_READ = 4 * 2**20


def installation_mismatch(ping: dict[str, Any], path: Path) -> list[str]:
    """Lines for the settings this caller gave explicitly (RIG_REDIS_URL, RIG_KEY_PREFIX) that the
    gateway it reached does not serve: it goes to that gateway's installation, not theirs."""
    from rig.redis_conn import strip_password

    lines = []
    for var, key in (("RIG_REDIS_URL", "redis_url"), ("RIG_KEY_PREFIX", "key_prefix")):
        mine = os.environ.get(var)
        theirs = ping.get(key)
        if mine and theirs and (strip_password(mine) if key == "redis_url" else mine) != theirs:
            lines.append(f"{var}={strip_password(mine) if key == 'redis_url' else mine} is not what the gateway at "
                         f"{path} serves ({theirs}, node {ping.get('node')}); this goes there. Point "
                         "RIG_GATEWAY_SOCKET at the gateway of the node you mean")
    return lines


def _id(job_id: int | str) -> int:
    text = str(job_id).strip()
    if not text.isdigit():
        raise InvalidInput(f"{job_id!r} is not a job id (a positive whole number); `rig jobs` lists them")
    return int(text)


def _peer_uid(sock: socket.socket) -> int:
    """The uid of the process serving the socket (SO_PEERCRED)."""
    import struct

    ucred = struct.Struct("3i")
    return ucred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, ucred.size))[1]


def _check_server(sock: socket.socket, path: Path) -> None:
    """The process answering must be root's (a node's gateway) or this user's own: a socket
    another user serves is not rig's gateway, wherever it is. Refused, nothing sent."""
    uid = _peer_uid(sock)
    if uid not in (0, os.getuid()):
        sock.close()
        raise GatewayUnavailable(f"the socket {path} is served by uid {uid}, neither root nor you: not rig's "
                                 "gateway; nothing was sent. Ask an admin where rig's gateway listens")
