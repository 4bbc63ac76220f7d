"""Fault scenarios about a full disk under ``log_dir`` (issue 11.3), on a real node whose
``log_dir`` is a small tmpfs (a real ENOSPC, not a simulated one):

- **disk fills during a job**: a job writes, the disk fills, it writes on and exits 0. It must
  end SUCCEEDED (its own exit status) with a record that says its log is incomplete; the node
  must stop taking jobs with a ``cannot write logs`` reason (status, a critical alert, the
  metric), a job submitted meanwhile must wait (not start, not fail) and run once when space
  returns.
- **disk full before start**: jobs arrive on a node whose disk is already full. None may be
  reported "could not start" while it ran, none may fail; each waits, and runs exactly once
  after space is freed, with consistent attempt numbers.
- **log_dir read-only**: the same with the file system remounted read-only (EROFS), then
  read-write again.

Both need ``mount -t tmpfs`` (root, or a user namespace that allows it): without it the
scenario is skipped (``unittest.SkipTest``), saying why.
"""

from __future__ import annotations

import errno
import subprocess
import time
import unittest
from collections.abc import Callable
from pathlib import Path

from rig import logspace
from rig.alerts import evaluate
from rig.models import Job, JobState
from rig.testing.faults import Scenario, ScenarioResult, _wait

#: Size of the scenario's log file system (bytes) and the free space below which the node
#: takes no jobs.
TMPFS_BYTES = 8 << 20
MIN_FREE = 1 << 20
#: Inodes of the tmpfs of the out-of-inodes scenario (few: filling them is quick).
INODES = 400


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``path`` for the scenario's life; ``fill`` takes all
    its space (a real ENOSPC for every writer), ``free`` gives it back."""

    def __init__(self, path: Path, size: int = TMPFS_BYTES, inodes: int | None = None) -> None:
        self.path = path
        self.size = size
        self.inodes = inodes  # nr_inodes of the tmpfs (None: tmpfs' default)
        self.many = path / "many-files"
        self.filler = path / "filler"
        self.mounted = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755"
                               + (f",nr_inodes={self.inodes}" if self.inodes else ""), "tmpfs", str(self.path)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise unittest.SkipTest(f"cannot mount a small tmpfs for a real full disk "
                                    f"({done.stderr.strip() or done.returncode}); needs root")
        self.mounted = True
        return self

    def fill(self) -> None:
        """Write until ENOSPC (then the file system has no byte left)."""
        block = b"\0" * 65536
        with open(self.filler, "ab", buffering=0) as fh:
            while True:
                try:
                    fh.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(block) == 1:
                        return
                    block = block[: len(block) // 2]

    def fill_inodes(self) -> None:
        """Create empty files until ENOSPC: no inode left, while bytes stay free."""
        self.many.mkdir(exist_ok=True)
        for i in range(10 * (self.inodes or 1_000_000)):
            try:
                (self.many / str(i)).touch()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        if self.many.exists():
            for child in self.many.iterdir():
                child.unlink()

    def read_only(self, on: bool) -> None:
        """Remount read-only (every write: EROFS) or back read-write."""
        subprocess.run(["mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.path)],
                       capture_output=True, check=True)

    def __exit__(self, *_exc: object) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


def _until(sc: Scenario, predicate: Callable[[], bool], timeout: float, what: str) -> bool:
    """Wait for ``predicate``; a timeout is one of the scenario's problems, not an exception."""
    try:
        _wait(predicate, timeout, what)
        return True
    except TimeoutError:
        sc.result.problems.append(f"gave up waiting for {what}")
        return False


def _out_of_service(sc: Scenario) -> list[str]:
    """The cards' ``cannot write logs`` reasons (empty while the node takes jobs)."""
    return [c.health_reason for c in sc.node.client.ledger.cards()
            if not c.healthy and logspace.is_log_space_reason(c.health_reason)]


