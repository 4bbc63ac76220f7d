"""``@rig.task``: run a Python function on a GPU through the same scheduler.

    @rig.task(gpu_memory="4G", priority="high")
    def train(lr: float) -> float: ...

    job = train.delay(3e-4)     # queued like any rig-submit job
    job.result                  # waits; returns train's return value (job.get(timeout))

The call runs in a fresh Python process (the submitter's interpreter, in the submitter's
working directory) that sees only its card(s) through CUDA_VISIBLE_DEVICES. The function must
be importable from its module (top level); arguments and the return value must pickle.

What ``.delay()`` refuses at once, with one line saying what to write instead (rather than a job
that fails on a card): a lambda, a function defined inside another function, a function defined
in an interactive session (no file to import), a name that does not lead back to the function,
a call made from the top level of a script without ``if __name__ == "__main__":`` (the job
imports that script to find the function, which would run the submission again; a guard is any
``if``/``elif`` whose test requires ``__name__ == "__main__"``, alone or in an ``and``), a function
or an argument's class that only that guard defines (the job's import does not run it), and an
argument's class from the script when the function is not (the job does not import the script).
Classes and functions of the script travel both ways (rig.callpickle). Inside the job,
a ``.delay()`` made while the call's module is being imported fails the job the same way instead
of submitting nested jobs (:func:`loading_call`).

The job's interpreter runs with ``-P`` (no script or working folder on ``sys.path``), so a
folder named ``rig`` there cannot shadow rig; rig.call then adds the function's own folder.

The call travels pickled on the job record in rig's Redis and is unpickled by the job's
process (rig.call): see there for what that means for who can run what.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import difflib
import functools
import inspect
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Generic, ParamSpec, TypeVar

from rig import callpickle
from rig.argnames import in_callers_words
from rig.errors import InvalidInput

P = ParamSpec("P")
R = TypeVar("R")

#: The largest pickled call (bytes, before base64) stored on a job record: Redis refuses values
#: over 512 MiB, and big data belongs in files the job reads, not in its arguments.
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024


#: Set (to the file being imported) while rig.call imports a call's module inside a job: a
#: ``.delay()`` then comes from that module's top level being run again (see loading_call).
_loading_call: str | None = None
#: What was refused while loading (rig.call fails the job with it even if the script caught the
#: exception, or raised it in a thread of its own where it never reaches rig.call).
refused_while_loading: list[str] = []


class SubmittedWhileImported(BaseException):  # noqa: N818 - reads as what happened
    """A ``.delay()`` ran while rig.call was importing the call's module in a job: the script
    submits jobs from its top level. A BaseException, so a script's ``except Exception`` around
    the submission cannot swallow it and submit on."""


@contextlib.contextmanager
def loading_call(file: str) -> Iterator[None]:
    """rig.call imports a call's module inside this block: any ``.delay()`` raises
    SubmittedWhileImported instead of submitting a nested job."""
    global _loading_call
    before, _loading_call = _loading_call, file
    try:
        yield
    finally:
        _loading_call = before


class RigTask(Generic[P, R]):
    """A function that can also be queued with ``.delay``; calling it runs it here."""

    def __init__(self, fn: Callable[P, R], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __get__(self, instance: object, owner: type | None = None) -> RigTask[..., R] | _BoundTask[R]:
        """A decorated method read through an instance (``K().meth``) is bound to it, as a
        plain method is: calling it runs ``meth(instance, ...)`` here, and ``.delay(x)`` queues
        ``K.meth(instance, x)``, the instance pickled as the first argument (a copy: what the job
        changes on it does not come back). Read through the class (``K.meth``) it stays the task."""
        if instance is None:
            return self
        return _BoundTask(self, instance)

    def delay(self, *args: P.args, **kwargs: P.kwargs):  # noqa: ANN201 - returns JobHandle
        return self.apply_async(args, kwargs)

    def apply_async(self, args: tuple = (), kwargs: dict | None = None, **overrides: Any):  # noqa: ANN201
        from rig.client import default_client

        if _loading_call is not None:
            message = (f"{_loading_call} submits {self.fn.__name__}() when it is imported: the job "
                       f"imports it to find the function, so put the code that calls .delay() under "
                       f"`if __name__ == \"__main__\":`")
            refused_while_loading.append(message)
            raise SubmittedWhileImported(message)
        _check_overrides(overrides)
        payload = _payload(self.fn)
        _check_importable(self, payload)
        _check_guarded(self.fn, payload)
        _check_defined_outside_guard(self.fn.__name__, f"{self.fn.__name__}()", payload)
        _check_arguments(self.fn, args, kwargs or {})
        client = overrides.pop("client", None) or default_client()
        options = {**self.options, **overrides}
        try:
            call, script_names = callpickle.dumps((tuple(args), dict(kwargs or {})))
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the caller's arguments
            raise InvalidInput(f"the arguments of {self.fn.__qualname__}() cannot be pickled "
                               f"({type(exc).__name__}: {exc}); pass plain data or file paths") from None
        _check_script_names(self.fn, payload, script_names)
        # The arguments travel as a pickle inside the payload: the job unpickles them only after
        # it has imported the function's script, where the script's classes are (rig.callpickle).
        pickled = pickle.dumps({**payload, "call": call})
        if len(pickled) > MAX_PAYLOAD_BYTES:
            raise InvalidInput(f"the arguments of {self.fn.__qualname__}() pickle to {len(pickled)} bytes, over "
                               f"{MAX_PAYLOAD_BYTES}; save large data to a file and pass its path")
        # No PYTHONPATH for the function's folder: rig.call adds it to sys.path itself, after
        # rig is imported (a folder named `rig` there would otherwise shadow rig).
        env = dict(options.pop("env", {}))
        name = options.pop("name", None) or self.fn.__name__
        return client.submit(
            call_argv(), name=name, env=env, kind="python",
            extra={"payload": base64.b64encode(pickled).decode()}, **options,
        )


class _BoundTask(Generic[R]):
    """A decorated method bound to an instance (see RigTask.__get__): the instance goes first."""

    def __init__(self, task: RigTask[..., R], instance: object) -> None:
        self.task = task
        self.instance = instance
        self.fn = task.fn  # what rig.call runs, given the instance first (as .delay() sends it)
        functools.update_wrapper(self, task.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:  # noqa: ANN401
        return self.task.fn(self.instance, *args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any):  # noqa: ANN201, ANN401 - returns JobHandle
        return self.task.apply_async((self.instance, *args), kwargs)

    def apply_async(self, args: tuple = (), kwargs: dict | None = None, **overrides: Any):  # noqa: ANN201
        return self.task.apply_async((self.instance, *args), kwargs, **overrides)


def task(
    fn: Callable[P, R] | None = None, *, gpu_memory: str | int | None = None, gpus: int = 1,
    priority: str | None = None, name: str | None = None, workdir: str | None = None,
    env: dict[str, str] | None = None, template: str | None = None, retries: int | None = None,
    time_limit: str | None = None, pool: str | None = None, oom_retry_grow: bool | None = None,
    export: str | None = None,
) -> Any:
    """Decorator: ``@rig.task(gpu_memory="4G")`` or ``@rig.task(template="test")``; takes
    every job option rig.submit takes (JOB_OPTIONS)."""
    options: dict[str, Any] = {"gpu_memory": gpu_memory, "gpus": gpus}
    for key, value in (("priority", priority), ("name", name), ("workdir", workdir), ("env", env),
                       ("template", template), ("retries", retries), ("time_limit", time_limit),
                       ("pool", pool), ("oom_retry_grow", oom_retry_grow), ("export", export)):
        if value is not None:
            options[key] = value

    _check_options(options)

    def wrap(f: Callable[P, R]) -> RigTask[P, R]:
        if isinstance(f, staticmethod | classmethod):
            kind = type(f).__name__
            raise InvalidInput(f"@rig.task is written above @{kind}; write @{kind} above @rig.task(...), "
                               f"which then decorates the plain function")
        _check_plain_function(f)
        return RigTask(f, options)

    return wrap(fn) if fn is not None else wrap


def _check_plain_function(fn: Callable[..., Any]) -> None:
    """An ``async def`` or a generator function returns an object the job cannot send back (a
    coroutine, a generator) without running its body: refused at decoration, not found out
    after the job held a card (it failed as bad_result, the body never run). So is what has no
    name the job could import it by (a functools.partial, a callable object: AttributeError at
    .delay()) and a bound method (the job would look it up on the class, without its instance)."""
    if inspect.ismethod(fn):
        raise InvalidInput(f"@rig.task got the bound method {fn.__qualname__}; decorate the method where its "
                           f"class defines it (`@rig.task(...)` above `def {fn.__name__}`), then call it "
                           f"through an instance")
    if not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn)):
        # A functools.partial or a callable object has no name the job could import it by.
        raise InvalidInput(f"@rig.task decorates a function defined with def (or a class); got a "
                           f"{type(fn).__module__}.{type(fn).__qualname__}: write a def at the top level of a "
                           f"module that calls it, and decorate that")
    name = getattr(fn, "__name__", repr(fn))
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise InvalidInput(f"{name}() is an async function, which a job does not await; decorate a plain "
                           f"function that runs it: `def {name}_job(...): return asyncio.run({name}(...))`")
    if inspect.isgeneratorfunction(fn):
        raise InvalidInput(f"{name}() is a generator function: a job can send back no generator; "
                           f"return a list (`return list(...)`) instead")


@in_callers_words
def _check_options(options: dict[str, Any]) -> None:
    """Refuse a malformed option where it is written, at decoration (the rules rig.submit
    applies, rig.request_rules), not at the first .delay(). What depends on the cluster (a
    template's or pool's name, a size no card has, ``"auto"``) or on the submitter's shell
    (``env={"NAME": None}``, ``export=``'s values) is checked at .delay(). The rules word their
    refusals in the CLI's words; in_callers_words names the keywords instead (rig.argnames)."""
    from rig.job_env import given_env, parse_export, refuse_rig_owned
    from rig.models import Priority
    from rig.request_rules import (
        check_flag,
        check_gpus,
        check_retries,
        check_text_options,
        parse_gpu_memory,
        parse_time_limit,
    )

    check_gpus(options["gpus"])
    check_text_options({f"--{key}": options.get(key) for key in ("name", "template", "pool", "workdir")})
    check_flag(options.get("oom_retry_grow"), "oom_retry_grow")
    if options["gpu_memory"] is not None:
        parse_gpu_memory(options["gpu_memory"])
    if "retries" in options:
        check_retries(options["retries"])
    parse_time_limit(options.get("time_limit"))
    if "priority" in options:
        Priority.parse(options["priority"])
    refused = refuse_rig_owned(given_env(options.get("env")))
    if refused:
        raise InvalidInput(refused)
    if "export" in options:
        try:
            parse_export(options["export"])
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None


def _check_overrides(overrides: dict[str, Any]) -> None:
    """``.apply_async(args, kwargs, gpu_mem="4G")``: one line naming the closest job option,
    not Python's TypeError about ``Client.submit()``, which the caller never called."""
    unknown = sorted(set(overrides) - JOB_OPTIONS - {"client"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(JOB_OPTIONS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InvalidInput(f".apply_async() takes no job option {unknown[0]!r}{hint}; the job options are "
                           f"{', '.join(sorted(JOB_OPTIONS))}, and the function's own arguments go in args "
                           f"and kwargs")


def call_argv(executable: str = sys.executable) -> list[str]:
    """The job's command line: ``python -P -m rig.call`` (3.11+), so neither the job's working
    folder nor a script's folder comes before the installed rig on ``sys.path``; before 3.11,
    the same through ``-c`` (whose ``sys.path[0]``, the working folder, is dropped first)."""
    if sys.version_info >= (3, 11):
        return [executable, "-P", "-m", "rig.call"]
    return [executable, "-c",
            "import sys; del sys.path[0]; import runpy; runpy.run_module('rig.call', run_name='__main__')"]


#: The job options @rig.task and .apply_async take (a keyword of .delay() is the function's).
JOB_OPTIONS = frozenset({"gpu_memory", "gpus", "priority", "name", "workdir", "env", "template", "retries",
                         "time_limit", "pool", "oom_retry_grow", "export"})


def _check_arguments(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse at once (InvalidInput) a call the function cannot take: in the job it would fail
    each attempt with the same TypeError. A job option given to .delay() is named as such."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): the job will say
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        options = sorted(set(kwargs) & JOB_OPTIONS - set(signature.parameters))
        hint = (f"; {options[0]}= is a job option: give it to @rig.task(...) or "
                f"{fn.__name__}.apply_async(args, kwargs, {options[0]}=...)") if options else ""
        raise InvalidInput(f"{fn.__name__}() cannot take these arguments ({exc}); nothing was submitted{hint}") from None


class _NotImportable(InvalidInput):
    pass


def _check_importable(task: RigTask[Any, Any], payload: dict[str, Any]) -> None:
    """Refuse (InvalidInput, one line: what to do) a function the job could not import by its
    module and qualified name."""
    fn, name, qualname = task.fn, task.fn.__name__, payload["qualname"]
    if fn.__name__ == "<lambda>":
        raise _NotImportable("@rig.task cannot queue a lambda (the job imports the function by name); "
                             "define it with `def NAME(...):` at the top level of a module")
    if "<locals>" in qualname:
        outer = qualname.rsplit(".<locals>.", 1)[0].rsplit(".", 1)[-1]
        raise _NotImportable(f"{name}() is defined inside {outer}() and the job imports it by name; "
                             f"move it to the top level of its module")
    if payload["file"] is None:
        where = "an interactive session or notebook" if payload["module"] == "__main__" else \
            f"module {payload['module']}, which has no source file"
        raise _NotImportable(f"{name}() is defined in {where}, which the job cannot import; "
                             f"put it in a .py file and import it from there")
    module = sys.modules.get(fn.__module__)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not task and target is not fn and getattr(target, "task", None) is not task:
        if isinstance(target, RigTask) and target.fn.__qualname__ == fn.__qualname__:
            # The module was run again (importlib.reload, a notebook cell) or defines it twice.
            raise _NotImportable(f"{fn.__module__}.{qualname} is now another {name}() (the module was reloaded, "
                                 f"or defines {name} twice) and the job would run that one; submit through "
                                 f"{fn.__module__}.{qualname} as it is now (import it again after a reload)")
        raise _NotImportable(f"{fn.__module__}.{qualname} does not name the decorated {name}() (was the "
                             f"name reused or the function renamed?); define it once, at the top level "
                             f"of its module, under its own name")


def _check_guarded(fn: Callable[..., Any], payload: dict[str, Any]) -> None:
    """Refuse a submission made while a script runs its top level outside
    ``if __name__ == "__main__":``, of a function from that script: the job imports the
    script to find the function, which would run this submission again."""
    main = sys.modules.get("__main__")
    if fn.__module__ != "__main__" or main is None or not payload["file"]:
        return
    frame = _script_top_level(sys._getframe(1), main)
    by_thread = ""
    if frame is None and threading.current_thread() is not threading.main_thread():
        # A thread the script's top level started (and may be joining): its import in the job
        # starts that thread again, which submits again.
        frame = _script_top_level(sys._current_frames().get(threading.main_thread().ident or 0), main)
        by_thread = " (from a thread it started there)"
    if frame is None:
        return  # the script's top level has finished: nothing re-runs
    line = frame.f_lineno
    guarded = _main_guard_lines(payload["file"])
    if guarded is None or any(first <= line <= last for first, last in guarded):
        return
    script = Path(payload["file"]).name
    raise InvalidInput(f"{script} line {line} submits {fn.__name__}(){by_thread} outside "
                       f"`if __name__ == \"__main__\":`; the job imports {script} to find "
                       f"{fn.__name__} and would submit again: put the code that submits under that guard")


def _script_top_level(frame: FrameType | None, main: ModuleType) -> FrameType | None:
    """The frame running the script's top level (``main``'s ``<module>``) among ``frame`` and
    its callers, or None."""
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is main.__dict__):
        frame = frame.f_back
    return frame


def _main_guard_lines(file: str) -> list[tuple[int, int]] | None:
    """The line ranges (first, last) of the bodies of the ``if`` blocks of ``file`` that run
    only when ``__name__ == "__main__"`` (see _is_main_test), at any depth, ``elif`` included;
    None when the file cannot be read or parsed: then nothing is refused here."""
    tree = _parse(file)
    if tree is None:
        return None
    return [(node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
            for node in ast.walk(tree) if isinstance(node, ast.If) and _is_main_test(node.test)]


def _parse(file: str) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_text(), file)
    except (OSError, SyntaxError, ValueError):
        return None


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is true only when ``__name__ == "__main__"``: that comparison (either
    order, ``==`` only), or an ``and`` with it among its terms (at any depth of ``and``s;
    parentheses leave no trace in the tree). ``!=``, ``not`` and ``or`` do not guard."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_main_test(value) for value in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _bound_at_top_level(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names the module's top-level code binds (def, class, assignment, import), as
    (outside any ``__main__`` guard, only inside one). Compound statements (try, for, with, other
    ifs) are looked into; function and class bodies are not (their names are not the module's)."""
    outside: set[str] = set()
    inside: set[str] = set()

    def visit(statements: list[ast.stmt], guarded: bool) -> None:
        for node in statements:
            names = inside if guarded else outside
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            for target in _targets(node):
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, ast.If) and _is_main_test(node.test):
                visit(node.body, True)
                visit(node.orelse, guarded)
                continue
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None) or []
                for child in children:
                    if isinstance(child, ast.ExceptHandler | ast.match_case):
                        visit(child.body, guarded)
                if children and isinstance(children[0], ast.stmt):
                    visit(children, guarded)

    visit(tree.body, False)
    return outside, inside - outside


def _targets(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        return [node.target]
    if isinstance(node, ast.With | ast.AsyncWith):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    return []


def _check_defined_outside_guard(qualname: str, label: str, payload: dict[str, Any]) -> None:
    """Refuse a name of the submitter's script that only its ``__main__`` guard defines: the
    job imports the script without running that block, so the name would not be there."""
    if payload["module"] != "__main__" or not payload["file"]:
        return
    tree = _parse(payload["file"])
    if tree is None:
        return
    name = qualname.split(".")[0]
    _outside, only_inside = _bound_at_top_level(tree)
    if name in only_inside:
        script = Path(payload["file"]).name
        raise InvalidInput(f"{label} is defined inside `if __name__ == \"__main__\":` in {script}, "
                           f"which the job does not run when it imports {script}: define {name} at the "
                           f"module's top level, outside the guard")


def _check_script_names(fn: Callable[..., Any], payload: dict[str, Any], names: dict[str, Any]) -> None:
    """Refuse arguments holding classes or functions of the submitter's script that the job
    cannot find: the job imports the script only when the function itself is from it, and
    then runs its top level only, not its ``__main__`` guard."""
    for qualname, obj in names.items():
        what = "class" if isinstance(obj, type) else "function"
        if payload["module"] != "__main__":
            main = sys.modules.get("__main__")
            script = Path(getattr(main, "__file__", None) or "the script").name
            raise InvalidInput(f"the arguments of {fn.__qualname__}() hold the {what} {qualname} of the script "
                               f"{script}, which the job does not import (it imports {payload['module']}): "
                               f"define {qualname} in a module that both import")
        _check_defined_outside_guard(qualname, f"the {what} {qualname} (passed to {fn.__name__}())", payload)


def _payload(fn: Callable[..., Any]) -> dict[str, Any]:
    """Where the job finds ``fn``: ``module``, ``qualname``, ``file`` (None: no source file)
    and ``root`` (the folder to put on ``sys.path``); ``package`` for a script run with
    ``python -m PACKAGE.NAME``. The arguments are added as ``call``."""
    module = fn.__module__
    if module == "__rig_main__":  # a call running in a job submits a task from its own script
        module = "__main__"
    try:
        source = inspect.getsourcefile(fn)
    except TypeError:  # a builtin or C function
        source = None
    # "<stdin>", "<ipython-input-...>": no file the job could import
    file = str(Path(source).resolve()) if source and Path(source).is_file() else None
    root = ""
    if file and module != "__main__":
        # The folder from which `module` imports: strip one path part per dotted name.
        root = str(Path(file).parents[module.count(".")])
        if Path(file).name == "__init__.py":
            root = str(Path(file).parents[module.count(".") + 1])
    elif file:
        root = str(Path(file).parent)
    payload = {"module": module, "qualname": fn.__qualname__, "file": file, "root": root}
    # A script run as part of a package (`python -m pkg.train`): the job imports it as a
    # member of that package, or its relative imports (`from .data import x`) fail there.
    package = getattr(sys.modules.get(fn.__module__), "__package__", None)
    if file and module == "__main__" and package:
        payload["package"] = package
        payload["root"] = str(Path(file).parents[package.count(".") + 1])
    return payload
