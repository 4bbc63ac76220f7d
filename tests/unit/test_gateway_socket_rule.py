"""Where a node's gateway listens: one rule (rig.gateway.paths.node_socket). A tester's root
test install (a RIG_HOME and Redis of its own) took the host's /run/rig/gateway.sock, and one
restart used gateway-vm.sock instead, depending on whether something answered there."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rig.config import load_settings
from rig.errors import StackError
from rig.gateway import paths
from rig.gateway.paths import SYSTEM_SOCKET, home_socket, node_socket
from rig.stack import Stack, UpOptions


@pytest.fixture
def root(monkeypatch, tmp_path):
    """This process seen as root, its $HOME at tmp_path/root (so ~/.rig is tmp_path/root/.rig)."""
    monkeypatch.setattr(paths.os, "geteuid", lambda: 0)
    monkeypatch.setenv("HOME", str(tmp_path / "root"))
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "root"))
    return tmp_path


def test_a_root_install_with_a_home_of_its_own_never_takes_the_hosts_socket(root):
    own = load_settings(home=root / "test-home", node_name="vm")
    assert node_socket(own) == home_socket(own) == root / "test-home/run/gateway-vm.sock"


def test_the_hosts_root_node_takes_the_system_socket_whatever_answers_there(root):
    host = load_settings(home=root / "root/.rig", node_name="vm")
    assert node_socket(host) == SYSTEM_SOCKET  # no probe of the socket: the same answer every start


def test_rig_up_says_which_socket_it_serves_and_refuses_one_already_served(tmp_path, monkeypatch):
    # pytest's folders are 0700: a root rig up rightly says users cannot reach a socket there
    # (tests/unit/test_web_addresses.py); not what this test is about.
    monkeypatch.setattr("rig.gateway.server.reach_problem", lambda path: None)
    settings = load_settings(home=tmp_path / "h", node_name="g", gateway_socket=tmp_path / "g.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(tmp_path / "g.sock"))
        other.listen()
        stack = Stack(settings, UpOptions(only=("gateway",)), say=lambda _: None)
        stack.stop_leftovers = lambda: None  # type: ignore[method-assign]
        stack._ensure_redis = lambda: None  # type: ignore[method-assign]
        stack._check_installation = lambda: None  # type: ignore[method-assign]
        with pytest.raises(StackError, match=rf"another gateway answers at {tmp_path}/g.sock .*gateway_socket"):
            stack.up()
        stack.gateway_path = tmp_path / "g.sock"
        assert stack.addresses()[0].startswith(f"gateway: {tmp_path}/g.sock (users without the Redis password")
