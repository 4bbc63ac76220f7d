"""gpu_whitelist set but naming no card (``RIG_GPU_WHITELIST=`` from an unset shell variable,
a stray comma, ``gpu_whitelist = ""``) is refused in one line, exit 6: it used to mean every
card, so a slip gave rig the cards the operator meant to keep out. ``all`` (or ``*``) says
every card on purpose; a list ``[]`` names no card on purpose (rig up warns then)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rig.config import load_settings
from rig.errors import ConfigError

SAID = "set but names no card; write card indexes like 0,1,3, or all for every card"


@pytest.mark.parametrize("value", ["", " ", ",", " , ,"])
def test_an_empty_whitelist_variable_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv("RIG_GPU_WHITELIST", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    text = str(info.value)
    assert text.startswith(f"RIG_GPU_WHITELIST: {SAID}") and "\n" not in text, text
    assert "unset it" in text, text


def test_an_empty_whitelist_in_the_file_names_the_file_and_key(tmp_path, monkeypatch):
    path = tmp_path / "rig.toml"
    path.write_text('gpu_whitelist = ""\n')
    monkeypatch.setenv("RIG_CONFIG", str(path))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith(f"{path}: gpu_whitelist: {SAID}"), str(info.value)


@pytest.mark.parametrize(("value", "whitelist"), [("all", None), ("*", None), ("[]", []), ("0,2", [0, 2]),
                                                  ("1,", [1])])
def test_every_card_and_no_card_are_said_on_purpose(monkeypatch, value, whitelist):
    monkeypatch.setenv("RIG_GPU_WHITELIST", value)
    assert load_settings().gpu_whitelist == whitelist


def test_rig_config_exits_6_naming_the_variable(monkeypatch):
    from rig.cli.main import cli

    monkeypatch.setenv("RIG_GPU_WHITELIST", "")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 6, result.output
    assert f"RIG_GPU_WHITELIST: {SAID}" in result.output
