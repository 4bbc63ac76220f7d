"""The edges of the configuration (issue 11, item 6, found from outside): `rig init` that can
replace a broken config, config paths that are no file, every RIG_* variable known, listen
addresses, a Redis URL that reaches no usable Redis, relative and clashing log folders, a BOM,
health.check_interval against health.timeout."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import tomllib
from click.testing import CliRunner

from rig.cli.main import cli
from rig.config import load_settings
from rig.errors import ConfigError, InvalidInput, RedisUnavailable

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.upper().startswith("RIG_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def refused(match: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings()
    text = str(info.value)
    assert match in text and "\n" not in text, text
    return text


def init(*args: str):
    return CliRunner().invoke(cli, ["init", *args])


def one_line(result, code: int, said: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith("rig: error: "), result.output


# -- 1, 2: rig init replaces a broken config, writes the file RIG_CONFIG names ------------------
def test_rig_init_replaces_a_broken_config(tmp_path):
    assert init().exit_code == 0
    config = tmp_path / "home" / "config.toml"
    with config.open("a") as f:
        f.write("max_tasks_per_gpu = 3\n")
    refused("did you mean 'max_task_per_gpu'?")  # every config error says: run rig init
    result = init("--force")
    assert result.exit_code == 0, result.output
    assert init(str(tmp_path / "other.toml")).exit_code == 0
    assert load_settings().max_task_per_gpu == 4  # the broken line is gone


def test_a_line_appended_to_the_generated_file_is_top_level(tmp_path):
    assert init().exit_code == 0
    with (tmp_path / "home" / "config.toml").open("a") as f:
        f.write("telemetry_interval = 1\n")
    settings = load_settings()
    assert settings.telemetry_interval == 1 and settings.health.timeout == 30
    with (tmp_path / "home" / "config.toml").open("a") as f:
        f.write("max_task_per_gpu = 3\n")  # the file sets it already
    refused("a setting or [section] given twice (there and earlier in the file); keep one of them")


@pytest.mark.parametrize(("text", "said"), [
    ("[health]\ntimeout = 30\nmax_task_per_gpu = 3\n",
     "unknown setting [health] 'max_task_per_gpu': max_task_per_gpu is a top-level setting; put it above the "
     "first [section]"),
    ("[health]\nmax_tasks_per_gpu = 3\n",
     "[health] 'max_tasks_per_gpu'; did you mean 'max_task_per_gpu'? It is a top-level setting"),
    ("[health]\ntimout = 3\n", "[health] 'timout'; did you mean 'timeout'? Correct or remove it"),
    # A job option a template does not set is no misplaced top-level setting: `gpus` was read
    # as fake_gpus ("did you mean 'fake_gpus'? ... put it above the first [section]"), `pool` as
    # pools, advice that set fake cards or a pool table.
    ('[templates.ddp]\ngpu_memory = "20G"\ngpus = 2\n',
     "[templates.ddp] 'gpus': a template does not set gpus: give it when submitting (rig-submit --gpus N, or "
     "gpus= in Python); [templates.ddp] takes description, gpu_memory, margin, oom_retry_grow, priority, "
     "retries, time_limit"),
    ('[templates.a100]\npool = "a100"\n', "[templates.a100] 'pool': a template does not set pool"),
    ('[templates.x]\ncommand = "python ft.py"\n', "'command': a template does not set the command"),
])
def test_a_top_level_setting_under_a_section_says_so(tmp_path, text, said):
    (tmp_path / "rig.toml").write_text(text)
    refused(said)


def test_rig_init_says_when_rig_would_not_read_what_it_wrote(tmp_path):
    result = init(str(tmp_path / "other.toml"))
    assert "rig does not read this file here" in result.output and "RIG_CONFIG=" in result.output
    # No ./rig.toml: rig reads its home's file, which is not "in this folder" and not there yet
    # (it read "<home>/config.toml comes first in this folder").
    assert f"it reads {tmp_path / 'home' / 'config.toml'} (absent: the defaults)" in result.output, result.output
    assert "comes first" not in result.output
    (tmp_path / "rig.toml").write_text("")
    result = init()
    assert f"{tmp_path / 'rig.toml'} comes first in this folder" in result.output
    assert "rig does not read" not in init(str(tmp_path / "rig.toml"), "--force").output


def test_rig_init_says_when_rig_node_name_in_the_shell_overrides_the_name_it_wrote(tmp_path, monkeypatch):
    """`rig init --node-name gpu2` in a shell that still has RIG_NODE_NAME=gpu1: the file says
    gpu2, every rig command there runs as gpu1 (the variable wins), and nothing said so."""
    monkeypatch.setenv("RIG_NODE_NAME", "gpu1")
    result = init("--node-name", "gpu2")
    assert result.exit_code == 0, result.output
    assert load_settings().node_name == "gpu1"
    assert 'note: RIG_NODE_NAME=gpu1 set in this shell overrides node_name = "gpu2"' in result.output
    assert "RIG_NODE_NAME" not in init("--node-name", "gpu1", "--force").output  # the same name: no note


def test_rig_init_never_says_to_write_a_password_and_names_section_variables(tmp_path, monkeypatch):
    """RIG_REDIS_PASSWORD in the shell was listed with "add them there" (a password into the
    config file its own comments keep it out of); a password in RIG_REDIS_URL was dropped from
    the file in silence; RIG_ALERTS__MAX_QUEUE was not listed at all."""
    monkeypatch.setenv("RIG_REDIS_PASSWORD", "s3cret")
    monkeypatch.setenv("RIG_ALERTS__MAX_QUEUE", "7")
    result = init()
    assert result.exit_code == 0, result.output
    assert "s3cret" not in (tmp_path / "home" / "config.toml").read_text() and "s3cret" not in result.output
    listed = next(line for line in result.output.splitlines() if "set in this shell" in line)
    assert "RIG_REDIS_PASSWORD" not in listed and "RIG_ALERTS__*" in listed, listed
    assert "note: RIG_REDIS_PASSWORD is not written to " in result.output
    assert "redis_password_file" in result.output
    monkeypatch.delenv("RIG_REDIS_PASSWORD")
    monkeypatch.setenv("RIG_REDIS_URL", "redis://:s3cret@db.example:6379/0")
    result = init("--force")
    assert "s3cret" not in (tmp_path / "home" / "config.toml").read_text() and "s3cret" not in result.output
    assert "note: the password in RIG_REDIS_URL is not written to " in result.output, result.output
    monkeypatch.setenv("RIG_REDIS_URL", "redis://db.example:6379/0")
    assert "password" not in init("--force").output


def test_rig_init_writes_the_file_rig_config_names(tmp_path, monkeypatch):
    target = tmp_path / "x" / "new.toml"
    monkeypatch.setenv("RIG_CONFIG", str(target))
    result = init()
    assert result.exit_code == 0, result.output
    assert target.is_file() and load_settings().config_file == target
    target.unlink()
    assert init(str(target)).exit_code == 0 and target.is_file()


# -- 3, 4: what rig init writes, and where it cannot ------------------------------------------
@pytest.mark.parametrize("name", ['x"y', "a b", "", "-a", "a" * 64])
def test_rig_init_refuses_a_bad_node_name_in_one_line(tmp_path, name):
    one_line(init("--node-name", name), InvalidInput.exit_code, "--node-name")
    assert not (tmp_path / "home" / "config.toml").exists()


def test_rig_init_escapes_what_it_writes(tmp_path, monkeypatch):
    home = tmp_path / 'odd "home" \\ x'
    monkeypatch.setenv("RIG_HOME", str(home))
    monkeypatch.setenv("RIG_KEY_PREFIX", 'a"b:')
    assert init("--node-name", "gpu-1.lab").exit_code == 0
    data = tomllib.loads((home / "config.toml").read_text())
    assert data["node_name"] == "gpu-1.lab" and data["key_prefix"] == 'a"b:'
    assert data["log_dir"] == str(home / "logs" / "jobs")
    monkeypatch.delenv("RIG_KEY_PREFIX")
    assert load_settings().key_prefix == 'a"b:'


def test_rig_init_where_it_cannot_write_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line(init(str(tmp_path / "afile" / "sub" / "rig.toml")), ConfigError.exit_code,
             "cannot write the config file")


def test_rig_init_never_leaves_half_a_file(tmp_path, monkeypatch):
    """ENOSPC in the middle: the old file stays whole."""
    assert init().exit_code == 0
    config = tmp_path / "home" / "config.toml"
    before = config.read_text()

    def full(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    one_line(init("--force"), ConfigError.exit_code, "No space left on device")
    monkeypatch.undo()
    assert config.read_text() == before
    assert [p.name for p in config.parent.iterdir()] == ["config.toml"]


# -- 5: a config path that is no file -----------------------------------------------------------
def test_a_config_path_that_is_a_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "rig.toml").mkdir()
    refused(f"the config file {tmp_path / 'rig.toml'} is a directory")
    (tmp_path / "rig.toml").rmdir()
    (tmp_path / "home" / "config.toml").mkdir(parents=True)
    refused("config.toml is a directory")
    monkeypatch.setenv("RIG_CONFIG", str(tmp_path))
    refused(f"RIG_CONFIG names {tmp_path}, which is a directory")


def test_a_config_path_that_is_no_regular_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_CONFIG", "/dev/null")
    refused("which is a device, not a regular file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("RIG_CONFIG", str(fifo))
    refused("which is a FIFO, not a regular file")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    monkeypatch.setenv("RIG_CONFIG", str(loop))
    refused("which is a symlink loop")
    monkeypatch.setenv("RIG_CONFIG", str(tmp_path / "none.toml"))
    refused("which does not exist; run `rig init")


# -- 7, 8: listen addresses -------------------------------------------------------------------
@pytest.mark.parametrize(("var", "value", "said"), [
    ("RIG_FLOWER_ADDRESS", "not an ip!", "RIG_FLOWER_ADDRESS: 'not an ip!' is neither an IP address nor a host name"),
    ("RIG_METRICS_ADDRESS", "999.1.1.1", "RIG_METRICS_ADDRESS: '999.1.1.1' is not an IP address"),
    ("RIG_METRICS_ADDRESS", "", "RIG_METRICS_ADDRESS: it is empty"),
    ("RIG_FLOWER_ADDRESS", "no-such-host.invalid", "the host name 'no-such-host.invalid' does not resolve"),
])
def test_a_bad_listen_address_is_refused_at_load(monkeypatch, var, value, said):
    monkeypatch.setenv(var, value)
    refused(said)


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "[::1]"])
def test_good_listen_addresses_load(monkeypatch, address):
    monkeypatch.setenv("RIG_METRICS_ADDRESS", address)
    assert load_settings().metrics_address == address


def test_a_bad_address_in_the_file_names_the_key(tmp_path):
    (tmp_path / "rig.toml").write_text('flower_address = "not an ip!"\n')
    refused(f"{tmp_path / 'rig.toml'}: flower_address: 'not an ip!' is neither")


def test_the_metrics_url_is_printed_only_for_an_endpoint_that_answers():
    from rig.metrics import answers

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert answers("127.0.0.1", port) and answers("0.0.0.0", port)
    assert not answers("127.0.0.1", port)


# -- 9, 10: a Redis URL that reaches no usable Redis ------------------------------------------
def _cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIG_")}
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], env={**base, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def http_server():
    """An HTTP server on a free loopback port: something that answers, but not as Redis."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.server_port}/0"
    server.shutdown()
    server.server_close()


