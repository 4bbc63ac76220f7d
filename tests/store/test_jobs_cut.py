"""`rig jobs` says when its list was cut at --limit (a tester saw 50 rows of 107 and no word)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rig.cli.main import cli
from rig.clock import shared_now
from rig.keys import Keys
from rig.ledger import Ledger
from tests.store.test_archive import finished


def test_a_list_cut_at_its_limit_says_so_and_a_whole_one_does_not(cli_env, real_redis):
    ledger = Ledger(real_redis, Keys(cli_env))
    now = shared_now(real_redis)
    ids = [finished(ledger, ended=now - 60 * i, user="ann").id for i in range(3)]
    run = CliRunner().invoke

    cut = run(cli, ["jobs", "--limit", "2", "--json"])
    assert cut.exit_code == 0, cut.output
    assert len(json.loads(cut.stdout)) == 2
    assert "the newest 2 shown; more jobs match: --limit N shows more, --since" in cut.stderr

    whole = run(cli, ["jobs", "--limit", "3"])
    assert whole.exit_code == 0 and "shown; more jobs match" not in whole.stderr, whole.output
    assert all(str(i) in whole.stdout for i in ids)
    since = run(cli, ["jobs", "--limit", "1", "--since", "1d"])
    assert "the newest 1 shown; more jobs match: --limit N shows more\n" in since.stderr
