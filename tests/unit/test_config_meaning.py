"""Configuration that says what it means (issue 11, item 6).

Every misspelt key is refused wherever it is written, with the closest name; every bad value
and every bad relation between values is one ConfigError line naming its source (file and key,
variable, flag) and what to do; from load_settings, Settings, the Client and the CLI alike.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rig.config import Settings, load_settings
from rig.config_check import OWN_VARIABLES, settings_shape
from rig.errors import ConfigError, InvalidInput

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.upper().startswith("RIG_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RIG_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def refused(match: str, **overrides) -> str:
    """load_settings raises one ConfigError line containing ``match`` (literally)."""
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    text = str(info.value)
    assert match in text, text
    assert "\n" not in text and "validation error" not in text and "pydantic" not in text, text
    return text


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rig.toml"
    path.write_text(text)
    return path


# -- misspelt keys -----------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "said"), [
    ("max_tasks_per_gpu = 3\n", "unknown setting 'max_tasks_per_gpu'; did you mean 'max_task_per_gpu'?"),
    ("[health]\ntimout = 30\n", "unknown setting [health] 'timout'; did you mean 'timeout'?"),
    ("[alerts]\nmax_queu = 3\n", "unknown setting [alerts] 'max_queu'; did you mean 'max_queue'?"),
    ('[templates.big]\ngpu_mem = "4G"\n', "unknown setting [templates.big] 'gpu_mem'; did you mean 'gpu_memory'?"),
    ("[user_limits.bob]\nmax_job = 3\n", "unknown setting [user_limits.bob] 'max_job'; did you mean 'max_jobs'?"),
    # A user (or template) named with a dot: TOML splits it; the fix is quoting, not a typo.
    ("[user_limits.o.brien]\nmax_jobs = 1\n",
     "unknown setting [user_limits.o] 'brien': TOML reads the dots of [user_limits.o.brien] as sections; "
     "a name with a dot is quoted: [user_limits.\"o.brien\"]"),
    ("[heath]\ntimeout = 30\n", "unknown setting 'heath'; did you mean 'health'?"),
    ("zzz = 1\n", "unknown setting 'zzz'; correct or remove it"),
])
def test_a_misspelt_key_in_the_file_is_refused_with_the_closest_name(tmp_path, text, said):
    path = write(tmp_path, text)
    message = refused(said)
    assert message.startswith(f"{path}: ")


@pytest.mark.parametrize(("var", "value", "said"), [
    ("RIG_MAX_TASKS_PER_GPU", "3", "RIG_MAX_TASKS_PER_GPU: unknown rig setting; did you mean RIG_MAX_TASK_PER_GPU?"),
    ("RIG_HEALTH__TIMOUT", "30", "RIG_HEALTH__TIMOUT: unknown rig setting; did you mean RIG_HEALTH__TIMEOUT?"),
    ("RIG_HELTH__TIMEOUT", "30", "RIG_HELTH__TIMEOUT: unknown rig setting; did you mean RIG_HEALTH__TIMEOUT?"),
    ("RIG_TIMEOUT", "30", "RIG_TIMEOUT: unknown rig setting; did you mean RIG_HEALTH__TIMEOUT or "),
    ("RIG_PRIORITY", "high", "RIG_PRIORITY: unknown rig setting; did you mean RIG_DEFAULT_PRIORITY?"),
    ("RIG_HEALTH_TIMEOUT", "30", "did you mean RIG_HEALTH__TIMEOUT?"),
    ("RIG_REDIS_URI", "redis://h:1/0", "did you mean RIG_REDIS_URL?"),
    ("rig_health__timout", "30", "did you mean RIG_HEALTH__TIMEOUT?"),  # pydantic reads any case
    ("RIG_TEMPLATES__BIG__GPU_MEM", "4G", "did you mean RIG_TEMPLATES__BIG__GPU_MEMORY?"),
    ("RIG_USER_LIMITS__BOB__MAX_JOB", "4", "did you mean RIG_USER_LIMITS__BOB__MAX_JOBS?"),
    ("RIG_HEALTH__TIMEOUT__X", "4", "RIG_HEALTH__TIMEOUT is one value, not a table"),
    ("RIG_HEALTH", '{"timout": 3}', "RIG_HEALTH: unknown setting 'timout' in its JSON; did you mean 'timeout'?"),
    ("RIG_TEMPLATES", '{"big": {"gpu_mem": "4G"}}', "unknown setting 'big.gpu_mem' in its JSON"),
])
def test_a_misspelt_variable_is_refused_with_the_closest_name(monkeypatch, var, value, said):
    monkeypatch.setenv(var, value)
    refused(said)


def test_a_misspelt_keyword_is_refused():
    refused("unknown setting 'max_tasks_per_gpu'; did you mean 'max_task_per_gpu'?", max_tasks_per_gpu=3)
    refused("unknown setting 'health.timout'; did you mean 'timeout'?", health={"timout": 3})
    with pytest.raises(ConfigError, match="did you mean 'max_task_per_gpu'"):
        Settings(max_tasks_per_gpu=3)  # the model itself, not only load_settings


def test_rigs_own_variables_are_no_typos(monkeypatch):
    for name in OWN_VARIABLES - {"RIG_CONFIG"}:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("NOTEBOOK_THEME", "dark")  # not RIG_*: not rig's business
    load_settings()


@pytest.mark.parametrize(("var", "said"), [
    ("RIG_NODE", "RIG_NODE: unknown rig setting; did you mean RIG_NODE_NAME?"),
    ("RIG_CONFIG_FILE", "did you mean RIG_CONFIG?"),
    ("RIG_CONF", "did you mean RIG_CONFIG?"),
    ("RIG_REDIS_HOST", "did you mean RIG_REDIS_URL?"),
    ("RIG_GPU_MEMORY", "RIG_GPU_MEMORY: unknown rig setting"),
    ("RIG_DEBUG", "RIG_DEBUG: unknown rig setting"),
    ("RIG_NOTEBOOK_THEME", "RIG_NOTEBOOK_THEME: unknown rig setting"),
])
def test_every_unknown_rig_variable_is_refused(monkeypatch, var, said):
    """The RIG_ prefix is rig's: a variable that is neither a setting nor one of rig's own is a
    slip, however far from every name (RIG_NODE meant RIG_NODE_NAME), never ignored."""
    monkeypatch.setenv(var, "a")
    refused(said)


#: RIG_* names the sources write on purpose that are no variable of rig's: the typos the tests
#: and the config-slips scenario make, and the examples in comments and docs.
BY_DESIGN = {"RIG_TIMEOUT", "RIG_PRIORITY", "RIG_X", "RIG_ALERTS__NAME", "RIG_SECTION__NAME", "RIG_NAME",
             "RIG_NODE", "RIG_CONFIG_FILE", "RIG_REDIS_URI", "RIG_HEALTH__TIMOUT", "RIG_MAX_TASKS_PER_GPU",
             "RIG_OWNED_PREFIX", "RIG_OWNED_NAMES",  # Python names in rig.job_env
             "RIG_ANYTHING"}  # tests/unit/test_job_env.py: any RIG_* is kept from a job


def test_no_rig_variable_in_the_sources_is_refused():
    """Every RIG_* variable rig sets or reads (a job's identity, a worker's mark, a script's or a
    test helper's knob) is a setting or in OWN_VARIABLES, or rig would refuse to start where it
    is set. This file's own typos are by design."""
    from rig.config_check import check_env_keys

    shape = settings_shape(Settings)
    patterns = ["rig/**/*.py", "workers/**/*.py", "scripts/*", "tests/**/*.py", ".ci/**/*", "docs/*.md",
                "examples/**/*", "config/**/*"]
    files = [p for pattern in patterns for p in ROOT.glob(pattern)]
    files += [ROOT / "README.md", ROOT / "Dockerfile", ROOT / "docker-compose.yml", ROOT / ".env.example"]
    found: dict[str, str] = {}
    for path in files:
        if path.is_file() and path.resolve() != Path(__file__).resolve():
            for name in re.findall(r"\bRIG_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
                found.setdefault(name, str(path.relative_to(ROOT)))
    taken: dict[str, str] = {}
    for name, where in found.items():
        if name in BY_DESIGN or name in OWN_VARIABLES:
            continue
        try:
            check_env_keys({name: "{}"}, shape)
        except ConfigError as exc:
            taken[name] = f"{where}: {exc}"
    assert not taken, f"add these to rig.config_check.OWN_VARIABLES: {taken}"
    assert {"RIG_JOB_NAME", "RIG_ALERTS__NAME", "RIG_TEST_REDIS_URL"} <= set(found)  # the scan reads what it should
    assert not (BY_DESIGN & OWN_VARIABLES)


def test_exported_settings_load_back_in_a_child(monkeypatch, tmp_path):
    """rig up hands its settings on as RIG_* variables: none of them reads as a typo."""
    from rig.stack import settings_env

    write(tmp_path, '[templates.mine]\ngpu_memory = "3G"\n[pools]\na = ["n1"]\n'
                    '[user_limits.bob]\nmax_jobs = 2\n[health]\ntimeout = 12\n')
    original = load_settings(gpu_whitelist=[1, 2], admins=["ann"])
    for key, value in settings_env(original).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path.parent)
    again = load_settings()
    assert again.model_dump(exclude={"config_file"}) == original.model_dump(exclude={"config_file"})


# -- bad values name their source --------------------------------------------------------------
@pytest.mark.parametrize(("url", "said"), [
    ("htp://localhost:6379/0", "the scheme 'htp' is not redis, rediss, unix or sentinel"),
    ("localhost:6379", "is not redis, rediss, unix or sentinel"),
    ("redis://localhost:99999/0", "its port is not a number from 1 to 65535"),
    ("redis://localhost:0/0", "its port 0 is not from 1 to 65535"),
    ("redis:///0", "it names no host"),
    ("redis://localhost:6379/x", "its database 'x' is not a number"),
    ("unix://", "needs the socket's path"),
])
def test_a_bad_redis_url_is_one_line_with_the_expected_form(monkeypatch, url, said):
    monkeypatch.setenv("RIG_REDIS_URL", url)
    message = refused(said)
    assert message.startswith("RIG_REDIS_URL: ") and "redis://host:port/db" in message
    assert "unset it to use the default 'redis://127.0.0.1:6379/0'" in message


@pytest.mark.parametrize("url", ["redis://10.0.0.5:6380/2", "rediss://cache.example:6380/0",
                                 "unix:///run/redis/redis.sock", "redis://h", "redis://:pw@h:6379"])
def test_good_redis_urls_load(url):
    assert load_settings(redis_url=url).redis_url.startswith(url.split(":")[0])


def test_a_bad_redis_url_never_shows_its_password():
    message = refused("--redis-url (redis_url): ", redis_url="redis://:s3cret@localhost:6379/x")
    assert "s3cret" not in message and "***" in message


@pytest.mark.parametrize(("var", "value", "said"), [
    ("RIG_FLOWER_PORT", "99999", "RIG_FLOWER_PORT: Input should be less than or equal to 65535"),
    ("RIG_FLOWER_PORT", "0", "RIG_FLOWER_PORT: Input should be greater than or equal to 1"),
    ("RIG_METRICS_PORT", "70000", "RIG_METRICS_PORT: "),
    ("RIG_HEALTH", "garbage", "RIG_HEALTH: expected a JSON object for the [health] settings, got 'garbage'"),
    ("RIG_USER_LIMITS", "[1]", "RIG_USER_LIMITS: expected a JSON object"),
    ("RIG_HEALTH__TIMEOUT", "soon", "RIG_HEALTH__TIMEOUT: Input should be a valid number"),
    ("RIG_GPU_WHITELIST", "a,b", "RIG_GPU_WHITELIST: write card indexes like 0,1,3"),
    ("RIG_GPU_WHITELIST", "1,1", "RIG_GPU_WHITELIST: card indexes repeat"),
    ("RIG_GPU_WHITELIST", "-1", "card index -1 is not from 0 to"),
    ("RIG_FAKE_GPUS", "lots", "RIG_FAKE_GPUS: cannot read 'lots'; write it like 8x80G"),
    ("RIG_MAX_RETRIES", "1000", "RIG_MAX_RETRIES: Input should be less than or equal to 100"),
    ("RIG_VRAM_RESERVE_FRACTION", "1", "RIG_VRAM_RESERVE_FRACTION: Input should be less than 1"),
    ("RIG_HEALTH__TIMEOUT", "inf", "RIG_HEALTH__TIMEOUT: Input should be a finite number"),
    ("RIG_TELEMETRY_INTERVAL", "nan", "RIG_TELEMETRY_INTERVAL: "),
    # a period of 0.01 s was taken: beat queued 373 archiving passes in 15 s that expired unrun
    ("RIG_ARCHIVE_INTERVAL", "0.01", "RIG_ARCHIVE_INTERVAL: give at least 1 s: rig does this work once a period"),
    ("RIG_ALERT_INTERVAL", "0.5", "RIG_ALERT_INTERVAL: give at least 1 s"),
    ("RIG_HEALTH__CHECK_INTERVAL", "0.01", "RIG_HEALTH__CHECK_INTERVAL: give at least 0.2 s"),
    ("RIG_TELEMETRY_INTERVAL", "0.001", "RIG_TELEMETRY_INTERVAL: give at least 0.1 s"),
    ("RIG_ADMINS", "[x", "RIG_ADMINS: write user names like alice,bob"),
    ("RIG_HOME", "", "RIG_HOME: empty"),
    # relative: `rig down` from another folder said "rig is not up" of the rig it had started
    ("RIG_HOME", "myhome", "RIG_HOME: 'myhome' is a relative path, which names another folder wherever rig runs; "
                           "give an absolute one, e.g. /"),
    ("RIG_ALERT_WEBHOOK", "hooks.example/x", "RIG_ALERT_WEBHOOK: write it like https://host/path"),
])
def test_a_bad_variable_names_itself_and_what_it_expects(monkeypatch, var, value, said):
    monkeypatch.setenv(var, value)
    message = refused(said)
    assert f"set {var} to a valid value or unset it" in message or "or unset it" in message
    assert "cannot read the config file" not in message


def test_an_empty_folder_variable_means_unset(monkeypatch, tmp_path):
    monkeypatch.setenv("RIG_LOG_DIR", "")
    monkeypatch.setenv("RIG_COMMAND_WORKDIR", " ")
    s = load_settings()
    assert s.log_dir is None and s.command_workdir is None  # never the current folder
    assert s.job_log_dir == tmp_path / "home" / "logs" / "jobs"


def test_metrics_port_zero_turns_it_off():
    assert load_settings(metrics_port=0).metrics_port == 0


def test_a_bad_value_in_the_file_names_the_file_and_key(tmp_path):
    path = write(tmp_path, "[health]\ncheck_interval = -1\n")
    refused(f"{path}: [health] check_interval: give at least 0.2 s: rig does this work once a period, and a shorter period queues more of it than can run (got -1); correct it in {path}, "
            "or delete the line to use the default 5.0")


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "max_task_per_gpu = \n")
    refused(f"cannot read the config file {path}: Invalid value (at line 1, column 20); fix its TOML syntax")


