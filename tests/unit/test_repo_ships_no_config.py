"""The repository ships no config file where rig looks for one: a rig.toml committed at the root
(a test's `node_name = "n7"`, by mistake) named every fresh clone's node n7, and a second server
cloning the repository was refused its name (exit 10)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_rig_toml_at_the_repository_root():
    assert not (ROOT / "rig.toml").exists() or not _tracked(ROOT / "rig.toml")


def _tracked(path: Path) -> bool:
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", path.name],
                          capture_output=True, text=True)
    return done.returncode == 0
