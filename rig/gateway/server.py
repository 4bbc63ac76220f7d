"""The gateway: rig's API on a Unix socket, for users who hold no Redis credentials.

`rig up` starts one per node (``rig up --only gateway`` alone on a login node without cards). Its
caller's identity comes from the kernel (SO_PEERCRED: uid, gid, pid of the connecting
process), never from anything the caller sends, so a user can submit only as themself and
act only on their own jobs (rig.gateway.privacy); admins (root, ``admins``) on all. A job
calls rig through the same socket as its own user: no job carries Redis' password.

Each request is one frame (rig.gateway.wire): ``{"op": NAME, "args": {...}}``; each answer
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type": "PermissionDenied",
"message": "..."}}``. A bad request (not rig's frame, an unknown op, wrong arguments, too
large) gets one error answer and, when the frame itself was bad, the connection closed; it
never stops the gateway. At most MAX_CONNECTIONS peers at once; a peer silent for
IDLE_TIMEOUT_S between requests is dropped.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import socket
import socketserver
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rig import __version__, logspace
from rig.argnames import cli_words
from rig.call import store_result
from rig.client import Client, Identity, acting_as, identity_of
from rig.config import Settings, load_settings
from rig.errors import InvalidInput, LogMissing, PermissionDenied, RedisUnavailable, RigError
from rig.gateway import privacy, wire
from rig.job_env import umask_of
from rig.models import Job, JobState
from rig.ownership import owns
from rig.redis_conn import is_unusable, unavailable

log = logging.getLogger("rig.gateway")

#: Peers served at once; one more is answered "busy" and closed.
MAX_CONNECTIONS = 256
#: A peer silent this long between two requests is dropped (s).
IDLE_TIMEOUT_S = 600.0
#: Longest time the rest of a request may take once its length arrived (s).
FRAME_TIMEOUT_S = 30.0
#: Connections one uid may hold at once (root's are not counted): one user cannot take them all.
MAX_PER_USER = 32
#: Bytes of requests one uid may have in the gateway at once (root's are not counted): one
#: largest frame. Parsed, a request takes many times its size (up to ~30x for `[{},{},...]`).
MAX_BYTES_PER_USER = 16 * 2**20
#: ... and all users together (root's not counted): the gateway's memory stays bounded however
#: many users send at once.
MAX_BYTES_TOTAL = 48 * 2**20
#: The most of a log one request returns (bytes).
LOG_CHUNK = 4 * 2**20
#: The most a log look returns from before its place, and from its probe (bytes; the follower
#: asks for 64 and for the marker line: rig.cli.logview.CutFollower).
TAIL_MAX = 4096
PROBE_MAX = 64 * 2**10
#: Log files remembered as allowed to a peer's user (Gateway._log_file), the most recent kept.
LOG_GRANTS = 1024

#: Operations whose answer lacks the archive's part when it cannot be read (rig.history:
#: Redis' jobs all the same): their answer carries why (``archive_unread``), for the one line.
ARCHIVE_LISTINGS = frozenset({"jobs", "usage"})

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_stopping = False  # set by SIGTERM/SIGINT: a stop asked for, not a lost socket


class Peer:
    """Who is on the other end of a connection, as the kernel says."""

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid
        self.identity: Identity = identity_of(uid)

    @classmethod
    def of(cls, sock: socket.socket) -> Peer:
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        return cls(pid, uid, gid)

    def environment(self) -> dict[bytes, bytes]:
        """The peer process's environment (empty when it cannot be read or it is gone)."""
        try:
            with open(f"/proc/{self.pid}/environ", "rb") as fh:
                items = fh.read().split(b"\0")
        except OSError:
            return {}
        return dict(item.split(b"=", 1) for item in items if b"=" in item)


