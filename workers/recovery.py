"""``rig recover``: the operator's way forward when this node's Redis is not the installation
it joined (rig.installation): stop the old installation's jobs still running here, then join
the Redis that answers now and register the node's cards in it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rig.config import Settings
from rig.gpus import detect_backend
from rig.installation import Installation, Verdict
from rig.keys import Keys
from rig.redis_conn import connect
from rig.registration import register_node
from workers.health import JobProcess, _rig_processes
from workers.process_tree import stop_tree


@dataclass
class Recovery:
    verdict: Verdict
    running: dict[int, JobProcess]  # session id -> the old installation's job process
    stopped: list[int] = field(default_factory=list)  # job ids
    joined: str | None = None  # the installation id joined


def inspect(settings: Settings) -> Recovery:
    """What this node would recover from: the verdict and the job processes running here."""
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
    backend, _notice = detect_backend(settings.fake_gpus, settings.home / "fake-gpus", node=settings.node_name)
    register_node(settings, client, backend, say)
    return found
