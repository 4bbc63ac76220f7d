"""Shared fixtures. Every test owns its Redis keys through a unique key prefix; nothing here
ever flushes a database."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable, Iterator
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


#: A pid above any pid_max (2**22): no process has it, so a test that hides it signals nobody.
HIDDEN_PID = 999_999_999


@pytest.fixture
def hidden_by_proc(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, type[OSError]], None]:
    """``hide(pid, error)``: from now on this test reads ``pid`` as a process of another user on
    a host whose /proc is mounted ``hidepid``: reading /proc/<pid>/stat raises ``error``
    (FileNotFoundError: hidepid=2, the entry is absent; PermissionError: hidepid=1, it cannot be
    read) and ``os.kill(pid, sig)`` raises EPERM (the kernel says it runs, and is not ours)."""
    import builtins

    import workers.process_tree as process_tree

    hidden: dict[int, type[OSError]] = {}
    real_open, real_kill = builtins.open, os.kill

    def proc_open(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - open's own
        for pid, error in hidden.items():
            if str(path).startswith(f"/proc/{pid}/"):
                raise error(errno.ENOENT if error is FileNotFoundError else errno.EACCES, "hidden", str(path))
        return real_open(path, *args, **kwargs)

    def kill(pid: int, sig: int) -> None:
        if pid in hidden:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr(process_tree, "open", proc_open, raising=False)
    monkeypatch.setattr(process_tree.os, "kill", kill)
    return lambda pid, error=FileNotFoundError: hidden.__setitem__(pid, error)


@pytest.fixture(autouse=True)
def _fresh_auth_gates() -> Iterator[None]:
    """A refused password in one test must not hold back the logins of the next (rig.authgate)."""
    from rig.authgate import reset_all

    reset_all()
    yield
    reset_all()
