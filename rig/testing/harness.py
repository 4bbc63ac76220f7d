"""A real rig node for tests and scenario scripts: real Redis (a private key prefix), real Celery
worker processes on fake cards, real subprocess jobs. Started through the same Stack that
``rig up`` uses, and removed (its keys included) by ``cleanup``.

``RigCluster`` runs several such nodes, each with its own name, home and fake cards, against
one Redis and one key prefix: the servers of one cluster, on one machine. ``RigHarness.kill``
takes a node away as a power cut would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from rig.client import Client
from rig.config import Settings, load_settings
from rig.keys import Keys
from rig.models import JobState
from rig.redis_conn import connect
from rig.sentinel_url import is_sentinel
from rig.stack import Stack, UpOptions

DEFAULT_REDIS_URL = os.environ.get("RIG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """Remove every key under ``prefix`` (this node's keys only)."""
    batch = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def new_prefix() -> str:
    """A key prefix no other test uses."""
    return f"rigtest:{uuid.uuid4().hex[:10]}:"


class RigHarness:
    """One node. With ``prefix`` it joins the keys of another harness (a cluster); otherwise
    it owns a fresh prefix and ``cleanup`` deletes it."""

    def __init__(self, home: Path, *, fake_gpus: str = "8x80G", redis_url: str | None = None,
                 prefix: str | None = None, node_name: str = "testnode", **overrides: Any) -> None:
        self.prefix = prefix or new_prefix()
        self.owns_prefix = prefix is None
        values = dict(
            home=home, redis_url=redis_url or DEFAULT_REDIS_URL, key_prefix=self.prefix,
            fake_gpus=fake_gpus, node_name=node_name, kill_grace_seconds=2.0,
            telemetry_interval=0.5, vram_reserve_fraction=0.05, max_task_per_gpu=4,
            # Its own gateway socket: never the host's /run/rig/gateway.sock (rig.gateway.paths),
            # and short (a Unix socket path has at most 107 bytes; tmp_path is long).
            gateway_socket=Path(tempfile.gettempdir()) / "rig-test-gateways" / f"{uuid.uuid4().hex[:12]}.sock",
        )
        values.update(overrides)
        self.settings: Settings = load_settings(**values)
        self.keys = Keys(self.prefix)
        # A sentinel:// URL needs rig's client (the sentinels' master); others keep the plain one.
        url = self.settings.redis_url
        self.redis = connect(url) if is_sentinel(url) else redis.Redis.from_url(url, decode_responses=True)
        self.client = Client(self.settings)
        self.stack: Stack | None = None
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self.restart_children = True

    def up(self, *, beat: bool = False, gateway: bool = False, flower: bool = False) -> RigHarness:
        """Start the node's workers (and beat, the gateway, Flower: tests that use them ask)."""
        self.stack = Stack(self.settings, UpOptions(no_flower=not flower, no_beat=not beat, no_metrics=True,
                                                    no_gateway=not gateway), say=lambda m: None)
        self.stack.up()
        missing = self.stack.wait_ready(timeout=120)
        if missing:
            raise RuntimeError(f"workers never reported: {missing}")
        self._stop_polling.clear()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()
        return self

    @property
    def name(self) -> str:
        return self.settings.node_name

    def _poll(self) -> None:
        # What `rig up` does in its main loop: restart children that died, heartbeat the node.
        while not self._stop_polling.wait(0.2):
            if self.stack is not None and self.restart_children:
                self.stack.supervise_once()

    def down(self) -> None:
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
        if self.stack is not None:
            self.stack.down()
            self.stack = None

    def cleanup(self) -> None:
        self.down()
        # rig down leaves jobs running by design; a test that failed before letting its jobs
        # end must not leave them looping on the host (14 such loops loaded a later CI run).
        try:
            self.kill_jobs()
        except TimeoutError:
            pass
        self.drop_fake_jobs_dir()
        if not self.owns_prefix:
            return  # the cluster's keys go with the cluster
        try:
            delete_prefix(self.redis, self.prefix)
        except redis.RedisError:
            pass

    def drop_fake_jobs_dir(self) -> None:
        """Remove this node's folder of the jobs' fake-card usage (rig.gpus.fake.jobs_dir_for:
        on a root host /run/rig/fake-gpus-<digest>, outside its home): its card workers drop a
        job's folder when the attempt ends, but the jobs killed with the node never end there,
        and every benchmark stopped mid-run left one folder with a job-N folder per running job."""
        if not self.settings.fake_gpus:
            return
        from rig.gpus.fake import jobs_dir_for

        shutil.rmtree(jobs_dir_for(self.settings.fake_usage_dir), ignore_errors=True)

    def kill(self, timeout: float = 10.0, *, jobs: bool = True) -> list[tuple[int, int]]:
        """Take this node away as a power cut would: SIGKILL every process group rig started
        here (workers, beat) and every job process of this node, and stop heartbeating.
        Nothing runs a shutdown path. Returns (job id, attempt) of the job processes killed,
        once they are all gone. With ``jobs=False`` only rig's processes die and the jobs run
        on, as when rig crashes or the node is cut off from Redis."""
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
            self._poller = None
        stack, self.stack = self.stack, None
        if stack is not None:
            for child in stack.children:
                if child.proc is not None and child.proc.poll() is None:
                    try:
                        os.killpg(child.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for child in stack.children:
                if child.proc is not None:
                    child.proc.wait(timeout)
            if stack.backend is not None:
                stack.backend.close()
            stack.release_home()  # a killed rig up's lock dies with it
        return self.kill_jobs(timeout) if jobs else []

    def kill_jobs(self, timeout: float = 10.0) -> list[tuple[int, int]]:
        """SIGKILL every job process of this node (and its session); (job id, attempt) of those
        killed, once they are all gone."""
        killed: dict[int, tuple[int, int]] = {}
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.job_processes()
            if not jobs:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"job processes of node {self.name} outlived SIGKILL: {sorted(jobs)}")
            for pid, job in jobs.items():
                killed.setdefault(pid, job)
                try:
                    sid = os.getsid(pid)
                    if sid > 1 and sid != os.getsid(0):  # never our own session
                        os.killpg(sid, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        return sorted(set(killed.values()))

    def job_processes(self) -> dict[int, tuple[int, int]]:
        """pid -> (job id, attempt) of the live job processes this node started."""
        from workers.process_tree import environments

        want = (f"RIG_KEY_PREFIX={self.prefix}".encode(), f"RIG_NODE_NAME={self.name}".encode())
        found = {}
        for pid, env in environments():
            if want[0] not in env or want[1] not in env:
                continue
            values = dict(item.split(b"=", 1) for item in env if b"=" in item)
            try:
                found[pid] = (int(values[b"RIG_JOB_ID"]), int(values[b"RIG_ATTEMPT"]))
            except (KeyError, ValueError):
                continue
        return found

    def child(self, name: str):  # noqa: ANN201 - rig.stack.Child
        assert self.stack is not None
        return next(c for c in self.stack.children if c.name == name)

    def worker_pid(self, name: str) -> int:
        value = self.redis.get(self.keys.worker(name))
        if not value:
            raise LookupError(f"no heartbeat from {name}")
        return int(json.loads(value)["pid"])

    def wait_for_state(self, job_id: int, states: set[JobState], timeout: float = 30.0) -> JobState:
        """Block on the events channel until the job is in one of ``states``."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self.keys.events_channel)
        try:
            deadline = time.monotonic() + timeout
            while True:
                state = self.client.get(job_id).state
                if state in states:
                    return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id} stayed {state.value}, wanted {states}")
                pubsub.get_message(timeout=min(remaining, 1.0))
        finally:
            pubsub.close()

    def leaked_bytes(self) -> int:
        """Memory still reserved on any card (0 when every job has ended)."""
        return sum(c.reserved for c in self.client.ledger.cards())

    def orphans(self) -> list[int]:
        """Live processes started for this node's jobs (found by their environment)."""
        from workers.process_tree import environments

        needle = f"RIG_KEY_PREFIX={self.prefix}".encode()
        return [pid for pid, env in environments()
                if needle in env and any(e.startswith(b"RIG_JOB_ID=") for e in env)]


class RigCluster:
    """Several harness nodes on one Redis under one key prefix, e.g.
    ``RigCluster(tmp, {"n1": "2x80G", "n2": "2x40G"}, health={...})``. Each node has its own
    home (logs, pid files, fake-card usage) and name; ``cleanup`` stops them all and deletes
    the shared keys."""

    def __init__(self, root: Path, nodes: dict[str, str], **overrides: Any) -> None:
        self.prefix = new_prefix()
        self.nodes = {name: RigHarness(root / name, fake_gpus=spec, prefix=self.prefix, node_name=name,
                                       **overrides)
                      for name, spec in nodes.items()}
        first = next(iter(self.nodes.values()))
        self.keys, self.redis, self.client = first.keys, first.redis, first.client

    def __getitem__(self, name: str) -> RigHarness:
        return self.nodes[name]

    def leaked_bytes(self) -> int:
        return next(iter(self.nodes.values())).leaked_bytes()

    def cleanup(self) -> None:
        for node in self.nodes.values():
            node.cleanup()
        try:
            delete_prefix(self.redis, self.prefix)
        except redis.RedisError:
            pass