def _db_99(real_redis) -> str:  # noqa: ANN001
    from tests.conftest import REDIS_URL

    parts = urlsplit(REDIS_URL)
    return parts._replace(path="/99").geturl()


COMMANDS = [["rig", "status"], ["rig-submit", "--gpu-memory", "1G", "--", "true"],
            ["rig", "up", "--fake-gpus", "1x8G", "--no-flower", "--no-metrics"]]  # never starts a Redis


@pytest.mark.parametrize("command", COMMANDS)
def test_no_such_database_is_one_line_exit_5(tmp_path, real_redis, command):
    done = _cli(command, {"RIG_HOME": str(tmp_path / "home"), "RIG_REDIS_URL": _db_99(real_redis)}, tmp_path)
    assert done.returncode == RedisUnavailable.exit_code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no such database (DB index is out of range)" in lines[0], done.stderr
    assert not (tmp_path / "home" / "redis").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_is_not_redis_is_one_line_exit_5(tmp_path, http_server, command):
    done = _cli(command, {"RIG_HOME": str(tmp_path / "home"), "RIG_REDIS_URL": http_server}, tmp_path)
    assert done.returncode == RedisUnavailable.exit_code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not answer as Redis does" in lines[0], done.stderr


def test_the_client_raises_rigs_error_for_no_redis_there(http_server, real_redis, monkeypatch):
    from rig.client import Client

    for url, said in ((http_server, "does not answer as Redis does"), (_db_99(real_redis), "no such database")):
        monkeypatch.setenv("RIG_REDIS_URL", url)
        client = Client()
        with pytest.raises(RedisUnavailable, match=said):
            client.ping()
        with pytest.raises(RedisUnavailable, match=said):
            client.submit(["true"], gpu_memory="1G")


