"""rig's one settings object.

Values come, strongest first, from: keyword overrides (the CLI's flags), environment variables
with the ``RIG_`` prefix (nested with ``__``, e.g. ``RIG_HEALTH__TIMEOUT=60``), the TOML config
file that ``rig init`` writes, then the defaults below.

The config file is the first of: ``$RIG_CONFIG``; ``./rig.toml``; ``$RIG_HOME/config.toml``
(``~/.rig/config.toml``). One that exists but is no regular file (a folder, a FIFO, a symlink
loop) is refused, never skipped for the defaults; a UTF-8 BOM is stripped. Every ``RIG_*``
variable must be a setting or one of rig's own (rig.config_check.OWN_VARIABLES). A relative
path setting (PATH_FIELDS) is taken under ``home``.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from rig import config_check
from rig.errors import ConfigError, InvalidInput
from rig.records import MAX_CARD_INDEX, MAX_RETRIES
from rig.words import typed_word

if TYPE_CHECKING:
    from rig.fairshare import UserLimit
    from rig.pools import Pools

#: A setting that is one of a few words, read as a flag's word is (rig.words: case and
#: surrounding spaces do not matter; RIG_QUEUE_ORDER=FIFO was refused while -p HIGH ran).
_Word = BeforeValidator(typed_word)
SchedulerType = Annotated[Literal["multi-factor", "best-fit", "least-loaded", "first-fit"], _Word]
PriorityName = Annotated[Literal["high", "medium", "low"], _Word]


#: What a node name may be: it becomes part of queue, worker and key names.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_node_name(value: str) -> str:
    """``value`` if it is a valid node name (:data:`NODE_NAME`); ValueError saying the rule
    otherwise. The one rule for the setting, ``rig up --node`` and ``rig init --node-name``."""
    if not NODE_NAME.fullmatch(value):
        raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return value


def default_node_name() -> str:
    """The host name, cut to a valid node name (its first label if it is too long)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-._") or "node"
    return name if len(name) <= 63 else name.split(".")[0][:63]


#: The longest a duration setting in seconds may be (30 days). A longer one only turns its
#: rule off without saying so: ``hold_after_seconds = 1e300`` meant no job ever held cards,
#: so big jobs could starve (issue 13).
MAX_SETTING_SECONDS = 30 * 86400


def check_setting_seconds(value: float) -> float:
    """``value`` (s) if it is at most MAX_SETTING_SECONDS; ValueError saying the bound otherwise
    (the one rule for every duration setting in seconds: :data:`Seconds`)."""
    if value > MAX_SETTING_SECONDS:
        raise ValueError(f"give at most 30 days ({MAX_SETTING_SECONDS} s)")
    return value


#: A duration setting in seconds: at most MAX_SETTING_SECONDS (its lower bound is the field's).
Seconds = Annotated[float, AfterValidator(check_setting_seconds)]


def _period_at_least(least: float) -> AfterValidator:
    """A period's floor (s): beat sends one task to the control queue per period (and the card
    workers read their cards per telemetry period), so a period far below what a pass takes
    queues tasks that expire before they run (archive_interval=0.01: 373 in 15 s) and starves
    the rest of the queue. ``gt=0`` alone let that through."""
    def check(value: float) -> float:
        if value < least:
            raise ValueError(f"give at least {least:g} s: rig does this work once a period, and a "
                             "shorter period queues more of it than can run")
        return value
    return AfterValidator(check)


#: Periods of rig's own periodic work, with their floors (s).
CheckPeriod = Annotated[Seconds, _period_at_least(0.2)]
ReadingPeriod = Annotated[Seconds, _period_at_least(0.1)]
PassPeriod = Annotated[Seconds, _period_at_least(1.0)]


def default_home() -> Path:
    return Path(os.environ.get("RIG_HOME", Path.home() / ".rig")).expanduser()


class HealthSettings(BaseModel):
    """Heartbeats and health checks. Seconds throughout. health.timeout must be at least twice
    telemetry_interval (rig.config_check.check_relations)."""

    # A misspelt key is refused, never ignored; inf and NaN are no durations.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    check_interval: CheckPeriod = Field(5.0, description="seconds between health checks")
    timeout: Seconds = Field(30.0, gt=0, description="a worker silent this long is dead (s)")
    max_temperature: int = Field(90, description="a card hotter than this (C) takes no new jobs")
    assigned_timeout: Seconds = Field(
        30.0, gt=0, description="a placed job not started after this long is re-sent (s)"
    )


