"""A URL that reaches a server of the wrong kind (a sentinel through redis://, a plain Redis
through sentinel://, a Redis Cluster node) is one line and exit 6 from every client, whatever
password rig sends (rig.server_kind). Real throwaway servers on free ports, started once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rig import sentinel_url
from rig.errors import ConfigError
from rig.redis_conn import connect
from rig.server_kind import probe_mode
from rig.testing.sentinel_set import free_port, redis_server_binary

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, int]]:  # noqa: ANN001
    """Ports of a plain Redis, a sentinel (no password) monitoring it as 'rigm', a cluster node,
    and a plain Redis and a sentinel that want a password ('pw', 'spw': *_pw)."""
    work = tmp_path_factory.mktemp("kinds")
    ports = {"plain": free_port(), "sentinel": free_port(), "cluster": _cluster_port(),
             "plain_pw": free_port(), "sentinel_pw": free_port()}
    (work / "s.conf").write_text(f"port {ports['sentinel']}\nbind 127.0.0.1\n"
                                 f"sentinel monitor rigm 127.0.0.1 {ports['plain']} 1\n")
    (work / "s_pw.conf").write_text(f"port {ports['sentinel_pw']}\nbind 127.0.0.1\nrequirepass spw\n"
                                    f"sentinel monitor rigm 127.0.0.1 {ports['plain']} 1\n")
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args = {"plain": ["--port", str(ports["plain"]), *common],
            "sentinel": [str(work / "s.conf"), "--sentinel"],
            "plain_pw": ["--port", str(ports["plain_pw"]), *common, "--requirepass", "pw"],
            "sentinel_pw": [str(work / "s_pw.conf"), "--sentinel"],
            "cluster": ["--port", str(ports["cluster"]), *common, "--cluster-enabled", "yes",
                        "--cluster-config-file", str(work / "nodes.conf")]}
    procs = {name: subprocess.Popen([redis_server_binary(), *a], cwd=work, stdout=(work / f"{name}.log").open("w"),
                                    stderr=subprocess.STDOUT) for name, a in args.items()}
    try:
        deadline = time.monotonic() + 20
        for name, port in ports.items():
            while True:
                password = {"plain_pw": "pw", "sentinel_pw": "spw"}.get(name)
                with contextlib.suppress(redis.ConnectionError), redis.Redis(port=port, password=password) as probe:
                    probe.ping()
                    break
                log = (work / f"{name}.log").read_text()[-500:]
                assert procs[name].poll() is None, f"the {name} server exited: {log}"
                assert time.monotonic() < deadline, f"the {name} server never answered on {port}: {log}"
                time.sleep(0.05)
        yield ports
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000, below 65536) is free too."""
    import socket

    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
                return port


def _refused(url: str) -> str:
    client = connect(url)
    with pytest.raises(ConfigError) as info:
        client.smembers("rig-kind-test:x")
    client.close()
    text = str(info.value)
    assert "\n" not in text and "pw" not in text
    return text


@pytest.mark.parametrize("creds", ["", ":pw@"])
def test_redis_url_on_a_sentinel_port_names_the_sentinel_form(servers, creds):
    port = servers["sentinel"]
    text = _refused(f"redis://{creds}127.0.0.1:{port}/0")
    assert text.startswith("that port is a Redis Sentinel") and f"sentinel://127.0.0.1:{port}/rigm/0" in text


@pytest.mark.parametrize("query", ["", "?sentinel_password=pw"])
def test_sentinel_url_on_a_plain_redis_says_it_is_no_sentinel(servers, query):
    port = servers["plain"]
    text = _refused(f"sentinel://127.0.0.1:{port}/rigm/0{query}")
    assert "is a plain Redis" in text and f"redis://127.0.0.1:{port}/0" in text


@pytest.mark.parametrize("query", ["", "?sentinel_password=wrong", "?sentinel_password=pw"])
def test_sentinel_url_on_a_plain_redis_with_a_password_says_it_is_no_sentinel(servers, query):
    """Issue 15: it said "refused the sentinel password" (redis-py's HELLO is refused by both
    kinds alike before anything; the command table tells them apart)."""
    port = servers["plain_pw"]
    text = _refused(f"sentinel://127.0.0.1:{port}/rigm/0{query}")
    assert "is a plain Redis" in text and f"redis://127.0.0.1:{port}/0" in text
    why, failover = sentinel_url.parse(f"sentinel://127.0.0.1:{port}/rigm/0{query}").diagnose()
    assert "is a plain Redis" in why and not failover


@pytest.mark.parametrize(("creds", "name"), [("", "MASTER_NAME"), (":spw@", "rigm"), (":wrong@", "MASTER_NAME")])
def test_redis_url_on_a_sentinel_port_with_a_password_names_the_sentinel_form(servers, creds, name):
    """The master's name is read only with the sentinel's own password (rig's, in the URL)."""
    port = servers["sentinel_pw"]
    text = _refused(f"redis://{creds}127.0.0.1:{port}/0")
    assert text.startswith("that port is a Redis Sentinel") and f"sentinel://127.0.0.1:{port}/{name}/0" in text


