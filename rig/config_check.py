"""What the configuration may say, checked when the settings load (rig.config.Settings).

A setting rig does not know is refused wherever it is written (the config file, at any depth:
``[health]``, ``[templates.NAME]``, ``[user_limits.NAME]``; a ``RIG_*`` variable that looks
like a setting; a keyword of ``load_settings``), with the closest known name. The valid names
are derived from the pydantic models (:func:`shape_of`), never listed by hand.

Every problem is one ConfigError line that names where the value came from (``FILE: [health]
timeout``, ``RIG_HEALTH__TIMEOUT``, ``--redis-url``), what is wrong and what to do
(:class:`Sources`, :func:`explain`). Relations between settings (:func:`check_relations`) are
checked once every value is read.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import json
import re
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from rig.errors import ConfigError

if TYPE_CHECKING:
    from rig.config import Settings

#: ``RIG_*`` variables that are not settings: set by rig itself on its workers and jobs (a
#: job may run rig: its identity must not read as a typo), or read by rig's scripts and tests.
#: Every other ``RIG_*`` variable that names no setting is refused (check_env_keys). A new one
#: must be added here (tests/unit/test_config_meaning.py scans the sources).
OWN_VARIABLES: frozenset[str] = frozenset({
    "RIG_CONFIG",  # the config file (rig.config.find_config_file)
    # A job's identity (workers/card_runner.py) and its exit file (workers/process_tree.py).
    "RIG_JOB_ID", "RIG_JOB_INSTANCE", "RIG_JOB_NAME", "RIG_ATTEMPT", "RIG_EXIT_FILE", "RIG_EXIT_FD",
    "RIG_INSTALLATION", "RIG_FAKE_GPU_DIR", "RIG_LOG_KEEPER",
    # The marks of rig up's children (rig.supervision, rig.stack).
    "RIG_ROLE", "RIG_CARD_INDEX", "RIG_NODE_PROCESS", "RIG_SUPERVISOR_PID", "RIG_SUPERVISOR_START",
    "RIG_PDEATHSIG", "RIG_NODE_OWNER",  # the owner of the node name (rig.node_claim)
    "RIG_UP_REDIS_URL",  # `rig up --daemon --redis URL`'s URL, for its daemon (rig.cli.main.up)
    "RIG_REDIS_POOL_LIMIT",  # a child's bound on its Redis connections (rig.connections, rig.redis_conn)
    "RIG_REDIS_PASSWORD_SOURCE",  # where the password in a child's RIG_REDIS_URL came from (rig.redis_conn)
    # Flower's login (rig.stack.flower_auth).
    "RIG_FLOWER_AUTH",
    # Scripts, tests and the image build.
    "RIG_TEST_REDIS_URL", "RIG_TEST_POSTGRES_URL", "RIG_BENCH_REDIS_URL", "RIG_GPU_CHECK_STACK", "RIG_REINSTALL", "RIG_UID",
    "RIG_TRACE_DIR",  # rig.jobtrace (scripts/profile_job_path.py)
    "RIG_FAULT_PARALLEL",  # how many fault scenarios tests/integration/test_faults.py runs at once
    "RIG_FAULT_BACKGROUND",  # ... and how many while the rest of the suite runs
    # tests/background.py: off switch, the child's bound, the child's results file
    "RIG_TEST_BACKGROUND", "RIG_TEST_BACKGROUND_TIMEOUT", "RIG_TEST_BACKGROUND_RESULTS",
    "RIG_DEMO_REDIS_URL",  # the Redis scripts/show_mixed_load.py uses
})

ENV_PREFIX = "RIG_"
NESTED = "__"
#: How close (difflib ratio) an unknown RIG_ variable must be to a setting's to count as a typo.
TYPO_CUTOFF = 0.8
#: The CLI flags that reach load_settings as keywords, by setting.
FLAGS = {"redis_url": "--redis-url", "fake_gpus": "--fake-gpus", "node_name": "--node"}
#: Fields of Settings that are no settings (filled by load_settings).
INTERNAL_FIELDS = frozenset({"config_file"})


# -- the shape of the configuration ------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What may sit at one place of the configuration: a table of fixed names (``fields``, a
    pydantic model), a table of names the operator chooses (``entries``: what each holds, a
    ``dict[str, X]``), or a value (neither)."""

    fields: Mapping[str, Shape] | None = None
    entries: Shape | None = None
    model: type[BaseModel] | None = None

    @property
    def is_table(self) -> bool:
        return self.fields is not None or self.entries is not None


