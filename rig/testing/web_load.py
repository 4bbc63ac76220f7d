"""A small mixed load for rig's web page: three users' running, waiting and failed jobs on two
fake nodes, written through the real ledger (reserve, claim, transition: the same scripts a
worker runs), plus history samples (rig.timeline). No worker runs: the records are real, the
processes are not. Used by tests/e2e/test_web_page.py and scripts/screenshot_web.py.

    load = mixed_load(client)          # a Client on a throwaway key prefix
    load.running, load.waiting, load.failed, load.hostile   # job ids
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rig import timeline
from rig.client import Client
from rig.gpus.base import GpuReading
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry

#: A job name a hostile submitter might choose: it must show as these characters, never run.
HOSTILE_NAME = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
CARD_TOTAL = 80 * GIB


@dataclass
class MixedLoad:
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    hostile: int = 0


def _card(client: Client, node: str, index: int, *, used: int, util: int, temp: int) -> None:
    reading = GpuReading(index=index, uuid=f"{node}-{index}", model="NVIDIA A100-SXM4-80GB",
                         total=CARD_TOTAL, used=used, utilization=util, temperature=temp)
    client.ledger.register_card(node, reading, max_jobs=2, reserve_fraction=0.05, allowed=True, fake=True)
    client.ledger.record_reading(node, reading)


def _job(client: Client, user: str, name: str, gib: int, *, gpus: int = 1,
         priority: Priority = Priority.MEDIUM, age: float = 0.0) -> Job:
    return client.store.create(Job(
        id=0, name=name, user=user, command=["python", "train.py"], gpu_memory=gib * GIB, gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/tmp", created_at=time.time() - age))


def _start(client: Client, job: Job, node: str, cards: list[int]) -> str:
    ok, token = client.ledger.reserve(job.id, node, cards, job.gpu_memory)
    if not ok:
        raise RuntimeError(f"job {job.id} does not fit on {node}/{cards}: {token}")
    ok, detail = client.ledger.claim(job.id, token, f"card{cards[0]}@{node}")
    if not ok:
        raise RuntimeError(f"job {job.id} could not be claimed: {detail}")
    return token


def _end(client: Client, job: Job, node: str, card: int, state: JobState, **fields: str) -> None:
    token = _start(client, job, node, [card])
    code, _ = client.ledger.transition(job.id, state, token=token, fields=fields,
                                       error_queue=state in (JobState.FAILED, JobState.TIMEOUT))
    if code != 1:
        raise RuntimeError(f"job {job.id} did not end as {state.value} ({code})")


def mixed_load(client: Client, *, history_hours: int = 0) -> MixedLoad:
    """Two nodes of two 80 GB cards; alice, bob and carol each run, wait and fail. With
    ``history_hours``, that many hours of made-up minute samples before now (a screenshot's
    charts); else one real sample of now."""
    load = MixedLoad()
    for node in ("gpu1", "gpu2"):
        for index in (0, 1):
            _card(client, node, index, used=0, util=0, temp=35)
        # A heartbeat, as a `rig up` there would keep (it expires: nothing keeps it up).
        NodeRegistry(client.r, client.keys).beat(node, ttl=600, source="web_load")
    # Jobs that ended: successes for the counters, two failures for the error queue.
    for i in range(3):
        _end(client, _job(client, "alice", f"eval-{i}", 4), "gpu1", 0, JobState.SUCCEEDED)
    oom = _job(client, "bob", "prep-data", 30)
    _end(client, oom, "gpu2", 0, JobState.FAILED, failure="cuda_oom",
         reason="CUDA out of memory (tried to allocate 2.00 GiB); retry with --gpu-memory 40G")
    slow = _job(client, "carol", "tokenize-corpus", 8)
    _end(client, slow, "gpu2", 1, JobState.TIMEOUT, failure="timeout", reason="ran past its time limit of 1h00m")
    load.failed = [oom.id, slow.id]
    # Running: alice on one card, bob on both cards of gpu2 (one 2-card job), carol beside alice.
    for user, name, gib, node, cards in (("alice", "train-resnet50", 40, "gpu1", [0]),
                                         ("bob", "llm-finetune-7b", 60, "gpu2", [0, 1]),
                                         ("carol", "sweep-lr-0.003", 20, "gpu1", [1])):
        job = _job(client, user, name, gib, gpus=len(cards), age=1800)
        _start(client, job, node, cards)
        load.running.append(job.id)
    for node, index, used, util, temp in (("gpu1", 0, 36, 97, 71), ("gpu1", 1, 14, 55, 64),
                                          ("gpu2", 0, 58, 88, 78), ("gpu2", 1, 57, 86, 77)):
        _card(client, node, index, used=used * GIB, util=util, temp=temp)
    # Waiting: too big for any card's free memory now, one per priority.
    for user, name, gib, prio in (("carol", "eval-70b", 70, Priority.HIGH),
                                  ("alice", "train-vit-large", 60, Priority.MEDIUM),
                                  ("bob", HOSTILE_NAME, 58, Priority.LOW)):
        job = _job(client, user, name, gib, priority=prio, age=600)
        load.waiting.append(job.id)
        if name == HOSTILE_NAME:
            load.hostile = job.id
    now = time.time()
    if history_hours:
        _made_up_history(client, now, history_hours)
    else:
        timeline.record(client.r, client.keys, client.ledger.cards(), now)
    return load


def _made_up_history(client: Client, now: float, hours: int) -> None:
    """Minute samples for the last ``hours`` hours, growing as a busy day would (a screenshot's
    charts; the samples are what rig.timeline.record writes)."""
    import math

    start = int(now // 60 * 60) - hours * 3600
    done = failed = 0
    pipe = client.r.pipeline(transaction=False)
    for minute in range(hours * 60 + 1):
        at = start + minute * 60
        wave = 0.5 + 0.5 * math.sin(minute / 47.0)
        done += int(minute % max(1, int(6 - 4 * wave)) == 0)
        failed += int(minute % 97 == 0)
        sample = timeline.Sample(at=at, succeeded=done, failed=failed, cancelled=minute // 240,
                                 used=int((60 + 150 * wave) * GIB), reserved=int((90 + 170 * wave) * GIB),
                                 usable=4 * int(CARD_TOTAL * 0.95))
        pipe.zadd(client.keys.timeline, {sample.encode(): at})
    pipe.execute()
