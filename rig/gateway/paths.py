"""Where a node's gateway listens, and where a client looks for one: the one rule.

A node (``rig up``) listens on ``gateway_socket`` when it is set; else a root node on the
well-known :data:`SYSTEM_SOCKET` (so a teammate configures nothing), unless another node of
this host already answers there; else ``$RIG_HOME/run/gateway-NODE.sock``. A Unix socket path
is at most :data:`MAX_PATH` bytes: a longer default moves to ``/tmp/rig-UID/``.

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


def node_socket(settings: Settings, *, in_use=None) -> Path:  # noqa: ANN001 - Callable[[Path], bool]
    """Where this node's gateway listens (see the module's docstring)."""
    if settings.gateway_socket is not None:
        return settings.gateway_socket
    if os.geteuid() == 0:
        from rig.gateway.server import socket_in_use

        if not (in_use or socket_in_use)(SYSTEM_SOCKET):
            return SYSTEM_SOCKET
    return home_socket(settings)


def client_socket(settings: Settings) -> Path | None:
    """The gateway a client without credentials talks to, or None when none is there."""
    if settings.gateway_socket is not None:
        return settings.gateway_socket
    for candidate in (home_socket(settings), SYSTEM_SOCKET):
        if candidate.exists():
            return candidate
    return None
