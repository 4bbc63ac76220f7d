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
        if visible(candidate):
            return candidate
    return None
