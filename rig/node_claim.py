"""Who owns a node name: exactly one live ``rig up`` at a time, whatever the host, RIG_HOME or
installation.

The owner is a string key (``P node:<node>:owner``, rig.keys.Keys.node_owner) set with SET NX
semantics in one Lua step and expiring after ``health.timeout`` s; the owner's heartbeat renews
it (``rig up`` every telemetry_interval s, and its control worker with it). Its value says
which process owns the name::

    {"host": ..., "pid": ..., "start": ..., "home": ..., "run_dir": ..., "install": ...}|<since>

The part before the last ``|`` is the *identity*: host name, pid and start time of the ``rig
up`` process (clock ticks since boot, against pid reuse), its absolute RIG_HOME and run folder,
and the folder rig is installed in. ``since`` (Unix epoch seconds) is when it took the name.

Rules (each in one function below):

- :func:`claim`: take the name if nobody holds it, if we already hold it (a renewal keeps the
  original ``since``), or if the holder is *provably dead* (same host, and its pid is gone or
  started at another time); otherwise return the holder and change nothing. Two simultaneous
  claims cannot both win: the compare and the write are one Lua script.
- A holder on another host is never provably dead: its claim must expire (health.timeout s
  without renewal) before another takes the name.
- :func:`release`: only the holder deletes its claim (``rig down`` of the owner).
- Every act on the node's shared records that a node makes for itself (registration, marking
  it stopped, its health pass, ``rig recover``) is done only by the owner, or by a process of
  the owner's home (:func:`refuse_unless_ours`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from rig.errors import NodeInUse
from rig.keys import Keys

#: KEYS[1] owner key. ARGV: our identity, ttl ms, our full value (identity|since), and the
#: value of a holder we proved dead ("" if none). Returns {1, value now} when the name is ours,
#: {0, holder's value} when another holds it (nothing written).
_CLAIM_LUA = """
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '|'
if cur and string.sub(cur, 1, string.len(mine)) == mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, cur}
end
if (not cur) or (ARGV[4] ~= '' and cur == ARGV[4]) then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return {1, ARGV[3]}
end
return {0, cur}
"""

#: KEYS[1] owner key. ARGV[1]: our identity. Deletes the claim only if it is ours; returns 1 then.
_RELEASE_LUA = """
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '|'
if cur and string.sub(cur, 1, string.len(mine)) == mine then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