VALUE = Shape()


def shape_of(annotation: Any, skip: frozenset[str] = frozenset()) -> Shape:
    """The shape of a type annotation: models by their fields (less ``skip``), dicts by their
    values; anything else (scalars, lists, paths, literals) is a value."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return shape_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        shapes = [shape_of(a) for a in typing.get_args(annotation) if a is not type(None)]
        return next((s for s in shapes if s.is_table), VALUE)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return Shape(fields={name: shape_of(f.annotation) for name, f in annotation.model_fields.items()
                             if name not in skip}, model=annotation)
    if origin in (dict, Mapping, typing.Dict):  # noqa: UP006 - typing.Dict may still be used
        args = typing.get_args(annotation)
        return Shape(entries=shape_of(args[1]) if len(args) == 2 else VALUE)
    return VALUE


@functools.cache
def settings_shape(model: type[BaseModel]) -> Shape:
    """The shape of ``model`` (rig.config.Settings) as an operator may write it."""
    return shape_of(model, skip=INTERNAL_FIELDS)


@dataclass(frozen=True)
class Unknown:
    """A key no setting has: its path, and the names its table does know."""

    path: tuple[str, ...]
    choices: tuple[str, ...]
    #: The model of the table it is in (a pydantic model), if any: its ``ELSEWHERE`` (a
    #: ClassVar, name -> where that is said instead) answers a name it knows is not its own.
    model: type[BaseModel] | None = None

    def closest(self) -> str | None:
        close = difflib.get_close_matches(self.path[-1], self.choices, n=1)
        return close[0] if close else None


def find_unknown(data: Any, shape: Shape, path: tuple[str, ...] = ()) -> Unknown | None:
    """The first key in ``data`` (nested dicts, e.g. parsed TOML or JSON) that ``shape`` does
    not allow, or None. Values of the wrong kind are left to pydantic."""
    if not isinstance(data, Mapping) or not shape.is_table:
        return None
    for key, value in data.items():
        name = str(key)
        if shape.fields is not None:
            inner = shape.fields.get(name)
            if inner is None:
                return Unknown((*path, name), tuple(sorted(shape.fields)), shape.model)
        else:
            inner = shape.entries or VALUE
        found = find_unknown(value, inner, (*path, name))
        if found:
            return found
    return None


def _section(path: tuple[str, ...]) -> str:
    """A setting's place as TOML shows it: ``[health] timeout``, ``max_retries``."""
    return (f"[{'.'.join(path[:-1])}] " if len(path) > 1 else "") + path[-1]


def env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + NESTED.join(part.upper() for part in path)


