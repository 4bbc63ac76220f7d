#!/usr/bin/env python3
"""A picture of Flower's task list as a person sees it (issue 14.1), with headless Chromium.

    .venv/bin/python scripts/flower_screenshot.py [OUT.png]     # default: ./flower-tasks.png

Brings up a throwaway rig node (rig's own Stack: fake 2x24G cards, control and card workers,
beat, Flower on a free port; the Redis of RIG_TEST_REDIS_URL, default redis://127.0.0.1:6379/0,
under a key prefix of its own that is removed afterwards), runs one job that succeeds, one
that fails (exit 3) and one that keeps running, waits until Flower's API shows the three,
then has Chromium load Flower's Tasks page with the node's admin login and save it as a PNG.
Checks what the page shows (each job's name, as text even where it looks like HTML, SUCCESS /
FAILURE / STARTED, no rig.tick row)
and exits 1 if it is not so. Without Chromium (Debian: ``apt-get install chromium``) it says
so in one line and exits 0: nothing to look at.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rig.models import JobState
from rig.stack import flower_credentials
from rig.task_events import task_id
from rig.testing.harness import RigHarness

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _task(port: int, auth: str, tid: str) -> dict | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/task/info/{tid}",
                                     headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def main(out: Path) -> int:
    browser = next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)
    if browser is None:
        print("flower_screenshot: skipped, no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rig-flower-shot-") as home:
        node = RigHarness(Path(home), fake_gpus="2x24G", node_name="demo", flower_port=_free_port())
        try:
            node.up(beat=True, flower=True)
            port = node.settings.flower_port
            user, password = flower_credentials(node.settings)
            auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            jobs = {}
            for name, script, state in (("train-ok <i>html</i>", "exit 0", JobState.SUCCEEDED),
                                        ("train-broken", "echo boom; exit 3", JobState.FAILED),
                                        ("train-long", "sleep 600", JobState.RUNNING)):
                handle = node.client.submit(["sh", "-c", script], gpu_memory="4G", name=name)
                node.wait_for_state(handle.id, {state}, timeout=60)
                jobs[task_id(node.client.get(handle.id))] = {
                    JobState.SUCCEEDED: "SUCCESS", JobState.FAILED: "FAILURE", JobState.RUNNING: "STARTED"}[state]
            deadline = time.monotonic() + 30
            while any((_task(port, auth, tid) or {}).get("state") != want for tid, want in jobs.items()):
                if time.monotonic() > deadline:
                    print("flower_screenshot: Flower never showed the three jobs", file=sys.stderr)
                    return 1
                time.sleep(0.3)
            url = f"http://{user}:{password}@127.0.0.1:{port}/tasks"
            shot = subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--window-size=1600,700", "--virtual-time-budget=8000", f"--screenshot={out}", url],
                capture_output=True, text=True, timeout=120)
            dom = subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000",
                 "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        finally:
            node.cleanup()
    if shot.returncode != 0 or not out.exists():
        print(f"flower_screenshot: chromium failed: {shot.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    # A job's name is the submitter's text: shown as text, never as markup.
    missing = [word for word in ("'train-ok &lt;i&gt;html&lt;/i&gt;'", "'train-broken'", "'train-long'", "SUCCESS",
                                 "FAILURE", "STARTED") if word not in dom]
    if missing or "rig.tick" in dom or "<i>html</i>" in dom:
        print(f"flower_screenshot: the page does not show {missing or ['no rig.tick']}; see {out}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "flower-tasks.png").resolve()))
