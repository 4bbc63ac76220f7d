"""``python -m rig.fakeuse SIZE SECONDS``: "use" GPU memory on the fake cards of this job.

Writes SIZE (e.g. 12G) for this process into $RIG_FAKE_GPU_DIR/<card>/<pid> for every card in
$CUDA_VISIBLE_DEVICES, holds it for SECONDS, then removes it. For demos, benchmarks and tests of
rig's measured-memory accounting on machines without a GPU; it does nothing useful elsewhere.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from rig.memory import parse_memory


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m rig.fakeuse SIZE SECONDS   (e.g. 12G 30)", file=sys.stderr)
        return 2
    nbytes = parse_memory(argv[0], what="SIZE")
    seconds = float(argv[1])
    folder = os.environ.get("RIG_FAKE_GPU_DIR")
    cards = [c for c in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if c.strip()]
    files = []
    if folder:
        for card in cards:
            path = Path(folder) / card.strip() / str(os.getpid())
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written aside and renamed in: a reader never sees the file empty (a 0-byte use).
            aside = path.with_name(f".{path.name}.new")
            aside.write_text(str(nbytes))
            os.replace(aside, path)
            files.append(path)
    try:
        time.sleep(seconds)
    finally:
        for path in files:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