# -- templates: the submit rules, at load --------------------------------------------------------
@pytest.mark.parametrize(("line", "said"), [
    ('gpu_memory = "lots"', "[templates.big] gpu_memory: cannot read 'lots' as a size"),
    ("gpu_memory = 12", "[templates.big] gpu_memory: '12' has no unit"),
    ('gpu_memory = "40T"', "[templates.big] gpu_memory: gpu_memory 40.0 TiB is more than any card has"),
    ('time_limit = "forever"', "[templates.big] time_limit: cannot read 'forever'"),
    ('time_limit = ""', "[templates.big] time_limit: time_limit is empty"),
    ('time_limit = "20y"', "[templates.big] time_limit: cannot read '20y'"),
    ('time_limit = "4000d"', "[templates.big] time_limit: time_limit '4000d' is more than ten years"),
    ("retries = 1000", "[templates.big] retries: Input should be less than or equal to 100"),
    ('priority = "urgent"', "[templates.big] priority: Input should be 'high', 'medium' or 'low'"),
    ("margin = 0.5", "[templates.big] margin: Input should be greater than or equal to 1"),
])
def test_a_bad_template_is_refused_at_load_naming_it(tmp_path, line, said):
    path = write(tmp_path, f"[templates.big]\n{line}\n")
    message = refused(said)
    assert message.startswith(f"{path}: ") and "--gpu-memory" not in message


