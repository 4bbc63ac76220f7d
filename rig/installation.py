"""The installation identity: does this node still talk to the Redis it joined?

A random id is kept in Redis (``<prefix>installation``) and, once a node has joined, in a file
of the node (``<run_dir>/installation-<node>-<prefix>``). When Redis comes back empty (no
persistence, a failed AOF load, an older server that cannot read it) or another Redis answers
at the same address, the two differ. A node that sees that does nothing destructive: its
running jobs keep running, nothing is concluded, killed or requeued from the mismatch, its
cards take no jobs (they are not registered in the new Redis), and it says so — in the node
record that ``rig status`` shows, in its log and as an alert — until the operator chooses
(``rig recover``). A node with no job of the old installation left running joins the new one
by itself (nothing is lost by that: the old records are gone either way).

Verdicts (:func:`check`):

============  ==========  ==========  =========================================
node file     Redis       verdict     what happens
============  ==========  ==========  =========================================
none          none        ``new``     first start: an id is created, both keep it
none          X           ``join``    a new node joins installation X
A             A           ``same``    carry on
A             none        ``empty``   Redis lost its data (or is a new server)
A             B           ``foreign`` another installation answers here
============  ==========  ==========  =========================================
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import redis

from rig.clock import shared_now
from rig.keys import Keys

SAME, NEW, JOIN, EMPTY, FOREIGN = "same", "new", "join", "empty", "foreign"


def local_file(run_dir: Path, node: str, key_prefix: str) -> Path:
    """Where ``node`` keeps the id of the installation it joined under ``key_prefix`` (two
    prefixes, two installations, may share one home)."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", key_prefix) or "_"
    return run_dir / f"installation-{node}-{slug}"


@dataclass(frozen=True)
class Verdict:
    kind: str  # SAME, NEW, JOIN, EMPTY or FOREIGN
    expected: str | None  # the id this node joined (its file)
    found: str | None  # the id in Redis now

    @property
    def mismatch(self) -> bool:
        return self.kind in (EMPTY, FOREIGN)

    def explain(self, node: str) -> str:
        """One line for the operator (only for a mismatch)."""
        if self.kind == EMPTY:
            what = ("holds no rig installation (it lost its data, or it is another Redis or database than "
                    "the one the node used: check RIG_REDIS_URL / --redis)")
        else:
            what = f"holds another installation ({self.found}; check RIG_REDIS_URL / --redis)"
        return f"node {node} joined installation {self.expected}, but this Redis {what}"


def verdict(expected: str | None, found: str | None) -> Verdict:
    """The verdict of a node that joined ``expected`` (None: none) on a Redis holding ``found``.
    claim.lua mirrors its ``mismatch`` (tests/store/test_start_list.py checks both)."""
    if expected is None:
        return Verdict(NEW if found is None else JOIN, None, found)
    if found is None:
        return Verdict(EMPTY, expected, None)
    return Verdict(SAME if found == expected else FOREIGN, expected, found)


class Installation:
    """The identity check of one node against one Redis and key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys, run_dir: Path, node: str) -> None:
        self.r = client
        self.keys = keys
        self.node = node
        self.path = local_file(run_dir, node, keys.prefix)

    def in_redis(self) -> str | None:
        return self.r.hget(self.keys.installation, "id")

    def on_node(self) -> str | None:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    def check(self) -> Verdict:
        return verdict(self.on_node(), self.in_redis())

    def join(self) -> str:
        """Make this node part of the installation in Redis, creating one if Redis has none;
        returns its id. Clears this node's mismatch mark."""
        self.r.hsetnx(self.keys.installation, "id", f"inst-{secrets.token_hex(6)}")
        self.r.hsetnx(self.keys.installation, "created_at", shared_now(self.r))
        found = self.in_redis()
        assert found is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(found + "\n")
        os.replace(tmp, self.path)
        self.r.hdel(self.keys.node(self.node), "installation_mismatch", "mismatch_since", "mismatch_jobs")
        return found

    def mark(self, verdict: Verdict, jobs: list[int]) -> str:
        """Say so in the new Redis (rig status, alerts): what the node found and which of the
        old installation's jobs still run here. Returns the line."""
        ids = ", ".join(map(str, jobs[:10])) + (" ..." if len(jobs) > 10 else "")
        line = (f"{verdict.explain(self.node)}; {len(jobs)} job(s) of another installation still run here "
                f"({ids}), untouched; on {self.node}: `rig recover` says more, `rig recover --stop` stops them "
                "and joins this Redis")
        pipe = self.r.pipeline(transaction=False)
        pipe.sadd(self.keys.nodes, self.node)
        pipe.hset(self.keys.node(self.node), mapping={"installation_mismatch": line,
                                                      "mismatch_jobs": len(jobs)})
        pipe.hsetnx(self.keys.node(self.node), "mismatch_since", shared_now(self.r))
        pipe.execute()
        return line


def matches(client: redis.Redis, keys: Keys, run_dir: Path, node: str) -> bool:
    """True unless this node has joined an installation and Redis now holds none or another
    (a card worker's cheap check before anything that writes a job's ending)."""
    verdict = Installation(client, keys, run_dir, node).check()
    return not verdict.mismatch
