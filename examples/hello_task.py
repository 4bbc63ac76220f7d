"""Queue a Python function on a GPU with @rig.task and collect the results.

    python examples/hello_task.py
"""

import os

import rig


@rig.task(gpu_memory="2G", priority="high")
def square(n: int) -> str:
    card = os.environ["CUDA_VISIBLE_DEVICES"]
    return f"job {os.environ['RIG_JOB_ID']} on card {card} (pid {os.getpid()}): {n}^2 = {n * n}"


if __name__ == "__main__":
    jobs = [square.delay(n) for n in range(3)]
    for job in jobs:
        print(job.get(timeout=300))
