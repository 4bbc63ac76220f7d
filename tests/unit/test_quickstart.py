"""scripts/quickstart outside the happy path: a pip install that fails, two quickstarts at once,
cards smaller than its demo jobs. The script runs from a copy in a temporary folder whose
.venv/bin holds stand-ins for python, rig and rig-submit (nothing is installed or started)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.bench_scripts import ROOT, load_script

GIB = 1024**3


def _card(node: str, index: int, usable_gib: float, **extra: object) -> dict:
    return {"node": node, "index": index, "usable": int(usable_gib * GIB), "allowed": True, "gone": False, **extra}


@pytest.mark.parametrize(("cards", "big", "pair"), [
    ([_card("n", i, 76) for i in range(8)], 40, 20),          # fake 8x80G: as written
    ([_card("n", 0, 22.8)], 11, 0),                           # one 24 GiB workstation card
    ([_card("n", 0, 38), _card("n", 1, 38)], 19, 20),         # 2 x A100 40GB
    ([_card("a", 0, 22.8), _card("b", 0, 22.8)], 11, 0),      # two nodes of one card: no pair
    ([_card("n", 0, 76), _card("n", 1, 30, allowed=False)], 40, 0),  # one card outside the whitelist
    ([_card("n", 0, 76), _card("n", 1, 16)], 40, 8),
])
def test_demo_jobs_fit_the_cards_that_are_up(cards, big, pair):
    """quickstart asked for 40 GiB and a 2-card job whatever the cards: on one 24 GiB card or an
    A100 40GB, rig-submit refused them (exit 3) half-way through, after queuing the first job."""
    sizes = load_script("quickstart_jobs.py").sizes
    got_big, got_pair, note = sizes({"cards": cards})
    assert (got_big, got_pair) == (big, pair)
    assert (note == "") == (big == 40 and pair == 20)
    if not pair:
        assert "skipped" in note


def _copy(tmp_path: Path, pip_compat_says: str, pip_compat_rc: int) -> Path:
    """A copy of scripts/quickstart whose .venv/bin/python answers pip with ``pip_compat_says``
    (exit ``pip_compat_rc``) for the compat install, records every call, and whose rig ends the
    script (exit 99) as soon as it is called."""
    tree = tmp_path / "clone"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "quickstart", tree / "scripts" / "quickstart")
    bin_dir = tree / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls"
    (bin_dir / "python").write_text(f"""#!/bin/bash
[ "$*" != "-m pip --version" ] || exit 0  # quickstart asks whether .venv has pip: not recorded
echo "python $*" >> {calls}
case "$*" in
  *editable_mode=compat*) sleep "${{STUB_PIP_SECONDS:-0}}"; echo "{pip_compat_says}"; exit {pip_compat_rc};;
