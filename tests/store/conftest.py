"""The store tests' ledger: fake cards registered on this test's backend (the parametrised
``redis_client`` of tests/conftest.py: fakeredis[lua] and real Redis) under its key prefix."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest
import redis

from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB


def add_cards(ledger: Ledger, cards: int = 1, gib: float = 40, *, node: str = "n1", max_jobs: int = 4,
              first: int = 0, uuid: str = "u{index}", reserve_fraction: float = 0.0,
              allowed: bool | Collection[int] = True) -> Ledger:
    """Register ``cards`` fake cards of ``gib`` GiB each on ``node`` (indexes ``first`` on,
    each taking at most ``max_jobs`` jobs, ``reserve_fraction`` of its memory kept back) and
    return ``ledger``. ``uuid`` is formatted with ``index`` and ``node``; ``allowed``: every
    card, none, or the indexes the whitelist lets rig use."""
    for index in range(first, first + cards):
        ledger.register_card(node, GpuReading(index=index, uuid=uuid.format(index=index, node=node), model="m",
                                              total=int(gib * GIB)),
                             max_jobs=max_jobs, reserve_fraction=reserve_fraction,
                             allowed=allowed if isinstance(allowed, bool) else index in allowed, fake=True)
    return ledger


def ledger_with_cards(client: redis.Redis, key_prefix: str, cards: int = 1, gib: float = 40,
                      **card: object) -> Ledger:
    """A Ledger on ``client`` under ``key_prefix`` with :func:`add_cards`'s cards (none for
    ``cards=0``). For a test bound to one backend (real Redis: ``real_redis``, ``cli_env``)."""
    return add_cards(Ledger(client, Keys(key_prefix)), cards, gib, **card)  # type: ignore[arg-type]


@pytest.fixture
def make_ledger(redis_client: redis.Redis, key_prefix: str) -> Callable[..., Ledger]:
    """``make_ledger(cards=1, gib=40, node="n1", max_jobs=4, ...)``: a Ledger on this test's
    backend with those fake cards (:func:`add_cards` says each option)."""
    return lambda cards=1, gib=40, **card: ledger_with_cards(redis_client, key_prefix, cards, gib, **card)