class Gateway:
    """The operations, each run for one peer against one direct Client (rig's credentials)."""

    def __init__(self, settings: Settings, client: Client | None = None) -> None:
        self.settings = settings
        self.client = client or Client(settings)
        self._submit_lock = threading.Lock()
        #: (peer uid, job id, path, instance) -> the log file allowed to it (_log_file), oldest first.
        self._grants: OrderedDict[tuple, Path] = OrderedDict()
        self._grants_lock = threading.Lock()
        self.ops: dict[str, Callable[..., Any]] = {
            name.removeprefix("op_"): getattr(self, name) for name in dir(self) if name.startswith("op_")}

    # -- dispatch -------------------------------------------------------------------------
    def handle(self, peer: Peer, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (never raises)."""
        me = os.geteuid()
        if me != 0 and peer.uid not in (0, me):
            # Its workers run every job as this gateway's user: serving anyone else would let them
            # run code as that user. Only a root node runs other users' jobs as themselves.
            return _error(PermissionDenied(
                f"this gateway runs as {identity_of(me).name}, not root: its jobs all run as "
                f"{identity_of(me).name}, so only that user may use it; ask an admin for a root node "
                "(`sudo rig up`)"))
        op = message.get("op")
        fn = self.ops.get(op) if isinstance(op, str) else None
        if fn is None:
            return _error(InvalidInput(f"the gateway has no operation {op!r}; is this rig client newer than rig "
                                       f"on the node ({__version__})?"))
        try:
            raw = message.get("args")
            args = wire.decode(raw) if raw else {}  # none: an operation without arguments
            if not isinstance(args, dict):
                raise InvalidInput("the request's args must be an object")
            environ = args.pop("environ", None) or {}
            if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in environ.items()):
                raise InvalidInput("environ must map names to strings")
            # CLI words: the caller's own client words a refusal for its caller (rig.argnames).
            with acting_as(peer.identity, environ, umask_of(peer.pid)), cli_words():
                result = fn(peer, **args)
            answer = {"ok": True, "result": wire.encode(result)}
            if op in ARCHIVE_LISTINGS and (unread := self.client.history.unread) is not None:
                # What `rig jobs` / `rig usage` say in one warning line when they read the archive
                # themselves (rig.history.archive_warning): this thread's listing's own.
                answer["archive_unread"] = unread
            return answer
        except RecursionError:
            return _error(InvalidInput("a request nested too deeply"))
        except RedisUnavailable as exc:
            return _error(exc, self._node_side(exc))
        except RigError as exc:
            return _error(exc)
        except TypeError as exc:
            return _error(InvalidInput(f"wrong arguments for {op}: {exc}"))
        except wire.WireError as exc:
            return _error(InvalidInput(f"a request the gateway cannot read: {exc}"))
        except Exception as exc:  # noqa: BLE001 - one request's fault never stops the gateway
            if is_unusable(exc):  # a bare redis-py error of an operation that reads Redis itself
                node_side = unavailable(self.settings.redis_url, exc)
                return _error(node_side, self._node_side(node_side))
            log.exception("gateway: %s of uid %s failed", op, peer.uid)
            return _error(RigError(f"the gateway failed on {op}: {type(exc).__name__}: {exc}; see the node's "
                                   "gateway.out (rig's system log folder)"))

    def _node_side(self, exc: RedisUnavailable) -> str:
        """The line a caller reads when this gateway cannot use its Redis (down, or its password
        refused: changed under the node). The error's own words tell whoever runs the node what to
        set (RIG_REDIS_URL, a password file, `rig up`); a user of the gateway has no Redis settings
        to fix and must not be sent looking for the password, so they are said to be the node's."""
        return (f"rig's gateway on node {self.settings.node_name} cannot use its Redis (the node's to fix, not "
                f"your settings: tell its admin): {exc}")

    def _admin(self, peer: Peer) -> bool:
        return self.client.is_admin(peer.identity)

    def _seen(self, peer: Peer, job: Job) -> Job:
        return privacy.as_seen_by(job, peer.identity, admin=self._admin(peer))

    # -- operations (each takes the peer first, then the request's arguments) ---------------
    def op_ping(self, peer: Peer) -> dict[str, Any]:
        from rig.redis_conn import strip_password

        return {"version": __version__, "node": self.settings.node_name, "user": peer.identity.name,
                "uid": peer.uid, "admin": self._admin(peer),
                # Which installation it serves, so a client told another one can say so.
                "redis_url": strip_password(self.settings.redis_url), "key_prefix": self.settings.key_prefix}

    def op_submit(self, peer: Peer, command: Any, options: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
        options = _submit_options(options)
        with self._submit_lock:  # last_auto_note is the shared client's: one submission at a time
            handle = self.client.submit(command, **options)
            note, durability = self.client.last_auto_note, self.client.last_durability_note
        return {"job": handle._job, "auto_note": note, "durability_note": durability}

    def op_submit_many(self, peer: Peer, requests: list[dict[str, Any]]) -> list[Job]:
        if not isinstance(requests, list):
            raise InvalidInput("requests must be a list")
        checked = []
        for number, request in enumerate(requests):
            if not isinstance(request, dict):
                raise InvalidInput(f"request {number}: expected an object")
            request = dict(request)
            command = request.pop("command", None)
            checked.append({"command": command, **_submit_options(request)})
        return [h._job for h in self.client.submit_many(checked)]

    def op_get(self, peer: Peer, job_id: int, instance: str | None = None, pick: str | None = None) -> Job:
        """``instance``: the job must be that very one (JobGone if the id names another now);
        ``pick``: a prefix of the instance choosing among jobs given the same id (``rig show
        --instance``, archived ones included)."""
        if pick is not None:
            if not isinstance(pick, str):
                raise InvalidInput("pick must be a string (a prefix of a job's instance)")
            return self._seen(peer, self.client.get(_job_id(job_id), pick))
        return self._seen(peer, self.client.get_instance(_job_id(job_id), instance))

    def op_jobs(self, peer: Peer, state: str | None = None, limit: int = 50, user: str | None = None,
                since: float | None = None) -> list[Job]:
        if user is not None and not isinstance(user, str):
            raise InvalidInput("user must be a login name")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
            raise InvalidInput("since must be a time in epoch seconds")
        # Archived jobs come through the same rule as live ones (privacy.as_seen_by).
        return [self._seen(peer, j)
                for j in self.client.jobs(state, limit=_bounded(limit, 10_000), user=user, since=since)]

    def op_usage(self, peer: Peer, since: float | None = None, by: str = "user") -> Any:  # noqa: ANN401
        """Accounting figures: who used how much is public (privacy), commands are not in them."""
        if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
            raise InvalidInput("since must be a time in epoch seconds")
        if not isinstance(by, str):
            raise InvalidInput("by must be a column name")
        return list(self.client.usage(since=since, by=by))

    def op_waiting(self, peer: Peer, limit: int = 50) -> list[Job]:
        return [self._seen(peer, j) for j in self.client.waiting(limit=_bounded(limit, 10_000))]

    def op_why_waiting(self, peer: Peer, job_id: int) -> str | None:
        return self.client.why_waiting(self.client.get(_job_id(job_id)))

    def op_start_estimates(self, peer: Peer, job_ids: list[int] | None = None) -> Any:  # noqa: ANN401 - Forecast
        """Start estimates hold job ids, times and the reasons why_waiting shows anyone."""
        if job_ids is not None and (not isinstance(job_ids, list) or len(job_ids) > 10_000):
            raise InvalidInput("job_ids must be a list of at most 10000 job ids")
        return self.client.start_estimates(None if job_ids is None else [_job_id(j) for j in job_ids])

    def op_waiting_words(self, peer: Peer, job_ids: list[int]) -> dict[int, str]:
        """Why each waiting job waits, public as why_waiting's sentences are."""
        if not isinstance(job_ids, list) or len(job_ids) > 10_000:
            raise InvalidInput("job_ids must be a list of at most 10000 job ids")
        found = self.client.records([_job_id(j) for j in job_ids])
        return self.client.waiting_words(j for j in found.values() if isinstance(j, Job))

    def op_jobs_ahead(self, peer: Peer, job_ids: list[int]) -> dict[int, int]:
        """Places in the queue are public, as why_waiting's "N job(s) ahead of it" is."""
        if not isinstance(job_ids, list) or len(job_ids) > 10_000:
            raise InvalidInput("job_ids must be a list of at most 10000 job ids")
        return self.client.jobs_ahead([_job_id(j) for j in job_ids])

    def op_running_end(self, peer: Peer, job_id: int) -> list:
        """A running job's expected end (at, source, now), public as the start estimates are."""
        end = self.client.running_end(self.client.get(_job_id(job_id)))
        return [end.at, end.source, end.now]

    def op_first_look(self, peer: Peer, job_id: int) -> str | None:
        return self.client.first_look(_job_id(job_id))

    def op_status(self, peer: Peer, pool: str | None = None) -> Any:  # noqa: ANN401 - StatusReport
        report = self.client.status(pool)
        report.running = {card: [self._seen(peer, j) for j in jobs] for card, jobs in report.running.items()}
        return report

    def op_errors(self, peer: Peer, limit: int = 100) -> list[Job]:
        return [self._seen(peer, j) for j in self.client.errors(limit=_bounded(limit, 10_000))]

    def op_in_error_queue(self, peer: Peer, job_id: int) -> bool:
        return self.client.in_error_queue(_job_id(job_id))

    def op_error_count(self, peer: Peer) -> int:
        return self.client.error_count()

    def op_nodes(self, peer: Peer) -> list[Any]:
        return self.client.nodes()

    def op_templates(self, peer: Peer) -> dict[str, dict[str, Any]]:
        return {name: t.model_dump() for name, t in self.client.templates().items()}

    def op_kill(self, peer: Peer, job_id: int) -> Job:
        # Never waits here: the client waits for the end itself (a gateway thread is no queue).
        return self._seen(peer, self.client.kill(_job_id(job_id), wait=False))

    def op_retry(self, peer: Peer, job_id: int, gpu_memory: str | int | None = None,
                 time_limit: str | float | None = None) -> Job:
        return self.client.retry(_job_id(job_id), gpu_memory=gpu_memory, time_limit=time_limit)

    def op_clear_error(self, peer: Peer, job_id: int) -> Job:
        return self._seen(peer, self.client.clear_error(_job_id(job_id)))

    def op_forget_node(self, peer: Peer, name: str, force: bool = False) -> dict[str, Any]:
        failed: dict[int, str] = {}
        cards = self.client.forget_node(str(name), force=bool(force), failed=failed)
        return {"cards": cards, "failed": failed}

    # A job's log: its owner's and admins' (the files are under rig's log_dir, which users
    # need not be able to enter); only paths the record names as its attempts' logs.
    def _log_file(self, peer: Peer, job_id: int, path: str, instance: str | None = None) -> Path:
        """``instance``: a prefix of the job's instance (``rig log --instance``): the log of that
        very job, archived or live, where its id was given again (Client.get's rule)."""
        file = self._named_log(peer, job_id, path, instance)
        if not self._in_log_folder(file):
            raise InvalidInput(f"{path!r} is not in this node's log folder; logs stay on the node that ran the job")
        return file

    def _named_log(self, peer: Peer, job_id: int, path: str, instance: str | None) -> Path:
        """``path``, checked to be one of the job's attempt logs, which the peer may read.

        A path once allowed to a peer's user stays allowed (a job's owner, its instance and the
        logs it names never change; admins are this gateway's settings): it is remembered
        (LOG_GRANTS), so `rig log -f` reads on through the gateway while Redis is lost for a
        moment, as it does where it reads the file itself."""
        if instance is not None and not isinstance(instance, str):
            raise InvalidInput("instance must be a string (a prefix of a job's instance)")
        if not isinstance(path, str):
            raise InvalidInput(f"a log path must be a string, got {type(path).__name__}")
        grant = (peer.uid, _job_id(job_id), path, instance)
        with self._grants_lock:
            file = self._grants.get(grant)
            if file is not None:
                self._grants.move_to_end(grant)
                return file
        file = self._allowed_log_file(job_id, path, instance)
        with self._grants_lock:
            self._grants[grant] = file
            while len(self._grants) > LOG_GRANTS:
                self._grants.popitem(last=False)
        return file

    def _allowed_log_file(self, job_id: int, path: str, instance: str | None) -> Path:
        job = self.client.get(_job_id(job_id), instance)
        self.client.check_control(job, "read the log of")
        named = set(job.log_paths) | ({job.log_path} if job.log_path else set())
        if not isinstance(path, str) or path not in named:
            raise InvalidInput(f"{path!r} is no log of job {job.id}; `rig log {job.id}` finds them")
        return Path(path)

    def _in_log_folder(self, path: Path) -> bool:
        """Only a file in this node's job log folder is served (a record is no proof: rig.records)."""
        root = self.settings.job_log_dir.resolve()
        plain = Path(os.path.normpath(path))
        return plain.is_relative_to(root) and path.resolve() == plain

    def op_log_exists(self, peer: Peer, job_id: int, path: str, instance: str | None = None) -> bool:
        """Whether this node has that log. One outside its log folder (an attempt that ran on
        another node, or any log asked of a login node's gateway) is one this gateway never
        serves: LogMissing (exit 1, as ``rig log`` of a log not on this machine) naming where
        the attempt ran, not bad input (exit 2), and never a wait for it in ``rig log -f``."""
        file = self._named_log(peer, job_id, path, instance)
        if not self._in_log_folder(file):
            from rig.cli.logview import attempt_logs, where

            job = self.client.get(_job_id(job_id), instance)
            ran = next((f"attempt {n} ran on {where(job, n)}" for n, p in attempt_logs(job).items() if p == path),
                       "no attempt of it ran here")
            raise LogMissing(f"log file {path} is not in node {self.settings.node_name}'s log folder, the only one its "
                             f"gateway serves ({ran}); logs stay on the node that ran the job: read it there, "
                             "through that node's gateway (RIG_GATEWAY_SOCKET)")
        return file.exists()

    def op_log_read(self, peer: Peer, job_id: int, path: str, offset: int = 0, size: int = LOG_CHUNK,
                    instance: str | None = None) -> str:
        """Up to ``size`` bytes (at most LOG_CHUNK) from ``offset``, base64; "" at the end."""
        file = self._log_file(peer, job_id, path, instance)
        _check_offset(offset)
        try:
            fd = _open_log(file)
        except FileNotFoundError:
            raise InvalidInput(f"the log file {file} is not on this node") from None
        try:
            return _b64(os.pread(fd, min(_bounded(size, LOG_CHUNK), LOG_CHUNK), offset))
        finally:
            os.close(fd)

    def op_log_look(self, peer: Peer, job_id: int, path: str, offset: int = 0, back: int = 0,
                    probe: list[int] | None = None, size: int = LOG_CHUNK,
                    instance: str | None = None) -> dict[str, Any]:
        """One look of `rig log -f` at a log it follows (rig.cli.logview.CutFollower): the bytes
        from ``offset`` (at most ``size``, at most LOG_CHUNK), the ``back`` bytes before it (at
        most TAIL_MAX), the ``probe`` range ``[start, length]`` (at most PROBE_MAX), all base64,
        with what the follower needs to see a cut or a log made again: the file's size, its
        (dev, ino), the keeper's note's ``cap_cut``, ``made_again`` (how many times its keeper made
        the log again: another file under the path without it is not the keeper's) and its words.
        ``{"gone": true}`` when the
        path names no file just now (deleted, not made again yet). Read under the same rule as
        op_log_read (_log_file: the caller's own job's log, in this node's log folder)."""
        file = self._log_file(peer, job_id, path, instance)
        _check_offset(offset)
        if isinstance(back, bool) or not isinstance(back, int) or not 0 <= back <= TAIL_MAX:
            raise InvalidInput(f"back must be 0..{TAIL_MAX} bytes, got {back!r}")
        if probe is not None and not (isinstance(probe, list) and len(probe) == 2
                                      and all(isinstance(n, int) and not isinstance(n, bool) for n in probe)
                                      and 0 <= probe[0] < 2**62 and 0 <= probe[1] <= PROBE_MAX):
            raise InvalidInput(f"probe must be [start, length] with a length of at most {PROBE_MAX} bytes")
        try:
            fd = _open_log(file)
        except FileNotFoundError:
            return {"gone": True}
        try:
            # The data first, the checks after it, the keeper's note last (rig.cli.logview.LogSource.look).
            data = os.pread(fd, min(_bounded(size, LOG_CHUNK), LOG_CHUNK), offset)
            back = min(back, offset)
            before = os.pread(fd, back, offset - back) if back else b""
            probed = os.pread(fd, probe[1], probe[0]) if probe else b""
            info = os.fstat(fd)
            note = _read_note(file.with_suffix(".note"))
            try:
                cut = int(note.get("cap_cut") or 0)
                made_again = int(note.get("log_made_again") or 0)
            except (TypeError, ValueError):
                cut = made_again = 0
            return {"size": info.st_size, "dev": info.st_dev, "ino": info.st_ino, "cap_cut": cut,
                    "made_again": made_again, "note": logspace.describe_note(note),
                    "before": _b64(before), "probe": _b64(probed), "data": _b64(data)}
        finally:
            os.close(fd)

    def op_result(self, peer: Peer, job_id: int) -> str | None:
        return self.client.result_of(_job_id(job_id))

    # A @rig.task job reads its call and stores its result (rig.call) as itself.
    def op_task_payload(self, peer: Peer, job_id: int) -> str | None:
        job = self._job_of_peer(peer, _job_id(job_id))
        return self.client.r.hget(self.client.keys.job(job.id), "payload")

    def op_task_result(self, peer: Peer, job_id: int, encoded: str) -> bool:
        job = self._job_of_peer(peer, _job_id(job_id))
        if not isinstance(encoded, str):
            raise InvalidInput("encoded must be a string")
        note = store_result(self.client.r, self.client.keys, self.client.replicas, job.id, encoded)
        if note is not None:
            log.warning("%s", note)
        return True

    def _job_of_peer(self, peer: Peer, job_id: int) -> Job:
        """The job whose running attempt the peer process is: its environment names the job,
        its instance and this installation's key prefix (the worker set them; a process of
        the peer's own cannot borrow another job's), its uid is the job's, and the job is
        RUNNING. Else PermissionDenied."""
        job = self.client.get(job_id)
        env = peer.environment()
        marks = {b"RIG_JOB_ID": str(job.id).encode(), b"RIG_KEY_PREFIX": self.settings.key_prefix.encode(),
                 b"RIG_JOB_INSTANCE": (job.instance or "").encode()}
        mine = all(env.get(k) == v for k, v in marks.items())
        owner = owns(job, peer.identity) or peer.uid == os.geteuid()
        if not (mine and owner and job.state is JobState.RUNNING):
            raise PermissionDenied(f"only job {job.id}'s own running process may read its call or store its "
                                   "result")
        return job


def _check_offset(offset: Any) -> None:  # noqa: ANN401
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**62:
        raise InvalidInput(f"offset must be a whole number of bytes, got {offset!r}")


def _open_log(file: Path) -> int:
    """A read-only descriptor of the log ``file``: never through a symbolic link, never a FIFO or
    device (its owner could put one there). FileNotFoundError when it is not there."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InvalidInput(f"the log file {file} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInput(f"{file} is no regular file")
    return fd


def _read_note(note: Path) -> dict[str, Any]:
    """The keeper's note beside a log (rig.logspace), {} when none: opened as the log is
    (_open_log), so a link put in its place reads nothing of elsewhere."""
    try:
        fd = _open_log(note)
    except (FileNotFoundError, InvalidInput):
        return {}
    try:
        return logspace.read_note(Path(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _error(exc: RigError, message: str | None = None) -> dict[str, Any]:
    """The error answer: ``exc``'s class (the client raises the same) and ``message``, else its own."""
    return {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc) if message is None else message}}


