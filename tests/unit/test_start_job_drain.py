"""rig.start_job, kept registered only to drain a start an older rig queued on a card's Celery
queue: it moves the start onto the card's start list (workers.start_list), never runs the job
itself. In a subprocess: importing workers.app reads the settings and installs patches."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_an_older_rigs_start_message_goes_onto_the_start_list(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env["RIG_HOME"] = str(tmp_path / "home")
    code = (
        "import json, workers.app as a\n"
        "pushed = []\n"
        "class Starts:\n"
        "    def push(self, job_id, token): pushed.append([job_id, token])\n"
        "class Runner:\n"
        "    starts = Starts()\n"
        "    def run_job(self, *args): raise AssertionError('run through Celery')\n"
        "a._runner = Runner()\n"
        "said = a.start_job.run(12, 3)\n"
        "print(json.dumps([said, pushed]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said, pushed = json.loads(done.stdout.strip().splitlines()[-1])
    assert pushed == [[12, "3"]] and "start list" in said
