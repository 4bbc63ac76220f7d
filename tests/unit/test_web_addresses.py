"""What `rig up` says about rig's web page (issue 14, item 5): its URL beside Flower's and
/metrics, where the login is (and a RIG_FLOWER_AUTH that is not used), a taken port in one
line, and the door warning when metrics_address opens the page beyond loopback."""

from __future__ import annotations

import socket

import pytest

from rig.config import load_settings
from rig.errors import ConfigError
from rig.stack import Stack, UpOptions, flower_credentials, http_url, login_place, open_doors


@pytest.fixture
def home(rig_home):
    return rig_home


def test_login_place_names_the_variable_or_the_file(home, monkeypatch):
    settings = load_settings()
    assert login_place(settings) == f"user and password in {home / 'flower.auth'}"
    monkeypatch.setenv("RIG_FLOWER_AUTH", "admin:pw")
    assert login_place(settings) == "user and password in $RIG_FLOWER_AUTH"
    monkeypatch.setenv("RIG_FLOWER_AUTH", "just-a-password")  # the slip: no user
    said = login_place(settings)
    assert str(home / "flower.auth") in said and "not user:password, so it is not used" in said


@pytest.mark.parametrize("login, wrong", [(":", "an empty user and an empty password"),
                                          ("admin:", "an empty password"), (":pw", "an empty user"),
                                          ("admin:pässwörd", "a password that is not printable ASCII")])
def test_a_login_rig_cannot_use_is_refused_in_one_line(home, monkeypatch, login, wrong):
    monkeypatch.setenv("RIG_FLOWER_AUTH", login)
    with pytest.raises(ConfigError) as refused:
        flower_credentials(load_settings())
    said = str(refused.value)
    assert refused.value.exit_code == 6 and "\n" not in said
    assert said.startswith(f"the admin login in $RIG_FLOWER_AUTH has {wrong}: write user:password")
    # rig up says it before starting anything (Flower and the page read the same function).
    with pytest.raises(ConfigError):
        Stack(load_settings(), UpOptions()).up()
    assert not (home / "run").exists() or not any((home / "run").iterdir())


def test_a_half_written_login_file_is_refused_not_replaced(home):
    home.mkdir(parents=True)
    (home / "flower.auth").write_text("admin:\n")
    with pytest.raises(ConfigError, match="flower.auth has an empty password"):
        flower_credentials(load_settings())
    assert (home / "flower.auth").read_text() == "admin:\n"
    (home / "flower.auth").write_text("")  # an empty file is made again
    user, password = flower_credentials(load_settings())
    assert user == "rig" and len(password) > 16


def test_rig_up_prints_the_page_and_metrics_urls_once_they_answer(home):
    said: list[str] = []
    stack = Stack(load_settings(metrics_port=0), UpOptions(), say=said.append)
    stack.settings.metrics_port = _free_port()
    stack._serve_web()
    try:
        port = stack.settings.metrics_port
        lines = stack.addresses()
        assert f"web page: http://127.0.0.1:{port}/ (the same admin login as Flower: user and password in " \
               f"{home / 'flower.auth'})" in lines
        assert f"metrics: http://127.0.0.1:{port}/metrics (no login)" in lines and said == []
    finally:
        stack.metrics_server.shutdown()
        stack.metrics_server.server_close()


