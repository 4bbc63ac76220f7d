"""rig: a VRAM-aware GPU job queue for teams that share multi-GPU servers.

    import rig
    job = rig.submit("python train.py", gpu_memory="12G", priority="high")
    job.wait()

    @rig.task(gpu_memory="4G")
    def train(lr): ...
    train.delay(3e-4).result     # waits; .get(timeout) bounds the wait
"""

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

__version__ = "0.1.0"

__all__ = [
    "Client", "JobHandle", "get_job", "submit", "submit_many", "task", "RigTask", "Settings", "load_settings",
    "Job", "JobState", "Priority", "RigError", "InvalidInput", "JobNotFound", "RedisUnavailable",
    "RedisFull", "Unschedulable", "RemoteError", "__version__",
]
