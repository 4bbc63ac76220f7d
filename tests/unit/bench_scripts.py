"""The benchmarks under scripts/, from the unit tests: run one as a user would (its own process,
none of the caller's RIG_ / PEERS_ variables, an unreachable Redis unless told otherwise, so a
run that should have been refused fails at once and never touches the shared Redis), or load
one as a module to call its functions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
#: Where a benchmark that gets past its arguments looks for Redis in these tests: nothing answers.
UNREACHABLE = {"RIG_BENCH_REDIS_URL": "redis://127.0.0.1:1/0", "PEERS_BROKER_URL": "redis://127.0.0.1:1/11"}


def run_script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``scripts/NAME ARGS`` in a fresh process; ``env`` added to the cleaned environment
    (default: UNREACHABLE)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RIG_", "PEERS_"))}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          env={**clean, **(UNREACHABLE if env is None else env)}, timeout=120, check=False)


def load_script(name: str) -> ModuleType:
    """``scripts/NAME`` as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(name).stem}", ROOT / "scripts" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
