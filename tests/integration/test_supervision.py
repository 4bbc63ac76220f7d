"""Item 8 through the real `rig up --daemon`: a folder named rig/workers/celery where the
operator stands does not break `rig up` (the supervision scenarios themselves run in
tests/integration/test_faults.py)."""

from __future__ import annotations

import pytest

from rig.testing import faults_supervision

pytestmark = pytest.mark.slow


SHADOW = "raise SystemExit('imported {name} from the working directory')\n"


@pytest.mark.background
def test_a_rig_folder_in_the_working_directory_does_not_break_rig_up(tmp_path):
    """Item 8: the operator stands in the parent of a clone (a `rig` folder), or beside folders
    named workers or celery. rig's own processes import nothing from there."""
    where = tmp_path / "operator"
    for package in ("rig", "workers", "celery"):
        (where / package).mkdir(parents=True)
        (where / package / "__init__.py").write_text(SHADOW.format(name=package))
    (where / "rig" / "config.py").write_text(SHADOW.format(name="rig.config"))
    (where / "workers" / "app.py").write_text(SHADOW.format(name="workers.app"))
    node = faults_supervision.DaemonNode(tmp_path / "node")
    node.cwd = where
    try:
        up = node.cli("up", "--daemon", "--no-metrics", "--no-flower")
        assert up.returncode == 0, up.stdout + up.stderr
        assert dict(node.workers()) == {"card0": 1, "card1": 1, "control": 1, "beat": 1, "gateway": 1}
        status = node.cli("status")
        assert status.returncode == 0, status.stderr
        down = node.cli("down")
        assert down.returncode == 0 and "rig stopped" in down.stdout, down.stdout + down.stderr
        assert not node.processes()
    finally:
        node.stop_all()


def test_a_users_script_beside_a_rig_folder_imports_rig(tmp_path):
    """A user runs `python job.py` from the parent of a clone (a folder named rig without an
    __init__.py): it must import rig, not an empty namespace package. Holds for an install with
    rig's folder on sys.path (scripts/test and scripts/quickstart install so)."""
    import glob
    import subprocess
    import sys

    site = [p for p in sys.path if p.endswith("site-packages")]
    if any(glob.glob(f"{p}/__editable__*finder.py") for p in site):
        pytest.skip("rig is installed in setuptools' strict editable mode here (scripts/test installs compat)")
    (tmp_path / "rig" / "rig").mkdir(parents=True)  # the clone, seen from its parent
    (tmp_path / "job.py").write_text("import rig\nprint(rig.submit.__module__)\n")
    out = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "rig.client", out.stderr
