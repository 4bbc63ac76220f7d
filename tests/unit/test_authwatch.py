"""rig.authwatch: a silent node whose logins Redis refuses is named, with the refusals; a node
at another address, an up node, and a Redis with no ACL LOG get nothing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
import redis

from rig.authwatch import annotate, refusals
from rig.nodes import NodeInfo


class _Log:
    def __init__(self, entries: list[dict] | Exception) -> None:
        self.entries = entries

    def acl_log(self, count: int) -> list[dict]:
        if isinstance(self.entries, Exception):
            raise self.entries
        return self.entries


def _entry(addr: str, age: float = 3.0, count: int = 40) -> dict:
    return {"reason": "auth", "username": "default", "count": count, "age-seconds": age,
            "client-info": {"addr": addr}}


def _node(name: str, host: str, state: str = "silent") -> NodeInfo:
    return NodeInfo(name=name, alive=state == "up", state=state, since=1.0, last_seen=1.0, host=host)


def test_a_silent_node_whose_logins_are_refused_is_named():
    here, far, up = _node("a", socket.gethostname()), _node("b", "no-such-host.invalid"), \
        _node("c", socket.gethostname(), "up")
    annotate(_Log([_entry("127.0.0.1:5555"), _entry("10.9.9.9:1", count=2)]), [here, far, up])
    assert here.auth_refused and here.auth_refused.startswith("node a cannot authenticate to Redis since ")
    assert "refused 40 login(s) from 127.0.0.1 (user default), the last 3 s ago" in here.auth_refused
    assert "cannot authenticate" in here.describe
    assert far.auth_refused is None and up.auth_refused is None


def test_old_refusals_and_a_redis_without_acl_log_say_nothing():
    node = _node("a", socket.gethostname())
    annotate(_Log([_entry("127.0.0.1:5555", age=900)]), [node])
    assert node.auth_refused is None
    annotate(_Log(redis.ResponseError("unknown command 'ACL'")), [node])
    assert node.auth_refused is None and refusals(_Log(redis.ConnectionError("x"))) == []


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_real_redis_refusing_an_old_password(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", "new"],
                            stdout=subprocess.DEVNULL)
    try:
        good = redis.Redis(port=port, password="new", decode_responses=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                good.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="old").ping()
        node = _node("a", socket.gethostname())
        annotate(good, [node])
        assert node.auth_refused and "from 127.0.0.1 (user default)" in node.auth_refused
    finally:
        proc.kill()
        proc.wait()