class AlertSettings(BaseModel):
    """Alert thresholds (rig.alerts.AlertRules), set under [alerts] or RIG_ALERTS__NAME."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_queue: int = Field(50, ge=0, description="waiting jobs per priority")
    max_temperature: int = Field(85, description="card temperature, Celsius")
    failure_window: Seconds = Field(900.0, gt=0, description="seconds the failure rate covers")
    min_ended: int = Field(5, ge=1, description="ended jobs in the window before the rate counts")
    max_failure_rate: float = Field(0.2, ge=0, le=1)
    idle_wait_seconds: Seconds = Field(60.0, ge=0, description="cards idle while a job waits this long")
    reserved_idle_seconds: Seconds = Field(600.0, ge=0, description="reserved but idle this long")
    max_fragmentation: float = Field(0.5, ge=0, le=1)


def _by_rule(rule: Any, value: Any, what: str) -> Any:
    """``rule(value, what=what)`` (a parser the CLI uses too: one rule, one place), its
    InvalidInput turned into the ValueError pydantic reports; the message's leading
    ``what:`` is dropped (the error names the setting already)."""
    try:
        return rule(value, what=what)
    except (InvalidInput, ConfigError) as exc:
        raise ValueError(str(exc).removeprefix(f"{what}: ")) from None


def _memory_limit(value: Any, what: str) -> str:
    """A memory limit as text, checked when the settings load: "0" (no limit) or a size. An
    empty one is refused: read as "0", `RIG_MAX_GPU_MEMORY_PER_USER="$LIMIT"` with LIMIT unset,
    or ``[user_limits.alice] max_gpu_memory = ""``, lifted a limit in silence (alice's even
    where the default is one), as an empty gpu_whitelist once gave away every card."""
    from rig.memory import parse_memory

    text = str(value).strip()
    if not text:
        raise ValueError(f"{what} is empty (an unset variable?): give a size like 160G, or 0 for no limit")
    if text == "0":
        return "0"
    try:
        parse_memory(text, what=what)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    return text


class UserLimitSettings(BaseModel):
    """One user's own limits ([user_limits.NAME]); a field left out uses the global default."""

    model_config = ConfigDict(extra="forbid")  # a misspelt limit must not be silently ignored

    max_jobs: int | None = Field(None, ge=0, description="placed or running jobs (0: no limit)")
    max_gpu_memory: str | None = Field(None, description="reserved memory over all cards, e.g. 80G")

    @field_validator("max_gpu_memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> str | None:
        return None if value is None else _memory_limit(value, "user_limits max_gpu_memory")


#: The largest memory margin (a template's ``margin``, ``auto_memory_margin``): headroom is a
#: fraction more; 1e9 turned `--gpu-memory 1G` into "976562.5 TiB", 1e300 into a traceback.
MAX_MARGIN = 100.0


class Template(BaseModel):
    """A named preset for submissions (M3). Explicit flags win over the template's values.

    ``margin`` multiplies the declared memory (from the flag or the template), or the learnt
    figure when the memory is ``auto`` (then it replaces auto_memory_margin).

    Every field is checked when the settings load, by the rule its flag is checked with at
    submit (rig.request_rules), so a bad template is refused when rig starts, naming it.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: Options of a submission a template does not set, and where they are given instead
    #: (rig.config_check says so: `gpus` read as a misplaced top-level fake_gpus).
    ELSEWHERE: ClassVar[dict[str, str]] = {
        **{name: f"a template does not set {name}: give it when submitting (rig-submit {flag}, "
                 f"or {name}= in Python)"
           for name, flag in (("gpus", "--gpus N"), ("pool", "--pool NAME"), ("name", "--name NAME"),
                              ("workdir", "--workdir DIR"), ("env", "--env NAME=VALUE"),
                              ("export", "--export NAMES"))},
        **{name: "a template does not set the command: give it when submitting (after `--`, or --cmd)"
           for name in ("command", "cmd")},
    }

    gpu_memory: str | None = None
    margin: float = Field(1.0, ge=1.0, le=MAX_MARGIN)
    priority: PriorityName | None = None
    retries: int | None = Field(None, ge=0, le=MAX_RETRIES)
    time_limit: str | None = None
    oom_retry_grow: bool | None = None
    description: str = ""

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _memory_is_a_size(cls, value: Any) -> Any:
        from rig.request_rules import parse_gpu_memory

        if value is None or isinstance(value, bool):
            return value
        text = str(value)  # as the flag reads it: 12 (no unit) is refused here as there
        _by_rule(parse_gpu_memory, text, "gpu_memory")
        return text

    @field_validator("time_limit", mode="before")
    @classmethod
    def _limit_is_a_duration(cls, value: Any) -> Any:
        from rig.request_rules import parse_time_limit

        if value is None or isinstance(value, bool):
            return value
        text = str(value)  # as the flag reads it: 3600 is seconds here as there
        _by_rule(parse_time_limit, text, "time_limit")
        return text


DEFAULT_TEMPLATES = {
    "finetune": Template(margin=1.2, priority="medium", retries=1, time_limit="24h",
                         oom_retry_grow=True, description="training runs: 20 % headroom, grow after an OOM"),
    "inference": Template(margin=1.1, priority="high", retries=2, time_limit="2h",
                          description="serving and evaluation: quick, high priority"),
    "test": Template(gpu_memory="2G", priority="low", retries=0, time_limit="15m",
                     description="smoke tests: small, low priority, no retries"),
}


class Settings(BaseSettings):
    """Everything rig can be told. Sizes in bytes or as strings like ``12G``; times in seconds."""

    model_config = SettingsConfigDict(
        env_prefix="RIG_", env_nested_delimiter="__", extra="forbid", validate_default=True,
        allow_inf_nan=False,  # an infinite timeout overflows the heartbeat's expiry
    )

    def __init__(self, **values: Any) -> None:
        """Read the settings (keywords, RIG_* variables, the config file, defaults) and check
        them: a key no setting has, a bad value, a bad relation between values is one
        ConfigError line naming where it was written (rig.config_check)."""
        shape = config_check.settings_shape(type(self))
        config_check.check_override_keys(values, shape)
        path = find_config_file()
        data = read_config_file(path) if path is not None else {}
        if path is not None:
            config_check.check_file_keys(path, data, shape)
        config_check.check_env_keys(os.environ, shape)
        sources = config_check.Sources.gather(shape, values, os.environ, path, data)
        # The file is read once, here (a BOM stripped): settings_customise_sources takes it.
        token = _FILE_DATA.set(data)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_check.explain(exc, sources) from None
        except SettingsError as exc:  # a RIG_* value pydantic-settings cannot decode
            raise ConfigError(_settings_error(exc, sources)) from None
        finally:
            _FILE_DATA.reset(token)
        config_check.check_relations(self, sources)
        self.__dict__["_sources"] = sources

    home: Path = Field(default_factory=default_home, description="rig's own folder")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding all state")
    redis_password: SecretStr | None = Field(
        None, description="Redis password when redis_url has none (see rig.redis_conn)"
    )
    redis_password_file: Path | None = Field(
        None, description="file holding the Redis password (one line, no access for others)"
    )
    redis_sentinel_password_file: Path | None = Field(
        None, description="with a sentinel:// redis_url: file holding the sentinels' own password (one line, "
        "no access for others), when the URL has no sentinel_password",
    )
    replica_wait_seconds: Seconds = Field(
        2.0, ge=0,
        description="with a sentinel:// redis_url: how long a submission, a job's start and a job's "
        "ending wait for a replica to have them (WAIT) before going on with a warning; 0: never wait "
        "(rig.replication)",
    )
    gateway_socket: Path | None = Field(
        None, description="the gateway's Unix socket, where users without Redis credentials reach rig "
        "(default: /run/rig/gateway.sock for a root rig up, else $RIG_HOME/run/gateway-NODE.sock)",
    )
    key_prefix: str = Field("rig:", description="prefix of every Redis key rig writes")
    node_name: str = Field(default_factory=default_node_name, description="this server's name")
    scheduler_type: SchedulerType = "multi-factor"
    aging_seconds: Seconds = Field(
        600.0, gt=0, description="a waiting job moves up one priority level per this many seconds"
    )
    hold_after_seconds: Seconds = Field(
        20.0, ge=0,
        description="a blocked medium job holds the cards closest to fitting it after this long "
        "(high: at once; low: twice this)",
    )
    backfill_estimate_delay_seconds: Seconds = Field(
        0.0, ge=0,
        description="for this long after a job starts holding cards, jobs without a time limit may "
        "also backfill in front of it on their estimated ends (rig.estimates), which may delay it by "
        "as long as such a job outruns its estimate; 0 (default): only time limits or leaving room",
    )
    pools: dict[str, list[str]] = Field(
        default_factory=dict,
        description="named sets of nodes/cards, e.g. a100 = [\"gpu1\", \"gpu2:0-3\"] (rig.pools)",
    )
    queue_order: Annotated[Literal["largest-first", "fifo"], _Word] = Field(
        "largest-first",
        description="within a priority (and a user): largest request first (packs better), or FIFO",
    )
    fair_share: bool = Field(
        True, description="within a priority, the user with the least recent usage starts first"
    )
    fair_share_half_life_hours: float = Field(
        24.0, gt=0, description="recent usage (GiB-hours) halves every this many hours"
    )
    max_jobs_per_user: int = Field(0, ge=0, description="placed or running jobs per user (0: no limit)")
    max_gpu_memory_per_user: str = Field(
        "0", description="memory reserved per user, summed over cards, e.g. 160G (0: no limit)"
    )
    user_limits: dict[str, UserLimitSettings] = Field(
        default_factory=dict, description="per-user overrides: alice = {max_jobs = 8}"
    )
    gpu_whitelist: list[int] | None = Field(None, description="card indexes rig may use")
    max_task_per_gpu: int = Field(4, ge=1, description="jobs at once on one card")
    vram_reserve_fraction: float = Field(
        0.05, ge=0, lt=1, description="fraction of each card's memory never handed out"
    )
    default_priority: PriorityName = "medium"
    overuse_policy: Annotated[Literal["warn", "stop"], _Word] = Field(
        "warn", description="a job using more than it declared: warn, or stop it"
    )
    overuse_tolerance: float = Field(1.05, ge=1.0, description="over means above declared x this")
    auto_memory_margin: float = Field(
        1.2, ge=1.0, le=MAX_MARGIN, description="--gpu-memory auto: the peak of earlier runs x this"
    )
    max_retries: int = Field(2, ge=0, le=MAX_RETRIES)
    command_workdir: Path | None = Field(None, description="default working folder of jobs")
    log_dir: Path | None = Field(None, description="job logs (default $RIG_HOME/logs/jobs; relative: under home)")
    system_log_dir: Path | None = Field(None, description="rig's own logs (default $RIG_HOME/logs/system)")
    fake_gpus: str | None = Field(None, description="e.g. 8x80G: fake cards instead of NVML")
    kill_grace_seconds: Seconds = Field(10.0, ge=0, description="SIGTERM to SIGKILL delay")
    log_max_bytes: int = Field(
        256 * 1024**2, gt=4096, description="one attempt's log is cut (marked) beyond this size"
    )
    log_min_free_bytes: int = Field(
        32 * 1024**2, ge=0, description="below this free space under log_dir the node takes no new jobs"
    )
    log_retention_days: float = Field(30.0, gt=0, description="task logs older than this go")
    error_log_retention_days: float = Field(
        90.0, gt=0, description="logs of jobs in the error queue are kept this long (when not set: "
                                "this, or log_retention_days when that is longer)"
    )
    archive_url: str | None = Field(
        None, description="where finished jobs go: sqlite:////PATH or postgresql://USER@HOST/DB "
                          "(default sqlite under $RIG_HOME; rig.archive)")
    archive_after_days: float = Field(
        7.0, gt=0, description="finished jobs that ended this long ago move from Redis to the archive")
    archive_keep_finished: int = Field(
        10_000, ge=0, description="at most this many finished jobs stay in Redis; the oldest move first (0: no limit)")
    archive_interval: PassPeriod = Field(60.0, description="seconds between two archiving passes")
    telemetry_interval: ReadingPeriod = Field(2.0, description="seconds between card readings")
    max_clock_skew: Seconds = Field(
        2.0, gt=0, description="a node whose clock is off Redis' by more than this (s) is reported"
    )
    flower_address: str = "127.0.0.1"
    flower_port: int = Field(5555, ge=1, le=65535, description="Flower's port")
    metrics_address: str = Field("127.0.0.1", description="Prometheus endpoint address")
    metrics_port: int = Field(9840, ge=0, le=65535, description="Prometheus endpoint port (0: don't serve)")
    alert_webhook: str | None = Field(None, description="alerts are POSTed here as JSON")
    alert_interval: PassPeriod = Field(30.0, description="seconds between alert checks")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    templates: dict[str, Template] = Field(default_factory=lambda: dict(DEFAULT_TEMPLATES))
    admins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="users who may kill, retry and clear anyone's jobs (root always may)",
    )
    allow_root_jobs: bool = Field(
        True, description="on a worker running as root, a job submitted by root runs as root; "
        "false: such jobs fail",
    )

    # Set by load_settings so `rig show-config` can say where values came from.
    config_file: Path | None = None

    @field_validator("key_prefix")
    @classmethod
    def _prefix_ends_with_colon(cls, value: str) -> str:
        if not value:
            raise ValueError("key_prefix must not be empty")
        return value if value.endswith(":") else value + ":"

    @field_validator("redis_url")
    @classmethod
    def _redis_url_is_one(cls, value: str) -> str:
        return config_check.check_redis_url(value)

    @field_validator("alert_webhook")
    @classmethod
    def _webhook_is_http(cls, value: str | None) -> str | None:
        return config_check.check_http_url(value)

    @field_validator("fake_gpus")
    @classmethod
    def _fake_gpus_spec(cls, value: str | None) -> str | None:
        from rig.gpus.fake import parse_fake_spec

        if value is not None:
            _by_rule(lambda spec, what: parse_fake_spec(spec), value, "fake_gpus")
        return value

    @field_validator("gpu_whitelist", mode="after")
    @classmethod
    def _whitelist_indexes(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        for index in value:
            if not 0 <= index <= MAX_CARD_INDEX:
                raise ValueError(f"card index {index} is not from 0 to {MAX_CARD_INDEX}")
        if len(set(value)) != len(value):
            raise ValueError(f"card indexes repeat in {value}; give each card once, e.g. 0,1,3")
        return value

    @field_validator("node_name")
    @classmethod
    def _node_name_is_a_name(cls, value: str) -> str:
        # It names Celery queues (rig.card.<node>.<i>), workers (card0@<node>) and keys.
        return check_node_name(value)

    @field_validator("flower_address", "metrics_address")
    @classmethod
    def _address_listens(cls, value: str) -> str:
        return config_check.check_listen_address(value)

    @field_validator("pools", mode="after")
    @classmethod
    def _pools_parse(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        from rig.pools import Pools

        Pools.from_config(value)  # raises ValueError naming the bad pool or member
        return value

    @field_validator("max_gpu_memory_per_user", mode="before")
    @classmethod
    def _memory_limit_text(cls, value: Any) -> str:
        return _memory_limit(value, "max_gpu_memory_per_user")

    @field_validator("templates", mode="after")
    @classmethod
    def _keep_shipped_templates(cls, value: dict[str, Template]) -> dict[str, Template]:
        from rig.pools import POOL_NAME

        # A name is typed after --template, as a pool's after --pool: the same rule. An empty
        # one was chosen by `--template "$T"` with T unset; a control character went into job
        # records and views.
        for name in value:
            if not POOL_NAME.fullmatch(name):
                raise ValueError(f"template name {name!r}: use letters, digits, '.', '_' or '-' "
                                 "(at most 63, starting with a letter or digit)")
        # A config that defines its own templates adds to (or overrides) the shipped ones.
        return {**DEFAULT_TEMPLATES, **value}

    @model_validator(mode="after")
    def _paths_under_home(self) -> Settings:
        # A relative folder or file means one under rig's home, wherever rig is started from
        # (never the shell's current folder at `rig up`). Runs before _redis_credentials.
        for name in PATH_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, under_home(self.home, value))
        return self

    @model_validator(mode="after")
    def _error_logs_kept_as_long(self) -> Settings:
        # Not set: the error queue's logs are kept at least as long as every other job's (a
        # config that only raised log_retention_days past 90 was refused by every command once
        # rig.config_check refused a shorter one; a value set shorter on purpose still is).
        if "error_log_retention_days" not in self.model_fields_set:
            self.error_log_retention_days = max(self.error_log_retention_days, self.log_retention_days)
        return self

    @model_validator(mode="after")
    def _redis_credentials(self) -> Settings:
        # The password goes into redis_url once, here, so every client, Celery and every child
        # (RIG_REDIS_URL) uses it without anyone typing it. Order: rig.redis_conn.resolve_auth.
        from rig.redis_conn import resolve_auth

        password = self.redis_password.get_secret_value() if self.redis_password else None
        self.redis_url = resolve_auth(self.redis_url, home=self.home, password=password,
                                      password_file=self.redis_password_file,
                                      sentinel_password_file=self.redis_sentinel_password_file).url
        return self

    @field_validator("admins", mode="before")
    @classmethod
    def _parse_admins(cls, value: Any) -> Any:
        # RIG_ADMINS="alice,bob" (or "alice bob"), or JSON as `rig up` hands settings on.
        if isinstance(value, str) and not value.lstrip().startswith("["):
            return [name for name in value.replace(",", " ").split() if name]
        try:
            return json.loads(value) if isinstance(value, str) else value
        except ValueError:
            raise ValueError("write user names like alice,bob (or a JSON list)") from None

    @field_validator("home", mode="before")
    @classmethod
    def _home_is_named(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty; give rig's folder, e.g. ~/.rig")
        if isinstance(value, (str, Path)) and not Path(value).expanduser().is_absolute():
            # Read against each command's own folder: `rig down` run elsewhere said "rig is not
            # up" of the rig it had started, and found neither its password nor its pid file.
            raise ValueError(f"'{value}' is a relative path, which names another folder wherever rig runs; "
                             f"give an absolute one, e.g. {Path.cwd() / value}")
        return value

    @field_validator("log_dir", "system_log_dir", "command_workdir", "redis_password_file",
                     "redis_sentinel_password_file", "gateway_socket",
                     mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: Any) -> Any:
        # RIG_LOG_DIR= (empty) means "not set", never the current folder.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("gpu_whitelist", mode="before")
    @classmethod
    def _parse_whitelist(cls, value: Any) -> Any:
        # "0,1,3" from an environment variable or the CLI.
        if isinstance(value, str):
            value = value.strip()
            if value in ("all", "*"):
                return None
            if value.startswith("["):
                return value
            from rig.pools import parse_card_list

            try:
                indexes = parse_card_list(value)  # the rule pools' card lists follow: 0,1,3 or 0-3,6
            except ValueError as exc:
                raise ValueError(f"{exc}; or all for every card") from None
            if not indexes:
                # Set but naming no card (RIG_GPU_WHITELIST= from an unset shell variable, a
                # stray comma): it once meant every card, a mistake that shares the cards
                # someone meant to keep out. "No card" is no safer a guess: refused, at load.
                raise ValueError("set but names no card; write card indexes like 0,1,3, or all "
                                 "for every card")
            return indexes
        if isinstance(value, int):
            return [value]
        return value

    @property
    def job_log_dir(self) -> Path:
        return (self.log_dir or self.home / "logs" / "jobs").expanduser()

    @property
    def archive_location(self) -> str:
        """The archive's URL: archive_url, else a SQLite file in rig's folder (rig.archive)."""
        from rig.archive import default_url

        return self.archive_url.strip() if self.archive_url and self.archive_url.strip() else default_url(self.home)

    @property
    def rig_log_dir(self) -> Path:
        return (self.system_log_dir or self.home / "logs" / "system").expanduser()

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def fake_usage_dir(self) -> Path:
        """Where jobs on fake cards write the memory they "use" (rig.gpus.fake)."""
        return self.home / "fake-gpus"

    @property
    def pool_map(self) -> Pools:
        """The configured pools, parsed once (validated when the settings were loaded)."""
        from rig.pools import Pools

        cached = self.__dict__.get("_pool_map")
        if cached is None or cached[0] is not self.pools:
            cached = (self.pools, Pools.from_config(self.pools))
            self.__dict__["_pool_map"] = cached
        return cached[1]

    def user_limit(self, user: str) -> UserLimit:
        """``user``'s limits: their [user_limits] entry where set, else the global defaults."""
        from rig.fairshare import UserLimit

        own = self.user_limits.get(user)
        jobs = own.max_jobs if own and own.max_jobs is not None else self.max_jobs_per_user
        memory = own.max_gpu_memory if own and own.max_gpu_memory is not None else self.max_gpu_memory_per_user
        return UserLimit(max_jobs=jobs, max_bytes=_memory_limit_bytes(memory))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        data = _FILE_DATA.get()
        if data:
            sources.append(InitSettingsSource(settings_cls, data))
        return tuple(sources)


#: Path settings: a relative one is taken under ``home`` (:func:`under_home`).
PATH_FIELDS = ("log_dir", "system_log_dir", "command_workdir", "redis_password_file", "redis_sentinel_password_file",
               "gateway_socket")
#: The config file's data while Settings reads it (read once, by Settings.__init__).
_FILE_DATA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("rig_config_data", default=None)
#: True while `rig init` reads the settings: the file it replaces is not read (it may be broken).
_NO_FILE: contextvars.ContextVar[bool] = contextvars.ContextVar("rig_no_config_file", default=False)


def under_home(home: Path, value: Path) -> Path:
    """``value`` (``~`` expanded) if absolute, else under ``home``."""
    value = value.expanduser()
    return value if value.is_absolute() else home.expanduser() / value


@contextlib.contextmanager
def without_config_file() -> Iterator[None]:
    """Settings read inside this block ignore every config file (`rig init` writes one: the
    one it replaces may be broken, RIG_CONFIG may name one that does not exist yet)."""
    token = _NO_FILE.set(True)
    try:
        yield
    finally:
        _NO_FILE.reset(token)


def explicit_config_file() -> Path | None:
    """The file ``$RIG_CONFIG`` names, or None when it is unset or empty."""
    explicit = os.environ.get("RIG_CONFIG")
    return Path(explicit).expanduser() if explicit else None


def local_config_file() -> Path | None:
    """``./rig.toml`` of the working folder, or None when that folder was deleted (a shell left
    standing in a removed run folder): rig then reads the other places, never a traceback."""
    try:
        return Path.cwd() / "rig.toml"
    except FileNotFoundError:
        return None


def find_config_file() -> Path | None:
    """The config file in force, or None. ``$RIG_CONFIG`` must name a readable file if it is
    set; ``./rig.toml`` or ``$RIG_HOME/config.toml`` that exists but is no regular file is
    refused, never skipped for the defaults."""
    if _NO_FILE.get():
        return None
    explicit = explicit_config_file()
    if explicit is not None:
        problem = config_file_problem(explicit)
        if problem == "does not exist":
            raise ConfigError(f"RIG_CONFIG names {explicit}, which does not exist; run `rig init {explicit}`, "
                              "or unset RIG_CONFIG")
        if problem:
            raise ConfigError(f"RIG_CONFIG names {explicit}, which {problem}; point RIG_CONFIG at a config "
                              f"file (`rig init FILE` writes one), or unset it")
        return explicit
    for candidate in (local_config_file(), default_home() / "config.toml"):
        if candidate is None:
            continue
        problem = config_file_problem(candidate)
        if problem is None:
            if (foreign := foreign_config(candidate)) is not None:
                raise ConfigError(foreign)
            return candidate
        if problem == "does not exist" or problem.startswith("cannot be read"):
            continue  # absent, or in a folder this user may not search (sudo -u from /root)
        if problem:
            raise ConfigError(f"the config file {candidate} {problem}; remove or rename it, or run "
                              f"`rig init {candidate}` once it is gone")
    return None


def foreign_config(path: Path) -> str | None:
    """Why rig will not read ``path`` found by itself (./rig.toml, the home's config.toml): it
    belongs to another user, or others may write to it. Such a file would choose rig's Redis
    (where the password and the jobs go), its log folder, whether root jobs run. One named on
    purpose with RIG_CONFIG is read as given. None when it is the caller's own (or root's)."""
    try:
        info = path.stat()
    except OSError:
        return None
    if info.st_uid not in (0, os.geteuid()):
        who = f"belongs to uid {info.st_uid}, not to you"
    elif info.st_mode & 0o022:
        who = "may be written by others"
    else:
        return None
    return (f"the config file {path} {who}: rig does not read a config someone else can change (it chooses "
            f"where the Redis password and your jobs go); name it on purpose with RIG_CONFIG={path}, or run "
            "rig from another folder")


def config_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a config file ("does not exist", "is a directory", ...), or None
    when it is a regular file (a symlink to one included)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file stands in its path
        return "is a broken symlink" if path.is_symlink() else "does not exist"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        return f"cannot be read ({exc.strerror})"
    import stat

    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
            else "a socket" if stat.S_ISSOCK(mode) else "a special file"
        return f"is {kind}, not a regular file"
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    """The config file's TOML as a dict; ConfigError (one line, the file and the place) if it
    cannot be read or is not TOML."""
    import tomllib

    try:
        # A BOM (Windows editors write one) is no TOML: strip it rather than refuse the file.
        return tomllib.loads(path.read_text().removeprefix("\ufeff"))
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path} ({exc.strerror}); check its permissions "
                          "or point RIG_CONFIG elsewhere") from None
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read the config file {path}: it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        if "Cannot overwrite a value" in str(exc) or "Cannot declare" in str(exc):
            raise ConfigError(f"cannot read the config file {path}: {exc}: a setting or [section] given twice "
                              "(there and earlier in the file); keep one of them") from None
        raise ConfigError(f"cannot read the config file {path}: {exc}; fix its TOML syntax") from None


