"""Pickling a ``@rig.task`` call's arguments and its result so that the classes and functions
of the submitter's *script* travel both ways.

The script runs as ``__main__`` where it submits, and is imported as ``__rig_main__`` in the job
(rig.call, so that its ``if __name__ == "__main__":`` block does not run there). A class ``Point``
defined in it is therefore ``__main__.Point`` on one side and ``__rig_main__.Point`` on the other,
and plain pickle finds neither on the other side ("Can't get attribute 'Point' on <module
'rig.call'>", "No module named '__rig_main__'"). Here such a class or function is pickled as a
call of :func:`script_global` with its qualified name, which looks it up in whichever module is
the script in the process that unpickles: ``__rig_main__`` in a job, ``__main__`` elsewhere.
So a plain ``pickle.loads`` (e.g. of a job's result by rig.client) needs nothing special.

Invariant: only objects whose qualified name leads back to them from the script module are
pickled by name; anything else (a class defined inside a function, a redefined name) is left to
pickle, which refuses it with its own message.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from types import ModuleType
from typing import Any

#: The script's module name where it submits, and inside a job (rig.call).
SUBMITTER_SCRIPT = "__main__"
JOB_SCRIPT = "__rig_main__"
_MISSING = object()


def script_module() -> ModuleType | None:
    """The submitter's script in this process: the imported copy in a job, else ``__main__``."""
    return sys.modules.get(JOB_SCRIPT) or sys.modules.get(SUBMITTER_SCRIPT)


def _lookup(module: ModuleType | None, qualname: str) -> Any:
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, _MISSING)
        if target is _MISSING:
            return _MISSING
    return target


class ScriptNameMissing(AttributeError):
    """A name pickled from the submitter's script is not defined in the script here."""


def script_global(qualname: str) -> Any:
    """The class or function ``qualname`` of the submitter's script, in this process (what a
    pickled script class or function unpickles to)."""
    module = script_module()
    found = _lookup(module, qualname)
    if found is _MISSING:
        where = getattr(module, "__file__", None) or "the script"
        raise ScriptNameMissing(
            f"{qualname} is not defined at the top level of {where} here (the job imports the script "
            f"without running `if __name__ == \"__main__\":`); define {qualname} at the script's top "
            f"level, outside that guard")
    return found


class _ScriptPickler(pickle.Pickler):
    """Pickles the script's classes and functions by name through :func:`script_global`, and
    records them (``script_names``: qualified name -> object) for the submit-side checks."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        self.script_names: dict[str, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        # Called for every object but plain builtins (ints, strs, lists, dicts...): cheap for data.
        if not isinstance(obj, type | types.FunctionType):
            return NotImplemented
        if getattr(obj, "__module__", None) not in (SUBMITTER_SCRIPT, JOB_SCRIPT):
            return NotImplemented
        qualname = obj.__qualname__
        found = _lookup(sys.modules.get(obj.__module__), qualname)
        # A decorated @rig.task function is reached through its RigTask wrapper.
        if "<locals>" in qualname or (found is not obj and getattr(found, "fn", None) is not obj):
            return NotImplemented  # pickle refuses it with its own message
        self.script_names[qualname] = obj
        return script_global, (qualname,)


def dumps(obj: Any) -> tuple[bytes, dict[str, Any]]:
    """``obj`` pickled with the script's names made portable, and those names (qualified name
    -> object) that it contains."""
    buffer = io.BytesIO()
    pickler = _ScriptPickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.script_names
