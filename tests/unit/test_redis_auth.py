"""Where rig finds the Redis password, how it keeps it (0600, out of argv and output), and the
one-line errors for a refused or missing one. No Redis needed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from rig.cli.common import handle_errors
from rig.cli.main import cli
from rig.config import load_settings
from rig.errors import ConfigError, RedisAuthFailed, RedisUnavailable
from rig.redis_conn import (
    auth_failed,
    ensure_password_file,
    home_password_file,
    is_auth_error,
    password_source,
    read_password_file,
    resolve_auth,
    strip_password,
    unavailable,
    url_password,
    with_password,
    write_private,
)
from rig.redis_server import private_config
from rig.stack import open_doors, settings_env

LOCAL = "redis://127.0.0.1:6390/0"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("RIG_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


# -- the order ----------------------------------------------------------------------------------
def test_the_urls_own_password_wins(tmp_path):
    secret_file(home_password_file(tmp_path), "fromhome\n")
    auth = resolve_auth("redis://:inurl@127.0.0.1:6390/0", home=tmp_path, password="fromenv",
                        password_file=secret_file(tmp_path / "pw", "fromfile"))
    assert url_password(auth.url) == "inurl" and "URL" in auth.source


def test_setting_then_file_then_home(tmp_path):
    secret_file(home_password_file(tmp_path), "fromhome\n")
    pw_file = secret_file(tmp_path / "pw", "fromfile\n")
    assert url_password(resolve_auth(LOCAL, home=tmp_path, password="fromenv", password_file=pw_file).url) == "fromenv"
    by_file = resolve_auth(LOCAL, home=tmp_path, password_file=pw_file)
    assert url_password(by_file.url) == "fromfile" and by_file.source == str(pw_file)
    by_home = resolve_auth(LOCAL, home=tmp_path)
    assert url_password(by_home.url) == "fromhome"
    assert password_source(by_home.url) == str(home_password_file(tmp_path))


def test_the_home_file_is_only_for_a_local_plain_url(tmp_path):
    secret_file(home_password_file(tmp_path), "fromhome\n")
    for url in ("redis://gpu-head:6379/0", "rediss://127.0.0.1:6390/0"):
        auth = resolve_auth(url, home=tmp_path)
        assert url_password(auth.url) is None and auth.source == "", url
    assert url_password(resolve_auth("redis://localhost:6390/0", home=tmp_path).url) == "fromhome"


def test_no_password_anywhere(tmp_path):
    auth = resolve_auth(LOCAL, home=tmp_path)
    assert auth.url == LOCAL and auth.source == "" and password_source(LOCAL) == ""


def test_odd_characters_survive_the_url():
    password = "p@ss:w/rd?#% é"
    url = with_password("redis://rig@10.0.0.5:6379/0", password)
    assert url_password(url) == password
    kwargs = redis.connection.parse_url(url)
    assert kwargs["password"] == password and kwargs["username"] == "rig" and kwargs["host"] == "10.0.0.5"
    assert strip_password(url) == "redis://rig@10.0.0.5:6379/0"
    assert strip_password(LOCAL) == LOCAL


def test_rediss_gets_certificate_checks(tmp_path):
    auth = resolve_auth("rediss://:pw@redis.example.org:6380/0?ssl_ca_certs=/etc/rig/ca.pem", home=tmp_path)
    assert "ssl_cert_reqs=required" in auth.url and "ssl_ca_certs=/etc/rig/ca.pem" in auth.url
    kept = "rediss://:pw@redis.example.org:6380/0?ssl_cert_reqs=none"
    assert resolve_auth(kept, home=tmp_path).url == kept  # an explicit choice stays


def test_settings_carry_the_resolved_url(clean_env, monkeypatch):
    assert load_settings().redis_url == "redis://127.0.0.1:6379/0"  # nothing configured
    secret_file(clean_env / "redis.password", "generated\n")
    assert url_password(load_settings().redis_url) == "generated"
    monkeypatch.setenv("RIG_REDIS_PASSWORD", "fromenv")
    assert url_password(load_settings().redis_url) == "fromenv"
    monkeypatch.delenv("RIG_REDIS_PASSWORD")
    monkeypatch.setenv("RIG_REDIS_PASSWORD_FILE", str(secret_file(clean_env / "team.pw", "team\n", 0o640)))
    assert url_password(load_settings().redis_url) == "team"  # group-readable is allowed
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:own@127.0.0.1:6379/0")
    assert url_password(load_settings().redis_url) == "own"


def test_children_get_the_password_in_the_url_not_a_mask(clean_env, monkeypatch):
    monkeypatch.setenv("RIG_REDIS_PASSWORD", "s3cret-value")
    env = settings_env(load_settings())
    assert url_password(env["RIG_REDIS_URL"]) == "s3cret-value"
    assert "RIG_REDIS_PASSWORD" not in env  # it would be "**********"


def test_a_child_names_the_password_file_rig_up_read_not_the_url(clean_env, monkeypatch):
    """rig up hands its children (the gateway, the workers) the password inside RIG_REDIS_URL:
    after a password change, the gateway's line said Redis "refused the password from the URL
    (RIG_REDIS_URL / redis_url)" when it came from redis_password_file."""
    team = secret_file(clean_env / "team.pw", "team\n", 0o640)
    monkeypatch.setenv("RIG_REDIS_PASSWORD_FILE", str(team))
    env = settings_env(load_settings())
    for key, value in env.items():  # the child's environment
        monkeypatch.setenv(key, value)
    url = load_settings().redis_url
    assert url_password(url) == "team"
    assert str(unavailable(url, WRONG)).startswith(
        f"Redis at redis://127.0.0.1:6379/0 refused the password from {team} (as read by rig up when it started)")
    # The variable names the source of that URL's password only: beside another URL, the URL's own.
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:other@127.0.0.1:6379/0")
    assert password_source(load_settings().redis_url) == "the URL (RIG_REDIS_URL / redis_url)"


