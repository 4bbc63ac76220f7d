"""Marking a node stopped at `rig down` when Redis may refuse the write.

A node stopped on purpose keeps its running jobs: the cluster health check leaves them alone
because the node record says ``stopped_at``. If that mark is not written (Redis is full, a
read-only replica, MISCONF) and the node's workers stop anyway, the node merely goes silent,
is declared DOWN after ``health.timeout`` and its running jobs are declared lost and run again
elsewhere while their first attempt still runs: a job run twice.

So the mark comes first, before any process of the node stops, retried while Redis refuses
writes for a bounded time (:func:`mark_stopped_retrying`); when it still cannot be written,
`rig up` refuses to stop: the node stays up (its workers keep heartbeating and supervising
their jobs) and `rig down` says so in one line with exit code 5 (:func:`write_refusal`,
:func:`read_refusal`). Staying up is the only state that is both true and safe: "stopped"
cannot be recorded and "silent" would get the node's jobs re-run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import redis

from rig.nodes import NodeRegistry
from rig.redis_writes import refusal

log = logging.getLogger(__name__)

#: What `rig down` (and Ctrl-C) says when the mark cannot be written.
REFUSED_LINE = ("Redis {why}: the node {node} cannot be marked stopped, so rig did not stop it "
                "(stopping it unmarked would get its running jobs declared lost and run twice); "
                "{fix}, then run rig down again")


class MarkRefused(Exception):
    """The stop mark could not be written within the time allowed; ``line`` says so."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def refused_line(node: str, exc: BaseException) -> str:
    """The one line for a mark that Redis refused (``exc``) or could not take (unreachable)."""
    kind = refusal(exc)
    if kind == "full":
        why, fix = "is full", "free memory in it or raise its maxmemory"
    elif kind == "read-only":
        why, fix = "is a read-only replica", "point RIG_REDIS_URL at the primary"
    elif kind == "cannot-persist":
        why, fix = "refuses writes (MISCONF)", "free disk space where it saves"
    else:
        why, fix = "refuses writes", "see its log"
    return REFUSED_LINE.format(why=why, node=node, fix=fix)


def mark_stopped_retrying(registry: NodeRegistry, node: str, *, owner: str | None, timeout: float,
                          between: Callable[[], None] = lambda: None, pause: float = 0.5) -> bool:
    """NodeRegistry.mark_stopped, retried while Redis refuses writes (rig.redis_writes.refusal)
    for up to ``timeout`` seconds; ``between`` runs between tries (the supervisor's
    loop: the node keeps being looked after while it waits). Returns mark_stopped's answer
    (False: another process owns the name). Raises MarkRefused when the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return registry.mark_stopped(node, owner=owner)
        except redis.RedisError as exc:
            # Only a refused write: an unreachable Redis keeps rig down's old way (stop, and
            # say the mark was not written), so a node can be stopped while its Redis is gone.
            if refusal(exc) is None:
                raise
            if time.monotonic() >= deadline:
                raise MarkRefused(refused_line(node, exc)) from exc
            log.warning("node %s not marked stopped yet (%s); retrying", node, exc)
        between()
        time.sleep(pause)


def confirm_stopped(registry: NodeRegistry, node: str, owner: str | None) -> None:
    """Once the node's workers have stopped: take away what they may have written after the
    stop mark while they wound down. The control worker renews the name claim as its ``rig up``
    (``owner``, rig.node_claim.renew_as) and so re-creates the claim the mark gave up; left
    there, it names a stopped node's owner until it expires. (Its heartbeats are refused by the
    mark itself: NodeRegistry.beat.) Only while the mark is still there and the claim, if any,
    is ``owner``'s: a rig up that claimed the name since is not touched. Best effort: the mark
    written first already holds."""
    keys = registry.keys
    try:
        with registry.r.pipeline(transaction=True) as pipe:
            pipe.watch(keys.node(node), keys.node_owner(node))
            if not pipe.hexists(keys.node(node), "stopped_at"):
                return
            held = pipe.get(keys.node_owner(node))
            ours = held is not None and owner is not None and held.rpartition("|")[0] == owner
            if held is not None and not ours:
                return
            pipe.multi()
            # A heartbeat by a writer that names no owner (a worker of an older rig) is not refused.
            pipe.delete(keys.node_alive(node))
            if ours:
                pipe.delete(keys.node_owner(node))
            pipe.execute()
    except redis.RedisError as exc:  # WatchError among them: someone else acted; leave it
        log.debug("stop mark of %s not confirmed: %s", node, exc)


def refusal_path(run_dir: Path, node: str) -> Path:
    """Where `rig up` tells `rig down` that it refused to stop."""
    return run_dir / f"down-refused-{node}"


def write_refusal(run_dir: Path, node: str, line: str) -> None:
    """Record (for the waiting `rig down`) that this process refused to stop, and why."""
    try:
        refusal_path(run_dir, node).write_text(f"{os.getpid()}\n{line}\n")
    except OSError as exc:
        log.warning("could not tell rig down why rig up stays up: %s", exc)


def read_refusal(run_dir: Path, node: str, pid: int) -> str | None:
    """The line `rig up` ``pid`` wrote when it refused to stop, or None."""
    try:
        head, _, line = refusal_path(run_dir, node).read_text().partition("\n")
    except OSError:
        return None
    return line.strip() if head.strip() == str(pid) and line.strip() else None
