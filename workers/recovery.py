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
from rig.redis_conn import connect
from rig.registration import register_node
from rig.stack import running_pid
from workers.health import JobProcess, _rig_processes
from workers.process_tree import stop_tree


@dataclass
class Recovery:
    verdict: Verdict
    running: dict[int, JobProcess]  # session id -> the old installation's job process
    stopped: list[int] = field(default_factory=list)  # job ids
    joined: str | None = None  # the installation id joined


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
    check_operator(settings)
    client = connect(settings.redis_url)
    inst = Installation(client, Keys(settings.key_prefix), settings.run_dir, settings.node_name)
    running = _rig_processes(settings.key_prefix, settings.redis_url, settings.node_name)
    return Recovery(inst.check(), running)


def stop_and_join(settings: Settings, say: Callable[[str], None] = print) -> Recovery:
    """Stop every job process of the old installation on this node (SIGTERM to each job's
    session, SIGKILL after kill_grace_seconds; their logs stay in log_dir), then join the
    installation in Redis (creating one if it holds none) and register this node's cards."""
    found = inspect(settings)
    if not found.verdict.mismatch:
        return found
    for sid, proc in sorted(found.running.items(), key=lambda item: item[1].job_id):
        say(f"stopping job {proc.job_id} attempt {proc.attempt} of installation {found.verdict.expected} "
            f"(session {sid})")
        stop_tree(sid, settings.kill_grace_seconds)
        found.stopped.append(proc.job_id)
    client = connect(settings.redis_url)
    found.joined = Installation(client, Keys(settings.key_prefix), settings.run_dir, settings.node_name).join()
    if running_pid(settings) is not None:
        # rig up runs: its cards take jobs again at once. Otherwise the next rig up registers
        # them (registering now would show the node up with no workers).
        backend, _notice = detect_backend(settings.fake_gpus, settings.home / "fake-gpus", node=settings.node_name)
        register_node(settings, client, backend, say)
    return found
