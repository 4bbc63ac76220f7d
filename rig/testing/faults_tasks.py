"""Fault scenario: a user's first-week slips with @rig.task and with jobs that cannot work, on a
real node (real Redis, real Celery workers, real processes).

- a script that submits from its top level without ``if __name__ == "__main__":`` is refused at
  ``.delay()`` with one line, and nothing is submitted;
- the same script submitting from a thread it starts at its top level: refused at ``.delay()``
  too (the check follows the thread to the frame that started it), nothing submitted;
- a script run from a folder that holds a ``rig`` folder (a clone's parent) and a ``rig`` package
  beside the script: the call runs and returns its value;
- a lambda is refused at ``.delay()``;
- a command that does not exist and a working folder that is gone, each with 3 retries: FAILED
  after one attempt, in the error queue, "not retried".

Counts: lost (a job not ended), duplicated (a job with more attempts than one where a retry
cannot help), leaked, orphans; problems: anything a user would be misled by.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rig.models import TERMINAL_STATES, JobState
from rig.testing.faults import Scenario, ScenarioResult

#: A script with one @rig.task; {submit} is how it submits (top level, thread, or guarded).
SCRIPT = '''
import sys, threading
import rig

@rig.task(gpu_memory="1G")
def train(lr):
    return lr * 2

def submit():
    try:
        job = train.delay(0.5)
    except rig.errors.InvalidInput as exc:
        print("REFUSED:", exc, flush=True)
        return
    print("JOB", job.id, flush=True)
    if "--wait" in sys.argv:
        print("RESULT", job.get(timeout=120), flush=True)

{submit}
'''
TOP_LEVEL = "submit()"
FROM_A_THREAD = "t = threading.Thread(target=submit)\nt.start()\nt.join()"
GUARDED = 'if __name__ == "__main__":\n    submit()'


def task_slips(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "task_slips", "@rig.task without a guard (top level, thread), a rig folder "
                  "in the way, a lambda; a command not found and a folder gone with retries",
                  fake_gpus="1x80G")
    r = sc.result
    try:
        sc.node.up()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
               "RIG_HOME": str(sc.node.settings.home), "RIG_REDIS_URL": sc.node.settings.redis_url,
               "RIG_KEY_PREFIX": sc.node.settings.key_prefix}
        before = _last_id(sc)

        # 1. Top level, no guard: refused before anything is submitted.
        out = _run(workdir / "top", SCRIPT.format(submit=TOP_LEVEL), env)
        if "REFUSED:" not in out or 'if __name__ == "__main__":' not in out or _last_id(sc) != before:
            r.problems.append(f"unguarded top level not refused at .delay(): {out.strip()[-200:]}")
        else:
            r.notes.append("top level: " + out.split("REFUSED: ", 1)[1].strip().splitlines()[0][:120])

        # 2. From a thread the top level starts: refused as well, nothing submitted (the job
        # would have held a card only to fail as bad_call, pyapi 39bf20a).
        out = _run(workdir / "thread", SCRIPT.format(submit=FROM_A_THREAD), env)
        if "REFUSED:" not in out or 'if __name__ == "__main__":' not in out or _last_id(sc) != before:
            r.problems.append(f"a thread started at the unguarded top level not refused at .delay(): "
                              f"{out.strip()[-200:]}")
        else:
            r.notes.append("thread: " + out.split("REFUSED: ", 1)[1].strip().splitlines()[0][:120])

        # 3. A rig folder in the working folder and a rig package beside the script.
        folder = workdir / "clone-parent"
        (folder / "rig" / "config").mkdir(parents=True)  # the clone: a namespace-like `rig`
        (folder / "rig" / "call.py").write_text("raise SystemExit('the wrong rig.call ran')\n")
        out = _run(folder, SCRIPT.format(submit=GUARDED), env, args=["--wait"], hostile_beside=True)
        hostile = _job_id(out)
        if "RESULT 1.0" not in out:
            r.problems.append(f"call beside a rig folder did not return 1.0: {out.strip()[-300:]}")

        # 4. A lambda.
        out = _run(workdir / "lambda", "import rig\nt = rig.task(lambda: 1)\ntry:\n    t.delay()\n"
                   "except rig.errors.InvalidInput as exc:\n    print('REFUSED:', exc)\n", env)
        if "REFUSED: @rig.task cannot queue a lambda" not in out:
            r.problems.append(f"lambda not refused: {out.strip()[-200:]}")

        # 5. Failures a retry cannot help, with retries left.
        missing = sc.node.client.submit(["no-such-command-rig-test"], gpu_memory="1G", retries=3).id
        # The folder disappears after the submission checked it, before the job starts: it
        # waits behind a job that holds the card until the folder is gone.
        blocker = sc.submit(gpu_memory="70G")
        sc.wait_running([blocker])
        gone = workdir / "gone"
        gone.mkdir()
        gone_job = sc.node.client.submit(["true"], gpu_memory="10G", retries=3, workdir=str(gone))
        gone.rmdir()
        sc.go.touch()

        ids = [i for i in (hostile, missing, gone_job.id) if i is not None]
        sc.job_ids.extend(ids)
        ids.append(blocker)
        finals = {}
        for jid in ids:
            try:
                finals[jid] = sc.node.client.wait(jid, timeout=120)
            except TimeoutError:
                pass
        sc.count(finals)
        for jid, want in ((missing, "command_not_found"),
                          (gone_job.id, {"start_failed", "command_not_found"})):
            job = finals.get(jid) if jid is not None else None
            if job is None:
                continue
            wanted = want if isinstance(want, set) else {want}
            if job.state is not JobState.FAILED or job.failure not in wanted:
                r.problems.append(f"job {jid}: {job.state.value}/{job.failure}, want FAILED/{'|'.join(sorted(wanted))}")
            if job.attempt != 1:
                r.duplicated += 1
                r.problems.append(f"job {jid} ran {job.attempt} attempts; a retry cannot help it")
            if "not retried" not in (job.reason or ""):
                r.problems.append(f"job {jid}: reason does not say it is not retried: {job.reason}")
            r.notes.append(f"job {jid}: {(job.reason or '')[:150]}")
        nested = [j for j in sc.node.client.store.list(limit=50) if j.id not in ids and j.id > before]
        if nested:
            r.problems.append(f"nested job(s) submitted from inside a job: {[j.id for j in nested]}")
        r.lost = sum(1 for jid in ids if jid not in finals or finals[jid].state not in TERMINAL_STATES)
        return r
    finally:
        sc.close()


def _run(folder: Path, script: str, env: dict[str, str], *, args: list[str] | None = None,
         hostile_beside: bool = False) -> str:
    """Run ``script`` (written to ``folder/code/job.py``) from ``folder``: stdout and stderr."""
    code = folder / "code"
    code.mkdir(parents=True, exist_ok=True)
    path = code / "job.py"
    path.write_text(textwrap.dedent(script))
    if hostile_beside:  # a regular `rig` package beside the script would shadow rig for the job
        (code / "rig").mkdir(exist_ok=True)
        (code / "rig" / "__init__.py").write_text("raise SystemExit('the rig beside the script ran')\n")
        # ... but the submitting interpreter must not import it either: run the script by -P.
        argv = [sys.executable, "-P", str(path), *(args or [])]
    else:
        argv = [sys.executable, str(path), *(args or [])]
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=180)
    return done.stdout + done.stderr


def _job_id(out: str) -> int | None:
    for line in out.splitlines():
        if line.startswith("JOB "):
            return int(line.split()[1])
    return None


def _last_id(sc: Scenario) -> int:
    return int(sc.node.redis.get(sc.node.keys.next_job_id) or 0)


SCENARIOS = [("task_slips", task_slips)]
