"""Click's own usage errors are one line, as rig's are: `rig: error: ...; see COMMAND --help`,
exit 2 (Click wrote three: "Usage: ...", "Try '... --help' for help.", "Error: ...")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rig.cli.main import cli
from rig.cli.submit import main as submit


@pytest.mark.parametrize(("command", "args", "line"), [
    (submit, ["--retries", "abc", "--", "true"],
     "rig: error: --retries: 'abc' is not a valid integer; see rig-submit --help"),
    (submit, ["--retries"], "rig: error: Option '--retries' requires an argument; see rig-submit --help"),
    (submit, ["--gpu-memroy", "1G", "--", "true"],
     "rig: error: No such option '--gpu-memroy' (did you mean '--gpu-memory'?); see rig-submit --help"),
    (cli, ["jobs", "--limit", "x"], "rig: error: --limit / -n: 'x' is not a valid integer; see rig jobs --help"),
    (cli, ["jobs", "--limit"], "rig: error: Option '--limit' requires an argument; see rig jobs --help"),
    (cli, ["show"], "rig: error: Missing argument 'JOB_ID'; see rig show --help"),
    (cli, ["nosuch"], "rig: error: No such command 'nosuch'; see rig --help"),
    (cli, ["--bad"], "rig: error: No such option '--bad'; see rig --help"),
    (cli, ["submit", "--retries", "abc", "--", "true"],
     "rig: error: --retries: 'abc' is not a valid integer; see rig submit --help"),
    (cli, ["usage", "--json", "--csv"], "rig: error: give one of --json and --csv; see rig usage --help"),
])
def test_a_usage_error_is_one_line_and_exit_2(command, args, line):
    prog = "rig-submit" if command is submit else "rig"
    result = CliRunner().invoke(command, args, prog_name=prog)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [line]
    assert result.stdout == ""


def test_help_is_still_click_s(tmp_path: Path):
    bare = CliRunner().invoke(cli, [], prog_name="rig")  # a bare group shows its help
    assert bare.output.startswith("Usage: rig [OPTIONS] COMMAND [ARGS]...") and "Commands:" in bare.output
    assert CliRunner().invoke(submit, ["--help"], prog_name="rig-submit").output.startswith("Usage: rig-submit")


def test_the_console_script_says_it_in_one_line():
    script = Path(sys.executable).with_name("rig-submit")
    done = subprocess.run([str(script), "--retries", "abc", "--", "true"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (
        2, "rig: error: --retries: 'abc' is not a valid integer; see rig-submit --help\n", "")
