"""One node (cards or control workers) per RIG_HOME: a tester's `rig up --daemon --node other
--fake-gpus 2x24G` beside node vm in the same home was accepted, and both nodes' workers wrote
logs/system/card0.log, control.log, beat.log, up.log. A second node is refused in one line
(exit 7) naming the running one; a `--only flower` add-on (docs/FLOWER.md) is not a node."""

from __future__ import annotations

import os

import pytest

from rig.config import load_settings
from rig.errors import StackError
from rig.stack import Stack, UpOptions, pid_file, second_node, write_pid_file


def _running(home, node: str, *, kind: str = "node") -> None:
    """A live rig up of ``node`` in ``home`` (this test process stands for it)."""
    settings = load_settings(home=home, node_name=node)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    write_pid_file(settings, node=kind == "node")
    assert pid_file(settings).read_text().split()[0] == str(os.getpid())


def test_a_second_node_in_one_home_is_refused_naming_the_running_one(tmp_path):
    _running(tmp_path / "home", "vm")
    other = load_settings(home=tmp_path / "home", node_name="other", fake_gpus="2x24G")
    with pytest.raises(StackError) as err:
        Stack(other, UpOptions(), say=lambda _: None).up()
    line = str(err.value)
    assert err.value.exit_code == 7 and "\n" not in line
    assert "already runs node vm (pid" in line and "RIG_HOME=" in line and "rig up --node other" in line, line
    assert not pid_file(other).exists()  # nothing of it was started or written


def test_a_flower_add_on_is_no_second_node_and_may_run_beside_one(tmp_path):
    _running(tmp_path / "home", "vm-flower", kind="addon")
    assert second_node(load_settings(home=tmp_path / "home", node_name="vm")) is None
    _running(tmp_path / "home", "vm")
    assert second_node(load_settings(home=tmp_path / "home", node_name="vm")) is None  # itself
    assert "already runs node vm " in second_node(load_settings(home=tmp_path / "home", node_name="b"))