# -- the three places a setting is written -----------------------------------------------------
def check_file_keys(path: Path, data: Mapping[str, Any], shape: Shape) -> None:
    """Refuse a key of the config file no setting has, at any depth."""
    unknown = find_unknown(data, shape)
    if unknown is None:
        return
    close = unknown.closest()
    name = unknown.path[-1]
    where = f"[{'.'.join(unknown.path[:-1])}] " if len(unknown.path) > 1 else ""
    subject = f"{path}: unknown setting {where}{name!r}"
    todo = "correct or remove it (`rig init FILE` writes a commented example)"
    top = shape.fields or {}
    dotted = _dotted_entry(data, shape, unknown.path)
    if dotted:
        raise ConfigError(f"{subject}: TOML reads the dots of [{'.'.join(unknown.path[:-1])}.{name}] as sections; "
                          f"a name with a dot is quoted: [{unknown.path[0]}.\"{dotted}\"]")
    elsewhere = getattr(unknown.model, "ELSEWHERE", {}).get(name)
    if elsewhere:
        # Said before the top-level guess: `gpus` in a template is no misplaced fake_gpus.
        raise ConfigError(f"{subject}: {elsewhere}; {where.strip()} takes {', '.join(unknown.choices)}")
    if len(unknown.path) > 1:
        # A top-level line appended at the end of the file lands in its last [section].
        above = "put it above the first [section] of the file"
        if name in top:
            raise ConfigError(f"{subject}: {name} is a top-level setting; {above}")
        top_close = difflib.get_close_matches(name, sorted(top), n=1)
        if top_close and _likeness(name, top_close[0]) > (_likeness(name, close) if close else 0):
            raise ConfigError(f"{subject}; did you mean {top_close[0]!r}? It is a top-level setting: "
                              f"{above}")
    raise ConfigError(_typo(subject, close and repr(close), todo))


def _dotted_entry(data: Mapping[str, Any], shape: Shape, path: tuple[str, ...]) -> str | None:
    """The name meant by an unknown table under a named entry (``[user_limits.o.brien]``: the
    user ``o.brien``, which TOML splits at its dot), or None when ``path`` is no such thing."""
    inner = (shape.fields or {}).get(path[0])
    if len(path) < 3 or inner is None or inner.entries is None:
        return None
    value: Any = data
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return ".".join(path[1:]) if isinstance(value, Mapping) else None


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _typo(subject: str, close: str | None, todo: str) -> str:
    """``subject; did you mean X? Todo`` (or ``subject; todo`` with nothing close)."""
    return f"{subject}; did you mean {close}? {todo[:1].upper()}{todo[1:]}" if close else f"{subject}; {todo}"


def check_override_keys(overrides: Mapping[str, Any], shape: Shape) -> None:
    """Refuse a keyword of load_settings (or Settings) that no setting has."""
    unknown = find_unknown(overrides, shape)
    if unknown is None:
        return
    close = unknown.closest()
    raise ConfigError(_typo(f"unknown setting {'.'.join(unknown.path)!r}", close and repr(close),
                            "correct or remove it"))


def _all_env_names(shape: Shape) -> list[str]:
    """Every variable name a setting answers to (sections' values included, entries not)."""
    names = []
    for name, inner in (shape.fields or {}).items():
        names.append(env_name((name,)))
        for sub in (inner.fields or {}):
            names.append(env_name((name, sub)))
    return names


def _env_refusal(var: str, close: str | None, what: str = "unknown rig setting") -> ConfigError:
    return ConfigError(_typo(f"{var}: {what}", close, "rename or unset it (`rig config` lists the settings)"))


def check_env_keys(environ: Mapping[str, str], shape: Shape) -> None:
    """Refuse every ``RIG_*`` variable that is neither a setting (``RIG_NAME``,
    ``RIG_SECTION__NAME``) nor one of rig's own (OWN_VARIABLES): the prefix is rig's, so an
    unknown one is a slip (``RIG_NODE`` for RIG_NODE_NAME, ``RIG_CONFIG_FILE`` for RIG_CONFIG),
    refused with the closest name (:func:`closest_variable`). A table setting given whole
    (``RIG_HEALTH='{"timeout": 60}'``) must be a JSON object of known keys."""
    fields = shape.fields or {}
    names = _all_env_names(shape)
    for raw, value in sorted(environ.items()):
        var = raw.upper()
        if not var.startswith(ENV_PREFIX) or var in OWN_VARIABLES:
            continue
        parts = tuple(var[len(ENV_PREFIX):].lower().split(NESTED))
        top = fields.get(parts[0])
        if top is None:
            raise _env_refusal(raw, closest_variable(var, names))
        if len(parts) == 1:
            if top.is_table:
                _check_env_table(raw, value, top, parts[0])
            continue
        inner, path = top, (parts[0],)
        for part in parts[1:]:
            if inner.fields is not None:
                nxt = inner.fields.get(part)
                if nxt is None:
                    close = difflib.get_close_matches(part, sorted(inner.fields), n=1)
                    raise _env_refusal(raw, env_name((*path, close[0])) if close else None)
                inner = nxt
            elif inner.entries is not None:
                inner = inner.entries
            else:
                raise _env_refusal(raw, env_name(path), f"{env_name(path)} is one value, not a table")
            path = (*path, part)


