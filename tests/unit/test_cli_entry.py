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


def test_pythonpaths_empty_entry_does_not_let_the_working_folder_replace_rigs_packages(tmp_path: Path) -> None:
    # `export PYTHONPATH=$PYTHONPATH:/x` with PYTHONPATH unset leaves ":/x": its empty entry is
    # the working folder, ahead of site-packages. An operator's redis.py or click/ there
    # replaced rig's own (`rig status` failed with that file's error).
    shadow = "raise SystemExit('imported {} from the working folder')\n"
    (tmp_path / "redis.py").write_text(shadow.format("redis"))
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "__init__.py").write_text(shadow.format("click"))
    (tmp_path / "mine.py").write_text("VALUE = 7\n")
    rig = Path(sys.executable).parent / "rig"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    for pythonpath in (os.pathsep + "/nonexistent", "." + os.pathsep, "sub/.."):
        out = subprocess.run([str(rig), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                             env={**env, "PYTHONPATH": pythonpath})
        assert out.returncode == 0 and "working folder" not in out.stderr, (pythonpath, out.stderr)
        assert "Usage" in out.stdout
    # moved to the end, not dropped: what only that folder holds still imports
    code = ("import sys; from rig.cli import entry; entry._working_folder_last(); "
            "import redis, mine; print(mine.VALUE, redis.__file__.startswith(sys.prefix))")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": os.pathsep + "/nonexistent"})
    assert out.stdout.split() == ["7", "True"], out.stderr
