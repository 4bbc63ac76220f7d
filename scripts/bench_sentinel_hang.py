#!/usr/bin/env python3
"""What hung sentinels cost a command (issue 15): a SentinelSet (a master, a replica, three
sentinels on free loopback ports, rig.testing.sentinel_set), then `rig status` and
`rig-submit` timed as subprocesses with no sentinel stopped, the first-listed one stopped
(SIGSTOP: it accepts connections and never answers) and all three stopped. Needs the system's
redis-server; touches no other Redis; everything it starts is stopped at the end (also on
SIGTERM). Figures: docs/PERFORMANCE.md, "Hung sentinels".

    .venv/bin/python scripts/bench_sentinel_hang.py
    PYTHONPATH=/path/to/other/tree .venv/bin/python scripts/bench_sentinel_hang.py   # another rig
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(Path(__file__).resolve().parents[1]))

from rig.testing.sentinel_set import SentinelSet  # noqa: E402


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # (an older tree lacks rig.testing.sigterm)
    bindir = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="rig-sentinel-hang-"))
    redis_set = SentinelSet(work / "set").start()
    env = {**os.environ, "RIG_HOME": str(work / "home"), "RIG_REDIS_URL": redis_set.url,
           "RIG_KEY_PREFIX": "bench-sentinel-hang:"}

    def run(label: str, argv: list[str]) -> None:
        began = time.monotonic()
        done = subprocess.run([str(bindir / argv[0]), *argv[1:]], env=env, capture_output=True, text=True, timeout=300)
        said = done.stderr.strip().splitlines()[-1][-200:] if done.stderr.strip() else ""
        print(f"| {label} | `{' '.join(argv)}` | {time.monotonic() - began:.1f} s | {done.returncode} | {said} |",
              flush=True)

    try:
        import rig

        print(f"rig from {Path(rig.__file__).parent}; load average {os.getloadavg()[0]:.1f}")
        print("| sentinels stopped | command | wall | exit | last line |\n|---|---|---|---|---|")
        run("none", ["rig", "status"])
        redis_set.procs["sentinel-0"].send_signal(signal.SIGSTOP)
        run("the first listed", ["rig", "status"])
        for number in range(1, len(redis_set.sentinel_ports)):
            redis_set.procs[f"sentinel-{number}"].send_signal(signal.SIGSTOP)
        run("all", ["rig", "status"])
        run("all", ["rig-submit", "--gpu-memory", "1G", "--", "true"])
    finally:
        for number in range(len(redis_set.sentinel_ports)):
            redis_set.procs[f"sentinel-{number}"].send_signal(signal.SIGCONT)
        redis_set.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