def closest_variable(var: str, names: list[str]) -> str | None:
    """The variable ``var`` most likely means, best guess first: a setting's name close to it
    (RIG_REDIS_URI), one it begins (RIG_NODE: RIG_NODE_NAME) or that begins it, one it ends
    (RIG_TIMEOUT: RIG_HEALTH__TIMEOUT), then rig's own variables the same ways
    (RIG_CONFIG_FILE: RIG_CONFIG), then anything loosely alike; None if nothing is."""
    def prefixed(pool: list[str]) -> list[str]:
        return sorted((n for n in pool if n.startswith(var + "_") or var.startswith(n + "_")), key=len)

    own = sorted(OWN_VARIABLES)
    close = difflib.get_close_matches(var, names, n=1, cutoff=TYPO_CUTOFF)
    if close:
        return close[0]
    for found in (prefixed(names),
                  sorted((n for n in names if n.endswith("_" + var[len(ENV_PREFIX):])), key=len),
                  difflib.get_close_matches(var, own, n=1, cutoff=TYPO_CUTOFF), prefixed(own),
                  difflib.get_close_matches(var, names + own, n=1, cutoff=0.7)):
        if found:
            return " or ".join(found[:3])
    return None


def _check_env_table(var: str, value: str, shape: Shape, name: str) -> None:
    """``RIG_HEALTH``, ``RIG_TEMPLATES``, ...: a JSON object whose keys are known."""
    if shape.fields:
        example = f'{var}=\'{{"{next(iter(shape.fields))}": ...}}\' or {var}__{next(iter(shape.fields)).upper()}=...'
    else:
        example = f'{var}=\'{{"NAME": ...}}\''
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{var}: expected a JSON object for the [{name}] settings, got {_short(value)}; "
                          f"write it like {example}, or unset it")
    unknown = find_unknown(data, shape)
    if unknown is not None:
        close = unknown.closest()
        raise ConfigError(_typo(f"{var}: unknown setting {'.'.join(unknown.path)!r} in its JSON",
                                close and repr(close), "correct or remove it"))


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


