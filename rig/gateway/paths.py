"""Where a node's gateway listens, and where a client looks for one: the one rule.

A node (``rig up``) listens on ``gateway_socket`` when it is set; else a root node of the
default home (``~/.rig``: the host's installation) on the well-known :data:`SYSTEM_SOCKET` (so a
teammate configures nothing); else ``$RIG_HOME/run/gateway-NODE.sock``. The choice depends on
nothing else: a root test install with a ``RIG_HOME`` of its own never takes the host's socket,
and the host's node never moves off it (a gateway already answering there is an error that says
so: rig.gateway.server.bind). ``rig up`` says on the terminal which socket it serves. A Unix
socket path is at most :data:`MAX_PATH` bytes: a longer default moves to ``/tmp/rig-UID/``.

A client without Redis credentials (rig.gateway.choice) uses ``gateway_socket`` when set
(``RIG_GATEWAY_SOCKET``: every job gets it), else its own home's socket if one is there, else
:data:`SYSTEM_SOCKET`.

Beside the socket, ``<socket>.up`` names the ``rig up`` that keeps its gateway running (pid and
start time), for as long as it runs: a client that finds no gateway answering tells a gateway
restarting under a live ``rig up`` (it waits a moment, then says so) from rig not being up.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from rig.config import Settings

#: Where a root node's gateway listens unless configured elsewhere.
SYSTEM_SOCKET = Path("/run/rig/gateway.sock")
#: The longest path a Unix socket may have (sun_path is 108 bytes with its NUL).
MAX_PATH = 107


def home_socket(settings: Settings) -> Path:
    """``$RIG_HOME/run/gateway-NODE.sock``, or a short stand-in under /tmp when that is too long."""
    path = settings.run_dir / f"gateway-{settings.node_name}.sock"
    if len(os.fsencode(str(path))) <= MAX_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(str(settings.run_dir))).hexdigest()[:12]
    return Path(f"/tmp/rig-{os.geteuid()}/gateway-{digest}-{settings.node_name[:40]}.sock")


def is_default_home(home: Path) -> bool:
    """Is ``home`` the default ``~/.rig`` (no RIG_HOME of its own), symlinks resolved?"""
    return home.expanduser().resolve() == (Path.home() / ".rig").resolve()


def node_socket(settings: Settings) -> Path:
    """Where this node's gateway listens (see the module's docstring): the one rule."""
    if settings.gateway_socket is not None:
        return settings.gateway_socket
    if os.geteuid() == 0 and is_default_home(settings.home):
        return SYSTEM_SOCKET
    return home_socket(settings)


def client_socket(settings: Settings) -> Path | None:
    """The gateway a client without credentials talks to, or None when none is there."""
    if settings.gateway_socket is not None:
        return settings.gateway_socket
    from rig.redis_conn import visible  # a home this user cannot enter holds no socket of theirs

    for candidate in (home_socket(settings), SYSTEM_SOCKET):
        # a socket gone while its gateway restarts: the node's live rig up still marks it (a
        # mark a dead one left sends nobody to a gateway that will not come back)
        if visible(candidate) or live_supervisor(candidate) is not None:
            return candidate
    return None


def supervisor_mark(socket_path: Path) -> Path:
    """``<socket>.up``: the live ``rig up`` that keeps the gateway at ``socket_path`` running."""
    return socket_path.with_name(socket_path.name + ".up")


def write_supervisor_mark(socket_path: Path) -> None:
    """Mark this process (a ``rig up``) as the one that keeps the gateway at ``socket_path``
    running: its pid and start time, mode 0644 (every client reads it), replaced in one step."""
    from workers.process_tree import proc_start_time

    mark = supervisor_mark(socket_path)
    staged = mark.with_name(f"{mark.name}.{os.getpid()}")
    staged.write_text(f"{os.getpid()}\n{proc_start_time(os.getpid()) or ''}\n")
    os.chmod(staged, 0o644)
    os.replace(staged, mark)


def remove_supervisor_mark(socket_path: Path) -> None:
    """Remove this process's mark (another ``rig up``'s, written meanwhile, stays)."""
    if live_supervisor(socket_path) == os.getpid():
        supervisor_mark(socket_path).unlink(missing_ok=True)


def live_supervisor(socket_path: Path) -> int | None:
    """The pid of the live ``rig up`` that marks the gateway at ``socket_path``, or None: no
    mark, an unreadable one, or one left by a rig up that is gone (its pid dead or reused). A
    rig up of another user that /proc hides from this one (hidepid) counts as live
    (workers.process_tree.may_run): its gateway is waited for, not said down."""
    from workers.process_tree import may_run

    try:
        pid_text, start_text = supervisor_mark(socket_path).read_text().split("\n")[:2]
        pid, start = int(pid_text), int(start_text)
    except (OSError, ValueError):
        return None
    return pid if may_run(pid, start) else None
