"""Registering a node's cards and the node itself in the ledger (``rig up``, ``rig recover``,
and a node that joins a new installation by itself)."""

from __future__ import annotations

import os
from collections.abc import Callable

import redis

from rig.config import Settings
from rig.draining import mark_gone_cards
from rig.gpus import GpuBackend
from rig.keys import Keys
from rig.ledger import Ledger
from rig.nodes import NodeRegistry


def register_node(settings: Settings, client: redis.Redis, backend: GpuBackend,
                  say: Callable[[str], None] = lambda _line: None, *, pid: int | None = None) -> list[int]:
    """Write every card of this node (``allowed`` by gpu_whitelist) and the node record;
    returns the indexes rig may use. ``pid`` is the node's ``rig up`` (default: this process)."""
    keys = Keys(settings.key_prefix)
    ledger = Ledger(client, keys)
    readings = backend.read_all()
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
        pid=pid or os.getpid(), fake_spec=getattr(backend, "spec", "") or "")
    if whitelist:
        missing = sorted(whitelist - {r.index for r in readings})
        if missing:
            say(f"gpus: gpu_whitelist names cards that do not exist: {missing}")
    say(f"gpus: {len(readings)} {backend.kind} card(s) on {settings.node_name}; "
        f"rig uses {allowed if allowed else 'none'}")
    return allowed
