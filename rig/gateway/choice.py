"""Which client a process gets: straight to Redis, or through the node's gateway. The rule:

- root, and a process that holds Redis credentials (a password in ``redis_url`` after
  rig.redis_conn found one: rig's own processes, admins who can read the password file),
  talks to Redis itself (root may read any password file; a job of the workers' own user
  carries the URL);
- anyone else (every user without the password, every job: none carries it) talks to the
  gateway (rig.gateway.paths.client_socket) when one is there;
- with no gateway either, to Redis itself (a single-user setup whose Redis has no password).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from rig.config import Settings


def holds_credentials(settings: Settings) -> bool:
    """Does this process have a Redis password (the URL carries the one rig found)?"""
    try:
        return urlsplit(settings.redis_url).password is not None
    except ValueError:
        return False


def make_client(settings: Settings):  # noqa: ANN201 - rig.client.Client | GatewayClient
    """The client for this process (see the module's docstring)."""
    from rig.client import Client

    if os.getuid() != 0 and not holds_credentials(settings):
        from rig.gateway.client import GatewayClient
        from rig.gateway.paths import client_socket

        path = client_socket(settings)
        if path is not None:
            return GatewayClient(settings, path)
    return Client(settings)
