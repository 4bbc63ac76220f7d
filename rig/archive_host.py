"""Which host a SQLite archive lives on: a SQLite file is one host's (its locks are that
kernel's; another host with the same path sees another file, or one it must not share), so
the cluster's record of a SQLite archive says whose disk it is on (rig.archive_cluster keeps it
under ``archive:host`` beside ``archive:url``).

A host is told by its machine id (``/etc/machine-id``, systemd's and D-Bus' stable id of an
installation; it survives reboots and renames), else by its host name; its host name is kept
for the words only.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path

#: Where the machine id is read, first found first.
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


@dataclass(frozen=True)
class Host:
    """A host: ``id`` tells hosts apart (machine id, else host name); ``name`` is for people."""

    id: str
    name: str

    def record(self, url: str) -> str:
        """The ``archive:host`` value: this host as the one holding SQLite archive ``url`` (no
        password), JSON; the URL is kept so a record left by a move of an older rig (which
        rewrote ``archive:url`` only) is told stale (rig.archive_cluster.archive_host)."""
        return json.dumps({"id": self.id, "name": self.name, "url": url}, sort_keys=True)


def parse(text: str) -> tuple[Host, str] | None:
    """An ``archive:host`` value as (host, the archive URL it is for); None when malformed."""
    try:
        data = json.loads(text)
        return Host(str(data["id"]), str(data["name"])), str(data["url"])
    except (ValueError, KeyError, TypeError):
        return None


@cache
def this_host() -> Host:
    """This host (see the module doc); read once per process."""
    name = socket.gethostname()
    for path in MACHINE_ID_FILES:
        try:
            machine_id = Path(path).read_text().strip()
        except OSError:
            continue
        if machine_id:
            return Host(machine_id, name)
    return Host(f"name:{name}", name)
