"""`rig down` with no --node says where the node name it looked for came from (a tester's
RIG_NODE_NAME=n9 was called "the default name")."""

from __future__ import annotations

import os

from rig.cli.daemon import not_up
from rig.config import load_settings


def _another_node_up(settings) -> None:  # noqa: ANN001 - rig.config.Settings
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    (settings.run_dir / "up-other.pid").write_text(str(os.getpid()))  # a live pid: "up"


def test_the_name_s_origin_is_said(rig_home, monkeypatch):
    _another_node_up(load_settings())
    line, code = not_up(load_settings(), named=False)
    assert code == 2 and "(the default name: no --node given)" in line and "rig down --node other" in line
    monkeypatch.setenv("RIG_NODE_NAME", "n9")
    line, _ = not_up(load_settings(), named=False)
    assert "node n9 (from RIG_NODE_NAME: no --node given)" in line
    monkeypatch.delenv("RIG_NODE_NAME")
    (rig_home.parent / "rig.toml").write_text('node_name = "n7"\n')
    line, _ = not_up(load_settings(), named=False)
    assert "node n7 (from the config file: no --node given)" in line
    line, _ = not_up(load_settings(), named=True)
    assert "no --node given" not in line


def test_recover_without_node_in_a_home_of_another_node_names_it(rig_home):
    """`rig recover` typed as the FROZEN line says, in the home whose rig up was given --node a,
    looked at the hostname's node and said "nothing to recover" while node a's jobs were frozen."""
    from click.testing import CliRunner

    from rig.cli.main import cli

    _another_node_up(load_settings())
    for args in (["recover"], ["recover", "--stop"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "rig recover --node other" in result.output and "nothing to recover" not in result.output
