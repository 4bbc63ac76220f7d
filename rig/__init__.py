"""rig: a VRAM-aware GPU job queue for teams that share multi-GPU servers.

    import rig
    job = rig.submit("python train.py", gpu_memory="12G", priority="high")
    job.wait()

    @rig.task(gpu_memory="4G")
    def train(lr): ...
    train.delay(3e-4).result     # waits; .get(timeout) bounds the wait

The names below are imported when first used (``rig.submit`` imports rig.client then): a
command line that imports only ``rig.cli.entry`` first can take Ctrl-C quietly while the rest
of rig is still being imported (a second or more on a busy machine).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module it comes from.
_EXPORTS = {
    "Client": "rig.client", "JobHandle": "rig.client", "RemoteError": "rig.client", "get_job": "rig.client",
    "submit": "rig.client", "submit_many": "rig.client",
    "Settings": "rig.config", "load_settings": "rig.config",
    "InvalidInput": "rig.errors", "JobNotFound": "rig.errors", "RedisFull": "rig.errors",
    "RedisUnavailable": "rig.errors", "RigError": "rig.errors", "Unschedulable": "rig.errors",
    "Job": "rig.models", "JobState": "rig.models", "Priority": "rig.models",
    "RigTask": "rig.pytask", "task": "rig.pytask",
}

__all__ = [
    "Client", "JobHandle", "get_job", "submit", "submit_many", "task", "RigTask", "Settings", "load_settings",
    "Job", "JobState", "Priority", "RigError", "InvalidInput", "JobNotFound", "RedisUnavailable",
    "RedisFull", "Unschedulable", "RemoteError", "__version__",
]

if TYPE_CHECKING:  # what a type checker and an editor see
    from rig.client import Client, JobHandle, RemoteError, get_job, submit, submit_many
    from rig.config import Settings, load_settings
    from rig.errors import (
        InvalidInput,
        JobNotFound,
        RedisFull,
        RedisUnavailable,
        RigError,
        Unschedulable,
    )
    from rig.models import Job, JobState, Priority
    from rig.pytask import RigTask, task


def __getattr__(name: str) -> Any:  # noqa: ANN401 - any of the public names
    module = _EXPORTS.get(name)
    if module is None:
        # A submodule (`rig.errors.InvalidInput` right after `import rig`), as when the names
        # above were imported eagerly and brought their modules with them.
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'rig' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