# -- where a value came from -------------------------------------------------------------------
@dataclass
class Sources:
    """The places the settings were read from, to name the one a value came from."""

    shape: Shape
    overrides: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)  # RIG_* only, names upper-cased
    file: Path | None = None
    file_data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def gather(cls, shape: Shape, overrides: Mapping[str, Any], environ: Mapping[str, str],
               file: Path | None, file_data: Mapping[str, Any]) -> Sources:
        env = {k.upper(): v for k, v in environ.items() if k.upper().startswith(ENV_PREFIX)}
        return cls(shape, dict(overrides), env, file, dict(file_data))

    def setting_path(self, loc: tuple[Any, ...]) -> tuple[str, ...]:
        """The part of a pydantic error location that names a setting (list indexes and
        union branches dropped)."""
        path: list[str] = []
        shape = self.shape
        for part in loc:
            if not isinstance(part, str) or not shape.is_table:
                break
            if shape.fields is not None:
                if part not in shape.fields:
                    break
                shape = shape.fields[part]
            else:
                shape = shape.entries or VALUE
            path.append(part)
        return tuple(path)

    def kind(self, path: tuple[str, ...]) -> str:
        """"flag", "env", "file" or "default": where the value at ``path`` came from."""
        if path and path[0] in self.overrides:
            return "flag"
        if self.env_var(path):
            return "env"
        if self.in_file(path):
            return "file"
        return "default"

    def env_var(self, path: tuple[str, ...]) -> str | None:
        for depth in range(len(path), 0, -1):
            name = env_name(path[:depth])
            if name in self.environ:
                return name
        return None

    def in_file(self, path: tuple[str, ...]) -> bool:
        """Does the config file set the value at ``path``?"""
        node: Any = self.file_data
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return bool(path)

    def where(self, path: tuple[str, ...]) -> str:
        """``--node``, ``RIG_HEALTH__TIMEOUT``, ``/etc/rig.toml: [health] timeout``, or the
        setting's name with "(default)"."""
        kind = self.kind(path)
        if kind == "flag":
            flag = FLAGS.get(path[0])
            return f"{flag} ({'.'.join(path)})" if flag else f"{'.'.join(path)} (given to load_settings)"
        if kind == "env":
            return self.env_var(path) or ""
        if kind == "file":
            return f"{self.file}: {_section(path)}"
        return f"{'.'.join(path) or 'the settings'} (default)"

    def remedy(self, path: tuple[str, ...]) -> str:
        """What to do about a bad value at ``path``."""
        default = _default(self.shape, path)
        back = f" to use the default {default!r}" if default is not None else ""
        return {
            "flag": "pass a valid value",
            "env": f"set {self.env_var(path)} to a valid value or unset it{back}",
            "file": f"correct it in {self.file}, or delete the line{back}",
        }.get(self.kind(path), "set a valid value")

    def named(self, path: tuple[str, ...], value: object) -> str:
        """``health.timeout = 1 (RIG_HEALTH__TIMEOUT)``: a setting, its value and its source."""
        kind = self.kind(path)
        source = "default" if kind == "default" else self.where(path)
        return f"{'.'.join(path)} = {value:g} ({source})" if isinstance(value, float) else \
            f"{'.'.join(path)} = {value!r} ({source})"


def _default(shape: Shape, path: tuple[str, ...]) -> Any:
    """The model default of the value at ``path``, or None (no plain default)."""
    for depth, part in enumerate(path):
        model = shape.model
        if model is None or shape.fields is None or part not in shape.fields:
            return None
        if depth == len(path) - 1:
            info = model.model_fields[part]
            default = info.default
            return None if default is PydanticUndefined or isinstance(default, BaseModel | dict | list) else default
        shape = shape.fields[part]
    return None


#: Fields whose value is never printed in an error (secrets); redis_url is printed redacted.
SECRET_FIELDS = frozenset({"redis_password"})


