"""Which words a refused request's message names its fields with: the CLI's options
(``--gpu-memory``) where a command was typed, the Python API's keyword arguments
(``gpu_memory``) where ``rig.submit``, ``submit_many`` or ``@rig.task`` was called.

The request rules (rig.client, rig.request_rules, rig.job_env) word their messages once, in
the CLI's words; :func:`in_callers_words` turns them into the Python API's unless the caller
is a CLI command (:func:`cli_words`, entered by rig.cli.common.handle_errors) or the gateway
answering a client (which words them for its own caller, rig.gateway.client).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from rig.errors import InvalidInput, Unschedulable

#: rig-submit's options that are submit()'s keyword arguments (and `rig log`'s --attempt, log()'s;
#: `rig jobs`' --limit, jobs()').
KEYWORDS = {
    "--gpu-memory": "gpu_memory", "--gpus": "gpus", "--priority": "priority", "--name": "name",
    "--workdir": "workdir", "--env": "env", "--export": "export", "--retries": "retries",
    "--time-limit": "time_limit", "--oom-retry-grow": "oom_retry_grow", "--template": "template",
    "--pool": "pool", "--attempt": "attempt", "--limit": "limit",
}
#: Whole phrases that only make sense at a prompt, and what a Python caller is told instead.
PHRASES = {
    "give it after `--` or with --cmd \"...\"": "pass a string (run by /bin/sh) or a list of arguments",
    "--export NONE, or --export NAME,NAME": "export=\"NONE\", or export=\"NAME,NAME\"",
}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*(?![\w-])")

_cli: ContextVar[bool] = ContextVar("rig_cli_words", default=False)


@contextmanager
def cli_words() -> Iterator[None]:
    """Within it, messages keep the CLI's words (a typed command, or the gateway's server)."""
    token = _cli.set(True)
    try:
        yield
    finally:
        _cli.reset(token)


def python_words(message: str) -> str:
    """``message`` with each rig-submit option named as submit()'s keyword (``--gpus`` ->
    ``gpus``); other text (`rig templates`, a job's own ``--flags``) unchanged."""
    for cli, python in PHRASES.items():
        message = message.replace(cli, python)
    return _FLAG.sub(lambda m: KEYWORDS[m.group()] if m.group() in KEYWORDS else m.group(), message)


F = TypeVar("F", bound=Callable[..., Any])


def in_callers_words(fn: F) -> F:
    """Decorate a submit path: a refused request (InvalidInput, Unschedulable) raised from
    Python names the keyword arguments, not the CLI's options."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        try:
            return fn(*args, **kwargs)
        except (InvalidInput, Unschedulable) as exc:
            if _cli.get() or type(exc) not in (InvalidInput, Unschedulable):
                raise
            worded = python_words(str(exc))
            if worded == str(exc):
                raise
            raise type(exc)(worded) from None

    return wrapper  # type: ignore[return-value]
