"""What a job's environment contains: the one place that decides it.

A job never inherits the environment of whoever typed ``rig up`` (the card worker's). It gets,
in this order, each layer over the one before:

1. **A minimal base**, set on the node: ``PATH=/usr/local/bin:/usr/bin:/bin``,
   ``LANG=C.UTF-8``, and ``HOME``, ``USER``, ``LOGNAME``, ``SHELL`` from the password entry of the
   user the job runs as.
2. **The submitter's exported variables** (:func:`exported`, read from the submitting process
   when the job is submitted), as Slurm's ``--export``: ``ALL`` (the default) passes every
   variable but those that must not travel (:func:`is_not_exported`: rig's own, the cards',
   and those of the submitter's login session and identity), so a job runs with the
   submitter's conda env or venv, ``LD_LIBRARY_PATH``, ``HF_HOME`` and tokens; ``NONE`` passes
   none; ``NAME,NAME`` only those. The values are the owner's: only they, admins and the job
   itself can read them (the gateway shows other users the names only; rig.gateway).
3. **``--env``** (``env=`` in Python): anything but the variables rig owns.
4. **rig's own** (:data:`RIG_OWNED_NAMES`, every ``RIG_*``): the job's cards
   (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``) and identity (``RIG_JOB_ID`` ...), and the
   identity variables of the user it runs as (``USER``, ``LOGNAME``). Asking for one of these
   with ``--env`` is refused at submit (:func:`refuse_rig_owned`); a record that carries one
   anyway is overridden on the node.

Pure standard library; no Redis.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

from rig.errors import InvalidInput
from rig.plain_numbers import plain_number
from rig.records import ENV_NAME_RE as _NAME  # the names a job's record may hold

#: The base PATH when the submitter passed none.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

#: Variables of the submitter's login session and identity that never travel with --export
#: ALL (or by name): they describe the terminal and login the job does not have, or are set
#: for the user it runs as on the node (layer 1). Besides these: rig's own (is_rig_owned).
NOT_EXPORTED_NAMES: frozenset[str] = frozenset({
    "HOME", "SHELL", "MAIL", "PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PROMPT_COMMAND",
    "TERM", "COLUMNS", "LINES", "DISPLAY", "XAUTHORITY", "WINDOWID", "TMUX", "TMUX_PANE", "STY",
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
    "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "XDG_SESSION_TYPE",
    "XDG_SESSION_CLASS", "XDG_SEAT", "XDG_VTNR", "LS_COLORS", "LD_PRELOAD", "LD_AUDIT",
})
#: ... and by prefix (sudo's record of the caller, the shell's exported functions).
NOT_EXPORTED_PREFIXES: tuple[str, ...] = ("SUDO_", "BASH_FUNC_")

#: Submitter variables passed on by name.
PASSED_NAMES: tuple[str, ...] = (
    "PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH",
    "CUDA_HOME", "CUDA_PATH", "CUDNN_HOME", "NCCL_HOME",
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME",
    "XDG_CACHE_HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)
#: Submitter variables passed on by prefix (conda's, locale categories).
PASSED_PREFIXES: tuple[str, ...] = ("CONDA_", "LC_")

#: Variables rig sets on every job and nobody may set with --env (besides every ``RIG_*``).
RIG_OWNED_NAMES: frozenset[str] = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "USER", "LOGNAME",
})
RIG_OWNED_PREFIX = "RIG_"


def is_rig_owned(name: str) -> bool:
    """Is ``name`` a variable rig sets on jobs itself (so --env may not set it)?"""
    return name in RIG_OWNED_NAMES or name.startswith(RIG_OWNED_PREFIX)


def is_passed_on(name: str) -> bool:
    """Is ``name`` one of the submitter's variables a job gets without asking?"""
    return name in PASSED_NAMES or name.startswith(PASSED_PREFIXES)


def refuse_rig_owned(env: Mapping[str, str]) -> str | None:
    """A one-line reason to refuse ``env`` (what --env asked for), or None when it is fine."""
    owned = sorted(name for name in env if is_rig_owned(name))
    if not owned:
        return None
    name = owned[0]
    if name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        why = "rig sets it to the cards it gives the job; ask for cards with --gpus (and --pool)"
    elif name in ("USER", "LOGNAME"):
        why = "rig sets it to the user the job runs as"
    else:
        why = "RIG_* variables are rig's own"
    more = f" (and {', '.join(owned[1:])})" if len(owned) > 1 else ""
    return f"--env {name}{more}: {why}; remove it"


def from_submitter(environ: Mapping[str, str]) -> dict[str, str]:
    """The submitter's search paths, locale and caches (:func:`is_passed_on`): what a job of
    ``--export NONE`` still needs to find its interpreter is not among them; kept for callers
    that want the narrow set."""
    return {k: v for k, v in environ.items() if is_passed_on(k) and "\x00" not in v}


def is_not_exported(name: str) -> bool:
    """Does ``name`` stay behind whatever --export says (rig's own, login session, identity)?"""
    return is_rig_owned(name) or name in NOT_EXPORTED_NAMES or name.startswith(NOT_EXPORTED_PREFIXES)