def explain(exc: ValidationError, sources: Sources) -> ConfigError:
    """The first problem of a failed load as one line: source, what is wrong, what to do."""
    from rig.errors import redact_url

    first = exc.errors()[0]
    path = sources.setting_path(tuple(first["loc"]))
    msg = str(first["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    got = first.get("input")
    if not path or path[0] in SECRET_FIELDS:
        shown = ""
    elif path[0] == "redis_url" and isinstance(got, str):
        shown = f" (got {redact_url(got)!r})"
    elif first["type"] in ("missing",) or isinstance(got, dict) or repr(got) in msg or (
            not isinstance(got, str) and str(got) in msg):
        # The message quotes it already. Text counts only quoted: RIG_AGING_SECONDS=0 lost its
        # "(got '0')" to the 0 of "greater than 0".
        shown = ""
    else:
        shown = f" (got {_short(got)})"
    if not path:
        return ConfigError(f"configuration: {msg}")
    return ConfigError(f"{sources.where(path)}: {msg}{shown}; {sources.remedy(path)}")


# -- values checked on their own ---------------------------------------------------------------
REDIS_URL_FORM = ("redis://host:port/db (rediss:// for TLS, unix:///path/to/redis.sock, "
                  "sentinel://h1:26379,h2:26379,h3:26379/MASTER_NAME/db for Redis Sentinel)")


def check_redis_url(url: str) -> str:
    """``url`` if rig can connect with it; ValueError (the expected form) otherwise."""
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise ValueError(f"cannot read it as a URL ({exc}); write it like {REDIS_URL_FORM}") from None
    if parts.scheme == "sentinel":
        from rig import sentinel_url

        sentinel_url.parse(url)  # ValueError: what is wrong, and the sentinel:// form
        return url
    if parts.scheme in ("redis-cluster", "rediss-cluster"):
        raise ValueError("rig does not run on Redis Cluster (its scripts touch keys of many slots); use one "
                         "Redis, or Redis Sentinel for fail-over (docs/RELIABILITY.md)")
    if parts.scheme not in ("redis", "rediss", "unix"):
        scheme = f"the scheme {parts.scheme!r} is not" if parts.scheme else "it has no scheme:"
        raise ValueError(f"{scheme} redis, rediss, unix or sentinel; write it like {REDIS_URL_FORM}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"a unix:// URL needs the socket's path; write it like {REDIS_URL_FORM}")
        return url
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"its port is not a number from 1 to 65535; write it like {REDIS_URL_FORM}") from None
    if not parts.hostname:
        raise ValueError(f"it names no host; write it like {REDIS_URL_FORM}")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"its port {port} is not from 1 to 65535; write it like {REDIS_URL_FORM}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"its database {db!r} is not a number (0, 1, ...); write it like {REDIS_URL_FORM}")
    return url


#: A host name: dot-separated labels of letters, digits and inner hyphens.
HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def check_listen_address(value: str) -> str:
    """An address a server of rig (Flower, the metrics endpoint) listens on: an IP address
    (``127.0.0.1``, ``0.0.0.0``, ``::``) or a host name that resolves; ValueError otherwise
    (the server would fail to start, or crash-loop, while `rig up` says it is up)."""
    text = value.strip()
    form = "write an IP address (127.0.0.1 for this machine only, 0.0.0.0 for every interface) or a host name"
    if not text:
        raise ValueError(f"it is empty; {form}")
    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
        return text
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", text):  # 999.1.1.1: meant as an IP address, never a name
        raise ValueError(f"{text!r} is not an IP address (four numbers from 0 to 255); {form}")
    if not HOST_NAME.fullmatch(text):
        raise ValueError(f"{text!r} is neither an IP address nor a host name; {form}")
    try:
        socket.getaddrinfo(text, None)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(f"the host name {text!r} does not resolve ({reason}); {form}") from None
    return text


def check_http_url(url: str | None) -> str | None:
    """An alert webhook: an http(s):// URL with a host."""
    if url is None or url == "":
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("write it like https://host/path (an http or https URL)")
    return url


# -- relations ---------------------------------------------------------------------------------
#: Heartbeats are written every telemetry_interval and expire after health.timeout: this many
#: intervals must fit in the timeout, so one late beat is not a death.
HEARTBEATS_PER_TIMEOUT = 2


def check_relations(settings: Settings, sources: Sources) -> None:
    """Refuse settings that are each valid but wrong together (one ConfigError line)."""
    s = settings
    timeout, beat = s.health.timeout, s.telemetry_interval
    if timeout < HEARTBEATS_PER_TIMEOUT * beat:
        raise ConfigError(
            f"{sources.named(('health', 'timeout'), timeout)} is less than {HEARTBEATS_PER_TIMEOUT} x "
            f"{sources.named(('telemetry_interval',), beat)}: workers heartbeat every telemetry_interval "
            "and are taken for dead after health.timeout, so this node would stop its own healthy jobs; "
            f"set health.timeout to at least {HEARTBEATS_PER_TIMEOUT * beat:g} or telemetry_interval to "
            f"at most {timeout / HEARTBEATS_PER_TIMEOUT:g}")
    check_interval = s.health.check_interval
    if check_interval >= timeout:
        raise ConfigError(
            f"{sources.named(('health', 'check_interval'), check_interval)} is not below "
            f"{sources.named(('health', 'timeout'), timeout)}: health checks would come less often than a "
            "silent worker counts as dead, so deaths go unnoticed for longer than the timeout says; "
            f"set health.check_interval below {timeout:g} (e.g. {timeout / 6:g}) or health.timeout "
            f"above {check_interval:g}")
    check_log_dirs(s, sources)
    ports: dict[int, tuple[str, ...]] = {}
    listening = [(("flower_port",), s.flower_port)]
    if s.metrics_port:
        listening.append((("metrics_port",), s.metrics_port))
    from rig.redis_conn import is_local

    if is_local(s.redis_url):  # rig up may start this Redis itself, on this port
        listening.append((("redis_url",), urlsplit(s.redis_url).port or 6379))
    def said(path: tuple[str, ...], port: int) -> str:
        if path == ("redis_url",):
            kind = sources.kind(path)
            return f"the port of redis_url, {port} ({'default' if kind == 'default' else sources.where(path)})"
        return sources.named(path, port)

    for path, port in listening:
        other = ports.setdefault(port, path)
        if other != path:
            raise ConfigError(f"{said(path, port)} is also {said(other, port)}: two servers cannot listen on "
                              "one port; give each its own port")


def check_log_dirs(settings: Settings, sources: Sources) -> None:
    """log_dir and system_log_dir are folders (or do not exist yet: rig up makes them), and
    two different ones: rig's own logs are pruned by other rules than the jobs' logs; the
    error queue's job logs are kept at least as long as the others."""
    from rig.redis_conn import visible

    dirs = {"log_dir": settings.job_log_dir, "system_log_dir": settings.rig_log_dir}
    for name, path in dirs.items():
        if visible(path) and not path.is_dir():
            raise ConfigError(f"{sources.named((name,), str(path))} is not a folder; set {name} to a folder "
                              "(or a path that does not exist yet: rig up makes it)")
    if dirs["log_dir"].resolve() == dirs["system_log_dir"].resolve():
        raise ConfigError(f"{sources.named(('log_dir',), str(dirs['log_dir']))} is also "
                          f"{sources.named(('system_log_dir',), str(dirs['system_log_dir']))}: jobs' logs and rig's "
                          "own logs are kept and pruned apart; give each its own folder")
    keep, errors = settings.log_retention_days, settings.error_log_retention_days
    if errors < keep:
        raise ConfigError(f"{sources.named(('error_log_retention_days',), errors)} is shorter than "
                          f"{sources.named(('log_retention_days',), keep)}: the logs of jobs waiting in the "
                          "error queue for a person would be deleted before any other job's; set "
                          f"error_log_retention_days to at least {keep:g} (or log_retention_days lower)")


def origins(settings: Settings, sources: Sources) -> dict[str, str]:
    """Where each top-level setting came from, for `rig config`: "file", "RIG_X", "default",
    or several of them for a table set in more than one place ("RIG_HEALTH__TIMEOUT, file")."""
    out: dict[str, str] = {}
    for name, inner in (sources.shape.fields or {}).items():
        paths = [(name,)] + [(name, sub) for sub in (inner.fields or {})]
        found: list[str] = []
        for path in paths:
            kind = sources.kind(path)
            label = {"env": sources.env_var(path) or "", "flag": FLAGS.get(name, "argument"),
                     "file": "file"}.get(kind)
            if label and label not in found:
                found.append(label)
        out[name] = ", ".join(found) or "default"
    return out
