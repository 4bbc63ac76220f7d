"""A config file rig finds by itself (./rig.toml, $RIG_HOME/config.toml) must be the caller's
own (or root's) and writable by nobody else: one left by another user in a shared folder would
choose rig's Redis, where the password and the jobs go (issue 12's breaker)."""

from __future__ import annotations

import os

import pytest

from rig.config import load_settings
from rig.errors import ConfigError


@pytest.fixture
def in_folder(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("RIG_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_config_others_may_write_is_refused(in_folder):
    config = in_folder / "rig.toml"
    config.write_text('redis_url = "redis://127.0.0.1:16998/0"\n')
    config.chmod(0o666)
    with pytest.raises(ConfigError, match="may be written by others") as caught:
        load_settings()
    assert "RIG_CONFIG=" in str(caught.value) and "\n" not in str(caught.value)
    config.chmod(0o644)
    assert load_settings().redis_url.endswith(":16998/0")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_another_users_config_is_refused_unless_named(in_folder, monkeypatch):
    config = in_folder / "rig.toml"
    config.write_text('redis_url = "redis://127.0.0.1:16998/0"\n')
    os.chown(config, 40001, 40001)
    with pytest.raises(ConfigError, match="belongs to uid 40001"):
        load_settings()
    monkeypatch.setenv("RIG_CONFIG", str(config))
    assert load_settings().redis_url.endswith(":16998/0")


@pytest.mark.skipif(os.geteuid() != 0, reason="seteuid needs root")
def test_a_home_the_user_cannot_enter_is_no_traceback(in_folder, monkeypatch):
    """A user whose RIG_HOME is the admin's (mode 0700, copied from a how-to) got a
    PermissionError traceback from every rig command (Python 3.11's Path.exists on the home's
    redis.password and log folders): the home holds nothing of theirs, as for its config file,
    so rig goes on without it (through the gateway)."""
    home = in_folder / "home"
    (home / "logs" / "jobs").mkdir(parents=True)
    (home / "redis.password").write_text("admins-only\n")
    (home / "redis.password").chmod(0o600)
    home.chmod(0o700)
    monkeypatch.chdir("/")
    load_settings()  # as root: every module it needs is imported before the switch
    (home / "run").mkdir()
    from rig.gateway.paths import SYSTEM_SOCKET, client_socket, home_socket

    home_socket(load_settings()).touch()  # the admin's node serves its gateway in the home
    os.seteuid(40001)
    try:
        settings = load_settings()
        found = client_socket(settings)
    finally:
        os.seteuid(0)
    assert "admins-only" not in settings.redis_url
    assert found in (None, SYSTEM_SOCKET)  # not the home's, which they cannot reach