#: KEYS[1] owner key. ARGV[1]: our identity, ARGV[2]: ttl ms. Extends the claim only if it is
#: ours (1); never creates one (2: nobody holds it); {0, value}: another holds it.
_RENEW_LUA = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  return {2, ''}
end
local mine = ARGV[1] .. '|'
if string.sub(cur, 1, string.len(mine)) == mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, cur}
end
return {0, cur}
"""

#: Variable carrying the owner identity from ``rig up`` to its workers.
OWNER_ENV = "RIG_NODE_OWNER"


@dataclass(frozen=True)
class Holder:
    """The process that holds (or held) a node name."""

    host: str
    pid: int | None
    start: int | None  # clock ticks since boot (/proc/<pid>/stat field 22)
    home: str
    run_dir: str
    install: str
    since: float | None  # epoch s
    raw: str  # the key's value, as read (for a compare-and-set takeover)

    @property
    def identity(self) -> str:
        return self.raw.rpartition("|")[0]

    def describe(self) -> str:
        """``host h1, home /srv/rig, pid 123, since 12:01:05``."""
        from rig.nodes import clock

        return (f"host {self.host or '?'}, home {self.home or '?'}, pid {self.pid if self.pid is not None else '?'}, "
                f"since {clock(self.since)}")

    def same_host(self) -> bool:
        return self.host == socket.gethostname()

    def same_home(self, home: Path) -> bool:
        """Is this holder a process of this host and of RIG_HOME ``home``?"""
        return self.same_host() and self.home == str(Path(home).expanduser().resolve())

    def unseen(self) -> bool:
        """Does this holder's pid run on this host hidden from this user (/proc hidepid)? Then it
        may be the holder or another process that took the pid after it died: nobody here can
        tell (workers.process_tree.runs_unseen), and its claim decides until it expires."""
        if not self.same_host() or self.pid is None:
            return False
        from workers.process_tree import runs_unseen

        return runs_unseen(self.pid)

    def provably_dead(self) -> bool:
        """True only when this machine can tell the holder is gone: same host, and its pid does
        not run or runs another process (another start time). Another host's holder is never
        provably dead: its claim must expire; nor is one that /proc hides from this user
        (hidepid: another user's rig up, workers.process_tree.may_run)."""
        if not self.same_host() or self.pid is None:
            return False
        from workers.process_tree import may_run

        return not may_run(self.pid, self.start)


def parse(raw: str | None) -> Holder | None:
    """The holder a key value names (a damaged value still names a holder, unknown fields '?')."""
    if not raw:
        return None
    ident, _, since = raw.rpartition("|")
    try:
        fields = json.loads(ident) if ident else {}
        if not isinstance(fields, dict):
            fields = {}
    except ValueError:
        fields = {}
    try:
        when: float | None = float(since)
    except ValueError:
        when = None

    def number(key: str) -> int | None:
        value = fields.get(key)
        return int(value) if isinstance(value, int) else None

    return Holder(host=str(fields.get("host", "")), pid=number("pid"), start=number("start"),
                  home=str(fields.get("home", "")), run_dir=str(fields.get("run_dir", "")),
                  install=str(fields.get("install", "")), since=when, raw=raw)


def identity(home: Path, run_dir: Path, pid: int | None = None) -> str:
    """The identity of process ``pid`` (default: this one) as owner of a node name served from
    ``home``. Stable for the life of that process: a renewal by it, or by its workers (who get
    it in RIG_NODE_OWNER), matches."""
    from workers.process_tree import proc_start_time

    pid = pid or os.getpid()
    install = identity_install()
    return json.dumps({"host": socket.gethostname(), "pid": pid, "start": proc_start_time(pid),
                       "home": str(Path(home).expanduser().resolve()),
                       "run_dir": str(Path(run_dir).expanduser().resolve()), "install": install},
                      sort_keys=True, separators=(",", ":"))


def holder(client: redis.Redis, keys: Keys, node: str) -> Holder | None:
    """Who holds ``node`` now, or None."""
    return parse(client.get(keys.node_owner(node)))


def claim(client: redis.Redis, keys: Keys, node: str, ident: str, ttl: float) -> Holder | None:
    """Take or renew ``node`` for ``ident`` for ``ttl`` s. Returns None when the name is ours
    now, else the live holder (nothing changed). A holder proved dead is replaced atomically
    (only if its value is still the one read: two claimants cannot both win)."""
    key = keys.node_owner(node)
    ttl_ms = str(max(1000, int(ttl * 1000)))
    script = client.register_script(_CLAIM_LUA)
    dead = ""
    for _ in range(2):
        won, value = script(keys=[key], args=[ident, ttl_ms, f"{ident}|{time.time():.3f}", dead])
        if int(won) == 1:
            return None
        other = parse(value)
        assert other is not None
        if dead or not other.provably_dead():
            return other
        dead = other.raw  # try once more, replacing exactly that dead holder
    return other


def release(client: redis.Redis, keys: Keys, node: str, ident: str) -> bool:
    """Give ``node`` up if ``ident`` holds it; True if it did."""
    return bool(client.register_script(_RELEASE_LUA)(keys=[keys.node_owner(node)], args=[ident]))


def renew_as(client: redis.Redis, keys: Keys, node: str, ttl: float) -> bool:
    """For a worker of rig up: renew the claim as the rig up that started this process
    (RIG_NODE_OWNER) and say whether the name is still its. A process not started by rig up
    (no RIG_NODE_OWNER: a test, a worker started by hand) owns nothing and is not refused."""
    ident = os.environ.get(OWNER_ENV)
    if not ident:
        return True
    # Extend only: a claim nobody holds is rig up's to take again (it renews its own; Redis
    # restarted empty), never a worker's. A worker that re-created it re-took a name its rig
    # up had just given up at `rig down` (the stop mark), and the node read "up" after it.
    ttl_ms = str(max(1000, int(ttl * 1000)))
    found, _ = client.register_script(_RENEW_LUA)(keys=[keys.node_owner(node)], args=[ident, ttl_ms])
    return int(found) != 0


def held_by_other(client: redis.Redis, keys: Keys, node: str, ident: str) -> Holder | None:
    """The holder of ``node`` when it is not ``ident`` (None when ``ident`` holds it or nobody
    does). Read only."""
    found = holder(client, keys, node)
    if found is None or found.identity == ident:
        return None
    return found


def there(node: str, other: Holder, command: str) -> str:
    """Exactly what to type, and where, to run ``rig COMMAND --node NODE`` as the holder."""
    host = "on this host" if other.same_host() else f"on host {other.host}"
    return f"`RIG_HOME={other.home} rig {command} --node {node}` {host}"


def refused_line(node: str, other: Holder, doing: str, hint: str) -> str:
    """The one line refusing ``doing`` on a name another live process holds: who holds it
    (host, home, pid, since; the rig installation when it is another one here) and ``hint``."""
    install = f", rig in {other.install}" if other.same_host() and other.install != identity_install() else ""
    if other.unseen():  # not said live: its pid may be another process's now (Holder.unseen)
        return (f"node name {node!r} is owned by a rig up ({other.describe()}{install}) whose pid runs hidden from "
                f"this user (/proc hidepid): that rig up, or another process that took the pid after it died (its "
                f"claim then expires unrenewed); {doing} refused, nothing was changed: {hint}")
    return (f"node name {node!r} is owned by a live rig up ({other.describe()}{install}); {doing} refused, "
            f"nothing was changed: {hint}")


def identity_install() -> str:
    """The folder this rig is installed in (part of an identity)."""
    return str(Path(__file__).resolve().parent.parent)


def refuse_unless_ours(client: redis.Redis, keys: Keys, node: str, home: Path, command: str) -> None:
    """Raise NodeInUse (one line naming the holder) when ``node`` is held by a live process that
    is not of this host and RIG_HOME ``home``: ``rig COMMAND`` (acting on the node for it) is
    the owner's to do. A holder proved dead is no owner."""
    doing = f"`rig {command}` of node {node} from RIG_HOME={Path(home).expanduser().resolve()}"
    found = holder(client, keys, node)
    if found is None or found.same_home(home) or found.provably_dead():
        return
    raise NodeInUse(refused_line(node, found, doing, f"run it as the owner: {there(node, found, command)}"))
