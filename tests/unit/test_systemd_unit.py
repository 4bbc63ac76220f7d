"""The shipped systemd unit (config/systemd/rig.service) stops rig the way `rig down` does: rig
up alone gets the signal. systemd's default KillMode (control-group) sends SIGTERM to every
process of the unit at once, the jobs included (they are rig up's descendants, whatever their
session): a unit written from the README's "or a systemd unit" killed every running job on each
`systemctl restart`."""

from __future__ import annotations

import configparser
import shutil
import subprocess

import pytest

from tests.unit.bench_scripts import ROOT

UNIT = ROOT / "config" / "systemd" / "rig.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_signals_rig_up_alone_and_runs_it_in_the_foreground():
    service = _unit()["Service"]
    assert service["KillMode"] == "process"
    assert service["Type"] == "simple"
    argv = service["ExecStart"].split()
    assert argv[0].endswith("/rig") and argv[1:] == ["up"]  # not --daemon: systemd supervises it


def test_systemd_accepts_it():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    out = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    # the unit names /opt/rig/.venv/bin/rig, not installed here: every other line is a fault
    problems = [line for line in out.stderr.splitlines() if line.strip() and "is not executable" not in line]
    assert not problems, out.stderr


def test_a_refusal_a_person_must_mend_is_not_restarted_every_5_s():
    """rig up refusing a bad config (6), a node already up or a cluster it must not join (7), a
    name or card owned elsewhere (10) would say so again every RestartSec for ever; Redis being
    away (5) is what a restart may cure."""
    service = _unit()["Service"]
    assert service["Restart"] == "on-failure"
    prevented = set(service["RestartPreventExitStatus"].split())
    assert prevented == {"6", "7", "10"}
    from rig.errors import ConfigError, RedisUnavailable

    assert str(ConfigError.exit_code) in prevented and str(RedisUnavailable.exit_code) not in prevented
