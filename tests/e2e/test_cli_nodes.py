"""What `rig down` says when this home runs another node, or another home owns the name; what
`rig up --daemon` reports as its reason; output a rig up may lose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rig.cli.daemon import daemon_reason, home_nodes, reason_path, write_reason
from rig.cli.main import cli


@pytest.mark.redis
def test_rig_down_names_the_node_this_home_runs(cli_env, tmp_path):
    run = tmp_path / "home" / "run"
    run.mkdir(parents=True)
    (run / "up-a.pid").write_text(f"{os.getpid()}\n")  # a live process stands for node a's rig up
    result = CliRunner().invoke(cli, ["down", "--node", "zz"])
    assert result.exit_code == 2
    assert "rig is not up on node zz from this home; this home runs node a (pid" in result.output
    assert "`rig down --node a`" in result.output and result.output.count("\n") == 1
    assert home_nodes(run) == {"a": os.getpid()}


@pytest.mark.redis
def test_rig_down_names_the_owner_in_another_home(cli_env, tmp_path, real_redis):
    from rig import node_claim as C
    from rig.keys import Keys

    other = tmp_path / "elsewhere"
    assert C.claim(real_redis, Keys(cli_env), "a", C.identity(other, other / "run"), 30) is None
    result = CliRunner().invoke(cli, ["down", "--node", "a"])
    assert result.exit_code == 10 and result.output.count("\n") == 1
    assert "node a is owned by a rig up (host" in result.output
    assert f"`RIG_HOME={other.resolve()} rig down --node a` on this host" in result.output
    plain = CliRunner().invoke(cli, ["down", "--node", "b"])
    assert plain.exit_code == 0 and plain.output == "rig is not up on b\n"


@pytest.mark.redis
def test_rig_down_of_a_node_named_and_owned_elsewhere_names_its_owner_not_this_homes_node(cli_env, tmp_path,
                                                                                        real_redis):
    """Two nodes on one host: `rig down --node b` typed in node a's home said `rig down --node
    a` (the node not named, which that line would stop) instead of where node b runs."""
    from rig import node_claim as C
    from rig.keys import Keys

    run = tmp_path / "home" / "run"
    run.mkdir(parents=True)
    (run / "up-a.pid").write_text(f"{os.getpid()}\n")  # this home runs node a
    other = tmp_path / "home-b"
    assert C.claim(real_redis, Keys(cli_env), "b", C.identity(other, other / "run"), 30) is None
    result = CliRunner().invoke(cli, ["down", "--node", "b"])
    assert result.exit_code == 10 and result.output.count("\n") == 1, result.output
    assert f"`RIG_HOME={other.resolve()} rig down --node b` on this host" in result.output
    assert "rig down --node a" not in result.output
    # A name nobody owns is still answered with this home's node (a typo: zz for a).
    typo = CliRunner().invoke(cli, ["down", "--node", "zz"])
    assert typo.exit_code == 2 and "`rig down --node a`" in typo.output


def test_a_daemon_reports_its_own_reason(tmp_path):
    mine, theirs = reason_path(tmp_path, "a"), reason_path(tmp_path, "a")
    assert mine != theirs  # two starts at once never share one
    write_reason(mine, RuntimeError("node name 'a' is owned by ...\nmore"))
    write_reason(theirs, KeyboardInterrupt())
    assert daemon_reason(mine, tmp_path / "up.log") == "node name 'a' is owned by ..."
    assert not mine.exists()
    assert daemon_reason(theirs, tmp_path / "up.log") == f"see {tmp_path / 'up.log'}"


def test_lossy_say_survives_a_closed_pipe(tmp_path):
    """`rig up | head`: a write to a reader that went away drops the stream, never raises."""
    script = ("import sys, time\nfrom rig.cli import lossy\n"
              "for i in range(2000):\n    lossy.say('x' * 100, err=False)\n"
              "open(sys.argv[1], 'w').write('survived')\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "out")], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(30) == 0
    assert Path(tmp_path / "out").read_text() == "survived"
