"""Fault scenarios about what a job gets and leaves on a real node (issue 10.4 and 10.11).

- **operator's environment**: ``rig up`` started from a shell holding ``ADMIN_SECRET``; a user
  submits with ``LD_LIBRARY_PATH``/``HF_HOME`` set and ``--env MY_TOKEN``. The job must see the
  user's variables and never the operator's; ``--env CUDA_VISIBLE_DEVICES=3`` is refused.
- **a job floods its log**: 300 MB written as fast as a pipe takes it against a 1 MiB
  ``log_max_bytes``; the log file, sampled while it grows, never passes the cap + 4 KiB, the
  job ends SUCCEEDED with its last line kept, and its log keeper has let go of the log.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rig.errors import InvalidInput
from rig.logs import job_folder
from rig.models import JobState
from rig.testing.faults import Scenario, ScenarioResult
from workers.card_runner import read_pid_file
from workers.process_tree import holds_file, is_alive


def operator_environment(workdir: Path) -> ScenarioResult:
    saved = {k: os.environ.get(k) for k in ("ADMIN_SECRET", "LD_LIBRARY_PATH", "HF_HOME", "MY_TOKEN")}
    os.environ["ADMIN_SECRET"] = "only-the-operator-knows"  # in the shell that starts rig
    sc = Scenario(workdir, "operator's environment vs the job's", "ADMIN_SECRET in rig up's shell",
                  fake_gpus="1x80G")
    try:
        sc.node.up()
        # The user's shell (the same process here: the submitter's variables are read at submit).
        del os.environ["ADMIN_SECRET"]
        os.environ.update(LD_LIBRARY_PATH="/opt/cuda/lib64", HF_HOME="/data/hf", MY_TOKEN="user-token")
        out = workdir / "env.txt"
        jid = sc.submit(body=f"env > {out}", gpu_memory="1G", env={"MY_TOKEN": None})
        try:
            sc.node.client.submit("true", gpu_memory="1G", env={"CUDA_VISIBLE_DEVICES": "3"})
            sc.result.problems.append("--env CUDA_VISIBLE_DEVICES=3 was accepted")
        except InvalidInput as exc:
            sc.result.notes.append(f"--env CUDA_VISIBLE_DEVICES=3 refused: {exc}")
        sc.go.touch()
        finals = sc.finish(timeout=60)
        seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line) if out.exists() else {}
        if "ADMIN_SECRET" in seen:
            sc.result.problems.append("the operator's ADMIN_SECRET reached the job")
        wanted = {"LD_LIBRARY_PATH": "/opt/cuda/lib64", "HF_HOME": "/data/hf", "MY_TOKEN": "user-token",
                  "CUDA_VISIBLE_DEVICES": "0"}
        missing = {k: seen.get(k) for k, v in wanted.items() if seen.get(k) != v}
        if missing:
            sc.result.problems.append(f"job environment lacks the submitter's variables: {missing}")
        if finals.get(jid) is None or finals[jid].state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"job {jid} did not succeed")
        return sc.result
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sc.close()


class LogWatch:
    """While in its ``with`` block, samples an attempt's log as fast as it can: the largest size
    seen (bytes) and the log keeper named in the attempt's pid file ((pid, start) or None)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.biggest = 0
        self.keeper: tuple[int, int] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            try:
                self.biggest = max(self.biggest, self.log.stat().st_size)
            except FileNotFoundError:
                pass
            noted = read_pid_file(self.log.with_suffix(".pid"))
            if noted and noted[3] and self.keeper is None:
                self.keeper = (noted[3], noted[4] or 0)

    def __enter__(self) -> LogWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()


def log_flood(workdir: Path, *, cap: int = 1 << 20, nbytes: int = 300_000_000) -> ScenarioResult:
    sc = Scenario(workdir, "a job floods its log at full speed", f"{nbytes // 10**6} MB against a "
                  f"{cap >> 20} MiB cap", fake_gpus="1x80G", log_max_bytes=cap)
    try:
        sc.node.up()
        jid = sc.submit(body=f"yes 'a line of output' | head -c {nbytes}; echo; echo last-line", gpu_memory="1G")
        job = sc.node.client.get(jid)
        log = job_folder(sc.node.settings.job_log_dir, jid, job.instance) / "attempt-1.log"
        with LogWatch(log) as watch:
            finals = sc.finish(timeout=120)
        sc.result.notes.append(f"largest log size seen while it ran: {watch.biggest} bytes (cap {cap})")
        if watch.biggest > cap + 4096:
            sc.result.problems.append(f"log reached {watch.biggest} bytes, cap {cap}")
        text = log.read_bytes() if log.exists() else b""
        if not text.endswith(b"last-line\n"):
            sc.result.problems.append("the log lost its last line")
        if finals.get(jid) is None or finals[jid].state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"job {jid} did not succeed")
        if watch.keeper is None:
            sc.result.problems.append("the job had no log keeper")
        elif is_alive(*watch.keeper) and holds_file(watch.keeper[0], log):
            # The card's keeper serves the card's next jobs too (rig.logkeeper); once this job
            # ended it must have let go of this job's log.
            sc.result.orphans += 1
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("operator-environment", operator_environment),
    ("log-flood", log_flood),
]
