"""Fault scenarios about what a job gets and leaves on a real node (issue 10.4 and 10.11).

- **operator's environment**: ``rig up`` started from a shell holding ``ADMIN_SECRET``; a user
  submits with ``LD_LIBRARY_PATH``/``HF_HOME`` set and ``--env MY_TOKEN``. The job must see the
  user's variables and never the operator's; ``--env CUDA_VISIBLE_DEVICES=3`` is refused.
- **a job floods its log**: 300 MB written as fast as a pipe takes it against a 1 MiB
  ``log_max_bytes``; the log file, sampled while it grows, never passes the cap + 4 KiB, the
  job ends SUCCEEDED with its last line kept, and its log keeper has let go of the log.
- **a card's log keeper SIGKILLed**: two jobs on one card each write a numbered line every few
  ms; the card's keeper is SIGKILLed while both run. Both must end SUCCEEDED on attempt 1, each
  log holding lines from before and after with one line saying the keeper was replaced, and at
  most one read of output (rig.logkeeper.read_size, and never more than the pipe held)
  missing, in one gap.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

from rig.errors import InvalidInput
from rig.logkeeper import read_size
from rig.logs import job_folder
from rig.models import JobState
from rig.testing.faults import Scenario, ScenarioResult, _wait
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


#: A numbered line ("line <n>") every 5 ms or so, until the go-file; then the last line.
COUNTER = 'i=0; while [ ! -f "$GO" ]; do echo "line $i"; i=$((i+1)); sleep 0.005; done; echo last-line'
#: rig.logkeeper.restart_line, as it reads in a log.
RESTARTED = re.compile(rb"\[rig: the log keeper \(pid (\d+)\) died at [0-9:]+; a new one took this log over")
#: A job's output pipe's capacity (bytes): Linux's default, which rig never changes.
PIPE_BYTES = 64 << 10
#: Numbered lines each log must hold before the kill, and after the new keeper's line.
LINES_EACH_SIDE = 200


def counters(text: bytes) -> list[int]:
    """The numbers of the "line <n>" lines of a log, in the order they are in it."""
    return [int(n) for n in re.findall(rb"^line (\d+)$", text, re.M)]


def missing_counters(numbers: list[int]) -> tuple[list[int], int]:
    """(the counters missing between the first and the last, the number of gaps they form)."""
    seen = set(numbers)
    missing = [n for n in range(numbers[0], numbers[-1] + 1) if n not in seen] if numbers else []
    gaps = sum(1 for i, n in enumerate(missing) if i == 0 or missing[i - 1] != n - 1)
    return missing, gaps


def keeper_sigkill(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "a card's log keeper SIGKILLed under two jobs", "SIGKILL of card0's log keeper",
                  fake_gpus="1x80G")
    try:
        sc.node.up()
        ids = [sc.submit(body=COUNTER, gpu_memory="10G") for _ in range(2)]
        sc.wait_running(ids)
        store = sc.node.client.store
        logs = {j.id: job_folder(sc.node.settings.job_log_dir, j.id, j.instance) / "attempt-1.log"
                for j in store.get_many(ids)}
        cards = {tuple(j.cards) for j in store.get_many(ids)}
        if cards != {(0,)}:
            sc.result.problems.append(f"the two jobs are not both on card 0: {cards}")

        def keepers() -> set[tuple[int, int]]:
            noted = [read_pid_file(log.with_suffix(".pid")) for log in logs.values()]
            return {(n[3], n[4] or 0) for n in noted if n and n[3]}

        def lines(log: Path, after_restart: bool = False) -> int:
            """Numbered lines in ``log`` (after the new keeper's line, with ``after_restart``)."""
            text = log.read_bytes() if log.exists() else b""
            if after_restart:
                found = RESTARTED.search(text)
                text = text[found.end():] if found else b""
            return len(counters(text))

        _wait(lambda: len(keepers()) == 1 and all(lines(log) >= LINES_EACH_SIDE for log in logs.values()),
              60, "both jobs to write through one keeper")
        ((dead, dead_start),) = keepers()  # the card's keeper copies both logs
        if not is_alive(dead, dead_start):
            sc.result.problems.append(f"the card's keeper {dead} was gone before the kill")
        os.kill(dead, signal.SIGKILL)
        try:
            _wait(lambda: all(lines(log, after_restart=True) >= LINES_EACH_SIDE for log in logs.values()), 60,
                  "both logs to go on under a new keeper")
        except TimeoutError as exc:
            sc.result.problems.append(str(exc))  # and the jobs are still counted as they end
        replaced_by = keepers()
        finals = sc.finish(timeout=60)
        if is_alive(dead, dead_start):
            sc.result.problems.append(f"the SIGKILLed keeper {dead} is still alive")
        if not replaced_by or any(pid == dead for pid, _ in replaced_by):
            sc.result.problems.append(f"the pid files do not name a new keeper (still {dead})")
        # What the dead keeper can have read and not written: one read, never more than the
        # pipe held (Linux's default 64 KiB; rig never resizes a job's pipe).
        limit = min(read_size(sc.node.settings.log_max_bytes), PIPE_BYTES)
        for jid, log in logs.items():
            job = finals.get(jid)
            if job is None or job.state is not JobState.SUCCEEDED or job.attempt != 1:
                sc.result.problems.append(f"job {jid} did not succeed on attempt 1: "
                                          f"{job and (job.state.value, job.attempt, job.reason)}")
            elif "log keeper restarted once" not in (job.reason or ""):
                sc.result.problems.append(f"job {jid}'s reason does not say its keeper was replaced: {job.reason!r}")
            text = log.read_bytes() if log.exists() else b""
            said = list(RESTARTED.finditer(text))
            if [int(m.group(1)) for m in said] != [dead]:
                sc.result.problems.append(f"job {jid}'s log says {len(said)} keeper restart(s), not one of {dead}")
                continue
            before, after = counters(text[:said[0].start()]), counters(text[said[0].end():])
            if not before or before[0] != 0 or not after:
                sc.result.problems.append(f"job {jid}'s log lacks lines from before or after the kill")
            if not text.endswith(b"last-line\n"):
                sc.result.problems.append(f"job {jid}'s log lost its last line")
            if before + after != sorted(set(before + after)):
                sc.result.problems.append(f"job {jid}'s log repeats lines or has them out of order")
            missing, gaps = missing_counters(before + after)
            lost = sum(len(b"line %d\n" % n) for n in missing)
            sc.result.notes.append(f"job {jid}: {len(before)} lines before the kill, {len(after)} after, "
                                   f"{len(missing)} missing ({lost} bytes, {gaps} gap(s); one read: {limit})")
            if lost > limit or gaps > 1:
                sc.result.problems.append(f"job {jid} lost {len(missing)} line(s), {lost} bytes in {gaps} "
                                          f"gap(s): more than one read ({limit} bytes)")
            for pid, start in replaced_by:
                if is_alive(pid, start) and holds_file(pid, log):
                    sc.result.orphans += 1  # the new keeper must have let go of an ended job's log
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("operator-environment", operator_environment),
    ("log-flood", log_flood),
    ("keeper-sigkill", keeper_sigkill),
]
