"""Fixtures of the integration tests that drive a card runner directly (no Celery)."""

from __future__ import annotations

import pytest

from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from tests.conftest import REDIS_URL
from workers.card_runner import CardRunner


@pytest.fixture
def card_runner_env(real_redis, key_prefix, tmp_path):
    """One fake 80 GiB card n1/0 in the ledger (real Redis, this test's prefix) and the
    CardRunner of its worker "card0@n1", started without Celery or background services.
    Yields (settings, ledger, runner, listed): ``listed()`` is the card's start list as
    [(job id, token)] (workers.start_list; reserve.lua pushes there, adopt pushes lost ones)."""
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home",
                             node_name="n1", kill_grace_seconds=1.0)
    ledger = Ledger(real_redis, Keys(key_prefix))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    runner = CardRunner(settings, "n1", 0, "card0@n1")

    def listed() -> list[tuple[int, str]]:
        return [(int(i), t) for i, _, t in (e.partition(" ") for e in runner.starts.listed()[0])]

    yield settings, ledger, runner, listed
    runner.stop()
