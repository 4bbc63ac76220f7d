"""``rig recover``: the operator's way forward when this node's Redis is not the installation
it joined (rig.installation): stop the old installation's jobs still running here, then join
the Redis that answers now and register the node's cards in it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from rig.config import Settings
from rig.errors import ConfigError, PermissionDenied
from rig.gpus import detect_backend
from rig.installation import Installation, Verdict
from rig.keys import Keys
from rig.node_claim import refuse_unless_ours
from rig.redis_conn import connect
from rig.registration import register_node
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
    found.joined = Installation(client, Keys(settings.key_prefix), settings.run_dir, settings.node_name).join()
    up = running_pid(settings)
    if up is not None:
        # rig up runs: its cards take jobs again at once. Otherwise the next rig up registers
        # them (registering now would show the node up with no workers). The node record names
        # that rig up, not this short-lived `rig recover`.
        backend, _notice = detect_backend(settings.fake_gpus, settings.fake_usage_dir, node=settings.node_name)
        register_node(settings, client, backend, say, pid=up)
        found.registered = True
    return found
