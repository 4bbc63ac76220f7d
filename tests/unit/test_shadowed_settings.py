"""A RIG_* variable that sets what the config file sets too wins, and `rig up` says so in one
line (a tester's stale RIG_FAKE_GPUS=1x80G silently beat rig.toml's fake_gpus = "2x24G")."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_a_variable_with_the_files_own_value_overrides_nothing(rig_home, monkeypatch):
    # `rig init` writes this shell's RIG_REDIS_URL, RIG_NODE_NAME, RIG_FLOWER_PORT into the
    # file; every `rig up` from that shell then said each one "overrides" the same value.
    (rig_home.parent / "rig.toml").write_text('redis_url = "redis://127.0.0.1:6630/0"\nflower_port = 6631\n'
                                               'fair_share = true\n[health]\ntimeout = 30\n')
    monkeypatch.setenv("RIG_REDIS_URL", "redis://127.0.0.1:6630/0")
    monkeypatch.setenv("RIG_FLOWER_PORT", "6631")
    monkeypatch.setenv("RIG_FAIR_SHARE", "true")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "30.0")
    assert shadowed_settings(load_settings()) == []
    monkeypatch.setenv("RIG_FLOWER_PORT", "6632")  # a value of its own: said
    monkeypatch.setenv("RIG_FAIR_SHARE", "false")
    lines = shadowed_settings(load_settings())
    assert len(lines) == 2, lines
    assert any("$RIG_FLOWER_PORT (in the environment) overrides flower_port" in line for line in lines)
    assert any("$RIG_FAIR_SHARE (in the environment) overrides fair_share" in line for line in lines)


def test_a_path_spelled_otherwise_than_the_files_overrides_nothing(rig_home, monkeypatch, tmp_path):
    # Reviewer (review3): system_log_dir = "/x/logs/" in the file and RIG_SYSTEM_LOG_DIR=/x/logs
    # (or ~/logs and its expansion) name one folder; rig up still said it 'overrides' it.
    home = Path(os.path.expanduser("~"))
    (rig_home.parent / "rig.toml").write_text(f'system_log_dir = "{tmp_path}/logs/"\nlog_dir = "~/review3-jobs"\n'
                                               'node_name = "n1"\n')
    monkeypatch.setenv("RIG_SYSTEM_LOG_DIR", f"{tmp_path}/logs")
    monkeypatch.setenv("RIG_LOG_DIR", f"{home}/review3-jobs/")
    assert shadowed_settings(load_settings()) == []
    monkeypatch.setenv("RIG_SYSTEM_LOG_DIR", f"{tmp_path}/logs2")  # another folder: said
    lines = shadowed_settings(load_settings())
    assert len(lines) == 1 and "overrides system_log_dir" in lines[0], lines


def test_a_value_that_parses_to_the_files_overrides_nothing(rig_home, monkeypatch):
    """Breaker (pyapi): RIG_FAIR_SHARE=1 (or yes, on) with the file's ``fair_share = true`` still
    said it 'overrides' the file: booleans, numbers and lists were compared as text. Compared
    after the setting's own parsing, a word meaning the same value says nothing."""
    (rig_home.parent / "rig.toml").write_text(
        'fair_share = true\nallow_root_jobs = false\nmax_gpu_memory_per_user = "160G"\n'
        'admins = ["alice", "bob"]\ngpu_whitelist = [0, 1]\nfake_gpus = "8x80G"\nflower_port = 6631\n[health]\ntimeout = 30\n')
    for fair, root in (("1", "0"), ("yes", "no"), ("on", "off"), ("True", "False")):
        monkeypatch.setenv("RIG_FAIR_SHARE", fair)
        monkeypatch.setenv("RIG_ALLOW_ROOT_JOBS", root)
        monkeypatch.setenv("RIG_MAX_GPU_MEMORY_PER_USER", "160 GiB")
        monkeypatch.setenv("RIG_ADMINS", "alice,bob")
        monkeypatch.setenv("RIG_GPU_WHITELIST", "0,1")
        monkeypatch.setenv("RIG_FLOWER_PORT", "6631")
        monkeypatch.setenv("RIG_FAKE_GPUS", "8X80GiB")
        monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "3e1")
        assert shadowed_settings(load_settings()) == [], (fair, root)
    monkeypatch.setenv("RIG_FAIR_SHARE", "0")  # another value: said
    monkeypatch.setenv("RIG_ADMINS", "alice")
    monkeypatch.setenv("RIG_GPU_WHITELIST", "0,2")
    monkeypatch.setenv("RIG_FAKE_GPUS", "8x40G")
    monkeypatch.setenv("RIG_MAX_GPU_MEMORY_PER_USER", "80G")
    lines = shadowed_settings(load_settings())
    said = {line.split()[1] for line in lines}
    assert said == {"$RIG_FAIR_SHARE", "$RIG_ADMINS", "$RIG_GPU_WHITELIST", "$RIG_MAX_GPU_MEMORY_PER_USER",
                    "$RIG_FAKE_GPUS"}, lines