def test_templates_use_the_very_rules_of_the_flags():
    """One rule, one place: the template's message is the flag's, with the key for the flag."""
    from rig.request_rules import parse_gpu_memory, parse_time_limit

    for rule, flag, key, value in ((parse_gpu_memory, "--gpu-memory", "gpu_memory", "lots"),
                                   (parse_time_limit, "--time-limit", "time_limit", "4000d")):
        with pytest.raises(InvalidInput) as by_flag:
            rule(value)
        with pytest.raises(ConfigError) as by_template:
            load_settings(templates={"big": {key: value}})
        flag_text = str(by_flag.value).removeprefix(f"{flag}: ").replace(flag, key)
        assert flag_text in str(by_template.value)


def test_good_templates_load(tmp_path):
    write(tmp_path, '[templates.big]\ngpu_memory = "auto"\ntime_limit = 3600\nretries = 3\n'
                    '[templates.small]\ngpu_memory = "512M"\ntime_limit = "1h30m"\n')
    templates = load_settings().templates
    assert templates["big"].gpu_memory == "auto" and templates["big"].time_limit == "3600"
    assert templates["small"].time_limit == "1h30m"
    assert "finetune" in templates  # shipped ones stay


# -- relations ---------------------------------------------------------------------------------
def test_a_health_timeout_below_the_heartbeat_interval_is_refused(monkeypatch):
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "1")
    refused("health.timeout = 1 (RIG_HEALTH__TIMEOUT) is less than 2 x telemetry_interval = 2 (default)")
    refused("set health.timeout to at least 4 or telemetry_interval to at most 0.5")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "3.9")
    refused("at least 4")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "4")
    monkeypatch.setenv("RIG_HEALTH__CHECK_INTERVAL", "1")  # below the timeout (its own rule)
    assert load_settings().health.timeout == 4


