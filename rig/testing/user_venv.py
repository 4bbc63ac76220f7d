"""A venv other Unix users can run rig from: Debian's /usr/bin/python3 with this checkout
installed (not editable: they may not be able to read the checkout; root's own Python lives where
they cannot enter). Kept in /tmp between runs of the same sources, keyed by their digest, so a
second run costs nothing; an older one is removed when the sources change."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

SYSTEM_PYTHON = Path("/usr/bin/python3")


def source_digest(repo: Path) -> str:
    """12 hex digits of the sources that go into the installed package (rig's Python, Lua, pyproject)."""
    digest = hashlib.sha256()
    for path in sorted([*repo.glob("rig/**/*.py"), *repo.glob("rig/lua/*.lua"), repo / "pyproject.toml"]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def user_venv(repo: Path) -> Path:
    """The venv of ``repo``'s current sources under /tmp (world-readable), built on first use."""
    venv = Path("/tmp") / f"rig-test-user-venv-{source_digest(repo)}"
    if not (venv / "bin" / "rig").exists():
        for old in Path("/tmp").glob("rig-test-user-venv-*"):
            subprocess.run(["rm", "-rf", str(old)], check=False)
        subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(repo)], check=True, timeout=600)
    return venv
