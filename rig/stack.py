"""``rig up``: bring up one node's stack and keep it up; ``rig down``: stop it.

Started, in order: Redis (only if none answers at the configured URL: a private one with AOF
under $RIG_HOME/redis), the node's cards in the ledger, one Celery worker per allowed card,
the control worker (dispatcher), beat and Flower. A child that dies is restarted. On SIGINT or
SIGTERM every child rig started is stopped, Redis last; nothing else is touched. Running jobs
keep running and are adopted by the card workers of the next ``rig up``.

Several nodes share one Redis (``rig up --node NAME --redis URL`` on each server): every node
registers its cards under its name and refreshes its node heartbeat (rig.nodes) while its
workers run; a node stopped on purpose is marked ``stopped`` so the others leave its running
jobs alone. Every node may run beat and the dispatcher: locks keep one of each active.

A node's processes are marked and die with their supervisor (rig.supervision); each worker
holds its card's (or the control) lock for life (rig.worker_lock). ``rig up`` first stops what
a crashed ``rig up`` of the node left, ``rig down`` stops every process of the node; jobs are
never among them. Children run from rig's own run folder with ``python -P``: nothing in the
operator's working directory is imported. The private Redis is restarted with a capped backoff
whenever it dies, and never over data it cannot read (rig.redis_server).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rig import authgate, sentinel_url
from rig.celery_config import card_queue, dispatcher_queues
from rig.config import Settings
from rig.connections import rig_pool_limit
from rig.draining import cards_to_serve, drained, worker_retired
from rig.errors import (
    ConfigError,
    NodeInUse,
    PermissionDenied,
    RedisAuthFailed,
    RedisRefusesWrites,
    RedisUnavailable,
    RigError,
    StackError,
)
from rig.gpus import GpuBackend, detect_backend
from rig.keys import Keys, card_worker_name, control_worker_name
from rig.listing import first_ids
from rig.node_claim import OWNER_ENV, claim, identity, refused_line, release, there
from rig.nodes import NodeRegistry
from rig.redis_conn import (
    FAILOVER_WINDOW_S,
    LOOPBACK,
    POOL_LIMIT_ENV,
    client_options,
    connect,
    ensure_password_file,
    handed_source,
    home_password_file,
    password_source,
    resolve_auth,
    strip_password,
    url_password,
    without_credentials,
)
from rig.redis_server import is_local, keep_data_id, private_redis_dir, probe, start_private_redis
from rig.redis_writes import notices_at as redis_notices_at
from rig.redis_writes import refusal_notice as redis_refusal_notice
from rig.registration import register_node
from rig.sentinel_url import is_sentinel
from rig.stop_mark import read_refusal, refusal_path
from rig.supervision import (
    beat_pid,
    child_marks,
    describe,
    hung_after,
    leftovers,
    live_supervisors,
    safe_python,
    stop_processes,
)
from rig.worker_lock import EXIT_LOCK_HELD
from workers.process_tree import is_alive, is_stopped

log = logging.getLogger(__name__)

COMPONENTS = ("redis", "cards", "control", "beat", "flower", "metrics", "gateway")
GATEWAY = "gateway"  # its part (and child) name, and how Stack.wait_ready names it missing
#: How long children get to stop after SIGTERM before SIGKILL (s).
STOP_TIMEOUT_S = 20.0
#: Longest a rig up waits for another's pools check and registration (the join lock), and that
#: lock's life (a rig up killed while holding it blocks the next for at most this long), s.
JOIN_LOCK_S = 30.0
#: Backoff between attempts to restart the private Redis (s): doubling from the first, capped.
REDIS_RETRY_FIRST_S = 1.0
REDIS_RETRY_MAX_S = 30.0
#: How often a running private Redis is asked whether its data id is still there (s).
DATA_ID_CHECK_S = 5.0



@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_file: Path
    role: str = ""  # RIG_ROLE (rig.supervision.ROLES); default: the name
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    #: Monotonic time since which this live worker has had no heartbeat of its own (None: it
    #: heartbeats, or it is not a worker). See Stack.check_hung.
    silent_since: float | None = None
    #: This process has heartbeated at least once (reset when it is started again).
    beat_seen: bool = False


@dataclass
class UpOptions:
    only: tuple[str, ...] = ()
    no_flower: bool = False
    no_beat: bool = False
    no_metrics: bool = False
    no_gateway: bool = False
    env_overrides: dict[str, str] = field(default_factory=dict)


def check_login(user: str, password: str, where: str) -> tuple[str, str]:
    """The admin login (Flower's and rig's web page's) as ``(user, password)``, or ConfigError
    (exit 6) naming ``where`` (the variable or file) and what to write, when rig cannot use it:
    a comma (Flower splits its login on commas into several logins: ``admin:pa,evil:evil``
    would let ``evil:evil`` in, and not the whole); an empty user or password (an empty pair
    would let an empty login in); text other than printable ASCII (Flower answers 500 to any
    other login; basic auth has no agreed charset)."""
    if "," in user or "," in password:
        raise ConfigError(f"the admin login in {where} has a comma, which Flower reads as two logins; "
                          "choose one without a comma")
    wrong = [f"an empty {name}" for name, value in (("user", user), ("password", password)) if not value]
    wrong += [f"a {name} that is not printable ASCII" for name, value in (("user", user), ("password", password))
              if value and not (value.isascii() and value.isprintable())]
    if wrong:
        instead = ("unset it: rig then uses the login in $RIG_HOME/flower.auth" if where.startswith("$")
                   else "delete the file: rig then generates a new login there")
        raise ConfigError(f"the admin login in {where} has {' and '.join(wrong)}: write user:password, both "
                          f"non-empty printable ASCII (or {instead})")
    return user, password


def flower_credentials(settings: Settings) -> tuple[str, str]:
    """Flower's basic-auth user and password: $RIG_FLOWER_AUTH ("user:password") if set, else
    the pair in $RIG_HOME/flower.auth, generated (mode 0600) on first use. Flower never runs
    without authentication. A login rig cannot use is refused (check_login)."""
    configured = os.environ.get("RIG_FLOWER_AUTH")
    if configured and ":" in configured:
        user, password = configured.split(":", 1)
        return check_login(user, password, "$RIG_FLOWER_AUTH")
    path = settings.home / "flower.auth"
    if path.exists():
        user, _, password = path.read_text().strip().partition(":")
        if user or password:  # an empty file is made again; a half-written login is refused
            return check_login(user, password, str(path))
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    user, password = "rig", secrets.token_urlsafe(18)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{user}:{password}\n")
    return user, password


#: The most tasks (jobs: rig.task_events) Flower keeps, in memory and in its saved history.
FLOWER_MAX_TASKS = 10_000
#: How often Flower saves its history (ms); it also saves when it stops (SIGTERM).
FLOWER_SAVE_INTERVAL_MS = 60_000


def flower_db(settings: Settings) -> Path:
    """Where Flower keeps its history across restarts: a dbm file set ``<node>.db*`` in
    ``$RIG_HOME/flower/`` (per node: two nodes sharing a home never write one file; a folder
    of its own: docker-compose keeps it on a volume)."""
    return settings.home / "flower" / f"{settings.node_name}.db"


def flower_history_options(settings: Settings) -> list[str]:
    """Flower's history: at most FLOWER_MAX_TASKS jobs, kept in flower_db across its restarts
    (saved every FLOWER_SAVE_INTERVAL_MS and when it stops; a file it cannot read is moved
    aside as ``*.corrupt`` and it starts empty)."""
    return [f"--max_tasks={FLOWER_MAX_TASKS}", "--persistent=True", f"--db={flower_db(settings)}",
            f"--state_save_interval={FLOWER_SAVE_INTERVAL_MS}"]


def flower_environment(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Flower's environment: ``env`` without any ``FLOWER_*`` variable (Flower reads each as
    an option: one left in the operator's shell, like FLOWER_UNAUTHENTICATED_API=true or
    FLOWER_AUTH, would change rig's Flower behind its back); rig adds its login itself.
    Returns (that environment, the names left out, sorted)."""
    ignored = sorted(k for k in env if k.startswith("FLOWER_"))
    return {k: v for k, v in env.items() if not k.startswith("FLOWER_")}, ignored


def http_url(address: str, port: int, path: str = "") -> str:
    """``http://address:port/path`` for what `rig up` prints: an IPv6 address in brackets
    (``http://[::1]:5555``), as a browser needs it; one already bracketed is kept so."""
    host = address.strip("[]")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def login_place(settings: Settings) -> str:
    """Where the admin login (Flower's, and rig's web page's) comes from, as flower_credentials
    decides it: for the lines `rig up` prints."""
    configured = os.environ.get("RIG_FLOWER_AUTH")
    if configured and ":" in configured:
        return "user and password in $RIG_FLOWER_AUTH"
    where = f"user and password in {settings.home / 'flower.auth'}"
    if configured:
        return f"{where} ($RIG_FLOWER_AUTH is set but is not user:password, so it is not used)"
    return where


def open_doors(settings: Settings, wants: Callable[[str], bool]) -> list[str]:
    """Warnings for the HTTP endpoints this stack would open beyond loopback. Both default to
    127.0.0.1; flower_address / metrics_address (/metrics and the web page) open them
    (docs/SECURITY.md)."""
    doors = []
    if wants("flower") and settings.flower_address not in LOOPBACK:
        doors.append(f"warning: Flower listens on {settings.flower_address}:{settings.flower_port}, beyond "
                     "loopback: its basic auth travels in plain HTTP; put TLS in front (docs/SECURITY.md)")
    if wants("metrics") and settings.metrics_port and settings.metrics_address not in LOOPBACK:
        doors.append(f"warning: the metrics endpoint and web page listen on {settings.metrics_address}:"
                     f"{settings.metrics_port}, beyond loopback: /metrics has no login (queue and card "
                     "figures are visible to whoever reaches it) and the page's basic auth travels in "
                     "plain HTTP; put TLS in front (docs/SECURITY.md)")
    return doors


def already_up(node: str, pid: int, only: tuple[str, ...] = ()) -> str:
    """The one line a second `rig up` of a node gets; one that wants only Flower is told how
    to add a Flower to a node that is up: under a name of its own (docs/FLOWER.md)."""
    line = f"rig is already up on node {node} (pid {pid}); `rig down` stops it"
    if only == ("flower",):
        line += f"; to add a Flower to it: `rig up --daemon --only flower --node {node}-flower`"
    return line


def pid_file(settings: Settings) -> Path:
    """``up-<node>.pid`` in the run folder: the live ``rig up``'s pid on its first line, the
    Redis it uses (rig.redis_conn.without_credentials: no password) on its second, on its third
    ``node`` when it runs cards or control workers, ``addon`` when it does not (``--only
    flower``: rig.stack.second_node)."""
    return settings.run_dir / f"up-{settings.node_name}.pid"


def write_pid_file(settings: Settings, *, node: bool = True) -> None:
    """This process is the node's ``rig up``, on ``settings.redis_url`` (see pid_file)."""
    kind = "node" if node else "addon"
    pid_file(settings).write_text(f"{os.getpid()}\n{without_credentials(settings.redis_url)}\n{kind}\n")


def second_node(settings: Settings) -> str | None:
    """Why a ``rig up`` with cards or control workers must not start in this RIG_HOME: one
    already runs another node with them there. Their own logs (logs/system/card0.log,
    control.log, beat.log, up.log, ...) and run files have one name per home, so two nodes
    would write the same files: one node per RIG_HOME is the rule (a ``--only flower`` add-on
    under a name of its own is allowed: docs/FLOWER.md). None when none runs."""
    from rig.cli.daemon import home_nodes

    for other, pid in sorted(home_nodes(settings.run_dir).items()):
        if other == settings.node_name:
            continue
        try:
            kind = (settings.run_dir / f"up-{other}.pid").read_text().split()[2:3]
        except OSError:
            continue
        if kind != ["addon"]:  # a pid file of an older rig says nothing: counted as a node
            return _second_node_line(settings, other, pid)
    return None


def root_node_here(settings: Settings) -> str | None:
    """Why an ordinary user's ``rig up`` with this server's real cards must not start: root's
    ``rig up`` already runs here (the up mark of its gateway, at /run/rig/gateway.sock or the
    configured gateway_socket, names it live: rig.gateway.paths.live_supervisor) and drives the
    same cards. The user's node has its own Redis (or its own node name), so neither would count
    the other's jobs and both would fill every card. None for root, for fake cards, and where no
    rig up of root's marks a gateway."""
    if os.geteuid() == 0 or settings.fake_gpus:
        return None
    from rig.gateway.paths import SYSTEM_SOCKET, live_supervisor, supervisor_mark

    for path in dict.fromkeys(p for p in (settings.gateway_socket, SYSTEM_SOCKET) if p is not None):
        try:
            owner = supervisor_mark(path).stat().st_uid
        except OSError:
            continue
        pid = live_supervisor(path)
        if owner == 0 and pid is not None:
            return (f"rig is already up on this server as root (its rig up, pid {pid}, serves the gateway {path}) "
                    "with this server's cards: a node of yours beside it would place jobs on the same cards, "
                    "neither counting the other's; nothing was started: use that node instead (rig-submit, rig "
                    "status and the rest reach it through its gateway, with nothing to start or configure)")
    return None


def _second_node_line(settings: Settings, other: str, pid: int) -> str:
    """The refusal of a second node in a RIG_HOME where node ``other`` (pid) runs."""
    return (f"this RIG_HOME ({settings.home}) already runs node {other} (pid {pid}); a second node "
            f"there would write the same logs ({settings.rig_log_dir}): start node {settings.node_name} "
            f"with a home of its own (`RIG_HOME=/another/folder rig up --node {settings.node_name}`), "
            f"or `rig down --node {other}` first")


def hold_home_lock(settings: Settings, only: tuple[str, ...] = ()) -> int:
    """Lock this RIG_HOME for the node this process runs: flock on its run folder, held while
    the returned descriptor is open (the kernel lets go when the process dies, SIGKILL
    included; nothing is written, so a refused rig up leaves no file). One node per home
    (second_node) and one rig up per node (already_up) read pid files, which two rig ups started
    at once both read before either wrote its own: the lock refuses the second, with the line
    those checks give once the first wrote its pid file."""
    import fcntl

    fd = os.open(settings.run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = running_pid(settings)
        if other is not None:
            raise StackError(already_up(settings.node_name, other, only)) from None
        why = second_node(settings)
        raise StackError(why or f"another rig up is starting in this RIG_HOME ({settings.home}) right now: "
                                "`rig status` once it is up, or start this node with a home of its own "
                                "(RIG_HOME=/another/folder)") from None
    return fd


#: In system_log_dir: the lock a node's rig up holds there, and who holds it (node, pid, home).
LOG_DIR_LOCK = "node.lock"


def runs_node(only: tuple[str, ...]) -> bool:
    """Does a ``rig up`` with these ``--only`` parts run a node (cards or control workers), which
    holds its home (hold_home_lock) and its system_log_dir (hold_log_dir_lock)? An add-on
    (``--only flower``, ``--only gateway``) does not."""
    return not only or "cards" in only or "control" in only


def _log_dir_lock_refusal(settings: Settings, path: Path, exc: OSError) -> str:
    """The one line of a rig up that cannot open system_log_dir's lock file (hold_log_dir_lock),
    saying what is true of it: a symlink, another user's file, or a folder this user cannot write."""
    import errno
    import stat

    from rig.client import identity_of

    own = f"give node {settings.node_name} a folder of its own (RIG_SYSTEM_LOG_DIR=/another/folder)"
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if exc.errno == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
        return (f"rig up refuses {path}: it is a symlink, and the node's lock is never taken through one "
                f"(it would truncate what it points to); remove it, or {own}")
    if st is not None and st.st_uid != os.geteuid():
        return (f"rig up cannot open {path} ({exc.strerror}): it is user {identity_of(st.st_uid).name}'s "
                f"node's lock; {own}")
    return (f"rig up cannot open {path} ({exc.strerror}): user {identity_of(os.geteuid()).name} may not write in {path.parent}; {own}")


def hold_log_dir_lock(settings: Settings) -> int:
    """Lock system_log_dir for the node this process runs, as hold_home_lock locks its home.
    Nodes in two homes whose configs name one absolute system_log_dir would write the same
    files (card0.log, control.log, beat.log, up.log, ...) without a word: refused, not warned
    about, since two writers' lines interleave in one file and the second node's rotation or
    truncation loses the first's, so neither node's log could be trusted. flock on a file in
    the folder, held while the returned descriptor is open (the kernel lets go when the process
    dies); the holder's node, pid and home are written into it for the refusal to name."""
    import fcntl

    path = settings.rig_log_dir / LOG_DIR_LOCK
    # O_NOFOLLOW: a node.lock that is a symlink (planted in a folder others may write) would have
    # rig up, root included, truncate and write whatever file it points to.
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    except PermissionError:  # another user's lock file: locked all the same, through a read-only open
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError as exc:
            raise StackError(_log_dir_lock_refusal(settings, path, exc)) from None
    except OSError as exc:
        raise StackError(_log_dir_lock_refusal(settings, path, exc)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            whose, _home = _log_dir_holder(fd)
        finally:
            os.close(fd)
        raise StackError(f"system_log_dir {settings.rig_log_dir} is already the logs of {whose}; two nodes "
                         "would write the same log files: give "
                         f"node {settings.node_name} a folder of its own (RIG_SYSTEM_LOG_DIR=/another/folder, "
                         f"or system_log_dir in its config), or `rig down` that node first") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{settings.node_name}\n{os.getpid()}\n{settings.home}\n".encode(), 0)
    except OSError:  # opened read-only: the lock holds, the refusal of a next one names no node
        pass
    return fd


def _log_dir_holder(fd: int) -> tuple[str, str | None]:
    """Who holds the system_log_dir lock open at ``fd`` (as hold_log_dir_lock wrote it): the
    words naming it, and its RIG_HOME (None when not known)."""
    from workers.process_tree import may_run

    holder = os.pread(fd, 4096, 0).decode(errors="replace").split("\n")
    node, pid, home = (holder + ["", "", ""])[:3]
    # Named only when the pid written there runs: not yet written, or written by an earlier
    # holder (one that opened it read-only could not replace it), names nobody. may_run: a node
    # of another user that /proc hides (hidepid) runs, and is named.
    if pid.isdigit() and may_run(int(pid), None):
        return f"node {node} (pid {pid}, RIG_HOME={home})", home or None
    return "another node (its rig up runs)", None


def check_add_on_log_dir(settings: Settings, only: tuple[str, ...]) -> None:
    """An add-on (``--only flower``, ``--only gateway``: not runs_node) holds no node lock, but
    writes up.log, flower.log, gateway.out into system_log_dir: refused (exit 7) where a node
    of another RIG_HOME holds that folder (hold_log_dir_lock), as a node would be. One of the
    holder's own home (a Flower added to a running node) is that node's and may write there;
    with no node holding it, nothing is refused."""
    import fcntl

    path = settings.rig_log_dir / LOG_DIR_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return  # no node ever ran there
    except OSError as exc:
        raise StackError(_log_dir_lock_refusal(settings, path, exc)) from None
    try:
        try:
            # A shared lock, let go at once: taken only while no node holds it.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            whose, home = _log_dir_holder(fd)
    finally:
        os.close(fd)
    if home is not None and Path(home).resolve() == Path(settings.home).expanduser().resolve():
        return
    parts = " ".join(f"--only {p}" for p in only)
    raise StackError(f"system_log_dir {settings.rig_log_dir} is already the logs of {whose}; `rig up {parts}` "
                     f"of RIG_HOME={settings.home} would write its logs there too: give it a folder of its own "
                     "(RIG_SYSTEM_LOG_DIR=/another/folder), or run it from that node's home")


def hold_node_locks(settings: Settings, only: tuple[str, ...] = ()) -> tuple[int, int]:
    """The locks of a node's rig up (runs_node), in this order: its home's (hold_home_lock),
    then its system_log_dir's (hold_log_dir_lock), so that a second node in one home is told
    that, not about its logs. Refused: neither is held."""
    home = hold_home_lock(settings, only)
    try:
        return home, hold_log_dir_lock(settings)
    except BaseException:
        os.close(home)
        raise


def up_redis_elsewhere(settings: Settings) -> str | None:
    """The Redis the node's running ``rig up`` uses (no password) when it is not
    ``settings.redis_url`` (a `rig down` with another RIG_REDIS_URL), else None (the same one,
    or not recorded: a pid file of an older rig)."""
    try:
        lines = pid_file(settings).read_text().split()
    except OSError:
        return None
    if len(lines) < 2 or lines[1] == without_credentials(settings.redis_url):
        return None
    return lines[1]


def ensure_writable_home(settings: Settings) -> None:
    """The folders ``rig up`` writes under its home (its own logs, its pid and ready files),
    created now, or one line (exit 6) naming the folder and why: a read-only or foreign home
    must not end in a traceback half-way through starting."""
    from rig.errors import ConfigError

    for folder in (settings.rig_log_dir, settings.run_dir):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".rig-write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"rig up cannot write in {folder} ({exc.strerror or exc}); it needs a writable "
                              f"home: set RIG_HOME (now {settings.home}) or home in the config file") from None


def running_pid(settings: Settings) -> int | None:
    """The pid of this node's live ``rig up``, or None."""
    path = pid_file(settings)
    try:
        pid = int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    # Not os.kill(pid, 0): a SIGKILLed rig up that nobody has reaped yet (a zombie) answers it.
    return pid if is_alive(pid, None) else None


class Stack:
    """One node's rig processes, supervised in the foreground."""

    def __init__(self, settings: Settings, options: UpOptions, say: Callable[[str], None] = print):
        self.settings = settings
        self.options = options
        self._print = say
        self.notes: list[str] = []  # warnings a `rig up --daemon` parent says on the terminal
        self._noting = True  # until take_notes(): bring-up's warnings, not those of the run
        self.metrics_url: str | None = None  # set once the endpoint answers
        self.page_url: str | None = None  # rig's web page, same server (rig.web.server)
        self.flower_url: str | None = None  # set once this rig up starts a Flower
        self.gateway_path: Path | None = None  # the gateway socket this rig up serves, once chosen
        self.keys = Keys(settings.key_prefix)
        self.children: list[Child] = []
        self.redis_proc: subprocess.Popen | None = None
        self.backend: GpuBackend | None = None
        self.metrics_server = None
        self._stopping = False
        self._marked_stopped = False  # the stop mark was written before stopping (rig.stop_mark)
        self._registered = False  # this Stack registered the node (it runs cards or control)
        #: This process's identity as owner of the node name (rig.node_claim), once claimed.
        self._owner: str | None = None
        #: The identity the stop mark was written as (rig.stop_mark.confirm_stopped).
        self._stopped_as: str | None = None
        #: Set when another process took the node name while this one ran: the line saying so.
        self.lost_name: str | None = None
        self._client: redis.Redis | None = None
        self._next_beat = 0.0  # monotonic time of the next node heartbeat
        self._next_auth_probe = 0.0  # monotonic time of the next fresh-login probe (rig.authgate)
        self._next_hung_check = 0.0  # monotonic time of the next look for hung workers
        self._next_retire_check = 0.0  # ... and for drained closed cards' workers (retire_drained)
        self._drained_seen: set[str] = set()  # card workers found drained at the last look
        self._usable_cards: set[int] = set()  # registered usable by this rig up: never retired
        self._home_lock: int | None = None  # the RIG_HOME's node lock while held (hold_home_lock)
        self._log_dir_lock: int | None = None  # system_log_dir's node lock while held (hold_log_dir_lock)
        # The private Redis (when this Stack started one): restart attempts after it died.
        self._private_redis = False
        self._redis_failures = 0  # failed restarts in a row
        self._redis_refusing = False  # Redis refused writes at the last hung check (said once)
        self._redis_next_try = 0.0  # monotonic time of the next attempt
        self._redis_last_error = ""  # said once per change
        self._next_data_id_check = 0.0  # monotonic time of the next look at its data id

    def wants(self, component: str) -> bool:
        if self.options.only:
            return component in self.options.only
        if component == "metrics" and self.options.no_metrics:
            return False
        if component == "flower" and self.options.no_flower:
            return False
        if component == "beat" and self.options.no_beat:
            return False
        if component == "gateway" and self.options.no_gateway:
            return False
        return True

    # -- bring-up -------------------------------------------------------------------------
    def up(self) -> None:
        s = self.settings
        absolute_paths(s)  # children run from the run folder: a relative path would move
        for folder in (s.home, s.run_dir, s.job_log_dir, s.rig_log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        is_node = runs_node(self.options.only)
        if is_node:  # before the checks: two rig ups started at once both passed them
            self._home_lock, self._log_dir_lock = hold_node_locks(s, self.options.only)
        else:
            check_add_on_log_dir(s, self.options.only)
        other = running_pid(s)
        if other and other != os.getpid():
            raise StackError(already_up(s.node_name, other, self.options.only))
        others = live_supervisors(s.node_name, s.home)
        if others:
            raise StackError(f"rig is already up on node {s.node_name} (pid {min(others)}, its pid file "
                             f"is gone); `rig down --node {s.node_name}` stops it")
        if is_node and (why := second_node(s)) is not None:
            raise StackError(why)
        if self.wants("cards") and (why := root_node_here(s)) is not None:
            raise StackError(why)
        if self.wants("flower") or self.wants("metrics"):
            flower_credentials(s)  # a login Flower would read otherwise: said before anything starts
        self.stop_leftovers()
        self._ensure_redis()
        if is_node:
            self._claim_name()
        # After the claim: a rig up refused the name never replaces the owner's pid file.
        write_pid_file(s, node=is_node)
        self._check_installation()
        if is_node:
            self._check_data_format()
            self._check_pools()
            self._check_policy()
        if self.wants("control"):
            # The control workers move finished jobs into the archive: a wrong archive_url, a
            # missing psycopg or an unwritable folder is said now (exit 6), not in a worker's log.
            from rig.archive_cluster import check_node_at_up

            # No archive_url set here: the cluster's archive, never a move to this home's SQLite.
            for line in check_node_at_up(self._redis(), self.keys, s):
                self._say_kept(line)  # on the terminal of `rig up --daemon` too, not only in up.log
        for warning in open_doors(s, self.wants):
            self.say(warning)
        from rig.celery_config import celery_variables_note
        from rig.config import shadowed_settings, unknown_users

        for line in [*shadowed_settings(s), *unknown_users(s), celery_variables_note(dict(os.environ))]:
            if line:  # a variable left in the shell beats rig.toml / is left out; a typo in a name: said
                self._say_kept(line)  # on the terminal of `rig up --daemon` too, not only in up.log
        from rig.logspace import never_enough  # here: the one edit of this file for it
        if self.wants("cards") and (small := never_enough(
                {"log_dir": s.job_log_dir, "run_dir": s.run_dir}, s.log_min_free_bytes)):
            self.say(small)
        if self.wants("gateway"):
            # Resolved once, here: every child (and so every job: RIG_GATEWAY_SOCKET) gets it.
            from rig.gateway.paths import node_socket
            from rig.gateway.server import path_problem, reach_problem, socket_in_use

            s.gateway_socket = node_socket(s)
            problem = path_problem(s.gateway_socket)
            if problem:
                raise StackError(f"{problem} (or `rig up --no-gateway`)")
            if os.geteuid() == 0 and (shut := reach_problem(s.gateway_socket)):  # root's serves everyone
                self.say(f"warning: {shut}")
                self.notes.append(f"warning: {shut}")
            if socket_in_use(s.gateway_socket):  # never moved elsewhere in silence: one rule (rig.gateway.paths)
                raise StackError(f"another gateway answers at {s.gateway_socket} (another rig up of this host?); "
                                 "stop it, or set gateway_socket (RIG_GATEWAY_SOCKET) to another path for this "
                                 "node (or `rig up --no-gateway`)")
            self.gateway_path = s.gateway_socket
        env = self._child_env()
        if is_node:
            allowed = self._register_cards()
        else:
            allowed = []
        #: Cards this rig up may place jobs on: their workers are never retired as drained.
        self._usable_cards = set(allowed)
        # -P: never the operator's working directory on sys.path (a folder named rig there).
        celery = safe_python("celery") + ["-A", "workers.app"]
        logs = s.rig_log_dir
        flower = self.wants("flower") and self._flower_port_free()
        # Task events for Flower (rig.celery_config): from the start when this rig up runs one.
        events = ["-E"] if flower else []
        if self.wants("control"):
            self.children.append(Child(
                "control",
                celery + ["worker", "-Q", ",".join(dispatcher_queues()), "-n", control_worker_name(s.node_name),
                          "--pool", "threads", "-c", "4", "-l", "INFO", "-f", str(logs / "control.log"),
                          "--without-gossip", "--without-mingle", *events],
                env, logs / "control.out", role="control"))
        if self.wants("cards"):
            # Also the cards no longer allowed (or gone) that still run jobs (rig.draining).
            for index in cards_to_serve(self._redis(), self.keys, s.node_name, allowed):
                self.children.append(Child(
                    f"card{index}",
                    celery + ["worker", "-Q", card_queue(s.node_name, index), "-n", card_worker_name(s.node_name, index),
                              "--pool", "threads", "-c", str(s.max_task_per_gpu), "-l", "INFO",
                              "-f", str(logs / f"card{index}.log"), "--without-gossip", "--without-mingle",
                              *events],
                    {**env, "RIG_CARD_INDEX": str(index)}, logs / f"card{index}.out", role="card"))
        if self.wants("beat"):
            self.children.append(Child(
                "beat", celery + ["beat", "-l", "INFO", "-f", str(logs / "beat.log")], env, logs / "beat.out",
                role="beat"))
        if flower:
            user, password = flower_credentials(s)
            flower_db(s).parent.mkdir(mode=0o700, exist_ok=True)  # its history shows every user's jobs
            flower_env, ignored = flower_environment(env)
            if is_sentinel(s.redis_url):  # Flower's Broker page asks only the first sentinel
                flower_env["RIG_REDIS_URL"] = sentinel_url.live_first(s.redis_url)
            if ignored:
                self.say(f"warning: flower: ignoring {', '.join(ignored)} from the environment (rig sets "
                                "Flower's options; docs/FLOWER.md)")
            self.flower_url = http_url(s.flower_address, s.flower_port)
            self.children.append(Child(
                "flower",
                celery + ["flower", f"--address={s.flower_address}", f"--port={s.flower_port}",
                          *flower_history_options(s), f"--log_file_prefix={logs / 'flower.log'}"],
                # Credentials travel in the environment, not on the command line (ps shows argv).
                {**flower_env, "FLOWER_BASIC_AUTH": f"{user}:{password}"}, logs / "flower.out", role="flower"))
        if self.wants("gateway"):
            from rig.gateway.paths import write_supervisor_mark

            write_supervisor_mark(s.gateway_socket)  # clients wait for it while it (re)starts
            self.children.append(Child(
                "gateway", safe_python("rig.gateway.server"), env, logs / "gateway.out", role="gateway"))
            self.say(f"gateway: {s.gateway_socket} (users without Redis' password use rig through it)")
        for child in self.children:
            self._spawn(child)
        if self.wants("metrics") and s.metrics_port:
            self._serve_web()

    def _flower_port_free(self) -> bool:
        """Is Flower's port free? A port something answers on (another node's Flower, any
        server) would leave this Flower exiting in a restart loop, seen only in its log: said in
        one line instead, and this Flower is not started (nor its URL printed)."""
        from rig.metrics import answers

        s = self.settings
        if not answers(s.flower_address, s.flower_port):
            return True
        self.say(f"warning: flower: not started, something already listens on {s.flower_address}:"
                        f"{s.flower_port} (another Flower?); set RIG_FLOWER_PORT (flower_port) to a free port")
        return False

    def _serve_web(self) -> None:
        """The node's HTTP endpoint: /metrics (no login) and the web page (the admin login)."""
        from rig.client import Client
        from rig.metrics import answers
        from rig.web.server import start_web_server

        s = self.settings
        try:
            self.metrics_server = start_web_server(Client(s), s.metrics_address, s.metrics_port,
                                                   flower_credentials(s))
        except OSError as exc:  # the port taken, or the address not this machine's
            # A warning: on the terminal of `rig up --daemon` too (README: one line at rig up).
            self.say(f"warning: metrics and web page: not served, cannot listen on {s.metrics_address}:"
                            f"{s.metrics_port} ({exc}); set RIG_METRICS_ADDRESS / RIG_METRICS_PORT (metrics_port = 0: "
                            "none)")
            return
        port = self.metrics_server.server_port
        if answers(s.metrics_address, port):  # the URLs are printed only once it answers
            self.metrics_url = http_url(s.metrics_address, port, "/metrics")
            self.page_url = http_url(s.metrics_address, port, "/")
        else:
            self.say(f"metrics and web page: not answering at {s.metrics_address}:{port}; see {s.rig_log_dir}")

    def _ensure_redis(self) -> None:
        """Use the Redis at the configured URL if one answers (with rig's credentials); else
        start a private one on loopback, with a password: the configured one, else the one
        generated into $RIG_HOME/redis.password (mode 0600) and reused at every start. A Redis
        that answers but refuses the credentials is an error (RedisAuthFailed, exit 5)."""
        url = self.settings.redis_url
        shown = strip_password(url)
        if is_sentinel(url) and (wrong := sentinel_url.parse(url).not_sentinels()):
            # Asked only once the sentinels before it fail, i.e. in a fail-over: the node would
            # then read a wrong-kind error and stop (a tester's node did). Refused now instead.
            from rig.errors import ConfigError

            raise ConfigError(f"{wrong[0]}; rig up refuses it: in a fail-over rig would ask it for the master "
                              "and stop")
        if probe(url):
            self.say(f"redis: using the one at {shown}")
            for line in redis_warnings(url):
                self.say(f"warning: {line}")
            return
        # Redis unreachable: exit 5, as from every command (StackError's 7 said "bring-up failed"),
        # also for `rig up --only` without redis (it said 7, and not which sentinel was wrong).
        if is_sentinel(url):  # which of the sentinels, their password or the master's name is wrong
            raise RedisUnavailable.said(
                url, f"no Redis master behind {shown}: {sentinel_url.parse(url).diagnose(client_options())[0]}")
        if not is_local(url) or (not self.wants("redis") and self.options.only):
            raise RedisUnavailable.said(url, f"no Redis answers at {shown}; start it, or point RIG_REDIS_URL at one")
        if url_password(url) is None:
            # No password configured (else the URL would carry it): generate or reuse the
            # home one, which resolve_auth then finds like any client on this machine will.
            ensure_password_file(home_password_file(self.settings.home))
            url = resolve_auth(url, home=self.settings.home).url
            # Every child gets this URL (RIG_REDIS_URL), so all of them use the password.
            self.settings.redis_url = url
        data = private_redis_dir(self.settings.home)
        self.redis_proc = self._start_private_redis()
        self._private_redis = True
        self.say(f"redis: started a private one at {shown} (AOF in {data}, password from "
                 f"{password_source(url)}, pid {self.redis_proc.pid})")

    def _start_private_redis(self) -> subprocess.Popen:
        """Start the private Redis on $RIG_HOME/redis (recorded there as this process's, so a
        later rig up or rig down finds it if this one crashes: rig.supervision)."""
        s = self.settings
        return start_private_redis(s.redis_url, private_redis_dir(s.home), s.rig_log_dir / "redis.log")

    # -- what a crashed rig up left --------------------------------------------------------
    def stop_leftovers(self) -> None:
        """Stop the processes a dead ``rig up`` of this node left (workers whose supervisor was
        SIGKILLed and did not follow it, its private Redis), telling the operator in one line.
        Their running jobs keep running: the card workers started next adopt them."""
        s = self.settings
        left = leftovers(s.node_name, s.home)
        if not left:
            return
        dead = sorted({p.supervisor for p in left if p.supervisor is not None})
        line = (f"found {len(left)} process(es) left by a rig up of node {s.node_name} that is gone "
                f"(pid {', '.join(map(str, dead)) or '?'}): {describe(left)}; stopping them "
                "(running jobs keep running and are adopted)")
        self._say_kept(line)  # on the terminal of `rig up --daemon` too, not only in up.log
        stuck = stop_processes(left, STOP_TIMEOUT_S, say=self.say)
        if stuck:
            raise StackError(f"could not stop {describe(stuck)} left by an earlier rig up of node "
                             f"{s.node_name}; stop them (`kill -9 PID`), then `rig up` again")

    def _check_installation(self) -> None:
        """Refuse to start over a Redis that is not the installation this node joined while
        jobs of another installation still run here (rig.installation): nothing is changed,
        the jobs run on, and the line says what to do. Otherwise join it."""
        from workers.health import node_identity

        s = self.settings
        found = node_identity(s, self._redis())
        verdict = found.verdict
        if verdict.mismatch:
            if found.others:
                raise StackError(
                    f"{verdict.explain(s.node_name)}, and {len(found.jobs)} of its jobs still run here "
                    f"({', '.join(map(str, found.jobs))}); nothing was changed: if RIG_REDIS_URL / --redis "
                    "is wrong, start rig with the right one; else `rig recover --stop` stops them and joins "
                    "this Redis (docs/RELIABILITY.md)")
            if found.running:
                self.say(f"{verdict.explain(s.node_name)}; the {len(found.running)} job(s) running here were "
                         "started from this one: joining it again")
            else:
                self.say(f"warning: {verdict.explain(s.node_name)}; no job of it runs here: joining this Redis "
                         "as a new installation")
        found.installation.join()

    def _check_data_format(self) -> None:
        """Refuse to run beside nodes of an older or newer rig on one Redis (rig.data_format):
        their records would be misread without a word. Nothing is changed when refused."""
        from rig.data_format import refusal

        line = refusal(self._redis(), self.keys, self.settings.node_name,
                       NodeRegistry(self._redis(), self.keys).read())
        if line:
            raise StackError(line)

    def _check_pools(self) -> None:
        """Refuse to run beside a node up with other [pools] (rig.pools.disagreement): the
        leading dispatcher places by its own node's pools. Nothing is changed when refused."""
        from rig.pools import disagreement

        line = disagreement(self.settings.node_name, self.settings.pools,
                            NodeRegistry(self._redis(), self.keys).read())
        if line:
            raise StackError(line)

    def _check_policy(self) -> None:
        """Warn, in one line, when a node up applies other rules to users' jobs (rig.policy):
        the leading dispatcher places by its own, each gateway lets its own admins kill."""
        from rig.policy import differences

        line = differences(self.settings.node_name, self.settings, NodeRegistry(self._redis(), self.keys).read())
        if line:
            self.say(line)

    def _claim_name(self) -> None:
        """Own the node name before anything of the node is written (rig.node_claim): a live
        rig up of this name elsewhere (another host, RIG_HOME or installation) refuses this one
        with one line naming it, and nothing is changed."""
        s = self.settings
        ident = identity(s.home, s.run_dir)
        other = claim(self._redis(), self.keys, s.node_name, ident, s.health.timeout)
        if other is not None:
            raise NodeInUse(refused_line(
                s.node_name, other, f"`rig up --node {s.node_name}` from RIG_HOME={s.home}",
                f"give this server its own name (`rig up --node NAME` / RIG_NODE_NAME), or stop that one "
                f"first ({there(s.node_name, other, 'down')}); a crashed owner's claim expires "
                f"{s.health.timeout:.0f} s after it died"))
        self._owner = ident

    def _register_cards(self) -> list[int]:
        s = self.settings
        backend, notice = detect_backend(s.fake_gpus, node=s.node_name)
        self.backend = backend
        if notice:
            self.say(f"gpus: {notice}")
        client = connect(s.redis_url)
        # The pools check and the registration that records this node's pools, one rig up at a
        # time: two nodes with different pools started at once both passed the first check.
        lock = self._redis().lock(self.keys.join_lock, timeout=JOIN_LOCK_S, blocking_timeout=JOIN_LOCK_S)
        if not lock.acquire():
            raise StackError(f"another rig up has been registering its node in this Redis for {JOIN_LOCK_S:.0f} s "
                             "(it holds the join lock); try `rig up` again")
        try:
            self._check_pools()
            allowed = register_node(s, client, backend, self.say)
        finally:
            try:
                lock.release()
            except redis.exceptions.LockError:  # it expired (a very slow registration): nothing to give back
                pass
        self._registered = True
        from rig.pools import Pools  # a pool member naming a card this node lacks: said, once

        if s.pools and (line := Pools.from_config(s.pools).unmatched(s.node_name, range(backend.count()))):
            self.say(line)
        return allowed

    def say(self, line: str) -> None:
        """Say ``line``; a warning said while rig comes up is also kept for a `rig up --daemon`
        parent to repeat on the terminal (rig.registration.read_notes), since this process's
        output goes to up.log (a Redis that evicts or keeps no copy on disk, Flower or the web
        page beyond loopback, a log folder too small for any job were said in up.log alone)."""
        self._print(line)
        if self._noting and line.startswith("warning:") and line not in self.notes:
            self.notes.append(line)

    def _say_kept(self, line: str) -> None:
        """Say ``line`` and keep it for `rig up --daemon`'s terminal, warning or not."""
        self.say(line)
        if line not in self.notes:
            self.notes.append(line)

    def take_notes(self) -> list[str]:
        """What `rig up --daemon`'s terminal is to repeat; later warnings go to up.log only."""
        self._noting = False
        return self.notes

    def _child_env(self) -> dict[str, str]:
        """The children's environment: the settings this process resolved (from flags, env
        and file) exported as RIG_* variables, so every child sees exactly the same ones; none
        of Celery's own variables, which would beat rig's configuration (rig up says so)."""
        from rig.celery_config import celery_variables

        env = dict(os.environ)
        for name in celery_variables(env):
            del env[name]
        env.update(self.options.env_overrides)
        env.update(settings_env(self.settings))
        if self._owner is not None:
            env[OWNER_ENV] = self._owner  # the workers renew and check the claim as this process
        if not self.settings.fake_gpus:
            # Fake cards chosen by detection must be the same ones in every child.
            backend = self.backend or detect_backend(None, node=self.settings.node_name)[0]
            if backend.kind == "fake":
                env["RIG_FAKE_GPUS"] = backend.spec  # type: ignore[attr-defined]
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, child: Child) -> None:
        """Start ``child`` marked as this node's and this process's (rig.supervision), from
        the run folder (rig's own: celery imports the app with the cwd on sys.path)."""
        s = self.settings
        child.log_file.parent.mkdir(parents=True, exist_ok=True)
        limit = rig_pool_limit(child.role or child.name, s)
        if limit is not None:  # rig's own connections in that process, all clients together
            child.env = {**child.env, POOL_LIMIT_ENV: str(limit)}
        # PR_SET_PDEATHSIG follows the forking thread: only the main thread lives as long as
        # this process (a test harness restarts children from a helper thread).
        marks = child_marks(s.node_name, s.home, child.role or child.name,
                            main_thread=threading.current_thread() is threading.main_thread())
        out = open(child.log_file, "ab")
        child.proc = subprocess.Popen(child.argv, env={**child.env, **marks}, stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                      cwd=s.run_dir)
        out.close()
        child.started_at = time.monotonic()
        child.beat_seen = False

    # -- supervision ----------------------------------------------------------------------
    def supervise_once(self) -> None:
        """One round of what ``rig up`` does while it runs: restart dead children, and
        refresh the node heartbeat."""
        self.poll_children()
        self.check_hung()
        self.retire_drained()
        self.beat_node()

    def retire_drained(self) -> None:
        """Stop, for good, the worker of a card that takes no new jobs (left gpu_whitelist, gone
        from the node) once its last job has ended (rig.draining.drained, seen twice, a
        telemetry interval apart, so a job just concluding is not cut short): it was kept only
        to supervise those jobs. Its child leaves the list, so poll_children never restarts it."""
        now = time.monotonic()
        if self._stopping or now < self._next_retire_check:
            return
        self._next_retire_check = now + self.settings.telemetry_interval
        s = self.settings
        for child in [c for c in self.children if c.role == "card" and c.proc is not None]:
            index = int(child.env.get("RIG_CARD_INDEX", "-1"))
            if index in self._usable_cards:
                continue  # configured usable: whatever Redis says now (it may have lost its data)
            try:
                idle = index >= 0 and drained(self._redis(), self.keys, s.node_name, index)
            except redis.RedisError:
                return  # judged again once Redis answers
            if not idle:
                self._drained_seen.discard(child.name)
                continue
            if child.name not in self._drained_seen:
                self._drained_seen.add(child.name)
                continue
            self._drained_seen.discard(child.name)
            _signal_group(child.proc, signal.SIGTERM)  # a warm shutdown; no job of it runs
            try:
                child.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait(timeout=5)
            self.children.remove(child)
            try:
                worker_retired(self._redis(), self.keys, s.node_name, index)
            except redis.RedisError:
                pass  # its reading stays until the next rig up registers the node's cards anew
            self.say(f"{child.name}: its card takes no new jobs and its last job ended: worker stopped")

    def check_hung(self) -> None:
        """A card or control worker whose process lives but has not heartbeated for
        health.timeout s (stopped with SIGSTOP, deadlocked, swapped out for good) is killed
        with SIGKILL, so poll_children starts another: a hung worker must not hold its card or
        the dispatcher for ever. Its running jobs live in their own sessions and are adopted by
        the next worker. Nothing is judged while Redis cannot be read (a Redis outage silences
        every heartbeat at once)."""
        now = time.monotonic()
        if self._stopping or now < self._next_hung_check:
            return
        self._next_hung_check = now + self.settings.telemetry_interval
        s = self.settings
        workers = [c for c in self.children if c.proc is not None and c.proc.poll() is None
                   and (c.name == "control" or c.name.startswith("card"))]
        if not workers:
            return
        names = [control_worker_name(s.node_name) if c.name == "control"
                 else card_worker_name(s.node_name, c.name[len("card"):]) for c in workers]
        try:
            beats = self._redis().mget([self.keys.worker(n) for n in names])
        except redis.RedisError:
            return
        notice = redis_refusal_notice(self._redis())  # full, read-only, MISCONF; None: takes writes
        refusing = notice is not None
        if refusing != self._redis_refusing:  # one line when it starts, one when it ends
            self._redis_refusing = refusing
            self.say(f"warning: {notice}; rig's workers wait and retry" if refusing
                     else "Redis takes writes again")
        if refusing:  # full or read-only: every heartbeat is refused
            for child in workers:
                child.silent_since = None  # silence counts from when Redis takes writes again
            return
        for child, _name, raw in zip(workers, names, beats, strict=True):
            pid = beat_pid(raw)
            assert child.proc is not None
            child.beat_seen = child.beat_seen or pid == child.proc.pid
            grace = hung_after(s.health.timeout, beat_seen=child.beat_seen)
            if pid == child.proc.pid or now - child.started_at < grace:
                child.silent_since = None
                continue
            if child.silent_since is None:
                child.silent_since = now
                continue
            if now - child.silent_since < s.health.timeout:
                continue
            self.say(f"{child.name} (pid {child.proc.pid}) has not heartbeated for {s.health.timeout:.0f} s "
                     f"though its process lives (hung?); killing it and starting another (its running jobs "
                     "keep running and are adopted)")
            child.silent_since = None
            try:
                os.kill(child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def beat_node(self) -> None:
        """Renew the claim on the node name (every telemetry_interval s, expiring after
        health.timeout s) and refresh this node's heartbeat while any of its workers runs: a
        node whose workers are all gone must look gone even if this process lives on. A claim
        found taken by another process (this one was cut off for longer than health.timeout)
        ends this rig up: lost_name says so."""
        now = time.monotonic()
        if not self._registered or self._stopping or now < self._next_beat:
            return
        self._next_beat = now + self.settings.telemetry_interval
        if not self._renew_name():
            return
        workers = [c for c in self.children if c.name == "control" or c.name.startswith("card")]
        if not any(c.proc is not None and c.proc.poll() is None for c in workers):
            return
        try:
            NodeRegistry(self._redis(), self.keys).beat(self.settings.node_name,
                                                        ttl=self.settings.health.timeout, source="rig up",
                                                        max_skew=self.settings.max_clock_skew, owner=self._owner)
        except redis.RedisError as exc:
            log.debug("node heartbeat skipped: %s", exc)
        self._watch_auth()

    def _watch_auth(self) -> None:
        """Every PROBE_EVERY_S, try a NEW login (rig.authgate): logged-in connections keep
        working after a password change, so only a new one tells; record it on the node."""
        now = time.monotonic()
        if now < self._next_auth_probe:
            return
        self._next_auth_probe = now + authgate.PROBE_EVERY_S
        try:
            if authgate.probe(self.settings.redis_url) is None:
                return  # unreachable: proves nothing about the password
            authgate.report(self._redis(), self.keys.node(self.settings.node_name), authgate.refused_since())
        except Exception as exc:  # noqa: BLE001 - a probe must never stop the node
            log.debug("login probe failed: %s", exc)

    def _renew_name(self) -> bool:
        """Renew the claim; False (and lost_name set, said once) when another process holds the
        name now. A Redis that cannot be reached proves nothing: True."""
        if self._owner is None or self.lost_name is not None:
            return self.lost_name is None
        s = self.settings
        try:
            other = claim(self._redis(), self.keys, s.node_name, self._owner, s.health.timeout)
        except redis.RedisError as exc:
            log.debug("node name claim not renewed: %s", exc)
            return True
        if other is None:
            return True
        self.lost_name = (f"node name {s.node_name!r} was taken by another rig up ({other.describe()}) while this one "
                          f"could not renew it; this rig up stops without marking the node stopped (the node is "
                          f"that one now); give this server its own name (`rig up --node NAME`)")
        self.say(self.lost_name)
        return False

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = connect(self.settings.redis_url)
        return self._client

    def wait_ready(self, timeout: float = 90.0) -> list[str]:
        """Wait until every worker rig started has a heartbeat and the gateway it started
        answers on its socket; returns the ones missing (worker names, and GATEWAY for the
        gateway). Not while Redis refuses writes (full, read-only): no heartbeat can arrive
        then, and the caller says why (rig.redis_writes) instead of making the operator wait
        ``timeout``."""
        from rig.redis_writes import refuses_writes

        client = connect(self.settings.redis_url)
        deadline = time.monotonic() + timeout
        missing = self._worker_names()
        checked_refusal = 0.0
        while time.monotonic() < deadline and not self._stopping:
            # Read each round: supervise_once may retire a card's worker (its card left the node
            # or the whitelist and its last job ended), which then never heartbeats again.
            want = self._worker_names()
            try:
                values = client.mget([self.keys.worker(w) for w in want]) if want else []
            except redis.RedisError:
                values = [None] * len(want)
            missing = [w for w, v in zip(want, values, strict=True) if v is None]
            if not self.gateway_answers():
                missing.append(GATEWAY)
            if not missing:
                return []
            if time.monotonic() - checked_refusal >= 1.0:
                checked_refusal = time.monotonic()
                if refuses_writes(client):
                    return missing
            self.supervise_once()
            time.sleep(0.2)
        return missing

    def gateway_answers(self) -> bool:
        """True when this rig up started no gateway, or its gateway answers on its socket."""
        if self.gateway_path is None or not any(c.role == GATEWAY for c in self.children):
            return True
        from rig.gateway.server import socket_in_use

        return socket_in_use(self.gateway_path)

    def _worker_names(self) -> list[str]:
        """The Celery names (``-n``) of the workers this stack runs now."""
        return [c.argv[c.argv.index("-n") + 1] for c in self.children if "-n" in c.argv]

    def poll_children(self) -> None:
        """Restart children that died (backing off when they keep dying)."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None or self._stopping:
                continue
            code = child.proc.poll()
            if code is None:
                continue
            if child.next_start == 0.0:
                lived = now - child.started_at
                delay = 1.0 if lived > 30 else min(30.0, 2.0 ** min(child.restarts, 5))
                child.next_start = now + delay
                log.warning("%s exited with code %s; restarting in %.0f s (see %s)",
                            child.name, code, delay, child.log_file)
                if code == EXIT_LOCK_HELD:
                    self.say(f"{child.name}: another process of node {self.settings.node_name} holds it "
                             f"(see {child.log_file}); trying again in {delay:.0f} s")
                else:
                    self.say(f"{child.name} exited (code {code}); restarting in {delay:.0f} s")
            elif now >= child.next_start:
                child.restarts += 1
                child.next_start = 0.0
                self._spawn(child)
        if self._private_redis and not self._stopping:
            self.keep_redis_up(now)

    def keep_redis_up(self, now: float) -> None:
        """Restart the private Redis if it died. A failed restart is retried after 1, 2, 4 ...
        s (at most REDIS_RETRY_MAX_S), said once per distinct reason, until one succeeds; the
        node never stops over it (workers reconnect once it is back)."""
        proc = self.redis_proc
        if proc is not None:
            if proc.poll() is None:
                self._keep_data_id(now)
                return
            self.redis_proc = None
            self._redis_failures, self._redis_next_try, self._redis_last_error = 0, now, ""
            self.say(f"the private Redis exited (code {proc.returncode}); restarting it")
        if now < self._redis_next_try:
            return
        try:
            self.redis_proc = self._start_private_redis()
        except (StackError, RedisAuthFailed, OSError) as exc:
            self._redis_failures += 1
            delay = min(REDIS_RETRY_MAX_S, REDIS_RETRY_FIRST_S * 2 ** (self._redis_failures - 1))
            self._redis_next_try = time.monotonic() + delay
            reason = str(exc).removeprefix("rig: error: ")
            log.warning("private Redis restart %d failed: %s; next try in %.0f s",
                        self._redis_failures, reason, delay)
            if reason != self._redis_last_error:
                self._redis_last_error = reason
                self.say(f"the private Redis did not restart: {reason}; rig keeps trying (every "
                         f"{REDIS_RETRY_FIRST_S:.0f} s, backing off to {REDIS_RETRY_MAX_S:.0f} s)")
            return
        if self._redis_failures:
            self.say(f"the private Redis is back (pid {self.redis_proc.pid}) after "
                     f"{self._redis_failures} failed restart(s)")
        else:
            self.say(f"the private Redis is back (pid {self.redis_proc.pid})")
        self._redis_failures, self._redis_last_error = 0, ""

    def _keep_data_id(self, now: float) -> None:
        """Every few seconds while the private Redis runs: a data id FLUSHALL deleted is
        recorded again (rig.redis_server.keep_data_id), said in one line."""
        if now < self._next_data_id_check:
            return
        self._next_data_id_check = now + DATA_ID_CHECK_S
        line = keep_data_id(self.settings.redis_url, private_redis_dir(self.settings.home))
        if line:
            self.say(line)

    def run_until_signalled(self) -> None:
        stop = {"flag": False}

        def _handler(signum: int, _frame: object) -> None:
            stop["flag"] = True

        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGHUP, _handler)
        while self.lost_name is None:
            if stop["flag"]:
                if self.mark_stopped_first():
                    break
                stop["flag"] = False  # refused: the node stays up (rig.stop_mark)
            self.supervise_once()
            time.sleep(0.25)

    def mark_stopped_first(self) -> bool:
        """Before stopping anything, mark the node stopped (rig.stop_mark), retrying while
        Redis refuses writes for up to STOP_TIMEOUT_S while the node keeps being supervised.
        False when it still cannot: the node stays up, and `rig down` is told why."""
        from rig.stop_mark import MarkRefused, mark_stopped_retrying, refusal_path, write_refusal

        if not (self._registered and self.wants("cards")) or self.lost_name is not None:
            return True
        node = self.settings.node_name
        refusal_path(self.settings.run_dir, node).unlink(missing_ok=True)
        try:
            if not mark_stopped_retrying(NodeRegistry(self._redis(), self.keys), node, owner=self._owner,
                                         timeout=STOP_TIMEOUT_S, between=self.supervise_once):
                log.warning("node %s not marked stopped: another process owns the name now", node)
            self._stopped_as = self._owner  # its workers may renew the claim until they stop
            self._owner = None
            self._marked_stopped = True
            return True
        except MarkRefused as refused:
            log.warning("%s", refused.line)
            write_refusal(self.settings.run_dir, node, refused.line)
            self.say(refused.line)
            return False
        except redis.RedisError as exc:
            log.warning("could not mark node %s stopped: %s", node, exc)
            return True

    def down(self) -> None:
        """Stop every child rig started, then the private Redis. Jobs keep running."""
        self._stopping = True
        if self.gateway_path is not None:  # first: a client no longer waits for a gateway that stops
            from rig.gateway.paths import remove_supervisor_mark

            remove_supervisor_mark(self.gateway_path)
        if not self._marked_stopped and self._registered and self.wants("cards") and self.lost_name is None:
            # Marked before its workers stop, as rig down does (mark_stopped_first): a stopped
            # worker's heartbeat is gone at once, and the node's own health pass, still running,
            # takes it for dead unless the node already says stopped (workers.health).
            # On purpose: the other nodes leave this node's running jobs alone (they keep
            # running and are adopted when it comes back) and place nothing on its cards.
            # Only as the name's owner, which it gives up in the same step.
            try:
                if not NodeRegistry(self._redis(), self.keys).mark_stopped(self.settings.node_name, owner=self._owner):
                    log.warning("node %s not marked stopped: another process owns the name now",
                                self.settings.node_name)
                self._stopped_as, self._owner, self._marked_stopped = self._owner, None, True
            except redis.RedisError as exc:
                log.warning("could not mark node %s stopped: %s", self.settings.node_name, exc)
        live = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for child in live:
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in live:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", child.name, STOP_TIMEOUT_S)
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait(timeout=5)
        if self._marked_stopped:
            from rig.stop_mark import confirm_stopped

            confirm_stopped(NodeRegistry(self._redis(), self.keys), self.settings.node_name, self._stopped_as)
        if self._owner is not None and self.lost_name is None:
            try:
                release(self._redis(), self.keys, self.settings.node_name, self._owner)
            except redis.RedisError as exc:
                log.warning("could not give up the name of node %s (it expires by itself): %s",
                            self.settings.node_name, exc)
        self._owner = None
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.redis_proc.terminate()
            try:
                self.redis_proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.redis_proc.kill()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        if self.backend is not None:
            self.backend.close()
        try:
            path = pid_file(self.settings)
            if path.read_text().split()[0] == str(os.getpid()):
                path.unlink()
        except (FileNotFoundError, IndexError):
            pass
        self.release_home()  # last: the home is this node's until everything stopped

    def release_home(self) -> None:
        """Give up the RIG_HOME's and system_log_dir's node locks (hold_home_lock,
        hold_log_dir_lock), as this process's death would."""
        for held in (self._home_lock, self._log_dir_lock):
            if held is not None:
                os.close(held)
        self._home_lock = self._log_dir_lock = None

    def started_anything(self) -> bool:
        """Did up() start a process or register the node (so down() has something to stop)?"""
        return (any(c.proc is not None for c in self.children) or self.redis_proc is not None
                or self._registered)

    def addresses(self) -> list[str]:
        """Where to look, for the terminal: Flower's URL, rig's web page and where their login
        is, and the /metrics URL (no login: loopback unless metrics_address opens it). Only what
        this `rig up` serves and what answers."""
        s = self.settings
        out = []
        if self.gateway_path is not None:  # which socket: the host's, or this home's (rig.gateway.paths)
            from rig.gateway.server import reach_problem, socket_in_use

            if socket_in_use(self.gateway_path) and os.geteuid() == 0 and reach_problem(self.gateway_path):
                out.append(f"gateway: {self.gateway_path}, which other users cannot reach (the warning above says why)")
            elif socket_in_use(self.gateway_path):
                out.append(f"gateway: {self.gateway_path} (users without the Redis password and jobs reach rig "
                           "there: RIG_GATEWAY_SOCKET)")
            else:
                # Said after wait_ready gave up on it (or stopped waiting: Redis refuses writes).
                out.append(f"gateway: {self.gateway_path}, not answering; see {s.rig_log_dir / 'gateway.out'}")
        if self.flower_url:
            out.append(f"flower: {self.flower_url} (an admin login: {login_place(s)})")
        if self.page_url:
            out.append(f"web page: {self.page_url} (the same admin login as Flower: {login_place(s)})")
        if self.metrics_url:
            out.append(f"metrics: {self.metrics_url} (no login)")
        elif self.options.no_metrics:
            out.append("web page and /metrics: off (rig up --no-metrics)")
        elif self.wants("metrics") and not s.metrics_port:
            out.append("web page and /metrics: off (metrics_port = 0; RIG_METRICS_PORT sets one)")
        return out

    def describe(self) -> str:
        lines = [f"{c.name:<8} pid {c.proc.pid if c.proc else '-':<8} log {c.log_file}" for c in self.children]
        return "\n".join(lines)


def absolute_paths(settings: Settings) -> None:
    """Make the settings' folders absolute (in place), as seen from where rig up was typed:
    children get them as RIG_* variables and run elsewhere (the run folder)."""
    settings.home = settings.home.expanduser().resolve()
    for name in ("log_dir", "system_log_dir", "config_file"):
        value = getattr(settings, name, None)
        if value is not None:
            setattr(settings, name, Path(value).expanduser().resolve())


def settings_env(settings: Settings) -> dict[str, str]:
    """Settings as RIG_* environment variables (nested ones with ``__``)."""
    env: dict[str, str] = {}
    # The Redis password travels inside RIG_REDIS_URL (resolved); redis_password would only
    # export its mask.
    for key, value in settings.model_dump(exclude={"config_file", "redis_password"}).items():
        if value is None:
            continue
        if isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
            env[f"RIG_{key.upper()}"] = json.dumps(value)  # e.g. templates: one JSON document
        elif isinstance(value, dict):
            for sub, subvalue in value.items():
                env[f"RIG_{key.upper()}__{sub.upper()}"] = str(subvalue)
        elif isinstance(value, list):
            env[f"RIG_{key.upper()}"] = json.dumps(value)
        else:
            env[f"RIG_{key.upper()}"] = str(value)
    if settings.config_file:
        env["RIG_CONFIG"] = str(settings.config_file)
    env.update(handed_source(settings.redis_url))  # where the password inside RIG_REDIS_URL came from
    return env


def redis_warnings(url: str) -> list[str]:
    """What `rig up` warns about the Redis it uses at ``url``, in the foreground and on the
    terminal of `rig up --daemon` alike: no password; full, an evicting policy, no persistence
    (rig.redis_writes); under Sentinel, a setup that would not fail over in time (one sentinel
    listed, no live replica, sentinels slower than rig waits: rig.sentinel_url)."""
    shown = strip_password(url)
    lines = []
    if url_password(url) is None:
        lines.append(f"the Redis at {shown} takes clients without a password: whoever can reach it can run "
                     "commands as this user through rig; set requirepass (docs/SECURITY.md)")
    lines += redis_notices_at(url)
    if is_sentinel(url):
        lines += sentinel_url.parse(url).notices(FAILOVER_WINDOW_S, client_options())
    return lines


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class DownReport:
    """What ``stop_node`` stopped."""

    supervisors: list[int] = field(default_factory=list)  # live rig up processes (SIGTERM)
    leftovers: str = ""  # processes whose rig up was gone ("card0 123, redis 99"), or ""
    running_jobs: list[int] = field(default_factory=list)  # ids of this node's jobs still running after it


def running_jobs_line(ids: list[int]) -> str:
    """What `rig down` says of the jobs of the node it stopped that still run (rig down never
    stops a job): without it, "rig stopped" read as if everything had."""
    listed = first_ids(ids)
    return (f"{len(ids)} job(s) of this node keep running ({listed}): stopping rig never stops jobs; "
            "the next `rig up` adopts them and records how they ended")


def stop_node(settings: Settings, timeout: float = 60.0,
              say: Callable[[str], None] | None = None) -> DownReport:
    """Stop every rig process of this node: its live ``rig up`` (the one in the pid file, and
    any other whose children serve this node and home), which stops its own children, then
    whatever a dead ``rig up`` left (rig.supervision). Jobs keep running."""
    report = DownReport()
    pids = set(live_supervisors(settings.node_name, settings.home))
    pid = running_pid(settings)
    if pid is not None:
        pids.add(pid)
    refusal_path(settings.run_dir, settings.node_name).unlink(missing_ok=True)  # a stale answer
    for pid in sorted(pids):
        try:
            os.kill(pid, signal.SIGTERM)
            report.supervisors.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            raise PermissionDenied(f"rig up of node {settings.node_name} (pid {pid}) runs as {_owner(pid)}: "
                                   "run rig down as that user or as root") from None
    deadline = time.monotonic() + timeout
    # rig up marks itself stopped in its own Redis: only that one's outage makes it wait.
    elsewhere = up_redis_elsewhere(settings)
    if report.supervisors and say is not None and elsewhere is None:
        from rig.redis_up import RedisUp

        down = RedisUp(settings.redis_url).down()
        if down:  # said now, not only after the whole wait
            say(f"{down}: rig up stops once it can mark node {settings.node_name} stopped there; waiting up to "
                f"{timeout:.0f} s (do not kill it)")
    for pid in report.supervisors:
        while is_alive(pid, None):
            refused = read_refusal(settings.run_dir, settings.node_name, pid)
            if refused:
                refusal_path(settings.run_dir, settings.node_name).unlink(missing_ok=True)
                raise RedisRefusesWrites(refused, settings.redis_url)
            if time.monotonic() >= deadline:
                if is_stopped(pid):  # a plain kill does nothing to it: say what does
                    raise StackError(f"rig up (pid {pid}) is stopped (SIGSTOP) and cannot stop itself; "
                                     f"`kill -CONT {pid}` (it then stops), or `kill -9 {pid}` and `rig down` again")
                raise _not_stopped(settings, pid, timeout, elsewhere)
            time.sleep(0.1)
    left = leftovers(settings.node_name, settings.home)
    if left:
        report.leftovers = describe(left)
        stuck = stop_processes(left, min(STOP_TIMEOUT_S, timeout), say=say)
        if stuck:
            raise StackError(f"could not stop {describe(stuck)} of node {settings.node_name}; "
                             "`kill -9 PID` them")
    report.running_jobs = jobs_left_running(settings)
    return report


def jobs_left_running(settings: Settings) -> list[int]:
    """Ids of the jobs of this node and home whose processes run on this machine (after a stop:
    those it left running, as it always does)."""
    from workers.health import node_job_processes

    return sorted({p.job_id for p in node_job_processes(
        settings.key_prefix, settings.node_name, log_dir=settings.job_log_dir).values()})


def _not_stopped(settings: Settings, pid: int, timeout: float, elsewhere: str | None = None) -> RigError:
    """Why ``rig up`` (pid) is still running after ``timeout`` s, and what to do. While Redis
    does not answer it cannot mark the node stopped and waits for it (on purpose): a kill would
    get its running jobs declared lost and maybe run twice, so that case never advises one.
    ``elsewhere``: the Redis that rig up uses when it is not ``settings.redis_url``
    (up_redis_elsewhere): then this Redis' state says nothing about it."""
    from rig.redis_up import RedisUp

    if elsewhere is not None:
        return StackError(f"rig up (pid {pid}) did not stop within {timeout:.0f} s (it uses Redis at {elsewhere}, "
                          f"not {strip_password(settings.redis_url)}); if that Redis does not answer it waits for "
                          f"it, do not kill it then; else `kill {pid}`, then `rig down` again")
    down = RedisUp(settings.redis_url).down()
    if down:
        return RedisUnavailable.said(
            settings.redis_url,
            f"rig up (pid {pid}) is still stopping after {timeout:.0f} s: it cannot mark node {settings.node_name} "
            f"stopped while {down}; it stops once Redis is back (start it, or let the fail-over finish), "
            "then `rig down` again; do not kill it: its running jobs would be declared lost and may run twice")
    return StackError(f"rig up (pid {pid}) did not stop within {timeout:.0f} s; "
                      f"kill it with `kill {pid}`, then `rig down` again")


def _owner(pid: int) -> str:
    """The login name of the user a process runs as (its uid when it has no name)."""
    import pwd

    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "another user"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def stop_daemon(settings: Settings, timeout: float = 60.0) -> int | None:
    """Ask this node's ``rig up`` to stop (SIGTERM) and wait; returns its pid or None. (What
    ``rig down`` does is stop_node: this, plus what a crashed ``rig up`` left.)"""
    report = stop_node(settings, timeout)
    return report.supervisors[0] if report.supervisors else None
