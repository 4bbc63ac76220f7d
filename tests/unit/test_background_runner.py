"""tests/background.py: the background-marked tests run in a child pytest, and the parent
reports each as the child found it (passed, skipped with its reason, failed with its text)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.background import outcomes

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest
from tests import background

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    background.move(config, items)

def pytest_runtest_logreport(report):
    background.record(report)
'''

TESTS = '''
import os
import pytest

def test_here():
    assert "RIG_TEST_BACKGROUND_RESULTS" not in os.environ

@pytest.mark.background
def test_passes_in_the_child():
    assert "RIG_TEST_BACKGROUND_RESULTS" in os.environ

@pytest.mark.background
def test_fails_in_the_child():
    assert 1 == 2, "the child's own words"

@pytest.mark.background
def test_skipped_in_the_child():
    pytest.skip("no such thing here")

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

@pytest.mark.background
def test_setup_error_in_the_child(broken):
    pass
'''


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    background: in the child\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RIG_TEST_BACKGROUND", "PYTEST_"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          cwd=tmp_path, env={**clean, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=120)


def test_each_background_test_is_reported_as_the_child_found_it(tmp_path):
    run = _run(tmp_path)
    out = run.stdout
    assert run.returncode == 1, out
    assert "PASSED test_sample.py::test_here" in out
    assert "PASSED test_sample.py::test_passes_in_the_child" in out
    assert "FAILED test_sample.py::test_fails_in_the_child" in out and "the child's own words" in out
    assert "SKIPPED" in out and "no such thing here" in out
    assert "FAILED test_sample.py::test_setup_error_in_the_child" in out and "setup broke" in out
    assert "2 failed, 2 passed, 1 skipped" in out


def test_disabled_or_alone_they_run_in_the_session_itself(tmp_path):
    off = _run(tmp_path, RIG_TEST_BACKGROUND="0")
    # In the session itself the child's variable is unset: the "passes in the child" test fails.
    assert "FAILED test_sample.py::test_passes_in_the_child" in off.stdout, off.stdout
    alone = _run(tmp_path, "test_sample.py::test_passes_in_the_child")
    assert "FAILED test_sample.py::test_passes_in_the_child" in alone.stdout, alone.stdout


def test_a_child_that_ends_without_results_fails_each_test_it_owed(tmp_path):
    run = _run(tmp_path, RIG_TEST_BACKGROUND_TIMEOUT="0")
    assert "ran past 0 s" in run.stdout and "was killed" in run.stdout, run.stdout


def test_outcomes_wait_for_the_teardown_and_keep_every_failed_phase():
    lines = [{"nodeid": "a", "when": "setup", "outcome": "passed", "text": ""},
             {"nodeid": "a", "when": "call", "outcome": "failed", "text": "boom"}]
    assert outcomes(lines) == {}
    lines.append({"nodeid": "a", "when": "teardown", "outcome": "failed", "text": "leak"})
    (done,) = outcomes(lines).values()
    assert done.outcome == "failed" and "boom" in done.text and "leak" in done.text


def test_the_childs_folder_is_removed_after_a_passing_run_and_kept_after_a_failure(tmp_path):
    """Every session left a /tmp/rig-test-background-* folder behind."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    passing = _run(tmp_path, "-k", "test_here or passes_in_the_child", TMPDIR=str(temp))
    assert "2 passed" in passing.stdout, passing.stdout
    assert not list(temp.glob("rig-test-background-*"))
    failing = _run(tmp_path, TMPDIR=str(temp))
    assert failing.returncode == 1
    (kept,) = temp.glob("rig-test-background-*")
    assert (kept / "child.log").exists()  # the failure's text points at it
