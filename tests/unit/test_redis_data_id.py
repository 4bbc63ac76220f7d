"""The private Redis' data id (rig.redis_server): recording one fsyncs that one write only."""

from __future__ import annotations

import pytest
import redis

from rig import redis_server


class RefusingWrites:
    """A Redis that takes CONFIG SET but refuses writes (a full disk: MISCONF)."""

    def __init__(self) -> None:
        self.config: dict[str, str] = {"appendfsync": "everysec"}

    def config_set(self, name: str, value: str) -> None:
        self.config[name] = value

    def set(self, *_args: object) -> None:
        raise redis.ResponseError("MISCONF Errors writing to the AOF file")


def test_a_refused_data_id_write_leaves_every_write_fsynced_no_longer():
    server = RefusingWrites()
    with pytest.raises(redis.ResponseError):
        redis_server._record_data_id(server)  # type: ignore[arg-type]
    assert server.config["appendfsync"] == "everysec"