def test_the_kind_is_told_without_the_password(servers):
    kinds = {name: probe_mode("127.0.0.1", port) for name, port in servers.items() if name != "cluster"}
    assert kinds == {"plain": "standalone", "sentinel": "sentinel", "plain_pw": "standalone",
                     "sentinel_pw": "sentinel"}


def test_a_plain_redis_among_the_sentinels_is_warned_about_at_rig_up(servers):
    """A plain Redis listed after a sentinel is never asked (the sentinel answers first):
    `rig up` names it."""
    url = f"sentinel://127.0.0.1:{servers['sentinel']},127.0.0.1:{servers['plain_pw']}/rigm/0"
    assert connect(url).ping()
    lines = [n for n in sentinel_url.parse(url).notices(30.0) if "is a plain Redis" in n]
    assert len(lines) == 1 and f"127.0.0.1:{servers['plain_pw']}, listed as a sentinel" in lines[0]


def test_a_listed_sentinel_that_does_not_answer_is_warned_about_at_rig_up(servers):
    """One dead sentinel among live ones: rig works, and nothing said that a typo in its port
    (or one never started) leaves fewer sentinels than the operator counts on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: nothing listens there
    url = f"sentinel://127.0.0.1:{dead},127.0.0.1:{servers['sentinel']}/rigm/0"
    assert connect(url).ping()
    lines = [n for n in sentinel_url.parse(url).notices(30.0) if "does not answer" in n]
    assert len(lines) == 1 and lines[0].startswith(f"the sentinel at 127.0.0.1:{dead} listed in redis_url")
    assert f"127.0.0.1:{servers['sentinel']}" not in lines[0]


def test_rig_up_refuses_a_plain_redis_among_the_sentinels(servers, tmp_path):
    """Warned of only, it was asked for the master at the first fail-over (the sentinels before
    it not answering then): every command said exit 6 and rig up stopped, leaving its job."""
    from rig.config import load_settings
    from rig.errors import ConfigError
    from rig.stack import Stack, UpOptions

    url = f"sentinel://127.0.0.1:{servers['sentinel']},127.0.0.1:{servers['plain_pw']}/rigm/0"
    stack = Stack(load_settings(home=tmp_path / "home", redis_url=url), UpOptions(), say=lambda _line: None)
    with pytest.raises(ConfigError) as refused:
        stack._ensure_redis()
    line = str(refused.value)
    assert f"127.0.0.1:{servers['plain_pw']}, listed as a sentinel" in line and "rig up refuses it" in line
    assert refused.value.exit_code == 6 and "\n" not in line


def test_a_cluster_node_is_refused(servers):
    assert "Redis Cluster node" in _refused(f"redis://127.0.0.1:{servers['cluster']}/0")


def test_the_right_kinds_work(servers):
    assert connect(f"redis://127.0.0.1:{servers['plain']}/0").ping()
    assert connect(f"sentinel://127.0.0.1:{servers['sentinel']}/rigm/0").ping()


@pytest.mark.parametrize(("command", "kind"), [(["rig", "status"], "sentinel"), (["rig-submit", "--gpu-memory", "1G", "--", "true"], "cluster")])
def test_every_command_refuses_in_one_line_with_exit_6(servers, tmp_path, command, kind):
    env = {**os.environ, "RIG_HOME": str(tmp_path), "RIG_KEY_PREFIX": "{rig}:",
           "RIG_REDIS_URL": f"redis://127.0.0.1:{servers[kind]}/0"}
    exe = Path(sys.executable).parent / command[0]
    done = subprocess.run([str(exe), *command[1:]], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 6, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_sentinels_without_a_quorum_say_they_cannot_fail_over(servers, tmp_path):
    """Two of three sentinels down, then the master: it said "a fail-over in progress" for
    good (none could start until the others were back); a lone sentinel with quorum 2 is the
    same to SENTINEL CKQUORUM."""
    port = free_port()
    (tmp_path / "q.conf").write_text(f"port {port}\nbind 127.0.0.1\n"
                                     f"sentinel monitor rigm 127.0.0.1 {servers['plain']} 2\n")
    proc = subprocess.Popen([redis_server_binary(), str(tmp_path / "q.conf"), "--sentinel"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.ConnectionError), redis.Redis(port=port) as probe:
                probe.ping()
                break
            assert proc.poll() is None and time.monotonic() < deadline, "the sentinel never answered"
            time.sleep(0.05)  # polling: a starting server signals nothing
        why, failover = sentinel_url.parse(f"sentinel://127.0.0.1:{port}/rigm/0").diagnose()
        assert "cannot fail over: 1 usable Sentinels (SENTINEL CKQUORUM)" in why and "in progress" not in why
        assert "SENTINEL FAILOVER rigm" in why and "\n" not in why
        assert failover  # retried: the sentinels may be back within the window
        why, _ = sentinel_url.parse(f"sentinel://127.0.0.1:{servers['sentinel']}/rigm/0").diagnose()
        assert "a fail-over in progress" in why  # quorum 1 of 1: nothing stops one
    finally:
        proc.kill()
        proc.wait()