#: What --export accepts besides a list of names.
EXPORT_MODES = ("ALL", "NONE")


def given_env(env: object) -> dict[str, str | None]:
    """``env=`` from Python as --env's items: each value text, a number or a path (written as
    text), or None (the submitter's own value). bytes, a bool or a list are refused in one line:
    ``str()`` made ``b'x'`` the value of ``b"x"``, and ``True`` is ``1`` to one program and
    ``true`` to the next."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidInput(f"env must be a mapping of names to values (e.g. {{'A': '1'}}), got {type(env).__name__}")
    given: dict[str, str | None] = {}
    for key, value in env.items():
        value = plain_number(value)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int | float)):
            raise InvalidInput(f"env {key}: give its value as text (a number or a path is written as text), "
                               f"or None for your own; got {type(value).__name__} {value!r:.40}")
        given[str(key)] = None if value is None else str(value)
    return given


def parse_export(mode: str | list[str] | tuple[str, ...] | None) -> str | tuple[str, ...]:
    """``--export`` as given: "ALL" (also None and ""), "NONE", or the names of a comma list
    (from Python also a list or tuple of names). Raises ValueError with one line for a name that
    is no variable name or never travels, or a value of another type."""
    if isinstance(mode, (list, tuple)) and all(isinstance(n, str) for n in mode):
        if not mode:
            raise ValueError("--export: an empty list names no variable; give ALL, NONE or variable names")
        mode = ",".join(mode)
    if mode is not None and not isinstance(mode, str):
        raise ValueError(f"--export: give ALL, NONE or variable names (a comma list, or a list of names); "
                         f"got {mode!r}")
    text = (mode or "ALL").strip()
    if text.upper() in EXPORT_MODES:
        return text.upper()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError("--export: give ALL, NONE or variable names separated by commas")
    for name in names:
        if not _NAME.fullmatch(name):
            raise ValueError(f"--export: {name!r} is not a variable name (letters, digits and _; "
                             "or ALL, NONE)")
        if is_not_exported(name):
            raise ValueError(f"--export: {name} never travels with a job (rig sets it, or it belongs "
                             "to your login session); see `rig-submit --help`")
    return names


def exported(environ: Mapping[str, str], mode: str | tuple[str, ...] | None = "ALL") -> dict[str, str]:
    """Layer 2: the submitter's variables ``--export`` passes (:func:`parse_export`'s result,
    or its text). Names the shell cannot name, values with NUL and every
    :func:`is_not_exported` variable are left out; a listed name that is not set is skipped."""
    chosen = parse_export(mode) if not isinstance(mode, tuple) else mode
    if chosen == "NONE":
        return {}
    keep = (lambda k: True) if chosen == "ALL" else set(chosen).__contains__
    return {k: v for k, v in environ.items()
            if keep(k) and _NAME.fullmatch(k) and not is_not_exported(k) and "\x00" not in v}


def resolve_names(items: Mapping[str, str | None], environ: Mapping[str, str]) -> dict[str, str]:
    """``--env`` items: a value of None means "the submitter's value of NAME". Raises
    ValueError naming a variable that is not set."""
    out: dict[str, str] = {}
    for name, value in items.items():
        if value is None:
            if name not in environ:
                raise ValueError(f"--env {name}: not set in your environment; write {name}=value")
            value = environ[name]
        out[name] = value
    return out


def umask_of(pid: int | str = "self") -> int | None:
    """The file-creation mask of process ``pid`` (this one by default) from /proc, None when it
    cannot be read. A job takes its submitter's (as Slurm's jobs do): a user whose umask is 077
    expects the files their job writes to be theirs alone, not world-readable under the
    workers' 022 (nor closed by an operator's 077)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    value = int(line.split()[1], 8)
                    return value if 0 <= value <= 0o777 else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def base(user: str | None = None, home: str | None = None, shell: str | None = None) -> dict[str, str]:
    """Layer 1, for the user the job runs as (their passwd entry's home and shell)."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    if user:
        env.update(USER=user, LOGNAME=user)
    if home:
        env["HOME"] = home
    if shell:
        env["SHELL"] = shell
    return env


def base_for_uid(uid: int) -> dict[str, str]:
    """Layer 1 for ``uid`` from the password database (only PATH and LANG without an entry)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return base()
    return base(entry.pw_name, entry.pw_dir, entry.pw_shell)


def compose(job_env: Mapping[str, str], *, identity: Mapping[str, str],
            rig_vars: Mapping[str, str]) -> dict[str, str]:
    """The job's whole environment: ``identity`` (layer 1, from base()), the job record's
    variables (layers 2 and 3, stored at submit), then ``rig_vars`` (layer 4). The record's
    rig-owned variables are dropped (a record written by hand or by an old client); ``USER``
    and ``LOGNAME`` always name the user the job runs as."""
    env = dict(identity)
    env.update({k: v for k, v in job_env.items() if not is_rig_owned(k)})
    for name in ("USER", "LOGNAME"):
        if name in identity:
            env[name] = identity[name]
    env.update(rig_vars)
    return env


def current_base() -> dict[str, str]:
    """Layer 1 for this process's effective user."""
    return base_for_uid(os.geteuid())