# -- 11: path settings ------------------------------------------------------------------------
def test_relative_paths_are_under_rigs_home(tmp_path, monkeypatch):
    (tmp_path / "rig.toml").write_text('log_dir = "relogs"\ncommand_workdir = "work"\n')
    monkeypatch.setenv("RIG_SYSTEM_LOG_DIR", "sys/logs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    settings = load_settings()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("RIG_CONFIG", str(tmp_path / "rig.toml"))
    assert load_settings().job_log_dir == settings.job_log_dir == tmp_path / "home" / "relogs"
    assert settings.rig_log_dir == tmp_path / "home" / "sys" / "logs"
    assert settings.command_workdir == tmp_path / "home" / "work"
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 0, result.output
    assert f"are taken under home, {tmp_path / 'home'}" in result.output
    assert f"log_dir = {str(tmp_path / 'home' / 'relogs')!r}  # file" in result.output.splitlines()  # text


def test_a_log_dir_that_is_a_file_or_the_system_log_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_LOG_DIR", "/etc/passwd")
    refused("log_dir = '/etc/passwd' (RIG_LOG_DIR) is not a folder")
    monkeypatch.setenv("RIG_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("RIG_SYSTEM_LOG_DIR", str(tmp_path / "logs"))
    refused("is also system_log_dir")
    monkeypatch.setenv("RIG_LOG_DIR", str(tmp_path / "home" / "logs" / "system"))
    monkeypatch.delenv("RIG_SYSTEM_LOG_DIR")
    refused("give each its own folder")  # the default system_log_dir


# -- 16: a BOM; health.check_interval against health.timeout ---------------------------------
def test_a_bom_is_accepted(tmp_path):
    (tmp_path / "rig.toml").write_bytes(b"\xef\xbb\xbfmax_retries = 3\n")
    assert load_settings().max_retries == 3


def test_a_check_interval_not_below_the_timeout_is_refused(tmp_path):
    (tmp_path / "rig.toml").write_text("[health]\ncheck_interval = 100\ntimeout = 30\n")
    refused("health.check_interval = 100 (")
    refused("set health.check_interval below 30")


@pytest.mark.parametrize("name", ["hold_after_seconds", "aging_seconds", "backfill_estimate_delay_seconds",
                                  "kill_grace_seconds", "alert_interval", "health.assigned_timeout",
                                  "alerts.failure_window"])
def test_a_duration_setting_longer_than_30_days_is_refused_in_one_line_naming_it(name, monkeypatch):
    """Issue 13: ``hold_after_seconds = 1e300`` was taken silently and turned holds off (big
    jobs could starve). Every duration setting in seconds is bounded by one rule
    (rig.config.MAX_SETTING_SECONDS), refused as other bad values are (exit 6)."""
    monkeypatch.setenv("RIG_" + name.upper().replace(".", "__"), "1e300")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith(f"RIG_{name.upper().replace('.', '__')}: give at most 30 days (2592000 s)")
    assert info.value.exit_code == 6 and "\n" not in str(info.value)
    monkeypatch.setenv("RIG_" + name.upper().replace(".", "__"), str(30 * 86400))
    load_settings()  # the bound itself is allowed


def test_error_queue_logs_kept_shorter_than_the_others_are_refused(monkeypatch):
    """error_log_retention_days = 7 beside the default 30 deleted the logs of the jobs waiting
    in the error queue for a person first, the evidence M15 keeps them there for."""
    monkeypatch.setenv("RIG_ERROR_LOG_RETENTION_DAYS", "7")
    refused("error_log_retention_days = 7 (RIG_ERROR_LOG_RETENTION_DAYS) is shorter than "
            "log_retention_days = 30 (default)")
    refused("set error_log_retention_days to at least 30")
    monkeypatch.setenv("RIG_LOG_RETENTION_DAYS", "7")
    assert load_settings().error_log_retention_days == 7


def test_error_queue_logs_not_set_are_kept_as_long_as_a_longer_log_retention(tmp_path, monkeypatch):
    """A config that only raises log_retention_days past the default 90 (keep job logs half a
    year) was refused by every command, rig-submit included, once a shorter
    error_log_retention_days was refused: the default 90 read as set shorter. Not set, it
    follows the longer retention; one set shorter on purpose is still refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rig.toml").write_text("log_retention_days = 180\n")
    settings = load_settings()
    assert (settings.log_retention_days, settings.error_log_retention_days) == (180, 180)
    monkeypatch.setenv("RIG_LOG_RETENTION_DAYS", "20")
    assert load_settings().error_log_retention_days == 90  # the default, when it is the longer
    monkeypatch.setenv("RIG_ERROR_LOG_RETENTION_DAYS", "100")
    monkeypatch.delenv("RIG_LOG_RETENTION_DAYS")
    refused("error_log_retention_days = 100 (RIG_ERROR_LOG_RETENTION_DAYS) is shorter than "
            "log_retention_days = 180 (")


@pytest.mark.parametrize("text", ['max_gpu_memory_per_user = ""\n',
                                  'max_gpu_memory_per_user = "160G"\n[user_limits.alice]\nmax_gpu_memory = " "\n'])
def test_an_empty_memory_limit_is_refused_not_read_as_no_limit(tmp_path, text):
    """An empty limit was read as "0", no limit: alice's own empty one lifted the default
    160G for her in silence (and RIG_MAX_GPU_MEMORY_PER_USER="$LIMIT" with LIMIT unset, the
    cluster's)."""
    (tmp_path / "rig.toml").write_text(text)
    refused("is empty (an unset variable?): give a size like 160G, or 0 for no limit")


def test_an_empty_memory_limit_variable_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_MAX_GPU_MEMORY_PER_USER", "")
    refused("RIG_MAX_GPU_MEMORY_PER_USER: max_gpu_memory_per_user is empty")
    monkeypatch.setenv("RIG_MAX_GPU_MEMORY_PER_USER", "0")
    assert load_settings().user_limit("bob").max_bytes == 0  # 0 is still no limit


@pytest.mark.parametrize("name", ["", "a b", "a\\u001bb", "-x"])
def test_a_template_name_that_cannot_be_typed_after_template_is_refused(tmp_path, name):
    """`[templates.""]` was taken, and `rig-submit --template "$T"` with T unset then used it;
    a name with an escape character went into job records."""
    (tmp_path / "rig.toml").write_text(f'[templates."{name}"]\ngpu_memory = "1G"\n')
    refused("template name")
