"""scripts/fault_scenarios.py's own command line (the scenarios themselves: tests/integration/test_faults.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fault_scenarios.py"


def test_help_says_how_to_run_it_and_names_the_scenarios_without_running_one():
    # It said "unknown scenario(s) ['--help']" (exit 2): --help was taken for a scenario's name.
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "fault_scenarios.py redis-restart beats" in done.stdout
    assert "scenarios: " in done.stdout and " sentinel_failover" in done.stdout


def test_an_unknown_name_is_refused_with_the_names():
    done = subprocess.run([sys.executable, str(SCRIPT), "no-such"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown scenario(s) ['no-such']; choose from" in done.stderr
