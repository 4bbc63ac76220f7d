#!/usr/bin/env python3
"""How much of a job's output a SIGKILL of its card's log keeper costs (workers/card_keeper.py).

A real card runner (no Celery) on a throwaway key prefix runs a job that writes numbered lines
without pause; once it has written some, the card's keeper is SIGKILLed at a random moment; the
job runs on for a while, then ends. The numbered lines missing from its log are what was lost
(the dead keeper had read them and not yet written them). Each trial says the job's state, its
attempt, and the lines / bytes lost.

    RIG_TEST_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python scripts/measure_keeper_death.py [TRIALS]

Two writers: ``sh`` (echo in a loop, ~1 line per write) and ``python`` (8 KiB writes as fast as
the pipe takes them, the keeper busy all the time).
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from rig.client import current_identity  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.gpus.base import GpuReading  # noqa: E402
from rig.keys import Keys  # noqa: E402
from rig.ledger import Ledger  # noqa: E402
from rig.logs import job_folder  # noqa: E402
from rig.memory import GIB  # noqa: E402
from rig.models import Job, JobState, Priority  # noqa: E402
from workers.card_runner import CardRunner, read_pid_file  # noqa: E402

WRITERS = {
    "sh": "i=0; while [ ! -e {go} ]; do echo line $i; i=$((i+1)); done",
    "python": ("python3 -c \"import os, sys\ni = 0\nout = open(1, 'w', buffering=8192)\n"
               "while i % 1000 or not os.path.exists(sys.argv[1]):\n    out.write('line %d\\n' % i); i += 1\n\" {go}"),
}


def lost(text: bytes) -> tuple[int, int, int]:
    """(lines written in all, lines missing, bytes missing) of the numbered output."""
    numbers = sorted({int(n) for n in re.findall(rb"^line (\d+)$", text, re.M)})
    missing = set(range(numbers[0], numbers[-1] + 1)) - set(numbers)
    return numbers[-1] + 1, len(missing), sum(len(b"line %d\n" % n) for n in missing)


def trial(runner: CardRunner, ledger: Ledger, settings, work: Path, writer: str) -> str:  # noqa: ANN001
    go = work / f"go-{uuid.uuid4().hex[:6]}"
    job = ledger.store.create(Job(
        id=0, name="keeper-death", user=current_identity().name, command=["/bin/sh", "-c", WRITERS[writer].format(go=go)],
        shell=True, gpu_memory=GIB, gpus=1, priority=Priority.MEDIUM, state=JobState.PENDING, workdir=str(work),
        created_at=time.time()))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok, token
    log = job_folder(settings.job_log_dir, job.id, job.instance) / "attempt-1.log"
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(runner.run_job(job.id, token)))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (log.exists() and log.stat().st_size > 10_000
                                                    and read_pid_file(log.with_suffix(".pid"))):
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.2))  # any moment of its copying
        dead = read_pid_file(log.with_suffix(".pid"))[3]
        os.kill(dead, signal.SIGKILL)
        killed = time.monotonic()
        while (read_pid_file(log.with_suffix(".pid")) or (0, 0, 0, dead))[3] in (dead, None) \
                and time.monotonic() - killed < 10:
            time.sleep(0.001)
        took_over = time.monotonic() - killed  # until the pid file names the new keeper
        time.sleep(0.5)  # the job writes on into the new keeper
    finally:
        go.touch()
    thread.join(60)
    done = ledger.store.get(job.id)
    written, lines, nbytes = lost(log.read_bytes())
    return (f"{writer:6} {done.state.value:9} attempt {done.attempt}  lines written {written:>10,}  "
            f"new keeper after {took_over * 1000:5.0f} ms  lost {lines} line(s), {nbytes} bytes")


def main() -> int:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    url = os.environ.get("RIG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    work = Path(tempfile.mkdtemp(prefix="rig-keeper-death-"))
    prefix = f"rigkd:{uuid.uuid4().hex[:8]}:"
    settings = load_settings(key_prefix=prefix, redis_url=url, home=work / "home", node_name="n1")
    r = redis.Redis.from_url(url, decode_responses=True)
    ledger = Ledger(r, Keys(prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB), max_jobs=4,
                         reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    try:
        for _ in range(trials):
            for writer in WRITERS:
                print(trial(runner, ledger, settings, work, writer), flush=True)
    finally:
        runner.stop()
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