#: submit()'s arguments a request may carry (never rig's internal ones).
SUBMIT_OPTIONS = frozenset({"gpu_memory", "gpus", "priority", "name", "workdir", "env", "shell", "kind", "extra",
                            "retries", "time_limit", "oom_retry_grow", "template", "pool", "export"})


def _submit_options(options: Any) -> dict[str, Any]:  # noqa: ANN401
    if not isinstance(options, dict):
        raise InvalidInput("submit options must be an object")
    unknown = sorted(set(options) - SUBMIT_OPTIONS)
    if unknown:
        raise InvalidInput(f"unknown submit option(s): {', '.join(map(str, unknown))}")
    if options.get("workdir") is None:
        # The gateway's own folder means nothing to the caller: its client sends its own.
        raise InvalidInput("the request names no working folder")
    return dict(options)


def _job_id(value: Any) -> int:  # noqa: ANN401
    text = str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise InvalidInput(f"{value!r} is not a job id (a positive whole number); `rig jobs` lists them")
    return int(value)


def _bounded(value: Any, most: int) -> int:  # noqa: ANN401
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"limit must be a positive whole number, got {value!r}")
    return min(value, most)


# -- the socket server ------------------------------------------------------------------------
class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        peer = Peer.of(sock)
        if not self.server.admit(peer.uid):
            _send_quietly(sock, _error(RigError(
                "the gateway is busy (too many connections, or too many of yours); try again")))
            return
        held = [0]  # bytes of this connection's request counted against its uid

        def take(size: int) -> None:
            if not self.server.take_bytes(peer.uid, size):
                raise wire.WireError("the gateway holds too many bytes of requests at once (yours, or "
                                     "everyone's); try again")
            held[0] = size

        try:
            while True:
                sock.settimeout(IDLE_TIMEOUT_S)
                try:
                    message = wire.receive(sock, body_timeout=FRAME_TIMEOUT_S, large=self.server.large, on_size=take)
                except wire.WireError as exc:
                    _send_quietly(sock, _error(InvalidInput(f"a request the gateway cannot read: {exc}")))
                    return
                except (OSError, TimeoutError):
                    return  # the peer went away or fell silent
                if message is None:
                    return
                answer = self.server.gateway.handle(peer, message)
                self.server.give_bytes(peer.uid, held[0])
                held[0] = 0
                try:
                    wire.send(sock, answer)
                except wire.WireError as exc:
                    wire.send(sock, _error(RigError(str(exc))))
                except OSError:
                    return
        finally:
            self.server.give_bytes(peer.uid, held[0])
            self.server.leave(peer.uid)


