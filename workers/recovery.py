"""``rig recover``: the operator's way forward when this node's Redis is not the installation
it joined (rig.installation): stop the old installation's jobs still running here, then join
the Redis that answers now and register the node's cards in it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from rig.config import Settings
from rig.errors import ConfigError, PermissionDenied
from rig.installation import Installation, Verdict
from rig.keys import Keys
from rig.node_claim import refuse_unless_ours
from rig.redis_conn import connect
from rig.stack import running_pid
from rig.store import JobStore
from workers.health import JobProcess, node_identity
from workers.process_tree import stop_tree
from workers.unrecorded import UNRECORDED_FIELD


@dataclass
class Recovery:
    verdict: Verdict
    #: Session id -> a job process here that this Redis cannot account for: of another
    #: installation (a mismatch), or of this one with no record of it (Redis rolled back).
    running: dict[int, JobProcess]
    stopped: list[int] = field(default_factory=list)  # job ids
    joined: str | None = None  # the installation id joined
    registered: bool = False  # the node's cards were registered again (rig up runs)

    @property
    def needed(self) -> bool:
        return self.verdict.mismatch or bool(self.running)


def check_operator(settings: Settings) -> None:
    """Only root or the user that runs the node's rig (the owner of its run folder) may recover
    it: another user cannot see (nor stop) the node's job processes, so it would wrongly find
    none. Raises PermissionDenied."""
    try:
        owner = settings.run_dir.stat().st_uid
    except FileNotFoundError:
        raise ConfigError(f"{settings.run_dir} does not exist: node {settings.node_name} never ran here "
                          "with this RIG_HOME; run rig recover where its rig up runs") from None
    if os.geteuid() not in (0, owner):
        raise PermissionDenied(f"rig recover must run as root or as the user that runs rig up on node "
                               f"{settings.node_name} (the owner of {settings.run_dir}): only they see its jobs")


def inspect(settings: Settings) -> Recovery:
    """What this node would recover from: the verdict and the job processes running here."""
    client = connect(settings.redis_url)
    # Another home's (or host's) rig up owns the node name: its jobs are not ours to stop.
    refuse_unless_ours(client, Keys(settings.key_prefix), settings.node_name, settings.home, "recover")
    check_operator(settings)
    found = node_identity(settings, client)
    if found.verdict.mismatch:
        return Recovery(found.verdict, found.others)
    # The same installation: jobs running here that it has no record of (rolled back).
    store = JobStore(client, Keys(settings.key_prefix))
    mine = {sid: p for sid, p in found.running.items() if sid not in found.others}
    records = {j.id: j for j in store.get_many(sorted({p.job_id for p in mine.values()}))} if mine else {}
    unrecorded = {sid: p for sid, p in mine.items() if p.job_id not in records
                  or (p.instance and records[p.job_id].instance and p.instance != records[p.job_id].instance)}
    return Recovery(found.verdict, unrecorded)


def clear_unrecorded(settings: Settings) -> str | None:
    """Remove the node's unrecorded-jobs line (workers.unrecorded) once nothing unrecorded runs
    here (inspect found none): what is left is an ending Redis lost, which the operator has now
    seen. Returns the line removed, or None."""
    client = connect(settings.redis_url)
    key = Keys(settings.key_prefix).node(settings.node_name)
    line = client.hget(key, UNRECORDED_FIELD)
    if line:
        client.hdel(key, UNRECORDED_FIELD)
    return line or None


def stop_and_join(settings: Settings, say: Callable[[str], None] = print) -> Recovery:
    """Stop every job process of the old installation on this node (SIGTERM to each job's
    session, SIGKILL after kill_grace_seconds; their logs stay in log_dir), then join the
    installation in Redis (creating one if it holds none) and register this node's cards."""
    found = inspect(settings)
    if not found.needed:
        return found
    for sid, proc in sorted(found.running.items(), key=lambda item: item[1].job_id):
        whose = proc.installation or found.verdict.expected or "?"
        say(f"stopping job {proc.job_id} attempt {proc.attempt} (instance {proc.instance or '?'}, installation "
            f"{whose}; session {sid})")
        stop_tree(sid, settings.kill_grace_seconds)
        found.stopped.append(proc.job_id)
    client = connect(settings.redis_url)
    client.hdel(Keys(settings.key_prefix).node(settings.node_name), UNRECORDED_FIELD)
    if not found.verdict.mismatch:
        return found
    installation = Installation(client, Keys(settings.key_prefix), settings.run_dir, settings.node_name)
    if running_pid(settings) is not None:
        # rig up runs: its control worker, which has rig up's own settings (--fake-gpus, a
        # gpu_whitelist or max_task_per_gpu in its environment), finds no job of another
        # installation left at its next check, joins and registers the node's cards
        # (workers.health). Registering them here, with this command's settings, gave the
        # node other cards than its workers run (8 fake 80G cards for rig up --fake-gpus 2x24G).
        joined = wait_joined(installation, client, Keys(settings.key_prefix).node(settings.node_name),
                             timeout=JOIN_WAIT_FACTOR * settings.health.check_interval + settings.kill_grace_seconds)
        if joined is not None:
            found.joined, found.registered = joined, True
            return found
    # No rig up (or no control worker of it): joined now; the next rig up registers the cards.
    found.joined = installation.join()
    return found


#: How many of the node's health checks `rig recover --stop` waits for its control worker to join.
JOIN_WAIT_FACTOR = 3


def wait_joined(installation: Installation, client: redis.Redis, node_key: str, *, timeout: float,
                pause: float = 0.2) -> str | None:
    """Wait up to ``timeout`` s for the node's control worker to have joined the installation in
    Redis and registered the node (its record's ``backend``, which only a registration writes:
    a frozen node's record holds its mismatch and heartbeats); the installation id, or None."""
    deadline = time.monotonic() + timeout
    while True:
        verdict = installation.check()
        if not verdict.mismatch and verdict.found is not None and client.hexists(node_key, "backend"):
            return verdict.found
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
