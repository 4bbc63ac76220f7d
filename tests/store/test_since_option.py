"""Every command with --since reads it with the one parser (rig.cli.usage.since_time ->
rig.durations.parse_duration, unit required): a bare number is refused in one line, exit 2,
never read as seconds ("no jobs", "no job ended in the last 7", exit 0)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.cli.main import cli

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("command", [["jobs"], ["jobs", "--json"], ["usage"], ["usage", "--csv"]])
@pytest.mark.parametrize("since, line", [
    ("7", "rig: error: --since needs a unit: 90s, 30m, 12h, 7d (got '7')"),
    ("0", "rig: error: --since needs a unit: 90s, 30m, 12h, 7d (got '0')"),
    ("0d", "rig: error: --since must be more than 0 seconds (got '0d')"),
    ("a week", "rig: error: --since: cannot read 'a week'; write it like 90s, 30m, 2h, 7d or 1h30m"),
])
def test_a_since_without_unit_or_of_zero_is_one_line_and_exit_2(cli_env, real_redis, command, since, line):
    got = CliRunner().invoke(cli, [*command, "--since", since])
    assert (got.exit_code, got.stdout, got.stderr) == (2, "", line + "\n"), got.output


def test_a_since_with_a_unit_still_works(cli_env, real_redis):
    run = CliRunner().invoke
    assert run(cli, ["jobs", "--since", "7d", "--json"]).stdout.strip() == "[]"
    assert run(cli, ["usage", "--since", "7d"]).exit_code == 0