def _settings_error(exc: SettingsError, sources: config_check.Sources) -> str:
    """A RIG_* variable pydantic-settings could not decode (``error parsing value for field
    "x" from source "EnvSettingsSource"``) as one line naming the variable."""
    match = re.search(r'field "([^"]+)"', str(exc))
    name = match[1] if match else ""
    var = sources.env_var((name,)) if name else None
    if var:
        return f"{var}: cannot read {sources.environ[var]!r} as JSON; write it as JSON (e.g. [0, 1] or {{...}}), or unset it"
    return f"cannot read the settings: {exc}"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings object; a bad key, value or relation becomes one ConfigError line
    naming where it was written (Settings.__init__). Keywords of None are left out (a flag
    not given)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    settings = Settings(**overrides)
    settings.config_file = find_config_file()
    return settings


def setting_origins(settings: Settings) -> dict[str, str]:
    """Where each top-level setting came from ("default", "file", "RIG_X", "--flag")."""
    sources = settings.__dict__.get("_sources")
    if sources is None:
        return {}
    return config_check.origins(settings, sources)


def _same_as_file(settings: Settings, sources: config_check.Sources, path: tuple[str, ...], var: str) -> bool:
    """Does the variable ``var`` give the setting at ``path`` the value the file gives it? Then
    it overrides nothing: `rig init` writes this shell's RIG_REDIS_URL, RIG_NODE_NAME and
    RIG_FLOWER_PORT into the file, and every `rig up` from that shell then said each one
    "overrides" the file's same value. Compared after parsing, by the setting's own validation:
    ``RIG_FAIR_SHARE=1`` or ``yes`` is the file's ``true``, ``30.0`` its ``30``, ``~/x/`` its
    ``/home/u/x`` (``..`` and symlinks are left as written). ``settings`` holds the variable's
    value (no flag set it: the caller checks); the file's value is validated on a copy. A file
    value that does not validate there, or a section given as one JSON variable
    (``RIG_HEALTH='{...}'``), counts as different."""
    if var != config_check.env_name(path):
        return False
    written: Any = sources.file_data
    for part in path:
        written = written[part]
    owner: BaseModel = settings
    for part in path[:-1]:
        owner = getattr(owner, part)
    copy = owner.model_copy()
    try:
        # The field's validators (before and after), as when the file alone was loaded.
        type(copy).__pydantic_validator__.validate_assignment(copy, path[-1], written)
    except Exception:  # noqa: BLE001 - any refusal of the file's value: different, said (a note never stops rig up)
        return False
    meaning = _MEANING_OF_TEXT.get(path, lambda value: value)
    return bool(meaning(getattr(copy, path[-1])) == meaning(getattr(owner, path[-1])))