def test_a_long_heartbeat_interval_against_the_default_timeout_is_refused(tmp_path):
    path = write(tmp_path, "telemetry_interval = 20\n")
    refused(f"health.timeout = 30 (default) is less than 2 x telemetry_interval = 20 ({path}: telemetry_interval)")


def test_two_servers_on_one_port_are_refused():
    refused("metrics_port = 5555 (metrics_port (given to load_settings)) is also flower_port = 5555 (default)",
            metrics_port=5555)
    refused("the port of redis_url, 6379 (default) is also flower_port = 6379", flower_port=6379)
    # A Redis on another host is not started here: its port is free on this one.
    assert load_settings(flower_port=6379, redis_url="redis://10.1.2.3:6379/0").flower_port == 6379
    assert load_settings(metrics_port=0, flower_port=9840).flower_port == 9840


# -- the Python API and the CLI ----------------------------------------------------------------
def test_the_client_raises_a_config_error(monkeypatch):
    from rig.client import Client

    monkeypatch.setenv("RIG_REDIS_URL", "htp://x:1/0")
    with pytest.raises(ConfigError, match="^RIG_REDIS_URL: the scheme 'htp'"):
        Client()


def test_rig_config_says_where_each_value_came_from(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rig.cli.main import cli

    write(tmp_path, "max_retries = 3\n[health]\ncheck_interval = 2\n")
    monkeypatch.setenv("RIG_HEALTH__TIMEOUT", "40")
    result = CliRunner().invoke(cli, ["--fake-gpus", "2x8G", "config"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "max_retries = 3  # file" in lines
    assert "fake_gpus = '2x8G'  # --fake-gpus" in lines
    assert "max_task_per_gpu = 4  # default" in lines
    assert any(line.startswith("health = ") and line.endswith("# file, RIG_HEALTH__TIMEOUT") for line in lines)


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIG_")}
    return subprocess.run(argv, env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=60)


CLI_CASES = [
    ({"RIG_HEALTH__TIMOUT": "30"}, "", "RIG_HEALTH__TIMOUT: unknown rig setting; did you mean RIG_HEALTH__TIMEOUT?"),
    ({"RIG_REDIS_URL": "htp://localhost:6379/0"}, "", "RIG_REDIS_URL: the scheme 'htp'"),
    ({"RIG_FLOWER_PORT": "99999"}, "", "RIG_FLOWER_PORT: "),
    ({"RIG_HEALTH": "garbage"}, "", "RIG_HEALTH: expected a JSON object"),
    ({}, "max_tasks_per_gpu = 3\n", "did you mean 'max_task_per_gpu'?"),
    ({}, '[templates.big]\ngpu_memory = "lots"\n', "[templates.big] gpu_memory: cannot read 'lots'"),
    ({}, "[health]\ntimeout = 1\n", "health.timeout = 1"),
]


SUBMIT = ["rig-submit", "--gpu-memory", "1G", "--", "true"]
UP = ["rig", "up", "--fake-gpus", "1x8G", "--no-flower"]


@pytest.mark.parametrize(("command", "env", "toml", "said"), [
    *[(["rig", "status"], *case) for case in CLI_CASES],
    *[(SUBMIT, *case) for case in CLI_CASES[::2]],
    (["rig-submit", "-t", "big", "--", "true"], *CLI_CASES[5]),
    *[(UP, *case) for case in CLI_CASES[1::2]],
])
def test_the_cli_says_one_line_and_exits_with_the_config_code(tmp_path, command, env, toml, said):
    if toml:
        write(tmp_path, toml)
    argv = [str(Path(sys.executable).parent / command[0]), *command[1:]]
    done = _run(argv, {"RIG_HOME": str(tmp_path / "home"), **env}, tmp_path)
    assert done.returncode == ConfigError.exit_code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rig: error: ") and said in lines[0], done.stderr
    assert not (tmp_path / "home" / "run").exists()  # rig up started nothing


def test_a_user_limit_or_admin_naming_nobody_here_is_said_at_rig_up(tmp_path, monkeypatch):
    """`[user_limits.alicee]` (a typo) left alice without her limit, in silence: rig up warns
    of every name in user_limits or admins without an account on the node, with the closest."""
    import pwd

    from rig.config import unknown_users

    me = pwd.getpwuid(os.getuid()).pw_name
    path = write(tmp_path, f'[user_limits.{me}x]\nmax_jobs = 1\n[user_limits.{me}]\nmax_jobs = 2\n')
    monkeypatch.setenv("RIG_CONFIG", str(path))
    monkeypatch.setenv("RIG_ADMINS", f"{me},nobody-here-zz")
    lines = unknown_users(load_settings())
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"warning: user_limits names '{me}x', who has no account on this node (did you "
                               f"mean '{me}'?)")
    assert lines[1].startswith("warning: admins names 'nobody-here-zz', who has no account on this node")


def test_a_home_under_the_users_home_is_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RIG_HOME", "~/rig-home")
    assert load_settings().home.expanduser() == tmp_path / "rig-home"  # accepted: ~ is absolute


@pytest.mark.parametrize(("var", "value", "field", "read"), [
    ("RIG_DEFAULT_PRIORITY", "HIGH", "default_priority", "high"),
    ("RIG_DEFAULT_PRIORITY", " low ", "default_priority", "low"),
    ("RIG_QUEUE_ORDER", "FIFO", "queue_order", "fifo"),
    ("RIG_SCHEDULER_TYPE", "Best-Fit", "scheduler_type", "best-fit"),
    ("RIG_OVERUSE_POLICY", "STOP ", "overuse_policy", "stop"),
])
def test_a_word_setting_is_read_as_a_flag_word_is(monkeypatch, var, value, field, read):
    """`-p HIGH` ran while RIG_DEFAULT_PRIORITY=HIGH and RIG_QUEUE_ORDER=FIFO were refused: one
    rule (rig.words.typed_word) for the flag, the variable and the file."""
    from rig.models import Priority

    monkeypatch.setenv(var, value)
    assert getattr(load_settings(), field) == read
    if field == "default_priority":
        assert Priority.parse(value).value == read  # the flag's rule, the same answer


def test_a_template_priority_is_read_as_the_flag_is(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_CONFIG", str(write(tmp_path, '[templates.big]\npriority = "High "\n')))
    assert load_settings().templates["big"].priority == "high"


@pytest.mark.parametrize(("value", "cards"), [("0-1", [0, 1]), ("0-2,5", [0, 1, 2, 5]), (" 3 , 0-1 ", [3, 0, 1])])
def test_the_whitelist_takes_ranges_as_pools_do(monkeypatch, value, cards):
    """`RIG_GPU_WHITELIST=0-1` was refused though pools take `gpu3:0-1`: one card-list rule."""
    from rig.pools import parse_member

    monkeypatch.setenv("RIG_GPU_WHITELIST", value)
    assert load_settings().gpu_whitelist == cards
    assert parse_member(f"n1:{value.replace(' ', '')}").cards == frozenset(cards)


def test_a_refused_number_says_what_it_got(monkeypatch):
    """RIG_AGING_SECONDS=0 left out "(got '0')": the 0 of "greater than 0" read as the value quoted."""
    monkeypatch.setenv("RIG_AGING_SECONDS", "0")
    refused("RIG_AGING_SECONDS: Input should be greater than 0 (got '0')")