def _send_quietly(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        wire.send(sock, message)
    except (OSError, wire.WireError):
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: str, gateway: Gateway) -> None:
        self.gateway = gateway
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # uid -> connections open
        self.large = threading.BoundedSemaphore(2)  # large frames parsed at once (wire.LARGE_FRAME)
        self._bytes: dict[int, int] = {}  # uid -> bytes of its requests in the gateway
        super().__init__(path, _Handler)

    def admit(self, uid: int) -> bool:
        """Room for one more connection of ``uid`` (MAX_CONNECTIONS in all, MAX_PER_USER each)?"""
        with self._lock:
            if sum(self._held.values()) >= MAX_CONNECTIONS or (uid != 0 and self._held.get(uid, 0) >= MAX_PER_USER):
                return False
            self._held[uid] = self._held.get(uid, 0) + 1
            return True

    def take_bytes(self, uid: int, size: int) -> bool:
        """Count ``size`` bytes against ``uid`` (MAX_BYTES_PER_USER; root's are not limited)."""
        with self._lock:
            now = self._bytes.get(uid, 0)
            total = sum(n for u, n in self._bytes.items() if u != 0)
            if uid != 0 and (now + size > MAX_BYTES_PER_USER or total + size > MAX_BYTES_TOTAL):
                return False
            self._bytes[uid] = now + size
            return True

    def give_bytes(self, uid: int, size: int) -> None:
        if size:
            with self._lock:
                self._bytes[uid] = self._bytes.get(uid, 0) - size

    def leave(self, uid: int) -> None:
        with self._lock:
            self._held[uid] -= 1
            if not self._held[uid]:
                del self._held[uid]


