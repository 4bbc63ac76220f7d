"""`rig log -f` through the gateway (as a user who cannot read rig's log folder does it), on a real
card worker: a log whose folder is deleted while the job runs is followed in the file its keeper
makes again, from that file's start, with one line on stderr; a log the keeper cuts to its cap
is shown as when read directly (every line once and in order, the marker where output not read
yet was cut, the job's last line), with the one line saying it was cut; the follower uses next
to no CPU while it waits (it polls every POLL_S, one request a poll)."""

from __future__ import annotations

import io
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.cli.logview import show_log
from rig.client import Client
from rig.config import Settings, load_settings
from rig.gateway.client import GatewayClient
from rig.gateway.server import Gateway, bind
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.logs import job_folder
from rig.memory import GIB
from rig.models import Job
from tests.conftest import REDIS_URL
from tests.integration.test_card_runner import placed
from tests.integration.test_keeper_death import _until
from workers.card_runner import CardRunner, read_pid_file

pytestmark = pytest.mark.redis

MADE_AGAIN = "was deleted and made again"
CAP = 64 * 1024


@pytest.fixture
def node(real_redis, key_prefix, tmp_path) -> Iterator[tuple[Settings, Ledger, CardRunner, GatewayClient]]:
    """One fake card's worker (log cap CAP) and the node's gateway, served in this process."""
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", kill_grace_seconds=1.0, log_max_bytes=CAP)
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-{key_prefix.split(':')[1]}.sock")
    server = bind(path, Gateway(settings, Client(settings, redis_client=real_redis)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    client = GatewayClient(settings, path)
    yield settings, ledger, runner, client
    client.close()
    runner.stop()
    server.shutdown()
    server.server_close()
    path.unlink(missing_ok=True)


def _follow_through(client: GatewayClient, ledger: Ledger, job: Job, out: io.BytesIO, said: list[str],
                    cpu: list[tuple[float, float]]) -> threading.Thread:
    """`rig log -f` as the CLI runs it for a user without Redis' password (rig.cli.main)."""
    def follow() -> None:
        began, wall = time.thread_time(), time.monotonic()
        show_log(lambda: client.get(job.id), attempt=None, follow=True, out=out, say=said.append,
                 open_log=lambda path: client.open_log(job.id, path),
                 exists=lambda path: client.log_exists(job.id, path))
        cpu.append((time.thread_time() - began, time.monotonic() - wall))

    return threading.Thread(target=follow)


def test_follow_through_the_gateway_goes_on_in_a_log_made_again(node, tmp_path):
    settings, ledger, runner, client = node
    go, end = tmp_path / "go", tmp_path / "end"
    job, token = placed(ledger, f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; i=0; "
                                f"while [ ! -e {end} ]; do echo after $i; i=$((i+1)); sleep 0.02; done; "
                                "echo the-last-line", tmp_path)
    folder = job_folder(settings.job_log_dir, job.id, job.instance)
    log = folder / "attempt-1.log"
    out, said, cpu = io.BytesIO(), [], []
    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    worker.start()
    follower = _follow_through(client, ledger, job, out, said, cpu)
    try:
        assert _until(lambda: log.exists() and read_pid_file(log.with_suffix(".pid")) is not None)
        follower.start()
        assert _until(lambda: out.getvalue() == b"before\n")
        shutil.rmtree(folder)
        go.touch()
        assert _until(lambda: any(MADE_AGAIN in line for line in said) and out.getvalue().count(b"after") >= 20)
    finally:
        go.touch()
        end.touch()
    worker.join(30)
    follower.join(30)
    assert results == ["SUCCEEDED"] and not follower.is_alive()
    text = out.getvalue()
    new = log.read_bytes()  # everything of the new file, from its first line (the keeper's) to the job's last
    assert new.startswith(b"[rig: this log was deleted") and text.endswith(new), (text[-300:], new[-300:])
    assert text.startswith(b"before\n") and text.endswith(b"the-last-line\n")
    assert sum(MADE_AGAIN in line for line in said) == 1
    assert said[-1] == f"--- job {job.id} SUCCEEDED after 1 attempt(s) ---"
    used, wall = cpu[0]
    assert used < 0.25 * wall, f"the follower used {used:.2f} s of CPU in {wall:.2f} s"


def test_follow_through_the_gateway_of_a_log_cut_to_its_cap(node, tmp_path):
    settings, ledger, runner, client = node
    go = tmp_path / "go"
    # Slow at first (the follower keeps up), then a burst far past the cap between two polls.
    job, token = placed(ledger, "i=0; while [ $i -lt 400 ]; do echo \"line $i yyyyyyyyyyyyyyyyyyyyyyyy\"; "
                                "i=$((i+1)); sleep 0.002; done; "
                                f"while [ ! -e {go} ]; do sleep 0.02; done; "
                                "seq 400 40000 | sed 's/.*/line & yyyyyyyyyyyyyyyyyyyyyyyy/'; echo the-last-line",
                        tmp_path)
    out, said, cpu = io.BytesIO(), [], []
    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(runner.run_job(job.id, token)))
    worker.start()
    follower = _follow_through(client, ledger, job, out, said, cpu)
    follower.start()
    try:
        assert _until(lambda: b"line 399 " in out.getvalue())
    finally:
        go.touch()
    worker.join(60)
    follower.join(30)
    assert results == ["SUCCEEDED"] and not follower.is_alive()
    text = out.getvalue()
    numbers = [int(n) for n in re.findall(rb"^line (\d+) ", text, re.M)]
    assert numbers == sorted(set(numbers)), "a line repeated or out of order"
    assert numbers[:400] == list(range(400)) and text.endswith(b"40000 yyyyyyyyyyyyyyyyyyyyyyyy\nthe-last-line\n")
    assert b"bytes of output were cut here" in text  # the burst was cut before it was read
    assert sum("log cut:" in line for line in said) == 1, said
    assert said[-1] == f"--- job {job.id} SUCCEEDED after 1 attempt(s) ---"
