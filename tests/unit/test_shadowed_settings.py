"""A RIG_* variable that sets what the config file sets too wins, and `rig up` says so in one
line (a tester's stale RIG_FAKE_GPUS=1x80G silently beat rig.toml's fake_gpus = "2x24G")."""

from __future__ import annotations

from rig.config import load_settings, shadowed_settings


def test_a_variable_over_the_file_is_said_once_per_setting(rig_home, monkeypatch):
    (rig_home.parent / "rig.toml").write_text('fake_gpus = "2x24G"\nnode_name = "n7"\n[health]\ntimeout = 90\n')
    assert shadowed_settings(load_settings()) == []
    monkeypatch.setenv("RIG_FAKE_GPUS", "1x80G")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "60")
    monkeypatch.setenv("RIG_KEY_PREFIX", "x:")  # set only here: nothing in the file to override
    lines = shadowed_settings(load_settings())
    assert len(lines) == 2, lines
    assert lines[0].startswith("note: $RIG_FAKE_GPUS (in the environment) overrides fake_gpus in ")
    assert "$RIG_HEALTH__TIMEOUT (in the environment) overrides health.timeout" in lines[1]
    # A flag (an override) is the operator's word at the moment: not a slip to point out.
    assert len(shadowed_settings(load_settings(fake_gpus="4x8G"))) == 1


def test_no_file_nothing_to_say(rig_home, monkeypatch):
    monkeypatch.setenv("RIG_FAKE_GPUS", "1x80G")
    assert shadowed_settings(load_settings()) == []
