import re

import pytest

from rig.config import load_settings
from rig.errors import ConfigError


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    for key in list(__import__("os").environ):
        if key.startswith("RIG_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def test_defaults():
    s = load_settings()
    assert s.key_prefix == "rig:"
    assert s.max_task_per_gpu == 4
    assert s.scheduler_type == "multi-factor"
    assert s.gpu_whitelist is None
    assert s.job_log_dir == s.home / "logs" / "jobs"
    assert s.rig_log_dir == s.home / "logs" / "system"
    assert s.job_log_dir != s.rig_log_dir


def test_env_overrides_with_prefix(monkeypatch):
    monkeypatch.setenv("RIG_MAX_TASK_PER_GPU", "2")
    monkeypatch.setenv("RIG_GPU_WHITELIST", "0,2")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "60")
    monkeypatch.setenv("RIG_SCHEDULER_TYPE", "first-fit")
    s = load_settings()
    assert s.max_task_per_gpu == 2
    assert s.gpu_whitelist == [0, 2]
    assert s.health.timeout == 60
    assert s.scheduler_type == "first-fit"


def test_config_file_written_by_init_is_read(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rig.cli.main import cli

    path = tmp_path / "rig.toml"
    result = CliRunner().invoke(cli, ["init", str(path), "--node-name", "gpu-box"])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    for field in ("node_name", "scheduler_type", "gpu_whitelist", "max_task_per_gpu", "check_interval",
                  "default_priority", "max_retries", "command_workdir", "log_dir"):
        assert field in text
    path.write_text(text.replace("max_task_per_gpu = 4", "max_task_per_gpu = 3"))
    s = load_settings()  # ./rig.toml in the current folder
    assert s.node_name == "gpu-box"
    assert s.max_task_per_gpu == 3
    assert s.config_file == path
    monkeypatch.setenv("RIG_MAX_TASK_PER_GPU", "1")
    assert load_settings().max_task_per_gpu == 1  # environment beats the file
    again = CliRunner().invoke(cli, ["init", str(path)])
    assert again.exit_code != 0 and "--force" in again.output


def test_bad_values_are_one_line_config_errors(monkeypatch):
    monkeypatch.setenv("RIG_SCHEDULER_TYPE", "random")
    with pytest.raises(ConfigError, match="RIG_SCHEDULER_TYPE: .*multi-factor"):
        load_settings()


def test_missing_explicit_config_file(monkeypatch, tmp_path):
    monkeypatch.setenv("RIG_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="rig init"):
        load_settings()


def test_key_prefix_gets_a_colon():
    assert load_settings(key_prefix="team").key_prefix == "team:"


def test_settings_survive_the_trip_to_child_processes(monkeypatch, tmp_path):
    """rig up exports its resolved settings as RIG_* variables for its workers."""
    from rig.stack import settings_env

    (tmp_path / "rig.toml").write_text('max_task_per_gpu = 3\n[templates.mine]\ngpu_memory = "3G"\n'
                                        '[health]\ntimeout = 12\n')
    original = load_settings(gpu_whitelist=[1, 2])
    for key, value in settings_env(original).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path.parent)  # the child does not see ./rig.toml
    again = load_settings()
    assert again.model_dump(exclude={"config_file"}) == original.model_dump(exclude={"config_file"})


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"user_limits": {"bob": {"max_gpu_memory": "80 gigs"}}}, "unknown unit 'gigs'"),
    ({"user_limits": {"bob": {"max_memory": "8G"}}}, "user_limits.bob.max_memory"),
    ({"pools": {"a": ["n1:0-99999999999"]}}, "card index 99999999999 is not from 0 to"),
    ({"pools": {"a": ["n1:3-1"]}}, "runs backwards"),
    ({"max_gpu_memory_per_user": "12Q"}, "unknown unit 'Q'"),
])
def test_team_settings_are_checked_when_loaded(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_settings(**overrides)


@pytest.mark.parametrize(("text", "said"), [
    ("max_task_per_gpus = 1\n", "unknown setting 'max_task_per_gpus'; did you mean 'max_task_per_gpu'?"),
    ("[helth]\ntimeout = 3\n", "unknown setting 'helth'; did you mean 'health'?"),
    ("[health]\nchek_interval = 1\n", "unknown setting [health] 'chek_interval'; did you mean 'check_interval'?"),
])
def test_a_misspelt_setting_in_the_config_file_is_refused(tmp_path, monkeypatch, text, said):
    """Breaker: typos were silently ignored, so the operator's limit never applied."""
    from rig.errors import ConfigError

    path = tmp_path / "rig.toml"
    path.write_text(text)
    monkeypatch.setenv("RIG_CONFIG", str(path))
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_settings()


def test_rig_init_writes_the_key_prefix_in_force_and_loads_back(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rig.cli.main import cli

    monkeypatch.setenv("RIG_KEY_PREFIX", "lab2:")
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "c.toml")])
    assert result.exit_code == 0, result.output
    monkeypatch.delenv("RIG_KEY_PREFIX")
    monkeypatch.setenv("RIG_CONFIG", str(tmp_path / "c.toml"))
    assert load_settings().key_prefix == "lab2:"  # the whole shipped template passes the key check
