"""The plain-Celery baseline of scripts/bench_peers.py: a throwaway Celery app, one worker
process per card (``-P solo``, concurrency 1, prefetch 1, acks_late), every worker consuming
one shared queue and running each job on its own card.

Configured from the environment (set by the benchmark for its workers and itself):
PEERS_BROKER_URL (a Redis URL, a private DB number), PEERS_PREFIX (every broker and result key
under it), PEERS_QUEUE, PEERS_CARD (the worker's card), PEERS_CARDS (cards on the machine),
PEERS_READY_DIR (the worker touches <dir>/<card> when it is ready).

A 2-card job: plain Celery has no way to take two cards at once, so the job runs on its
worker's card and the next one (card + 1 mod cards), the second taken without asking: the
neighbour's own worker may be running a job there, and the stamps then count that overlap as a
rule break.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready

#: priority name -> Celery priority on Redis (0 = served first)
PRIORITY_STEPS = {"high": 0, "medium": 3, "low": 6}

_url = os.environ.get("PEERS_BROKER_URL", "redis://127.0.0.1:6379/11")
_prefix = os.environ.get("PEERS_PREFIX", "rigpeers:")
app = Celery("rig_peers_baseline", broker=_url, backend=_url)
app.conf.update(
    broker_transport_options={"global_keyprefix": _prefix,
                              "priority_steps": sorted(PRIORITY_STEPS.values()),
                              "sep": ":", "queue_order_strategy": "priority"},
    result_backend_transport_options={"global_keyprefix": _prefix},
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("PEERS_QUEUE", "peers"),
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
    result_expires=3600,
    broker_connection_retry_on_startup=True,
)


def cards_for(gpus: int) -> list[int]:
    card = int(os.environ.get("PEERS_CARD", "0"))
    total = int(os.environ.get("PEERS_CARDS", "8"))
    return [(card + k) % total for k in range(max(1, gpus))]


@app.task(name="peers.run")
def run(command: str, gpus: int = 1) -> int:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(c) for c in cards_for(gpus)))
    return subprocess.run(["/bin/sh", "-c", command], env=env, check=False).returncode


@worker_ready.connect
def _ready(**_kwargs: object) -> None:
    ready = os.environ.get("PEERS_READY_DIR")
    if ready:
        (Path(ready) / os.environ.get("PEERS_CARD", "0")).touch()
