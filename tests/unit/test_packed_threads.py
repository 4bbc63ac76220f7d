"""rig.packed in threads: base64 builds its base85 decoding table on first use and publishes it
before filling it, so the first decodes of a fresh process, in two threads at once, could fail on
a sound value (a card worker starting two jobs at once: "job 2: not started: invalid record ...
bad base85 character at position 0"). rig.packed builds the tables when it is imported."""

from __future__ import annotations

import subprocess
import sys


def test_importing_packed_builds_base85s_tables_before_any_thread_decodes() -> None:
    code = ("import base64, rig.packed; "
            "print(base64._b85dec is not None and None not in [base64._b85dec[c] for c in base64._b85alphabet])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True", out


def test_fresh_processes_unpack_in_many_threads_at_once() -> None:
    # The race itself, as a card worker meets it: a fresh process, threads released together.
    code = """
import sys, threading
sys.setswitchinterval(1e-6)
from rig import packed
value = packed.pack({"command": ["sleep", "60"], "workdir": "/tmp"})
failed = []
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    try:
        packed.unpack(value)
    except ValueError as exc:
        failed.append(str(exc))
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(failed))
"""
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "0", out