def socket_in_use(path: Path) -> bool:
    """Does a live process answer on the socket at ``path``?"""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def path_problem(path: Path) -> str | None:
    """Why the gateway cannot listen at ``path`` (one line), or None. Its folder (made 0755 if
    missing) must be this process's user's or root's and writable by nobody else: whoever can
    write there could replace the socket with their own and read what clients send."""
    if len(os.fsencode(str(path))) > 107:
        return (f"the gateway socket path {path} is longer than a Unix socket allows (107 bytes); "
                "set gateway_socket to a shorter path")
    try:
        _make_folders(path.parent)
    except OSError as exc:
        return f"cannot use the folder of the gateway socket {path}: {exc.strerror}; set gateway_socket elsewhere"
    # Every folder on the way: one another user owns (or may write to without the sticky bit,
    # as /tmp has) could be renamed or replaced, and the socket with it.
    for place in [path.parent, *path.parent.parents]:
        info = place.lstat()
        if stat.S_ISLNK(info.st_mode):
            whose = "is a symbolic link"
        elif info.st_uid not in (0, os.geteuid()):
            whose = f"belongs to uid {info.st_uid}"
        elif info.st_mode & 0o022 and not (place != path.parent and info.st_mode & stat.S_ISVTX):
            whose = f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
        else:
            continue
        return (f"the folder {place} on the way to the gateway socket {whose}: someone else could put their "
                "own socket there; set gateway_socket to a path in folders of your own or root's, mode 0755")
    return None