# -- the files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o604, 0o606, 0o644, 0o601])
def test_a_password_file_open_to_everyone_is_refused(tmp_path, mode):
    path = secret_file(tmp_path / "pw", "x\n", mode)
    with pytest.raises(ConfigError, match=r"open to every user .*chmod 600"):
        read_password_file(path)


def test_bad_password_files(tmp_path, clean_env, monkeypatch):
    with pytest.raises(ConfigError, match="is empty"):
        read_password_file(secret_file(tmp_path / "empty", "\n \n"))
    monkeypatch.setenv("RIG_REDIS_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings()
    assert read_password_file(secret_file(tmp_path / "pw", "  first  \nsecond\n")) == "first"


def test_a_password_file_this_user_may_not_read_sends_them_to_the_gateway(tmp_path, monkeypatch):
    """A team's file kept from users (0640 root:rigadmins): a user who cannot read it holds no
    credentials, so rig.gateway.choice sends them to the gateway; refusing at load (exit 6, 'ask
    its owner for the password') stopped every command of every such user. os.access is faked:
    the suite runs as root, who reads any file."""
    from rig.gateway.choice import holds_credentials

    path = secret_file(tmp_path / "pw", "s3cret\n", 0o640)
    real_access = os.access
    monkeypatch.setattr("rig.redis_conn.os.access",
                        lambda p, mode, **kw: False if Path(p) == path else real_access(p, mode, **kw))
    auth = resolve_auth("redis://10.0.0.5:6379/0", home=tmp_path / "home", password_file=path)
    assert url_password(auth.url) is None and auth.source == "" and str(path) in auth.unreadable
    error = auth_failed(auth.url, redis.AuthenticationError("Authentication required."))
    assert f"cannot read redis_password_file {path}" in str(error) and "gateway" in str(error)
    assert "\n" not in str(error)

    class Settings:  # what holds_credentials reads
        redis_url = auth.url

    assert not holds_credentials(Settings())  # type: ignore[arg-type]


def test_another_users_home_password_file_sends_them_to_the_gateway(tmp_path, monkeypatch):
    """RIG_HOME set to the node's home (its config.toml, its gateway's socket) by a user who may
    not read its redis.password (0600 root): every command stopped with exit 6 ('cannot read the
    Redis password file ... ask its owner'), never reaching the gateway the README sends them to.
    os.access is faked: the suite runs as root."""
    from rig.gateway.choice import holds_credentials

    home = tmp_path / "home"
    path = secret_file(home / "redis.password", "s3cret\n")
    real_access = os.access
    monkeypatch.setattr("rig.redis_conn.os.access",
                        lambda p, mode, **kw: False if Path(p) == path else real_access(p, mode, **kw))
    auth = resolve_auth("redis://127.0.0.1:6379/0", home=home)
    assert url_password(auth.url) is None and auth.source == "" and str(path) in auth.unreadable
    error = auth_failed(auth.url, redis.AuthenticationError("Authentication required."))
    assert f"cannot read {path}, the password file of RIG_HOME" in str(error) and "gateway" in str(error)

    class Settings:  # what holds_credentials reads
        redis_url = auth.url

    assert not holds_credentials(Settings())  # type: ignore[arg-type]


def test_generated_password_file_is_0600_from_the_start_and_reused(tmp_path):
    path = tmp_path / "home" / "redis.password"
    old = os.umask(0)  # the most permissive umask must not widen it
    try:
        first = ensure_password_file(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 40 and first.replace("-", "").replace("_", "").isalnum()
    assert ensure_password_file(path) == first
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_a_racing_writer_does_not_replace_the_password(tmp_path):
    path = secret_file(tmp_path / "redis.password", "winner\n")
    write_private(path, "loser\n", replace=False)
    assert read_password_file(path) == "winner"
    write_private(path, "new\n")  # replace=True: the config file of the private Redis
    assert read_password_file(path) == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_private_redis_config_holds_the_password_not_argv(tmp_path):
    text = private_config('redis://:pa"ss\\word@127.0.0.1:6390/0', tmp_path / "data dir", tmp_path / "r.log")
    lines = text.splitlines()
    assert "port 6390" in lines and "bind 127.0.0.1" in lines and "protected-mode yes" in lines
    assert 'requirepass "pa\\"ss\\\\word"' in lines
    assert f'dir "{tmp_path / "data dir"}"' in lines
    assert "requirepass" not in private_config(LOCAL, tmp_path, tmp_path / "r.log")


# -- errors -------------------------------------------------------------------------------------
WRONG = redis.AuthenticationError("invalid username-password pair or user is disabled.")
NOAUTH = redis.AuthenticationError("Authentication required.")
UNSET = redis.AuthenticationError("AUTH <password> called without any password configured for the "
                                  "default user. Are you sure your configuration is correct?")


def test_wrong_password_message(tmp_path):
    url = resolve_auth(LOCAL, home=tmp_path, password="nope").url
    err = unavailable(url, WRONG)
    assert isinstance(err, RedisAuthFailed) and err.exit_code == 5
    text = str(err)
    assert text.startswith("Redis at redis://127.0.0.1:6390/0 refused the password from redis_password")
    assert "set RIG_REDIS_URL=redis://:PASSWORD@127.0.0.1:6390/0" in text
    assert str(home_password_file(tmp_path)) in text and "nope" not in text and "\n" not in text


def test_missing_password_message(tmp_path):
    text = str(auth_failed(resolve_auth(LOCAL, home=tmp_path).url, NOAUTH))
    assert "requires a password and rig has none" in text and "RIG_REDIS_PASSWORD" in text


def test_password_sent_to_an_open_redis_message(tmp_path):
    url = resolve_auth(LOCAL, home=tmp_path, password="x").url
    assert "has no password, but rig sent the one from redis_password" in str(auth_failed(url, UNSET))


def test_auth_errors_are_told_apart():
    assert is_auth_error(WRONG) and is_auth_error(NOAUTH)
    assert is_auth_error(redis.ResponseError("NOAUTH Authentication required."))
    assert is_auth_error(redis.exceptions.NoPermissionError("this user has no permissions"))
    assert not is_auth_error(redis.ConnectionError("Connection refused"))
    assert not is_auth_error(redis.ResponseError("WRONGTYPE Operation against a key"))
    plain = unavailable(LOCAL, redis.ConnectionError("Error 111 connecting"))
    assert type(plain) is RedisUnavailable and "cannot reach Redis" in str(plain)


@pytest.mark.parametrize("exc", [WRONG, NOAUTH, redis.ResponseError("NOAUTH Authentication required.")])
def test_cli_turns_auth_errors_into_one_line_and_exit_5(clean_env, capsys, exc):
    @handle_errors
    def command() -> None:
        raise exc

    with pytest.raises(SystemExit) as exited:
        command()
    assert exited.value.code == 5
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rig: error: Redis at redis://127.0.0.1:6379/0")


def test_other_response_errors_still_propagate(clean_env):
    @handle_errors
    def command() -> None:
        raise redis.ResponseError("WRONGTYPE Operation against a key")

    with pytest.raises(redis.ResponseError):
        command()


# -- output -------------------------------------------------------------------------------------
def test_rig_config_masks_the_password(clean_env, monkeypatch):
    secret_file(clean_env / "redis.password", "home-secret-123\n")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 0, result.output
    assert "home-secret-123" not in result.output
    assert f"redis://127.0.0.1:6379/0 (password from {clean_env / 'redis.password'})" in result.output
    monkeypatch.setenv("RIG_REDIS_PASSWORD", "env-secret-456")
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:url-secret-789@10.1.2.3:6379/0")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 0
    assert "env-secret-456" not in result.output and "url-secret-789" not in result.output
    assert "redis://10.1.2.3:6379/0 (password from the URL" in result.output
    monkeypatch.setenv("RIG_ARCHIVE_URL", "postgresql://rig:pg-secret-1@db/rig?password=pg-secret-2")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 0, result.output
    assert "pg-secret" not in result.output
    assert "archive_url = 'postgresql://rig:***@db/rig?password=***'" in result.output


def test_rig_init_writes_no_password(clean_env):
    secret_file(clean_env / "redis.password", "home-secret-123\n")
    result = CliRunner().invoke(cli, ["init"])
    assert result.exit_code == 0, result.output
    written = (clean_env / "config.toml").read_text()
    assert "home-secret-123" not in written and 'redis_url = "redis://127.0.0.1:6379/0"' in written


def test_open_doors_warns_beyond_loopback(clean_env):
    settings = load_settings()
    assert open_doors(settings, lambda _: True) == []
    wide = load_settings(flower_address="0.0.0.0", metrics_address="10.0.0.7")
    warnings = open_doors(wide, lambda _: True)
    assert len(warnings) == 2 and "Flower listens on 0.0.0.0" in warnings[0]
    assert "10.0.0.7:9840" in warnings[1] and "no login" in warnings[1]
    assert open_doors(wide, lambda part: part != "metrics")[1:] == []



def test_the_home_password_never_goes_to_another_users_listener(tmp_path, monkeypatch):
    """A user squatting the private Redis' port while it is down must not get the password."""
    from rig import redis_conn as RC
    from rig.errors import ConfigError

    home = tmp_path / "home"
    home.mkdir()
    RC.ensure_password_file(home / RC.PASSWORD_FILE_NAME)
    monkeypatch.setattr(RC, "listener_uid", lambda port: 40004)
    with pytest.raises(ConfigError, match="belongs to uid 40004, not to rig's Redis"):
        RC.resolve_auth("redis://127.0.0.1:6391/0", home=home)
    monkeypatch.setattr(RC, "listener_uid", lambda port: None)  # nothing listens: the password, as before
    assert RC.resolve_auth("redis://127.0.0.1:6391/0", home=home).url.startswith("redis://:")


def test_listener_uid_reads_the_kernels_table():
    import socket as S

    from rig.redis_conn import listener_uid

    with S.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert listener_uid(server.getsockname()[1]) == os.geteuid()


def test_a_refused_password_of_a_user_names_the_gateway_they_need_no_password_for(tmp_path, monkeypatch):
    """A teammate with a password left in the shell (the admin has since changed it) read only
    'set RIG_REDIS_URL=redis://:PASSWORD@..., RIG_REDIS_PASSWORD, or redis_password_file' on every
    command, sent to ask for the new password, though the node's gateway serves them without one."""
    socket_path = tmp_path / "gw" / "gw.sock"
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIG_GATEWAY_SOCKET", str(socket_path))
    url = resolve_auth(LOCAL, home=tmp_path / "home", password="old").url
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    text = str(unavailable(url, WRONG))
    assert text.endswith("; users of the node need no password: with redis_password (RIG_REDIS_PASSWORD) unset, "
                         f"rig goes through the node's gateway at {socket_path}"), text
    # A teammate who once ran `rig up` (a private Redis): its home password went to the node's
    # Redis on that port from then on, every command refused (exit 5), the gateway never tried.
    (tmp_path / "mine").mkdir()
    home_password_file(tmp_path / "mine").write_text("generated\n")
    home_password_file(tmp_path / "mine").chmod(0o600)
    monkeypatch.setattr("rig.redis_conn.listener_uid", lambda port: None)
    home_url = resolve_auth(LOCAL, home=tmp_path / "mine").url
    assert str(unavailable(home_url, WRONG)).endswith(
        f"; if that file is left from a `rig up` of your own and this Redis is the node's, move "
        f"{home_password_file(tmp_path / 'mine')} away: users of the node need no password, rig goes through the "
        f"node's gateway at {socket_path}")
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root holds the password: no gateway for it
    assert "gateway" not in str(unavailable(url, WRONG))
