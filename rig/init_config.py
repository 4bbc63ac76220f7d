"""``rig init``: write the commented config file (rig.config_template).

`rig init` must work exactly when the config in force is broken (every ConfigError says "run
rig init"), so it never reads a config file (rig.config.without_config_file): neither the one
it replaces nor the one ``RIG_CONFIG`` names and that does not exist yet. Values it writes are
TOML-escaped; the node name obeys the one node-name rule (rig.config.check_node_name); a file
that cannot be written is one ConfigError line, and the old file stays whole (written beside,
then renamed over it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rig.errors import ConfigError, InvalidInput

#: Settings the generated file carries (a RIG_* variable for another one is noted).
WRITTEN = frozenset({"node_name", "home", "redis_url", "scheduler_type", "max_task_per_gpu",
                     "vram_reserve_fraction", "default_priority", "max_retries", "log_dir", "system_log_dir",
                     "kill_grace_seconds", "flower_address", "flower_port", "key_prefix", "health"})


#: Settings that hold a secret: never written, and not named as "add it there".
SECRETS = frozenset({"redis_password"})
SECRET_NOTE = ("without it, rig commands take the password from redis_password_file (a file of its own, "
               "no access for \"other\"), else for a local Redis from {home}/redis.password "
               "(docs/SECURITY.md, where rig finds it)")


def _set_by(name: str) -> str | None:
    """The RIG_* variable of this shell that sets setting ``name`` (``RIG_ALERTS__*`` for a
    section's fields), or None."""
    variable = f"RIG_{name.upper()}"
    if variable in os.environ:
        return variable
    return f"{variable}__*" if any(v.startswith(f"{variable}__") for v in os.environ) else None


def toml_string(value: object) -> str:
    """``value`` as a TOML basic string: quoted, backslash, quote and control characters
    escaped (JSON's escapes are TOML's; DEL, which JSON leaves, is escaped too)."""
    return json.dumps(str(value)).replace("\x7f", "\\u007f")


def comment_safe(value: object) -> str:
    """``value`` for a comment line: a line break would end the comment."""
    return str(value).replace("\r", "\\r").replace("\n", "\\n")


@dataclass
class Written:
    """What `rig init` wrote and the notes for the operator (stderr)."""

    path: Path
    notes: list[str] = field(default_factory=list)


def init_config(path: str | None, node_name: str | None, force: bool) -> Written:
    """Write the config file at ``path`` (default: ``$RIG_CONFIG``, else
    ``$RIG_HOME/config.toml``) with the settings of this shell's defaults and RIG_* variables.
    InvalidInput for a bad name or an existing file without ``force``; ConfigError when the file
    cannot be written."""
    from rig.config import (
        Settings,
        check_node_name,
        config_file_problem,
        explicit_config_file,
        local_config_file,
        without_config_file,
    )
    from rig.config_template import TEMPLATE
    from rig.redis_conn import without_credentials  # a password never goes into the config file

    if node_name is not None:
        try:
            check_node_name(node_name)
        except ValueError as exc:
            raise InvalidInput(f"--node-name {node_name!r}: {exc}") from None
    with without_config_file():
        defaults = Settings()
    target = Path(path).expanduser() if path else (explicit_config_file() or defaults.home / "config.toml")
    problem = config_file_problem(target)
    if problem not in (None, "does not exist", "is a broken symlink"):
        raise InvalidInput(f"{target} {problem}; give the path of a file to write (or remove that one)")
    if problem is None and not force:
        raise InvalidInput(f"{target} exists; pass --force to overwrite it")
    text = TEMPLATE.format(
        path=comment_safe(target), node_name=toml_string(node_name or defaults.node_name),
        home=comment_safe(defaults.home), redis_url=toml_string(without_credentials(defaults.redis_url)),
        scheduler_type=toml_string(defaults.scheduler_type), max_task_per_gpu=defaults.max_task_per_gpu,
        vram_reserve_fraction=defaults.vram_reserve_fraction,
        default_priority=toml_string(defaults.default_priority), max_retries=defaults.max_retries,
        log_dir=toml_string(defaults.job_log_dir), system_log_dir=toml_string(defaults.rig_log_dir),
        kill_grace_seconds=defaults.kill_grace_seconds, flower_address=toml_string(defaults.flower_address),
        flower_port=defaults.flower_port, check_interval=defaults.health.check_interval,
        timeout=defaults.health.timeout, key_prefix=toml_string(defaults.key_prefix),
    )
    _write(target.resolve() if target.is_symlink() else target, text)
    written = Written(target)
    # Settings taken from RIG_* variables of this shell that the file does not carry: without
    # them, rig commands read the file's value (e.g. another key prefix: every job "gone").
    # Nested ones count by their section (RIG_ALERTS__MAX_QUEUE); a password is never written
    # to a config file, and the note does not say to write it there (SECRET_NOTE).
    missing = sorted({_set_by(name) for name in Settings.model_fields
                      if name not in WRITTEN and name not in SECRETS and _set_by(name) is not None})
    if missing:
        one = len(missing) == 1
        written.notes.append(f"note: {', '.join(missing)} set in this shell {'is' if one else 'are'} not in "
                             f"{target}; add {'it' if one else 'them'} there, or rig commands run without that "
                             "variable will use the default")
    shell_url = os.environ.get("RIG_REDIS_URL", "")
    in_url = without_credentials(shell_url) != shell_url
    if "RIG_REDIS_PASSWORD" in os.environ or in_url:
        where = "the password in RIG_REDIS_URL" if in_url else "RIG_REDIS_PASSWORD"
        written.notes.append(f"note: {where} is not written to {target} (no password goes into a config "
                             f"file); {SECRET_NOTE.format(home=comment_safe(defaults.home))}")
    shell_name = os.environ.get("RIG_NODE_NAME")
    if node_name is not None and shell_name is not None and shell_name != node_name:
        # The variable beats the file (rig.config's order): the name just written is not used.
        written.notes.append(f"note: RIG_NODE_NAME={shell_name} set in this shell overrides node_name = "
                             f"{toml_string(node_name)} written to {target}; unset RIG_NODE_NAME (or give "
                             f"--node-name {shell_name}) to run as the file says")
    explicit = explicit_config_file()
    local, home_file = local_config_file(), defaults.home / "config.toml"
    # The file rig reads here now (rig.config.find_config_file's order): RIG_CONFIG, else
    # ./rig.toml, else $RIG_HOME/config.toml.
    read = explicit or (local if local is not None and local.exists() else home_file)
    if read.resolve() != target.resolve():
        if explicit:
            how = f"RIG_CONFIG={explicit} is set in this shell"
        elif read == local:
            how = f"{read} comes first in this folder"
        else:  # rig's home's file, read from any folder, present or not
            how = f"it reads {read}{'' if read.exists() else ' (absent: the defaults)'}"
        written.notes.append(f"rig does not read this file here: {how}; set RIG_CONFIG={target} to use it")
    return written


def _write(target: Path, text: str) -> None:
    """``text`` into ``target``, whole or not at all: written beside it, then renamed over it
    (a full disk leaves the old file as it was)."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text)
        os.replace(temporary, target)
    except OSError as exc:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"cannot write the config file {target} ({reason}); choose a folder you can write "
                          "to (rig init FILE), or free space there") from None
