"""Long end-to-end tests that mostly wait run in a second pytest process beside the suite.

A test marked ``@pytest.mark.background`` (or a module with it in ``pytestmark``) brings up whole
nodes, private Redis servers or real Unix users: tens of seconds each, nearly all of it waiting
for processes to start and stop. Run one after another with the rest, they made the suite
longer than CI's 15 minutes on 2 cores while a core idled. So when the session has other tests
too, these are taken out of it as soon as it has collected, run in one child ``pytest`` started
at once (in this rootdir, with this interpreter), and each is replaced, near the end of the
session, by a stand-in item of the same node id that waits for the child's result and reports
it: passed, skipped with its reason, or failed with the child's own failure text.

``RIG_TEST_BACKGROUND=0`` runs them in the session itself, as any other test.
``RIG_TEST_BACKGROUND_TIMEOUT`` (seconds, default 1500) bounds the child: past it the child is
killed and every test still without a result fails, naming the child's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

MARK = "background"
#: Set in the child: the file its results go to, one JSON object per test phase.
RESULTS_ENV = "RIG_TEST_BACKGROUND_RESULTS"


def enabled() -> bool:
    return os.environ.get("RIG_TEST_BACKGROUND", "1") != "0" and RESULTS_ENV not in os.environ


def timeout_s() -> float:
    return float(os.environ.get("RIG_TEST_BACKGROUND_TIMEOUT", "1500"))


@dataclass(frozen=True)
class Outcome:
    """One test's result in the child: ``outcome`` is passed, skipped or failed; ``text`` the
    skip reason or the failure's report (every failed phase's, in order)."""

    outcome: str
    text: str


def record(report: pytest.TestReport) -> None:
    """In the child (pytest_runtest_logreport): append one phase's result to the results file."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    text = ""
    if report.skipped:
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    elif report.failed:
        text = report.longreprtext
    line = json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                       "text": text, "duration": report.duration})
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")  # one write per line: the parent never reads half a line it uses


def outcomes(lines: list[dict]) -> dict[str, Outcome]:
    """Each test's outcome once its teardown has been reported (every test's last phase)."""
    phases: dict[str, list[dict]] = {}
    done: dict[str, Outcome] = {}
    for line in lines:
        phases.setdefault(line["nodeid"], []).append(line)
        if line["when"] != "teardown":
            continue
        seen = phases[line["nodeid"]]
        failed = [p for p in seen if p["outcome"] == "failed"]
        skipped = [p for p in seen if p["outcome"] == "skipped"]
        if failed:
            done[line["nodeid"]] = Outcome("failed", "\n\n".join(
                f"(background, {p['when']})\n{p['text']}" for p in failed))
        elif skipped:
            done[line["nodeid"]] = Outcome("skipped", skipped[0]["text"])
        else:
            done[line["nodeid"]] = Outcome("passed", "")
    return done


class Child:
    """The child pytest running ``nodeids`` from ``rootdir``; :meth:`outcome` waits for one."""

    def __init__(self, nodeids: list[str], rootdir: Path) -> None:
        self.nodeids = list(nodeids)
        self.folder = Path(tempfile.mkdtemp(prefix="rig-test-background-"))
        self.results = self.folder / "results.jsonl"
        self.results.touch()
        self.log = self.folder / "child.log"
        env = {**os.environ, RESULTS_ENV: str(self.results)}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                 *nodeids], cwd=rootdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        self.deadline = time.monotonic() + timeout_s()
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Outcome]:
        text = self.results.read_text(encoding="utf-8")
        return outcomes([json.loads(line) for line in text.splitlines() if line.endswith("}")])

    def outcome(self, nodeid: str) -> Outcome:
        with self._lock:
            while True:
                found = self._read().get(nodeid)
                if found is not None:
                    return found
                if self.proc.poll() is not None:
                    found = self._read().get(nodeid)  # written just before it ended
                    if found is not None:
                        return found
                    return Outcome("failed", f"the background pytest ended (exit {self.proc.returncode}) "
                                             f"without a result for this test; its output: {self.log}\n"
                                             + self._tail())
                if time.monotonic() > self.deadline:
                    self.proc.kill()
                    self.proc.wait()
                    return Outcome("failed", f"the background pytest ran past {timeout_s():.0f} s "
                                             f"(RIG_TEST_BACKGROUND_TIMEOUT) and was killed; its output: "
                                             f"{self.log}\n" + self._tail())
                time.sleep(0.2)  # polling a file another process appends to

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the child: one that gave every result is let finish its session (a few
        seconds at most), else it is killed (an interrupted or -x session). Its folder is
        removed when every test passed or was skipped (a failure's text points at its log)."""
        try:
            found = self._read()
        except (OSError, ValueError):
            found = {}
        complete = set(self.nodeids) <= set(found)
        if self.proc.poll() is None and complete:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if complete and all(o.outcome != "failed" for o in found.values()):
            shutil.rmtree(self.folder, ignore_errors=True)


class BackgroundFailure(Exception):
    """A test failed in the child; the message is the child's own report."""


class BackgroundResult(pytest.Item):
    """The stand-in for one test run by the child: same node id, keywords and markers."""

    def __init__(self, *, child: Child, original: pytest.Item, **kwargs) -> None:
        super().__init__(**kwargs)
        self.child = child
        self.original = original
        self.own_markers = list(original.own_markers)
        self.keywords.update(original.keywords)

    def runtest(self) -> None:
        result = self.child.outcome(self.nodeid)
        if result.outcome == "skipped":
            pytest.skip(result.text)
        if result.outcome == "failed":
            raise BackgroundFailure(result.text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, BackgroundFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.original.reportinfo()


def move(config: pytest.Config, items: list[pytest.Item]) -> Child | None:
    """Take the background-marked items out of ``items`` (in place), start the child for them
    and put a stand-in for each at the end. Nothing moves when the session has only those
    (running them here is as fast), when collecting only, or when disabled."""
    if not enabled() or config.option.collectonly:
        return None
    chosen = [item for item in items if item.get_closest_marker(MARK) is not None]
    if not chosen or len(chosen) == len(items):
        return None
    child = Child([item.nodeid for item in chosen], config.rootpath)
    config.add_cleanup(child.stop)  # an interrupted or -x session leaves no child behind
    stand_ins = [BackgroundResult.from_parent(item.parent, name=item.name, child=child, original=item)
                 for item in chosen]
    kept = [item for item in items if item.get_closest_marker(MARK) is None]
    items[:] = kept + stand_ins
    return child
