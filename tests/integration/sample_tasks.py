"""Functions queued with @rig.task by the integration tests."""

import os

import rig


@rig.task(gpu_memory="2G", priority="high")
def probe(x: int) -> dict:
    return {
        "double": 2 * x,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "pid": os.getpid(),
        "job_id": os.environ.get("RIG_JOB_ID"),
    }


@rig.task(gpu_memory="1G")
def explode() -> None:
    raise ValueError("boom from inside the job")
