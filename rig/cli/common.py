"""What every command shares: settings from flags, one-line errors, exit codes."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import redis

from rig.argnames import cli_words
from rig.config import Settings, load_settings
from rig.errors import InvalidInput, RigError
from rig.redis_conn import is_unusable, unavailable
from rig.redis_writes import refusal, refused_at
from rig.request_rules import MAX_LIMIT, check_limit  # noqa: F401 - the rule's home; rig.cli.main imports it here
from rig.text import clean

F = TypeVar("F", bound=Callable[..., Any])


def error_line(message: str) -> str:
    """THE form of rig's one-line errors: ``rig: error: MESSAGE``. The message may quote a job's
    text (a name, an invalid record's field): control sequences are stripped (rig.text)."""
    return f"rig: error: {clean(message)}"


def fail(message: str, code: int = 1) -> None:
    """One line on stderr (:func:`error_line`) and exit ``code``."""
    click.echo(error_line(message), err=True)
    sys.exit(code)


def usage_words(exc: click.UsageError, command: str = "rig") -> str:
    """A usage error of Click's in rig's words, one line that says where help is:
    ``--retries: 'abc' is not a valid integer; see rig-submit --help`` (Click wrote "Usage: ...",
    "Try ... for help." and "Error: Invalid value for '--retries': ..." on three lines).
    ``command``: the command's name where the error has no context (a missing option value)."""
    if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
        hint = exc.param_hint
        if hint is None and exc.param is not None:
            hint = exc.param.get_error_hint(exc.ctx) if exc.ctx is not None else exc.param.name
        elif hint is not None and not isinstance(hint, str):
            hint = " / ".join(hint)
        text = f"{hint.replace(chr(39), '')}: {exc.message}" if hint else exc.message
    else:
        text = exc.format_message()
    text = " ".join(text.split())
    text = re.sub(r"\. (Did you mean .*\?)$", lambda m: f" ({m[1][0].lower()}{m[1][1:]})", text).rstrip(".")
    where = exc.ctx.command_path if exc.ctx is not None else command
    return f"{text}; see {where} --help"


class _OneLineUsageError(click.UsageError):
    """A usage error that Click's own handling shows as rig's one line (exit 2, as Click's)."""

    def __init__(self, exc: click.UsageError, command: str) -> None:
        super().__init__(exc.message, exc.ctx)
        self.exit_code = exc.exit_code
        self.words = usage_words(exc, command)

    def show(self, file: Any = None) -> None:
        click.echo(error_line(self.words), err=True)


class OneLineUsage:
    """Mixed into the console scripts' commands (``rig``, ``rig-submit``): every usage error
    Click raises under them, parsing or resolving a subcommand, is one line (:func:`usage_words`)."""

    def make_context(self, info_name: str | None, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(info_name, *args, **kwargs)  # type: ignore[misc]
        except click.UsageError as exc:
            raise _one_line(exc, info_name or "rig") from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except click.UsageError as exc:  # a subcommand's own parsing: the path to it, if resolved
            raise _one_line(exc, ctx.meta.get(_RESOLVED, ctx.command_path)) from None


#: A bare group (`rig` alone): Click shows its help, which stays as it is.
_HELP_SHOWN = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _one_line(exc: click.UsageError, command: str) -> click.UsageError:
    if isinstance(exc, (_OneLineUsageError, _HELP_SHOWN)):
        return exc
    return _OneLineUsageError(exc, command)


_RESOLVED = "rig.command_path"  # ctx.meta: the path of the subcommand a group resolved


class RigGroup(OneLineUsage, click.Group):
    """``rig``: its usage errors and its commands' are one line."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        if name is not None:
            ctx.meta[_RESOLVED] = f"{ctx.command_path} {name}"
        return name, cmd, rest


class RigCommand(OneLineUsage, click.Command):
    """``rig-submit``: its usage errors are one line."""


def handle_errors(fn: F) -> F:
    """Turn rig's errors into one line on stderr and the error's exit code; never a traceback.
    A reader that closed our stdout (``rig status | head -1``) ends the command quietly with
    exit 0, as ``cat`` in a pipe does (:func:`quiet_broken_pipe`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with cli_words():  # refusals name the options typed (rig.argnames)
                result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
            return result
        except BrokenPipeError:
            quiet_broken_pipe()
        except RigError as exc:
            fail(str(exc), exc.exit_code)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError,
                redis.exceptions.InvalidResponse) as exc:
            # Unreachable, or a refused password / ACL right (AuthenticationError is a
            # ConnectionError; NOAUTH, WRONGPASS and NOPERM can come as ResponseErrors), or a
            # refused write (full, read-only, MISCONF: rig.redis_writes).
            if refusal(exc) is not None:
                err = refused_at(_settings_url(), exc)
                fail(str(err), err.exit_code)
            if not is_unusable(exc):
                raise
            err = unavailable(_settings_url(), exc)
            fail(str(err), err.exit_code)
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def quiet_broken_pipe() -> None:
    """End quietly (exit 0) after stdout's reader went away: what was asked for was printed up
    to where the reader stopped reading. stdout is pointed at /dev/null first, so the
    interpreter's own flush at exit does not fail again ("Exception ignored ... BrokenPipeError",
    exit 120). Click, left to itself, exits 1 on EPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test's captured stdout)
        pass
    sys.exit(0)


def _check_instance(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--instance HEX``: the first 1 to 16 lowercase hex digits of a job's instance (the
    rule rig.history.History.get matches a prefix of), else one line, as every other bad value
    is (:func:`fail`, exit 2; click's own three-line Usage/Error form was the odd one out)."""
    if value is not None and not re.fullmatch(r"[0-9a-f]{1,16}", value):
        fail(f"--instance: give the first hex digits of the instance, e.g. 3fa9c2 (got {value!r}; "
             "`rig jobs --since 30d` shows them)", InvalidInput.exit_code)
    return value


#: ``--instance HEX`` of every command that reads one job (show, log, metrics): the same
#: option, check and words everywhere; the command passes it to ``client.get(job_id, instance)``.
INSTANCE_OPTION = click.option(
    "--instance", metavar="HEX", callback=_check_instance,
    help="That very job where its id was given again after Redis lost its data: the first digits "
         "of its instance, as `rig jobs` shows them.")


def parse_job_id(text: str) -> int:
    """A job id as typed on the command line (the rule: rig.records.parse_job_id)."""
    from rig.records import parse_job_id as parse

    return parse(text)


def _settings_url() -> str:
    try:
        return load_settings().redis_url
    except RigError:
        return "the configured Redis"


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.find_object(dict) or {}
    return load_settings(**obj.get("overrides", {}))


def client_from(ctx: click.Context):  # noqa: ANN201
    """Straight to Redis or through the node's gateway (rig.gateway.choice)."""
    from rig.gateway.choice import make_client

    return make_client(settings_from(ctx))


def parse_env_items(items: tuple[str, ...]) -> dict[str, str | None]:
    env: dict[str, str | None] = {}
    for item in items:
        key, eq, value = item.partition("=")
        # --env NAME (no "="): the submitter's own value of NAME (rig.job_env.resolve_names).
        env[key] = value if eq else None
    return env


def no_node_note(client) -> str | None:  # noqa: ANN001 - rig.client.Client or the gateway's
    """One line naming the Redis this command used, for when no rig node has ever registered
    there: a RIG_HOME, RIG_CONFIG or RIG_REDIS_URL left in the shell (or mistyped) sends every
    command to another Redis than the node's, where jobs wait for ever and `rig status` says no
    node is up while rig runs. None through the gateway (the node's own Redis) or once any node
    is known there (up, down or stopped)."""
    from rig.config import find_config_file
    from rig.nodes import NodeRegistry
    from rig.redis_conn import strip_password

    if getattr(client, "via_gateway", False) or NodeRegistry(client.r, client.keys).read():
        return None
    settings = client.settings
    found = find_config_file()
    read = f"settings from {found}" if found else "no config file found: defaults"
    return (f"note: no rig node has ever registered with the Redis at {strip_password(settings.redis_url)} "
            f"(key prefix {settings.key_prefix!r}; {read}); if rig is up elsewhere, check RIG_HOME, "
            "RIG_CONFIG and RIG_REDIS_URL in your shell")


def paused_words(job_id: int, since: str) -> str:
    """What `rig show` / `rig jobs` say of a running job whose every process is stopped
    (Job.paused_since; ``since``: that time as the reader writes times)."""
    return (f"paused since {since}: all its processes are stopped (state T: kill -STOP, Ctrl-Z, a debugger); "
            f"it holds its cards and does nothing; `kill -CONT` its processes to resume it, or `rig kill {job_id}`")


def stuck_words(stuck: str) -> str:
    """Why a job whose processes were stopped still runs: ``stuck`` (Job.stuck) outlived SIGKILL."""
    return (f"{stuck} outlived SIGKILL (stuck in the kernel: a GPU driver, a hung file system?); "
            "its cards stay reserved until it is gone")