def _check_told(sc: Scenario) -> None:
    """While out: the reason on every card, one critical alert, the metric at 0."""
    reasons = _out_of_service(sc)
    cards = sc.node.client.ledger.cards()
    if len(reasons) != len(cards):
        sc.result.problems.append(f"only {len(reasons)} of {len(cards)} cards say the node cannot write logs")
    else:
        sc.result.notes.append(f"rig status says: {reasons[0]}")
    alerts = [a for a in evaluate(sc.node.client) if a.key.startswith("log_space:")]
    if not alerts or alerts[0].severity != "critical":
        sc.result.problems.append("no critical log_space alert while the node cannot write logs")
    from rig.metrics import _log_space_family

    values = [s.value for s in _log_space_family(cards).samples]
    if values != [0]:
        sc.result.problems.append(f"rig_node_logs_writable is {values}, not [0]")


def _check_wait_named(sc: Scenario, job_id: int) -> None:
    """A job waiting on a node that cannot write logs is told so (rig show, --json
    waiting_because and rig-submit read rig.waiting.why_waiting): the node and its cause, never
    "no healthy allowed card" alone."""
    why = sc.node.client.why_waiting(sc.node.client.get(job_id)) or ""
    if f"node {sc.node.name} takes no jobs: {logspace.REASON_PREFIX}" not in why:
        sc.result.problems.append(f"job {job_id} waits without naming the cause: {why!r}")
    else:
        sc.result.notes.append(f"rig show {job_id}: waits: {why}")


def _check_log_note(sc: Scenario, job: Job) -> None:
    """`rig log` of a cut log says so on stderr; stdout stays the job's output alone."""
    import io

    from rig.cli.logview import show_log

    out, said = io.BytesIO(), []
    show_log(lambda: job, attempt=None, follow=False, out=out, say=said.append)
    notes = [line for line in said if "log incomplete" in line]
    if len(notes) != 1 or b"log incomplete" in out.getvalue():
        sc.result.problems.append(f"rig log {job.id} of a cut log: stderr {said}")
    else:
        sc.result.notes.append(f"rig log {job.id} (stderr): {notes[0]}")


def _check_final(sc: Scenario, finals: dict[int, Job], markers: dict[int, Path]) -> None:
    """No false state: a job is SUCCEEDED with its marker, ran once, its attempt numbers agree;
    nothing went to the error queue as 'could not start'."""
    for jid, marker in markers.items():
        job = finals.get(jid)
        if job is None:
            continue  # counted as lost
        if job.state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"job {jid} ended {job.state.value}: {job.reason}")
        if not marker.exists():
            sc.result.problems.append(f"job {jid} is {job.state.value} but never ran")
        if job.failure:
            sc.result.problems.append(f"job {jid} SUCCEEDED but keeps failure class {job.failure}")
        ran = [a for a in job.attempts if a.get("started") is not False]
        if len(ran) != 1 or job.attempt != len(job.attempts):
            sc.result.problems.append(f"job {jid}: attempt {job.attempt}, history {job.attempts}")
    errors = sc.node.client.store.r.zrange(sc.node.keys.errors, 0, -1)
    if errors:
        sc.result.problems.append(f"jobs in the error queue: {errors}")


