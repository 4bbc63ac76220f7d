"""What every command shares: settings from flags, one-line errors, exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import redis

from rig.config import Settings, load_settings
from rig.errors import RigError
from rig.redis_conn import is_auth_error, unavailable
from rig.text import clean

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 1) -> None:
    """One line on stderr and exit ``code``. The message may quote a job's text (a name, an
    invalid record's field): control sequences are stripped (rig.text)."""
    click.echo(f"rig: error: {clean(message)}", err=True)
    sys.exit(code)


def handle_errors(fn: F) -> F:
    """Turn rig's errors into one line on stderr and the error's exit code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RigError as exc:
            fail(str(exc), exc.exit_code)
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
            # Unreachable, or a refused password / ACL right (AuthenticationError is a
            # ConnectionError; NOAUTH, WRONGPASS and NOPERM can come as ResponseErrors).
            if isinstance(exc, redis.ResponseError) and not is_auth_error(exc):
                raise
            err = unavailable(_settings_url(), exc)
            fail(str(err), err.exit_code)
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def _settings_url() -> str:
    try:
        return load_settings().redis_url
    except RigError:
        return "the configured Redis"


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.find_object(dict) or {}
    return load_settings(**obj.get("overrides", {}))


def client_from(ctx: click.Context):  # noqa: ANN201
    from rig.client import Client

    return Client(settings_from(ctx))


def parse_env_items(items: tuple[str, ...]) -> dict[str, str | None]:
    env: dict[str, str | None] = {}
    for item in items:
        key, eq, value = item.partition("=")
        # --env NAME (no "="): the submitter's own value of NAME (rig.job_env.resolve_names).
        env[key] = value if eq else None
    return env