def _make_folders(folder: Path) -> None:
    """Make ``folder`` and the folders above it that are missing, each mode 0755 whatever the
    umask: under an operator's umask 077 they would be 0700 and no user could reach the socket."""
    if folder.is_dir():
        return
    if folder.parent != folder:
        _make_folders(folder.parent)
    try:
        folder.mkdir(mode=0o755)
    except FileExistsError:
        return  # made meanwhile (or a file: stat() and bind() say what is wrong)
    os.chmod(folder, 0o755)


def reach_problem(path: Path) -> str | None:
    """Why other users cannot reach the socket at ``path`` (one line), or None: a folder on the
    way they may not pass through (no search permission for others), as an admin's umask 077 or
    a ``chmod 700`` leaves it. A root gateway serves every user; such a folder shuts them out."""
    for place in [path.parent, *path.parent.parents]:
        try:
            mode = stat.S_IMODE(place.stat().st_mode)
        except OSError:
            continue
        if not mode & 0o001:
            return (f"users cannot reach the gateway socket {path}: the folder {place} is mode {mode:o} (others may "
                    f"not pass through it); `chmod o+x {place}`, or set gateway_socket elsewhere")
    return None


def bind(path: Path, gateway: Gateway) -> _Server:
    """The server on ``path`` (mode 0666: everyone may connect; who they are is the kernel's
    answer). A stale socket file is replaced; a live one is refused with one line; so is a
    folder someone else may write to (path_problem)."""
    problem = path_problem(path)
    if problem:
        raise RigError(problem)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise RigError(f"{path} exists and is no socket; remove it or set gateway_socket elsewhere")
        if socket_in_use(path):
            raise RigError(f"another gateway answers at {path}; set gateway_socket to another path for this node")
        path.unlink()
    old = os.umask(0o111)  # created 0666 at once: no chmod of a path that could be swapped
    try:
        server = _Server(str(path), gateway)
    finally:
        os.umask(old)
    return server


