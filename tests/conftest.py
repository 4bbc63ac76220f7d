"""Shared fixtures. Every test owns its Redis keys through a unique key prefix; nothing here
ever flushes a database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rig.testing.harness import delete_prefix
from tests import background

REDIS_URL = os.environ.get("RIG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
__all__ = ["REDIS_URL", "delete_prefix"]


def _real_redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


REAL_REDIS = _real_redis_available()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After -m/-k selection (trylast), with a real Redis: the background-marked tests go to a
    child pytest started now (tests/background.py), their stand-ins near the end."""
    if REAL_REDIS:
        background.move(config, items)
        # The fault scenarios' tests last: the scenarios run in the background from the start
        # (pytest_collection_finish) and those tests only collect what they found.
        items.sort(key=lambda item: item.nodeid.startswith(FAULT_TESTS))
        return
    skip = pytest.mark.skip(reason=f"no Redis at {REDIS_URL} (set RIG_TEST_REDIS_URL); .ci/run starts one")
    for item in items:
        if "redis" in item.keywords or "slow" in item.keywords:
            item.add_marker(skip)


FAULT_TESTS = "tests/integration/test_faults.py::"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the background child (tests/background.py): each phase's result for the parent."""
    background.record(report)


def pytest_collection_finish(session: pytest.Session) -> None:
    if REAL_REDIS and any(item.nodeid.startswith(FAULT_TESTS) for item in session.items):
        from tests.integration import test_faults

        test_faults.start_early(session)


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A fresh prefix; afterwards its keys are removed from the real Redis too, including the
    Celery queues that submissions' background messages (rig.notify) create there even when
    the test's own client is fakeredis."""
    prefix = f"rigtest:{uuid.uuid4().hex[:10]}:"
    yield prefix
    if REAL_REDIS:
        from rig import notify

        notify.flush(5.0)
        client = redis.Redis.from_url(REDIS_URL)
        try:
            delete_prefix(client, prefix)
        finally:
            client.close()


@pytest.fixture(params=["fakeredis", pytest.param("real", marks=pytest.mark.redis)])
def redis_client(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[redis.Redis]:
    """The same store/ledger tests on fakeredis[lua] and on a real Redis."""
    if request.param == "fakeredis":
        import fakeredis

        client = fakeredis.FakeRedis(decode_responses=True)
        yield client
        client.flushall()  # a private in-memory server: nobody else's data
        return
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    delete_prefix(client, key_prefix)
    client.close()


@pytest.fixture
def real_redis(key_prefix: str) -> Iterator[redis.Redis]:
    if not REAL_REDIS:
        pytest.skip(f"no Redis at {REDIS_URL}")
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    delete_prefix(client, key_prefix)
    client.close()


@pytest.fixture
def rig_home(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Path:
    """No RIG_* variable of the shell that runs the tests, a RIG_HOME of the test's own (the
    returned folder, not created) and the test's folder as working directory (so a ./rig.toml
    there is the test's own)."""
    for key in list(os.environ):
        if key.upper().startswith("RIG_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


@pytest.fixture
def cli_env(key_prefix: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The `rig` command line run in this process against real Redis under this test's key
    prefix, with a private RIG_HOME and none of the caller's RIG_* settings. Returns the prefix."""
    for key in list(os.environ):
        if key.startswith("RIG_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIG_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("RIG_REDIS_URL", REDIS_URL)
    monkeypatch.chdir(tmp_path)
    return key_prefix


@pytest.fixture(autouse=True)
def _fresh_auth_gates() -> Iterator[None]:
    """A refused password in one test must not hold back the logins of the next (rig.authgate)."""
    from rig.authgate import reset_all

    reset_all()
    yield
    reset_all()
