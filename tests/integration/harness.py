"""A real rig node for tests: real Redis (a private key prefix), real Celery worker processes on
fake cards, real subprocess jobs. Started through the same Stack that `rig up` uses."""

from __future__ import annotations

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
from rig.stack import Stack, UpOptions
from tests.conftest import REDIS_URL, delete_prefix


class RigHarness:
    def __init__(self, home: Path, *, fake_gpus: str = "8x80G", **overrides: Any) -> None:
        self.prefix = f"rigtest:{uuid.uuid4().hex[:10]}:"
        values = dict(
            home=home, redis_url=REDIS_URL, key_prefix=self.prefix, fake_gpus=fake_gpus,
            node_name="testnode", kill_grace_seconds=2.0, telemetry_interval=0.5,
            vram_reserve_fraction=0.05, max_task_per_gpu=4,
        )
        values.update(overrides)
        self.settings: Settings = load_settings(**values)
        self.keys = Keys(self.prefix)
        self.redis = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.client = Client(self.settings)
        self.stack: Stack | None = None
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()

    def up(self, *, beat: bool = False) -> RigHarness:
        self.stack = Stack(self.settings, UpOptions(no_flower=True, no_beat=not beat), say=lambda m: None)
        self.stack.up()
        missing = self.stack.wait_ready(timeout=120)
        assert not missing, f"workers never reported: {missing}"
        self._stop_polling.clear()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()
        return self

    def _poll(self) -> None:
        # What `rig up` does in its main loop: restart children that died.
        while not self._stop_polling.wait(0.2):
            if self.stack is not None:
                self.stack.poll_children()

    def down(self) -> None:
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
        if self.stack is not None:
            self.stack.down()
            self.stack = None

    def cleanup(self) -> None:
        self.down()
        delete_prefix(self.redis, self.prefix)

    def worker_pid(self, name: str) -> int:
        import json

        value = self.redis.get(self.keys.worker(name))
        assert value, f"no heartbeat from {name}"
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
                assert remaining > 0, f"job {job_id} stayed {state.value}, wanted {states}"
                pubsub.get_message(timeout=min(remaining, 1.0))
        finally:
            pubsub.close()