def test_a_taken_port_is_one_line_and_no_url(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said: list[str] = []
        stack = Stack(load_settings(metrics_port=port), UpOptions(), say=said.append)
        stack._serve_web()
    assert len(said) == 1 and said[0].startswith(f"warning: metrics and web page: not served, cannot listen on "
                                                 f"127.0.0.1:{port}")
    assert stack.notes == said  # `rig up --daemon` repeats it on the terminal, not only in up.log
    assert "RIG_METRICS_PORT" in said[0]
    assert not any(line.startswith(("web page", "metrics")) for line in stack.addresses())


def test_opening_the_port_beyond_loopback_warns_about_the_page_too(home):
    wide = load_settings(metrics_address="0.0.0.0")
    (warning,) = open_doors(wide, lambda part: part == "metrics")
    assert "web page" in warning and "plain HTTP" in warning and "no login" in warning


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_printed_url_brackets_an_ipv6_address():
    """`rig up` forms Flower's, the page's and /metrics' URLs with http_url (RIG_FLOWER_ADDRESS=::1
    printed http://::1:15555)."""
    assert http_url("::1", 15555) == "http://[::1]:15555" == http_url("[::1]", 15555)
    assert http_url("127.0.0.1", 9840, "/metrics") == "http://127.0.0.1:9840/metrics"


def test_a_page_that_is_off_is_said(home):
    assert Stack(load_settings(metrics_port=0), UpOptions()).addresses()[-1] == \
        "web page and /metrics: off (metrics_port = 0; RIG_METRICS_PORT sets one)"
    assert Stack(load_settings(), UpOptions(no_metrics=True)).addresses()[-1] == \
        "web page and /metrics: off (rig up --no-metrics)"


def test_a_flower_port_taken_is_one_line_and_no_flower(home):
    """Finding 8: a Flower on a port something answers on would exit in a restart loop seen
    only in its log, while rig up printed its URL."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said: list[str] = []
        stack = Stack(load_settings(flower_port=port), UpOptions(), say=said.append)
        assert not stack._flower_port_free()
    assert said == stack.notes and len(said) == 1  # kept for a --daemon parent's terminal too
    assert f"flower: not started, something already listens on 127.0.0.1:{port}" in said[0]
    assert "RIG_FLOWER_PORT" in said[0]
    assert not any(line.startswith("flower") for line in stack.addresses())


def test_a_login_with_a_comma_is_refused_wherever_it_comes_from(home, monkeypatch):
    """Finding 5: Flower splits its login on commas (two logins), rig's page would not."""
    from rig.errors import ConfigError
    from rig.stack import flower_credentials

    monkeypatch.setenv("RIG_FLOWER_AUTH", "admin:pa,evil:evil")
    with pytest.raises(ConfigError, match="has a comma") as refused:
        flower_credentials(load_settings())
    assert refused.value.exit_code == 6 and "$RIG_FLOWER_AUTH" in str(refused.value)
    monkeypatch.delenv("RIG_FLOWER_AUTH")
    home.mkdir(parents=True, exist_ok=True)
    (home / "flower.auth").write_text("rig:a,b\n")
    with pytest.raises(ConfigError, match="flower.auth has a comma"):
        flower_credentials(load_settings())


def test_what_rig_up_warns_while_coming_up_reaches_the_daemons_terminal(home):
    """`rig up --daemon` repeats the notes on its terminal; warnings said with the stack's plain
    say (a door open beyond loopback, a Redis that evicts or keeps no copy on disk, a log folder
    too small for any job) went to up.log alone, and the operator read only "rig is up"."""
    said: list[str] = []
    stack = Stack(load_settings(metrics_address="0.0.0.0"), UpOptions(), say=said.append)
    (door,) = open_doors(stack.settings, lambda part: part == "metrics")
    stack.say(door)
    stack.say(door)  # said twice (a restart of the check): kept once
    stack.say("redis: using the one at redis://127.0.0.1:6379/0")  # not a warning
    assert stack.take_notes() == [door]
    stack.say("warning: Redis is full ...; rig's workers wait and retry")  # while it runs: up.log only
    assert stack.notes == [door] and len(said) == 4


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="a root rig up serves every user")
def test_a_gateway_users_cannot_reach_is_not_said_to_be_reached(home, tmp_path):
    """rig up warned that a folder on the gateway's way shut users out, then printed `gateway:
    ... (users ... reach rig there)` under it: the line says they cannot."""
    import tempfile
    from pathlib import Path

    from rig.gateway.server import bind, reach_problem

    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # 0700, as an admin's umask 077 makes it
    try:
        path = folder / "g.sock"
        server = bind(path, gateway=None)  # type: ignore[arg-type] - only listens
        try:
            stack = Stack(load_settings(), UpOptions())
            stack.gateway_path = path
            assert reach_problem(path) is not None
            assert f"gateway: {path}, which other users cannot reach (the warning above says why)" in stack.addresses()
            folder.chmod(0o755)
            assert any(line.startswith(f"gateway: {path} (users without the Redis password") for line in
                       stack.addresses()) or reach_problem(path) is not None
        finally:
            server.server_close()
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
