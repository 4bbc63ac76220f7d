"""Fault-suite scenarios for what the command line tells people (issue 10, items 5 and 6).

Each runs a real node on fake cards against real Redis and returns a ScenarioResult row (lost,
duplicated, leaked, orphans, what the operator was told):

- ``submit_after_rig_down``: `rig down` of the only node, then a submission. The job must say
  that no node is up (not "it fits now"), then run once when the node is back.
- ``log_follow_through_retry``: `rig log -f` of a job that fails once and is retried must
  follow it through attempt 2 to its end, with a header per attempt.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rig.models import JobState
from rig.stack import settings_env
from rig.testing.faults import Scenario, ScenarioResult
from rig.waiting import why_waiting


def submit_after_rig_down(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "job submitted after rig down", "rig down of the only node, then a submit",
                  fake_gpus="2x24G")
    try:
        sc.node.up()
        sc.node.down()  # `rig down`: the node is marked stopped; no dispatcher runs anywhere
        jid = sc.submit(gpu_memory="4G")
        told = why_waiting(sc.node.client, sc.node.client.get(jid)) or ""
        sc.result.notes.append(f"told: job {jid} waits: {told}")
        if not told.startswith("no rig node is up (node testnode: stopped since"):
            sc.result.problems.append(f"wait reason after rig down: {told!r}")
        sc.node.up()  # the node comes back: the job runs, once
        sc.finish()
        return sc.result
    finally:
        sc.close()


def log_follow_through_retry(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "rig log -f of a retried job", "attempt 1 fails, attempt 2 succeeds",
                  fake_gpus="1x24G")
    try:
        sc.node.up()
        marker = workdir / "marker"
        body = (f'if [ -e "{marker}" ]; then echo second; exit 0; fi; touch "{marker}"; echo first; '
                'while [ ! -e "$GO" ]; do sleep 0.05; done; exit 3')
        jid = sc.submit(body, gpu_memory="1G", retries=1)
        sc.wait_running([jid])
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(sc.node.settings)}
        follower = subprocess.Popen([sys.executable, "-m", "rig.cli.main", "log", "-f", str(jid)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir)
        first_mark = follower.stderr.readline()  # following attempt 1 now (it waits for GO)
        finals = sc.finish()
        try:
            out, err = follower.communicate(timeout=60)
            err = first_mark + err
        except subprocess.TimeoutExpired:
            follower.kill()
            out, err = follower.communicate()
            sc.result.problems.append("rig log -f did not end with the job")
        marks = [line for line in err.splitlines() if line.startswith("---")]
        sc.result.notes.append(f"told: {' / '.join(marks)}")
        if "first" not in out or "second" not in out:
            sc.result.problems.append(f"rig log -f printed {out!r}: an attempt is missing")
        if len(marks) != 3 or finals.get(jid) is None or finals[jid].state is not JobState.SUCCEEDED:
            sc.result.problems.append(f"attempt headers {marks}, final {finals.get(jid)}")
        return sc.result
    finally:
        sc.close()


SCENARIOS = {
    "submit-after-rig-down": submit_after_rig_down,
    "log-follow-through-retry": log_follow_through_retry,
}
