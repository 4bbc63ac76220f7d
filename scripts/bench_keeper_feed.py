#!/usr/bin/env python3
"""What one read of a job's output costs its log keeper: ``rig.logkeeper.LogCopy.feed`` of
100-byte reads into a log far below its cap (no cut), in microseconds per read, for two trees
side by side, alternating rounds (the machine is shared: compare the best rounds).

    .venv/bin/python scripts/bench_keeper_feed.py BASE_TREE [THIS_TREE] [--rounds 12] [--reads 100000]

A tree is a folder holding rig/logkeeper.py (this checkout, or another commit's from
``git archive``). The keeper is standard library only, so each tree's file is loaded by path.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType


def load(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / "rig" / "logkeeper.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def one_round(module: ModuleType, folder: Path, reads: int) -> float:
    """Microseconds per feed of one 100-byte read."""
    path = folder / "attempt-1.log"
    copy = module.LogCopy(path, 1 << 40)
    line = b"x" * 99 + b"\n"
    started = time.perf_counter()
    for _ in range(reads):
        copy.feed(line)
    spent = time.perf_counter() - started
    copy.close()
    path.unlink()
    path.with_suffix(".note").unlink(missing_ok=True)
    return spent / reads * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path)
    parser.add_argument("this", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--reads", type=int, default=100_000)
    args = parser.parse_args()
    modules = {"base": load(args.base, "keeper_base"), "this": load(args.this, "keeper_this")}
    folder = Path(tempfile.mkdtemp(prefix="rig-keeper-feed-"))
    times: dict[str, list[float]] = {name: [] for name in modules}
    try:
        for _ in range(args.rounds):
            for name, module in modules.items():
                times[name].append(one_round(module, folder, args.reads))
    finally:
        shutil.rmtree(folder)
    for name, values in times.items():
        print(f"{name}: best {min(values):.2f} us/read, median {sorted(values)[len(values) // 2]:.2f} "
              f"({' '.join(f'{v:.1f}' for v in values)})")
    print(f"this / base: best {min(times['this']) / min(times['base']):.2f}, "
          f"median {sorted(times['this'])[len(times['this']) // 2] / sorted(times['base'])[len(times['base']) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