def still_bound(path: Path, bound: int) -> bool:
    """Is the socket at ``path`` still the one bound (inode ``bound``)? Its mode is put back to
    0666 on the way: a socket chmod'ed 0600 (a tidy-up, an admin's slip) shut every user out
    while the gateway ran on, and they read `Permission denied`."""
    try:
        info = path.lstat()
    except OSError:
        return False
    if info.st_ino != bound:
        return False
    if stat.S_IMODE(info.st_mode) != 0o666:
        try:
            os.chmod(path, 0o666)  # in a folder only its owner may write to (path_problem)
            log.warning("the gateway socket %s was mode %o; made 0666 again so users reach it", path,
                        stat.S_IMODE(info.st_mode))
        except OSError as exc:
            log.error("the gateway socket %s is mode %o and cannot be made 0666 again: %s", path,
                      stat.S_IMODE(info.st_mode), exc)
    return True


def serve(settings: Settings | None = None) -> None:
    """Run the gateway of this node until SIGTERM or SIGINT."""
    from rig.gateway.paths import node_socket

    settings = settings or load_settings()
    path = node_socket(settings)
    server = bind(path, Gateway(settings))
    log.info("gateway of node %s listening on %s", settings.node_name, path)
    try:
        bound = path.lstat().st_ino
    except OSError as exc:
        server.server_close()
        raise RigError(f"the gateway socket {path} vanished as it was made ({exc.strerror})") from None

    def watch() -> None:
        # A socket file removed (a /tmp or /run cleaner) or replaced leaves a gateway nobody
        # reaches: exit, and rig up starts it again, bound afresh.
        while True:
            time.sleep(2.0)
            if not still_bound(path, bound):
                log.error("the gateway socket %s was removed or replaced; stopping so rig up binds it again", path)
                server.shutdown()
                return

    threading.Thread(target=watch, name="rig-gateway-watch", daemon=True).start()

    def stop(signum: int, _frame: object) -> None:
        global _stopping
        _stopping = True
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        try:
            if path.exists() and not socket_in_use(path):
                path.unlink()
        except OSError:
            pass


def main() -> None:
    from rig.supervision import watch_supervisor

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/gateway] %(message)s")
    watch_supervisor()  # dies with the rig up that started it (a no-op when started by hand)
    try:
        serve()
    except RigError as exc:
        log.error("%s", exc)
        raise SystemExit(6) from None
    raise SystemExit(0 if _stopping else 1)


if __name__ == "__main__":
    main()
