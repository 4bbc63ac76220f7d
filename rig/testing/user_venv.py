"""A venv other Unix users can run rig from: Debian's /usr/bin/python3 with this checkout
installed (not editable: they may not be able to read the checkout; root's own Python lives where
they cannot enter). Kept in /tmp between runs of the same sources, keyed by their digest, so a
second run costs nothing. Several checkouts on one machine share /tmp: one builder at a time (a
lock), a venv counts only once its ``.installed`` mark is written (a half-built one is rebuilt),
and only stale venvs of other sources are removed (another run may be using its own now)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import time
from pathlib import Path

SYSTEM_PYTHON = Path("/usr/bin/python3")
LOCK = Path("/tmp/rig-test-user-venv.lock")
#: A venv of other sources untouched this long (s) is no longer in use by anyone's run.
STALE_AFTER_S = 3600


def source_digest(repo: Path) -> str:
    """12 hex digits of the sources that go into the installed package (rig's Python, Lua, pyproject)."""
    digest = hashlib.sha256()
    for path in sorted([*repo.glob("rig/**/*.py"), *repo.glob("rig/lua/*.lua"), repo / "pyproject.toml"]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def user_venv(repo: Path) -> Path:
    """The venv of ``repo``'s current sources under /tmp (world-readable), built on first use."""
    venv = Path("/tmp") / f"rig-test-user-venv-{source_digest(repo)}"
    ready = venv / ".installed"  # written last: a venv without it is half built
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            for old in Path("/tmp").glob("rig-test-user-venv-*"):
                if old == venv or time.time() - old.stat().st_mtime > STALE_AFTER_S:
                    shutil.rmtree(old, ignore_errors=True)
            subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(repo)], check=True, timeout=600)
            ready.touch()
    return venv
