"""Item 8 through the real `rig up --daemon`: a folder named rig/workers/celery where the
operator stands does not break `rig up` (the supervision scenarios themselves run in
tests/integration/test_faults.py)."""

from __future__ import annotations

import pytest

from rig.testing import faults_supervision

pytestmark = pytest.mark.slow


SHADOW = "raise SystemExit('imported {name} from the working directory')\n"


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
        assert dict(node.workers()) == {"card0": 1, "card1": 1, "control": 1, "beat": 1}
        status = node.cli("status")
        assert status.returncode == 0, status.stderr
        down = node.cli("down")
        assert down.returncode == 0 and "rig stopped" in down.stdout, down.stdout + down.stderr
        assert not node.processes()
    finally:
        node.stop_all()