esac
exit 0
""")
    (bin_dir / "rig").write_text(f"#!/bin/bash\necho \"rig $*\" >> {calls}\nexit 99\n")
    for stub in ("python", "rig"):
        (bin_dir / stub).chmod(stat.S_IRWXU)
    return tree


def _run(tree: Path, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    return subprocess.Popen(["bash", str(tree / "scripts" / "quickstart")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**clean, **env})


def test_a_failed_install_stops_quickstart_instead_of_falling_back(tmp_path):
    """Any failure of the compat install (two quickstarts racing in one .venv, no network) made
    quickstart install again in setuptools' strict mode, silently: the mode under which a folder
    named rig beside a user's script shadows rig (tests/integration/test_supervision.py)."""
    tree = _copy(tmp_path, "ERROR: Could not install packages due to an OSError: [Errno 2] No such file", 1)
    proc = _run(tree)
    out, err = proc.communicate(timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert proc.returncode == 1, (out, err)
    assert len(calls) == 1 and "editable_mode=compat" in calls[0], calls  # no fallback, no rig
    assert "OSError" in err
    assert err.strip().splitlines()[-1].startswith("scripts/quickstart: installing rig into .venv failed")


def test_falls_back_only_where_setuptools_has_no_compat_mode(tmp_path):
    tree = _copy(tmp_path, "error: Invalid editable mode: 'compat'. Try: 'strict'.", 1)
    proc = _run(tree)
    out, err = proc.communicate(timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].endswith("-m pip install -q --config-settings editable_mode=compat -e ."), calls
    assert calls[1].endswith("-m pip install -q -e ."), calls
    assert calls[2] == "rig status", calls
    assert "no compat editable mode" in err


def test_a_second_quickstart_waits_for_the_first(tmp_path):
    """Two at once ran two pip installs into one .venv (both failed) and two `rig up`s."""
    if shutil.which("flock") is None:
        pytest.skip("no flock here")
    tree = _copy(tmp_path, "", 0)
    first = _run(tree, STUB_PIP_SECONDS="3")
    time.sleep(1)
    second = _run(tree)
    _, err2 = second.communicate(timeout=60)
    first.communicate(timeout=60)
    assert "another scripts/quickstart, or scripts/test installing, runs in this folder; waiting" in err2
    calls = (tmp_path / "calls").read_text().splitlines()
    # the installs never overlap: the first's pip and rig status, then the second's
    assert calls == [calls[0], "rig status", "rig up --daemon"] * 2, calls


def test_ctrl_c_during_the_install_stops_quickstart(tmp_path):
    """pip catches SIGINT and may end with status 0: bash then went on, and a quickstart
    interrupted during its install brought rig up anyway."""
    tree = _copy(tmp_path, "", 0)
    stub = tree / ".venv" / "bin" / "python"
    stub.write_text(stub.read_text().replace('sleep "${STUB_PIP_SECONDS:-0}"',
                                             'trap "exit 0" INT; touch ' + str(tmp_path / "began") + '; sleep 5 & wait'))
    # As from a terminal: Ctrl-C not ignored (a CI runner started in the background passes it on
    # ignored, and bash cannot trap a signal ignored on entry).
    proc = subprocess.Popen(["bash", str(tree / "scripts" / "quickstart")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            env={k: v for k, v in os.environ.items() if not k.startswith("RIG_")})
    deadline = time.monotonic() + 30
    while not (tmp_path / "began").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, 2)  # Ctrl-C: the terminal signals the whole foreground process group
    _, err = proc.communicate(timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert proc.returncode == 130, err
    assert not [c for c in calls if c.startswith("rig ")], calls
    assert "interrupted" in err


def _finetune_command() -> str:
    """The shell text of quickstart's 'finetune' demo job, as rig-submit receives it."""
    text = (ROOT / "scripts" / "quickstart").read_text()
    after = text[text.index("--name finetune"):]
    start = after.index("sh -c '") + len("sh -c '")
    return after[start:after.index("')", start)]


def test_the_finetune_demo_job_writes_where_another_users_run_cannot_block_it(tmp_path):
    """A second user's quickstart on one machine: the job wrote a fixed name in the shared /tmp
    that the first user's run had left (sticky /tmp: Permission denied), and FAILED 3 attempts.
    A folder by that name stands for the other user's file (root is refused by it too)."""
    (tmp_path / "rig-quickstart-model.txt").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    saved = []
    for _ in range(2):  # and two runs of one user do not collide either
        done = subprocess.run(["sh", "-c", _finetune_command().replace("sleep 1", "true")], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        saved.append(Path(done.stdout.splitlines()[-1].removeprefix("saved ")))
    assert saved[0] != saved[1] and all(p.read_text() == "saved\n" and p.parent.parent == tmp_path for p in saved)


def test_an_unwritable_tmpdir_is_said_not_blamed_on_pip(tmp_path):
    """TMPDIR left in the shell naming a folder that is gone (or not the user's): mktemp failed
    and quickstart said `installing rig into .venv failed (pip's lines above)` with no pip line."""
    tree = _copy(tmp_path, "", 0)
    proc = _run(tree, TMPDIR=str(tmp_path / "gone"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.strip().splitlines() == [
        f"scripts/quickstart: cannot create a temporary file in {tmp_path / 'gone'} (TMPDIR); point TMPDIR at a "
        "folder you can write to, or unset it, and run scripts/quickstart again"]
    assert not (tmp_path / "calls").exists() or not (tmp_path / "calls").read_text().strip()


def test_started_by_a_relative_path_from_another_folder(tmp_path):
    """`rig/scripts/quickstart` typed in the clone's parent: after its cd into the clone, the lock
    opened "$0", a path relative to the folder it had left: exit 1, "No such file or directory"."""
    tree = _copy(tmp_path, "", 0)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    proc = subprocess.run(["bash", "clone/scripts/quickstart"], cwd=tmp_path, capture_output=True, text=True,
                          env=clean, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "No such file" not in proc.stderr, proc.stderr
    assert calls[1:] == ["rig status", "rig up --daemon"], calls  # installed, then on to rig (the stub's 99)
    assert tree.exists()


def test_scripts_test_help_by_a_relative_path_from_another_folder(tmp_path):
    """`rig/scripts/test --help` from the clone's parent: it read "$0" after its cd (sed: can't
    read rig/scripts/test, exit 2)."""
    (tmp_path / "clone" / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "test", tmp_path / "clone" / "scripts" / "test")
    done = subprocess.run(["bash", "clone/scripts/test", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Run rig's whole test suite") and not done.stderr
    assert not (tmp_path / "clone" / ".venv").exists()  # nothing installed


@pytest.mark.parametrize("script", ["quickstart", "test"])
def test_run_with_sh_it_runs_under_bash(tmp_path, script):
    """`sh scripts/quickstart` (Debian's sh is dash) stopped at once: `set: Illegal option -o
    pipefail`, exit 2."""
    sh = shutil.which("dash") or shutil.which("sh")
    tree = _copy(tmp_path, "", 0)
    shutil.copy2(ROOT / "scripts" / "test", tree / "scripts" / "test")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    args = ["--help"] if script == "test" else []
    done = subprocess.run([sh, f"clone/scripts/{script}", *args], cwd=tmp_path, capture_output=True, text=True,
                          env=clean, timeout=60)
    assert "pipefail" not in done.stderr, done.stderr
    if script == "test":
        assert done.returncode == 0 and done.stdout.startswith("Run rig's whole test suite"), done.stderr
    else:  # installed, then on to rig (the stub ends it with 99)
        assert (tmp_path / "calls").read_text().splitlines()[1:] == ["rig status", "rig up --daemon"]


def test_a_venv_left_without_pip_is_made_again(tmp_path):
    """Debian's python3 without python3-venv: `python3 -m venv .venv` fails on ensurepip and leaves
    .venv/bin/python without pip. Once python3-venv was installed, as Debian's message says,
    quickstart skipped the venv (its python existed) and failed "No module named pip" each run."""
    tree = _copy(tmp_path, "", 0)
    calls = tmp_path / "calls"
    has_pip = tmp_path / "has-pip"
    stub = tree / ".venv" / "bin" / "python"
    stub.write_text(stub.read_text().replace('|| exit 0  #', f'|| exec test -e {has_pip}  #'))
    host_bin = tmp_path / "host-bin"
    host_bin.mkdir()
    (host_bin / "python3").write_text(f"#!/bin/bash\necho \"python3 $*\" >> {calls}\ntouch {has_pip}\n")
    (host_bin / "python3").chmod(stat.S_IRWXU)
    proc = _run(tree, PATH=f"{host_bin}:{os.environ['PATH']}")
    _, err = proc.communicate(timeout=60)
    lines = calls.read_text().splitlines()
    assert lines[0] == "python3 -m venv .venv", lines
    assert "editable_mode=compat" in lines[1] and lines[2:] == ["rig status", "rig up --daemon"], (lines, err)


def test_a_rig_up_from_another_installation_is_named():
    """quickstart in a second clone (or after a git pull with an older rig left up) found rig up
    and ran its demo there, on other code than it had just installed, saying nothing."""
    jobs = load_script("quickstart_jobs.py")
    status = {"nodes": [{"name": "gone", "state": "stopped", "host": "h", "pid": 1},
                        {"name": "other-host", "state": "up", "host": "elsewhere", "pid": 2},
                        {"name": "n", "state": "up", "host": "h", "pid": 3}]}
    programs = {1: "/x/.venv/bin/python", 2: "/x/.venv/bin/python", 3: "/a/rig/.venv/bin/python"}
    note = jobs.served_elsewhere(status, "/b/rig/.venv", "h", programs.get)
    assert note.startswith("note: rig is already up on node n (pid 3), started from /a/rig/.venv/bin/python, "
                           "not from this clone's .venv") and "`rig down`" in note
    assert jobs.served_elsewhere(status, "/a/rig/.venv", "h", programs.get) == ""  # its own
    assert jobs.served_elsewhere(status, "/a/rig/.ven", "h", programs.get) != ""  # a prefix is not the folder


def test_scripts_test_installs_after_a_running_quickstart(tmp_path):
    """The README's two commands at once in a fresh clone: scripts/test upgraded pip in .venv
    while quickstart installed into it ("No module named 'pip._vendor.rich'", exit 1). scripts/test
    now waits for quickstart's lock before it installs."""
    if shutil.which("flock") is None:
        pytest.skip("no flock here")
    tree = _copy(tmp_path, "", 0)
    shutil.copy2(ROOT / "scripts" / "test", tree / "scripts" / "test")
    stub = tree / ".venv" / "bin" / "python"
    # rig not importable yet (the check before scripts/test installs); its Redis check answers
    stub.write_text(stub.read_text().replace('case "$*" in', 'case "$*" in\n  "-c import rig"*) exit 1;;\n  "-")  exit 0;;'))
    first = _run(tree, STUB_PIP_SECONDS="3")
    time.sleep(1)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    second = subprocess.run(["bash", str(tree / "scripts" / "test"), "--co", "-q"], capture_output=True, text=True,
                            env={**clean, "RIG_TEST_REDIS_URL": "redis://127.0.0.1:1/0"}, timeout=60)
    first.communicate(timeout=60)
    assert "scripts/test: scripts/quickstart runs in this folder; waiting for it to finish" in second.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    # quickstart's install and rig calls come before any install of scripts/test
    assert "editable_mode=compat" in calls[0] and calls[1:3] == ["rig status", "rig up --daemon"], calls
    assert any("pip install" in c for c in calls[3:]), calls
