"""Registering a node's cards and the node itself in the ledger (``rig up``, ``rig recover``,
and a node that joins a new installation by itself)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import redis

from rig.cluster_templates import encode as encode_templates
from rig.config import Settings
from rig.draining import NO_WORKER_REASON, mark_gone_cards, needs_worker
from rig.errors import NodeInUse
from rig.gpus import GpuBackend, GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.nodes import NODE_DOWN_REASON, NODE_STOPPED_REASON, NodeRegistry
from rig.policy import encode as encode_policy
from rig.pools import encode as encode_pools


def up_pid(settings: Settings) -> int | None:
    """The pid of this node's ``rig up`` as one of its children sees it: RIG_SUPERVISOR_PID
    (rig.supervision: rig up gives it to every child) when set, else the live ``rig up`` of the
    node's pid file (rig.stack.running_pid), else None. Never the caller's own pid: a worker that
    rejoined the node recorded itself as its rig up, and once rig up was killed `rig status`
    said "its rig up (pid <the worker>) no longer runs" (issue 13)."""
    from rig.stack import running_pid  # rig.stack imports this module
    from rig.supervision import SUPERVISOR_PID

    raw = os.environ.get(SUPERVISOR_PID, "")
    return int(raw) if raw.isdigit() else running_pid(settings)


def register_node(settings: Settings, client: redis.Redis, backend: GpuBackend,
                  say: Callable[[str], None] = lambda _line: None, *, pid: int | None = None) -> list[int]:
    """Write every card of this node (``allowed`` by gpu_whitelist) and the node record;
    returns the indexes rig may use. ``pid`` is the node's ``rig up`` (default: this process,
    so only rig up itself may leave it out; its children and `rig recover` pass :func:`up_pid`
    or rig.stack.running_pid)."""
    keys = Keys(settings.key_prefix)
    ledger = Ledger(client, keys)
    readings = backend.read_all()
    shared = cards_of_another_node(ledger, settings.node_name, readings) if backend.kind != "fake" else None
    if shared:
        raise NodeInUse(shared)
    whitelist = set(settings.gpu_whitelist) if settings.gpu_whitelist is not None else None
    allowed = []
    for reading in readings:
        ok = whitelist is None or reading.index in whitelist
        ledger.register_card(settings.node_name, reading, max_jobs=settings.max_task_per_gpu,
                             reserve_fraction=settings.vram_reserve_fraction, allowed=ok,
                             fake=backend.kind == "fake")
        if ok:
            allowed.append(reading.index)
    kept, removed = mark_gone_cards(client, keys, settings.node_name, [r.index for r in readings])
    if kept:
        say(f"gpus: card(s) {kept} of {settings.node_name} are gone from the node but jobs still run there: "
            "they take no new jobs and are watched until those end")
    if removed:
        say(f"gpus: card(s) {removed} of {settings.node_name} are gone from the node: forgotten")
    NodeRegistry(client, keys).register(
        settings.node_name, ttl=settings.health.timeout, backend=backend.kind, cards=len(readings),
        pid=pid or os.getpid(), fake_spec=getattr(backend, "spec", "") or "",
        pools=encode_pools(settings.pools),  # the cluster's pools are the nodes' (rig.pools)
        templates=encode_templates(settings.templates),  # and so are its templates (rig.cluster_templates)
        policy=encode_policy(settings))  # compared by the next node's rig up (rig.policy)
    # The node is up again: a "node stopped/down" mark on any of its cards is false now. An
    # allowed card's worker would clear it too, but a card outside gpu_whitelist (or gone) has
    # no worker, so the mark would stay for ever (issue 11: `[UNHEALTHY: node stopped ...]` on
    # a node that is up).
    clear_node_marks(ledger, settings.node_name)
    warning = whitelist_warning(settings.gpu_whitelist, [r.index for r in readings], allowed)
    if warning:
        say(warning)
    say(f"gpus: {len(readings)} {backend.kind} card(s) on {settings.node_name}; "
        f"rig uses {allowed if allowed else 'none'}")
    return allowed


def cards_of_another_node(ledger: Ledger, node: str, readings: list[GpuReading]) -> str | None:
    """Why ``node`` must not register these cards (one line), or None: one of them (by its
    UUID) is already another node's in this Redis. A second `rig up` on one server under
    another name (a second RIG_HOME, an operator's `--node`) would place jobs on the same
    physical cards as the first, neither counting the other's: oversubscribed, out of memory.
    (Fake cards are each node's own: not asked.)"""
    mine = {r.uuid: r.index for r in readings if r.uuid}
    for card in ledger.cards():
        if card.node != node and card.uuid in mine:
            return (f"card {mine[card.uuid]} of this server ({card.uuid}) is already card {card.id} of node "
                    f"{card.node!r} in this Redis: two nodes on one card would each fill it; nothing was changed. "
                    f"Run this server as node {card.node!r} (`rig up --node {card.node}`), or, if {card.node!r} "
                    f"is this server's old name, `rig down --node {card.node}` and `rig forget-node {card.node}` "
                    "first")
    return None


def clear_node_marks(ledger: Ledger, node: str) -> list[int]:
    """Make every card of ``node`` healthy again whose only fault was its node being stopped or
    down (rig.nodes reasons, written by the other nodes' health checks), or, on a card that
    needs no worker (outside gpu_whitelist, no job: rig.draining.needs_worker), its worker not
    running: none is started for it by design, so nothing else would ever clear that mark. Other
    faults (heat, a full log disk) stay. Called when the node registers, i.e. when it is up.
    Returns the indexes."""
    cleared = []
    for card in ledger.cards():
        if card.node == node and not card.healthy and (card.health_reason.startswith(
                (NODE_DOWN_REASON, NODE_STOPPED_REASON))
                or (card.health_reason == NO_WORKER_REASON and not needs_worker(card))):
            ledger.set_healthy(node, card.index, True)
            cleared.append(card.index)
    return cleared


def whitelist_warning(whitelist: list[int] | None, present: list[int], allowed: list[int]) -> str | None:
    """The one line `rig up` says on the terminal when gpu_whitelist names cards the node does
    not have, or leaves it no usable card; None when it fits. A warning, not a refusal: a
    narrowed whitelist is a legitimate maintenance step, and the node must stay up to supervise
    jobs still running on cards that left the whitelist (rig.draining)."""
    if whitelist is None:
        return None
    missing = sorted(set(whitelist) - set(present))
    if not allowed:
        how = "names no card of this node" if missing else "leaves this node no usable card"
        return (f"warning: gpu_whitelist {sorted(set(whitelist))} {how} (its cards are {sorted(present)}): "
                "it runs no new job until gpu_whitelist names one")
    if missing:
        return (f"warning: gpu_whitelist names card(s) {missing} that do not exist on this node "
                f"(its cards are {sorted(present)}); rig uses {allowed}")
    return None


def notes_path(run_dir: Path, node: str, kind: str = "notes") -> Path:
    """Where a `rig up --daemon` child leaves the lines its parent repeats on the terminal:
    ``notes`` (warnings, on stderr) or ``addresses`` (where Flower and /metrics listen)."""
    return run_dir / f"up-{node}.{kind}"


def write_notes(run_dir: Path, node: str, lines: list[str], kind: str = "notes") -> None:
    """Leave ``lines`` for the `rig up --daemon` parent (an empty list removes old notes)."""
    path = notes_path(run_dir, node, kind)
    if lines:
        path.write_text("".join(f"{line}\n" for line in lines))
    else:
        path.unlink(missing_ok=True)


def read_notes(run_dir: Path, node: str, kind: str = "notes") -> list[str]:
    """The lines the `rig up --daemon` child left (read once: the file is removed)."""
    path = notes_path(run_dir, node, kind)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    path.unlink(missing_ok=True)
    return [line for line in lines if line.strip()]
