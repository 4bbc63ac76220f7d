#!/usr/bin/env python3
"""What the job wrapper's read end of its own output pipe costs at launch (workers.card_keeper.job_fds):
Popen with and without pass_fds=(a pipe's read end,), in random order, in one process.
argv: N [MiB of RSS to hold, as a large worker would]."""
import os
import random
import subprocess
import sys
import time

argv = ["/bin/sh", "-c", "exit 0"]
r, w = os.pipe2(os.O_CLOEXEC)
ballast = bytearray(int(sys.argv[2]) << 20) if len(sys.argv) > 2 else b""
for i in range(0, len(ballast), 4096):
    ballast[i] = 1  # touched: resident
def run(pass_fds):
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=w, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, pass_fds=pass_fds)
    spawn = time.perf_counter() - t
    p.wait()
    return spawn
N = int(sys.argv[1])
order = [False] * N + [True] * N
random.shuffle(order)
got = {False: [], True: []}
for with_fd in order:
    got[with_fd].append(run((r,) if with_fd else ()))
a, b = sorted(got[False]), sorted(got[True])
print(f"RSS ballast {len(ballast) >> 20} MiB: Popen() median ms without {a[N//2]*1e3:.3f}, with pass_fds "
      f"{b[N//2]*1e3:.3f}, ratio {b[N//2]/a[N//2]:.3f}")