def disk_fills_during_job(workdir: Path) -> ScenarioResult:
    with SmallDisk(workdir / "logs") as disk:
        sc = Scenario(workdir, "disk under log_dir fills during a job", "tmpfs log_dir filled to ENOSPC",
                      fake_gpus="2x80G", log_dir=disk.path, log_min_free_bytes=MIN_FREE)
        try:
            sc.node.up()
            wrote = workdir / "wrote"
            markers = {}
            body = (f'head -c 100000 /dev/zero | tr "\\0" a; echo; touch {wrote}; {{gate}}; '
                    f'head -c 300000 /dev/zero | tr "\\0" b; echo; echo last-line; touch {{marker}}')
            a_marker = workdir / "started-a"
            a = sc.submit(body=body.format(gate='while [ ! -f "$GO" ]; do sleep 0.05; done', marker=a_marker),
                          gpu_memory="1G")
            markers[a] = a_marker
            _wait(wrote.exists, 60, "job a to write its first output")
            time.sleep(0.3)  # its keeper copies the first 100 kB to the log
            disk.fill()
            _until(sc, lambda: bool(_out_of_service(sc)), 30, "the node to say it cannot write logs")
            b_marker = workdir / "started-b"
            b = sc.submit(body=f"touch {b_marker}; echo b-ran", gpu_memory="1G")
            markers[b] = b_marker
            sc.go.touch()  # job a writes 300 kB more into a full disk and exits 0
            job_a = sc.node.client.wait(a, timeout=60)
            time.sleep(2.0)  # job b must keep waiting meanwhile
            job_b = sc.node.client.get(b)
            _check_told(sc)
            _check_wait_named(sc, b)
            _check_log_note(sc, job_a)
            if job_b.state is not JobState.PENDING or b_marker.exists():
                sc.result.problems.append(f"job b was {job_b.state.value} (marker: {b_marker.exists()}) "
                                          "while the node could not write logs")
            if job_a.state is JobState.SUCCEEDED and "log incomplete" not in (job_a.reason or ""):
                sc.result.problems.append(f"job a SUCCEEDED with a cut log and no note: {job_a.reason!r}")
            else:
                sc.result.notes.append(f"job a: {job_a.state.value}: {job_a.reason}")
            disk.free()
            _until(sc, lambda: not _out_of_service(sc), 30, "the node to take jobs again")
            finals = sc.finish(timeout=60)
            _check_final(sc, finals, markers)
            return sc.result
        finally:
            sc.close()


def disk_full_before_start(workdir: Path, *, read_only: bool = False, inodes: bool = False) -> ScenarioResult:
    what = "read-only" if read_only else "out of inodes" if inodes else "full"
    with SmallDisk(workdir / "logs", inodes=INODES if inodes else None) as disk:
        sc = Scenario(workdir, f"log_dir {what} before jobs start", f"tmpfs log_dir {what}",
                      fake_gpus="2x80G", log_dir=disk.path, log_min_free_bytes=0)
        try:
            sc.node.up()
            disk.read_only(True) if read_only else disk.fill_inodes() if inodes else disk.fill()
            markers = {}
            for i in range(4):  # at once: the first starts meet the full disk before the guard does
                marker = workdir / f"started-{i}"
                markers[sc.submit(body=f"touch {marker}; echo ran", gpu_memory="1G")] = marker
            _until(sc, lambda: bool(_out_of_service(sc)), 30, "the node to say it cannot write logs")
            time.sleep(2.0)
            _check_told(sc)
            if inodes and not all("no free inodes" in r for r in _out_of_service(sc)):
                sc.result.problems.append(f"inodes exhausted but the reason says: {_out_of_service(sc)}")
            for jid, marker in markers.items():
                job = sc.node.client.get(jid)
                if marker.exists() and job.state is not JobState.RUNNING:
                    sc.result.problems.append(f"job {jid} ran but is {job.state.value}: {job.reason}")
                elif not marker.exists() and job.state is not JobState.PENDING:
                    sc.result.problems.append(f"job {jid} never ran but is {job.state.value}: {job.reason}")
                elif job.reason:
                    sc.result.notes.append(f"job {jid} waits: {job.reason}")
            disk.read_only(False) if read_only else disk.free()
            _until(sc, lambda: not _out_of_service(sc), 30, "the node to take jobs again")
            finals = sc.finish(timeout=60)
            _check_final(sc, finals, markers)
            return sc.result
        finally:
            sc.close()


def log_dir_read_only(workdir: Path) -> ScenarioResult:
    return disk_full_before_start(workdir, read_only=True)


def log_dir_out_of_inodes(workdir: Path) -> ScenarioResult:
    """df shows free bytes, yet no file can be made: said as "no free inodes"."""
    return disk_full_before_start(workdir, inodes=True)


SCENARIOS = [
    ("disk-fills-during-job", disk_fills_during_job),
    ("disk-full-before-start", disk_full_before_start),
    ("log-dir-read-only", log_dir_read_only),
    ("log-dir-out-of-inodes", log_dir_out_of_inodes),
]