def _memory_limit_bytes(text: str | None) -> int:
    """A memory limit setting's bytes (it is kept as written): 0 for none."""
    from rig.memory import parse_memory

    return 0 if text in (None, "", "0") else parse_memory(text, what="user memory limit")


def _fake_card_sizes(text: str | None) -> list[int] | None:
    from rig.gpus.fake import parse_fake_spec

    return None if text is None else parse_fake_spec(text)


#: Settings kept as the text written, validated but not converted: what that text stands for,
#: to compare two spellings by (``160G`` and ``160 GiB``; ``8x80G`` and ``8X80GiB``).
_MEANING_OF_TEXT: dict[tuple[str, ...], Callable[[Any], Any]] = {
    ("max_gpu_memory_per_user",): _memory_limit_bytes,
    ("fake_gpus",): _fake_card_sizes,
}


def shadowed_settings(settings: Settings) -> list[str]:
    """One line for each setting a RIG_* variable sets while the config file sets it too: the
    variable wins (a value left in the operator's shell changes what rig.toml says, silently
    otherwise). `rig up` says them; `rig config` shows every origin."""
    sources = settings.__dict__.get("_sources")
    if sources is None or sources.file is None:
        return []
    lines = []
    for name, inner in (sources.shape.fields or {}).items():
        for path in [(name,)] + [(name, sub) for sub in (inner.fields or {})]:
            var = sources.env_var(path)
            if (var and path[0] not in sources.overrides and sources.in_file(path)
                    and not _same_as_file(settings, sources, path, var)):
                lines.append(f"note: ${var} (in the environment) overrides {'.'.join(path)} in {sources.file}; "
                             f"unset it to use the file's value")
                break
    return lines


