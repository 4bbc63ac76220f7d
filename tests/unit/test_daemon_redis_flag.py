"""`rig up --daemon --redis URL` beside a rig.toml that sets redis_url: the daemon said
"note: $RIG_REDIS_URL (in the environment) overrides redis_url in ./rig.toml; unset it to use
the file's value" on the terminal, of a variable the operator never set (the parent handed the
flag's URL down as RIG_REDIS_URL, kept out of `ps`). The daemon now takes it as its --redis."""

from __future__ import annotations

import os

from click.testing import CliRunner

from rig.cli.main import DAEMON_REDIS_URL, cli
from rig.config import shadowed_settings

URL = "redis://127.0.0.1:6999/0"


def test_the_parent_hands_the_flags_url_down_out_of_argv_and_not_as_rig_redis_url(rig_home, monkeypatch):
    (rig_home.parent / "rig.toml").write_text('redis_url = "redis://127.0.0.1:6998/0"\n')
    seen: dict = {}

    class Exited:
        pid, returncode = 4242, 7

        def poll(self) -> int:
            return 7

    def popen(argv, **kwargs):  # noqa: ANN001, ANN003
        seen.update(argv=argv, env=kwargs["env"])
        return Exited()

    monkeypatch.setattr("rig.cli.main.subprocess.Popen", popen)
    result = CliRunner().invoke(cli, ["up", "--daemon", "--redis", URL, "--fake-gpus", "1x8G"])
    assert result.exit_code == 7, result.output
    assert seen["env"].get(DAEMON_REDIS_URL) == URL and "RIG_REDIS_URL" not in seen["env"]
    assert not any(URL in part for part in seen["argv"])


def test_the_daemon_takes_the_handed_url_as_its_flag_not_as_a_shell_variable(rig_home, monkeypatch):
    (rig_home.parent / "rig.toml").write_text('redis_url = "redis://127.0.0.1:6998/0"\n')
    monkeypatch.setenv(DAEMON_REDIS_URL, URL)
    got: dict = {}

    class Stopped(Exception):
        pass

    def stack(settings, options, say=None):  # noqa: ANN001
        got.update(settings=settings, env=dict(os.environ))
        raise Stopped

    monkeypatch.setattr("rig.stack.Stack", stack)
    CliRunner().invoke(cli, ["up", "--fake-gpus", "1x8G"])
    settings = got["settings"]
    assert settings.redis_url == URL and DAEMON_REDIS_URL not in got["env"]
    assert shadowed_settings(settings) == []  # no "$RIG_REDIS_URL (in the environment) overrides ..."
