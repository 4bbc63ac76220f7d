"""``@rig.task``: run a Python function on a GPU through the same scheduler.

    @rig.task(gpu_memory="4G", priority="high")
    def train(lr: float) -> float: ...

    job = train.delay(3e-4)     # queued like any rig-submit job
    job.result                  # waits; returns train's return value (job.get(timeout))

The call runs in a fresh Python process (the submitter's interpreter, in the submitter's
working directory) that sees only its card(s) through CUDA_VISIBLE_DEVICES. The function must
be importable from its module (top level); arguments and the return value must pickle.

The call travels pickled on the job record in rig's Redis and is unpickled by the job's
process (rig.call): see there for what that means for who can run what.
"""

from __future__ import annotations

import base64
import functools
import inspect
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

from rig.errors import InvalidInput

P = ParamSpec("P")
R = TypeVar("R")

#: The largest pickled call (bytes, before base64) stored on a job record: Redis refuses values
#: over 512 MiB, and big data belongs in files the job reads, not in its arguments.
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024


class RigTask(Generic[P, R]):
    """A function that can also be queued with ``.delay``; calling it runs it here."""

    def __init__(self, fn: Callable[P, R], options: dict[str, Any]) -> None:
        if "<locals>" in fn.__qualname__:
            raise InvalidInput(f"@rig.task needs a top-level function; {fn.__qualname__} is nested")
        self.fn = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs):  # noqa: ANN201 - returns JobHandle
        return self.apply_async(args, kwargs)

    def apply_async(self, args: tuple = (), kwargs: dict | None = None, **overrides: Any):  # noqa: ANN201
        from rig.client import default_client

        client = overrides.pop("client", None) or default_client()
        options = {**self.options, **overrides}
        payload = _payload(self.fn, args, kwargs or {})
        try:
            pickled = pickle.dumps(payload)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the caller's arguments
            raise InvalidInput(f"the arguments of {self.fn.__qualname__}() cannot be pickled "
                               f"({type(exc).__name__}: {exc}); pass plain data or file paths") from None
        if len(pickled) > MAX_PAYLOAD_BYTES:
            raise InvalidInput(f"the arguments of {self.fn.__qualname__}() pickle to {len(pickled)} bytes, over "
                               f"{MAX_PAYLOAD_BYTES}; save large data to a file and pass its path")
        pythonpath = os.pathsep.join(p for p in [payload["root"], os.environ.get("PYTHONPATH", "")] if p)
        env = {**options.pop("env", {}), "PYTHONPATH": pythonpath}
        name = options.pop("name", None) or self.fn.__name__
        return client.submit(
            [sys.executable, "-m", "rig.call"], name=name, env=env, kind="python",
            extra={"payload": base64.b64encode(pickled).decode()}, **options,
        )


def task(
    fn: Callable[P, R] | None = None, *, gpu_memory: str | int | None = None, gpus: int = 1,
    priority: str | None = None, name: str | None = None, workdir: str | None = None,
    env: dict[str, str] | None = None, template: str | None = None, retries: int | None = None,
    time_limit: str | None = None, pool: str | None = None,
) -> Any:
    """Decorator: ``@rig.task(gpu_memory="4G")`` or ``@rig.task(template="test")``."""
    options: dict[str, Any] = {"gpu_memory": gpu_memory, "gpus": gpus}
    for key, value in (("priority", priority), ("name", name), ("workdir", workdir), ("env", env),
                       ("template", template), ("retries", retries), ("time_limit", time_limit),
                       ("pool", pool)):
        if value is not None:
            options[key] = value

    def wrap(f: Callable[P, R]) -> RigTask[P, R]:
        return RigTask(f, options)

    return wrap(fn) if fn is not None else wrap


def _payload(fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    module = fn.__module__
    source = inspect.getsourcefile(fn)
    file = str(Path(source).resolve()) if source else None
    root = ""
    if file and module != "__main__":
        # The folder from which `module` imports: strip one path part per dotted name.
        root = str(Path(file).parents[module.count(".")])
        if Path(file).name == "__init__.py":
            root = str(Path(file).parents[module.count(".") + 1])
    elif file:
        root = str(Path(file).parent)
    return {"module": module, "qualname": fn.__qualname__, "file": file, "root": root,
            "args": args, "kwargs": kwargs}