def unknown_users(settings: Settings, getpwnam: Callable[[str], Any] | None = None) -> list[str]:
    """One line for each name in ``user_limits`` or ``admins`` without an account on this node:
    a typo there (``[user_limits.alicee]``) silently leaves the user without their limit (or the
    admin without their rights). `rig up` says them; the node's own password database decides,
    as the gateway does (rig.ownership)."""
    import difflib
    import pwd

    getpwnam = getpwnam or pwd.getpwnam
    lines = []
    for setting, names in (("user_limits", sorted(settings.user_limits)), ("admins", list(settings.admins))):
        for name in names:
            try:
                getpwnam(name)
            except KeyError:
                known = [entry.pw_name for entry in pwd.getpwall()]
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                lines.append(f"warning: {setting} names {name!r}, who has no account on this node{hint}: "
                             "nothing of it applies to anyone; correct the name")
    return lines


def shown_setting(value: object, *, quoted: bool = True) -> str:
    """A setting's value as `rig config` prints it: a path as text, absolute and resolved (a
    relative one, from a relative RIG_HOME, is said to be taken from the current folder, as
    every rig command started there takes it); anything else as its repr. ``quoted=False``:
    a path without quotes, for a sentence."""
    if isinstance(value, Path):
        text = str(value.expanduser().resolve())
        text = repr(text) if quoted else text
        return text if value.expanduser().is_absolute() else f"{text} ({str(value)!r} relative to the current folder)"
    return repr(value)
