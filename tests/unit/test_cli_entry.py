"""The console scripts' entry (rig.cli.entry): Ctrl-C while rig is still being imported ends the
command quietly, exit 130, never a traceback (a breaker pressed it 2 s into `rig` on a busy host)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_ctrl_c_during_the_import_is_quiet_and_exits_130(tmp_path: Path) -> None:
    began = tmp_path / "began"
    (tmp_path / "slow_cli.py").write_text(
        f"open({str(began)!r}, 'w').close()\nimport time\ntime.sleep(30)\n\ndef main():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", "from rig.cli.entry import _quietly_imported; "
                             "_quietly_imported('slow_cli')()"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not began.exists():  # the slow import is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, (proc.returncode, err)


def test_the_entry_imports_no_more_of_rig_than_it_needs() -> None:
    # Its handler must be in place before rig's heavy modules load: importing the entry (and so
    # the rig package) must not import the client, Celery or redis.
    code = ("import sys, rig.cli.entry; heavy = [m for m in ('rig.client', 'celery', 'redis', 'click') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
