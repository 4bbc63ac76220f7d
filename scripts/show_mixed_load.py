#!/usr/bin/env python3
"""Issue 14's evidence: a real root node with three real users' mixed load, pictured and printed.

    sudo .venv/bin/python scripts/show_mixed_load.py [OUT_DIR]     # default: docs/screens/

As root: makes the Unix users rigdemo-alice, rigdemo-bob and rigdemo-carol and a venv of
/usr/bin/python3 with this checkout they can run (rig.testing.user_venv); brings up a node
(`rig up --daemon --fake-gpus 4x24G`) in a throwaway RIG_HOME, on the shared Redis of
RIG_DEMO_REDIS_URL (default redis://127.0.0.1:6379/0) under the key prefix ``rigdemo-screens:``,
with free ports for Flower and the web page and its own gateway socket. Each user submits through
the gateway with `rig-submit`: jobs that run, jobs that wait, a job that exits 3, a CUDA OOM and a
sweep with long names. Once some run, some wait with an estimated start and some are in the error
queue, it saves Chromium screenshots of rig's page and Flower's task lists, `rig status` /
`rig jobs` / `rig errors` at 80 and 160 columns, `rig top` at 80x24 (tmux) and `promtool check
metrics`. Then it kills the jobs, `rig down`, removes the users and every key of the prefix, and
checks that no process of the node or the users is left. Safe to rerun: leftovers of an earlier
run are removed first. About 35 s (the first run builds the users' venv: about a minute more).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from rig.testing.user_venv import SYSTEM_PYTHON, user_venv

REPO = Path(__file__).resolve().parents[1]
RIG = REPO / ".venv" / "bin" / "rig"  # root's rig: this checkout's venv
LOCK = Path("/tmp/rigdemo-screens.lock")
USERS = ("rigdemo-alice", "rigdemo-bob", "rigdemo-carol")
PREFIX = "rigdemo-screens:"
NODE = "demo"
GATEWAY_DIR = Path("/tmp/rigdemo-gateway")  # root's, mode 0755: users reach the socket, cannot plant one
TOOLS = ("chromium", "tmux", "promtool", "useradd", "userdel")
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0; 24.00 GiB total)"


def say(message: str) -> None:
    print(f"show_mixed_load: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               context: Callable[[], str] = lambda: "") -> None:
    """Poll ``predicate`` every 0.5 s until it holds; exit 1 naming ``what`` (and ``context()``,
    e.g. the job list) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"show_mixed_load: gave up after {timeout:.0f} s waiting for {what}\n{context()}")
        time.sleep(0.5)


class Demo:
    """One run: the node's environment, the users, their jobs, and the cleanup of all of it."""

    def __init__(self, out: Path, redis_url: str) -> None:
        self.out = out
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.home = Path(tempfile.mkdtemp(prefix="rigdemo-home-"))
        self.shared = Path(tempfile.mkdtemp(prefix="rigdemo-work-"))  # the users' working folder
        self.shared.chmod(0o1777)
        (self.home / "config.toml").write_text("# empty: the environment below says it all\n")
        self.flower_port, self.metrics_port = free_port(), free_port()
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")},
                    "RIG_HOME": str(self.home), "RIG_KEY_PREFIX": PREFIX, "RIG_REDIS_URL": redis_url,
                    "RIG_NODE_NAME": NODE, "RIG_FAKE_GPUS": "4x24G", "RIG_FLOWER_PORT": str(self.flower_port),
                    "RIG_METRICS_PORT": str(self.metrics_port), "RIG_CONFIG": str(self.home / "config.toml"),
                    "RIG_GATEWAY_SOCKET": str(GATEWAY_DIR / "gateway.sock"), "TZ": "UTC"}
        self.venv: Path | None = None
        self.made_users: list[str] = []

    # --- setup ---------------------------------------------------------------------------
    def rig(self, *argv: str, columns: int = 160, check: bool = True) -> subprocess.CompletedProcess:
        """Run `rig ARGV` as root (admin: it reads the Redis directly) at ``columns`` columns."""
        done = subprocess.run([str(RIG), *argv], env={**self.env, "COLUMNS": str(columns)},
                              capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise SystemExit(f"show_mixed_load: rig {' '.join(argv)} failed: {done.stderr.strip()[-400:]}")
        return done

    def remove_leftovers(self) -> None:
        """What an earlier, interrupted run may have left: its node, users (and their processes), keys."""
        for old in Path(tempfile.gettempdir()).glob("rigdemo-home-*"):
            if old == self.home:
                continue
            if (old / "config.toml").exists():
                subprocess.run([str(RIG), "down"], env={**self.env, "RIG_HOME": str(old),
                                                         "RIG_CONFIG": str(old / "config.toml")},
                               capture_output=True, timeout=120)
            shutil.rmtree(old, ignore_errors=True)
        for old in Path(tempfile.gettempdir()).glob("rigdemo-work-*"):
            if old != self.shared:
                shutil.rmtree(old, ignore_errors=True)
        for name in USERS:
            self.remove_user(name)
        self.delete_keys()
        shutil.rmtree(GATEWAY_DIR, ignore_errors=True)

    def make_users(self) -> None:
        for name in USERS:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
            self.made_users.append(name)

    def up(self) -> None:
        GATEWAY_DIR.mkdir(mode=0o755)
        self.rig("up", "--daemon")
        say(f"node up: Flower :{self.flower_port}, web page :{self.metrics_port}, home {self.home}")

    # --- the load ------------------------------------------------------------------------
    def submit(self, user: str, *argv: str) -> int:
        """`rig-submit ARGV` as ``user`` through the gateway; the job id."""
        assert self.venv is not None
        entry = pwd.getpwnam(user)
        env = {"HOME": entry.pw_dir, "PATH": f"{self.venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "RIG_GATEWAY_SOCKET": self.env["RIG_GATEWAY_SOCKET"]}
        done = subprocess.run(["rig-submit", *argv], user=entry.pw_uid, group=entry.pw_gid,
                              extra_groups=os.getgrouplist(user, entry.pw_gid), env=env, cwd=self.shared,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SystemExit(f"show_mixed_load: rig-submit as {user} failed: {done.stderr.strip()}")
        return int(done.stdout.split()[0])

    def load(self) -> dict[str, list[int]]:
        """Submit the mix; the ids by what each should become (failed, running, waiting)."""
        alice, bob, carol = USERS
        # The failures first, small, so they find room before the cards fill up.
        failed = [self.submit(alice, "-n", "preprocess-shards", "-m", "1G", "--retries", "0", "--cmd",
                              "echo 'reading shard 7'; echo 'shard 7: checksum mismatch' >&2; exit 3"),
                  self.submit(bob, "-n", "finetune-llama-7b-bs64", "-m", "2G", "--retries", "0", "--cmd",
                              f"echo 'step 1/900'; echo '{OOM_LINE}' >&2; exit 1")]
        wait_until(lambda: all(self.state(j) == "FAILED" for j in failed), 90, "the two failures", self.job_list)
        # The running jobs "use" memory on their fake cards (each job run as its user writes its
        # own usage folder, rig.gpus.fake.job_usage_dir), so the cards' "used" reads it.
        hold = "sleep 1800"

        def use(size: str) -> str:
            return f"{self.venv}/bin/python -m rig.fakeuse {size} 1800"

        running = [self.submit(alice, "-n", "train-resnet50", "-m", "20G", "--time-limit", "2h", "--cmd",
                               use("17G")),
                   self.submit(bob, "-n", "eval-gpt2-xl", "-m", "22G", "--time-limit", "45m", "--cmd",
                               use("19.5G")),
                   self.submit(carol, "-n", "sweep-lr0.001-seed-11", "-m", "20G", "--time-limit", "30m",
                               "--cmd", use("14G")),
                   self.submit(carol, "-n", "sweep-lr0.001-seed-12", "-m", "20G", "--time-limit", "30m",
                               "--cmd", use("15G"))]
        wait_until(lambda: all(self.state(j) == "RUNNING" for j in running), 90, "four running jobs", self.job_list)
        waiting = [self.submit(carol, "-n", f"sweep-lr{lr}-seed-{seed}", "-m", "20G", "--time-limit", "30m",
                               "--cmd", hold)
                   for lr, seed in (("0.001", 13), ("0.0003", 11), ("0.0003", 12))]
        waiting += [self.submit(alice, "-n", "train-resnet50-long-context-ablation", "-m", "16G", "-g", "2",
                                "-p", "high", "--time-limit", "3h", "--cmd", hold),
                    self.submit(bob, "-n", "eval-gpt2-xl", "-m", "22G", "-p", "low", "--cmd", hold)]
        return {"failed": failed, "running": running, "waiting": waiting}

    def job_list(self) -> str:
        listed = json.loads(self.rig("jobs", "--json", check=False).stdout or "[]")
        logs = [f"--- rig log {j['id']}:\n" + self.rig("log", str(j["id"]), check=False).stdout[-600:]
                for j in listed if j["state"] == "FAILED"][:3]
        return self.rig("jobs", check=False).stdout + "\n".join(logs)

    def state(self, job_id: int) -> str:
        shown = json.loads(self.rig("show", str(job_id), "--json").stdout)
        return str(shown["state"])

    def settled_forecast(self, job_ids: list[int]) -> Callable[[], bool]:
        """A predicate: has the leader's forecast (rig.forecast_store) given each of ``job_ids`` a
        start, the same in two forecasts made one after the other? The first one after a burst of
        submissions can be made before the holds are placed and moves 10 s later; the pictures
        and renders should all show the one that stays."""
        seen: dict[str, object] = {}

        def settled() -> bool:
            made, *stored = self.redis.hmget(f"{PREFIX}sched:forecast", ["made_at", *map(str, job_ids)])
            starts = [None if s is None else json.loads(s).get("a") for s in stored]
            if made is None or None in starts or made == seen.get("made"):
                return False
            same = starts == seen.get("starts")
            seen.update(made=made, starts=starts)
            return same
        return settled

    # --- the evidence --------------------------------------------------------------------
    def screenshot(self, path: str, name: str, height: int = 1600) -> None:
        user, password = (self.home / "flower.auth").read_text().strip().split(":", 1)
        port = self.metrics_port if path == "/" else self.flower_port
        target = self.out / name
        done = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--virtual-time-budget=8000", f"--window-size=1400,{height}",
                               f"--screenshot={target}", f"http://{user}:{password}@127.0.0.1:{port}{path}"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not target.exists():
            raise SystemExit(f"show_mixed_load: chromium failed on {path}: {done.stderr.strip()[-300:]}")
        say(f"{target.name}: {target.stat().st_size // 1024} KiB")

    def renders(self) -> None:
        for command in ("status", "jobs", "errors"):
            for columns in (80, 160):
                done = self.rig(command, columns=columns)
                (self.out / f"{command}-{columns}.txt").write_text(done.stdout)
        session = f"rigdemo-top-{os.getpid()}"
        env_args = [arg for k, v in {**self.env, "COLUMNS": "80", "LINES": "24"}.items()
                    if k.startswith(("RIG_", "TZ")) for arg in ("-e", f"{k}={v}")]
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", *env_args,
                        str(RIG), "top"], check=True)
        try:
            def capture() -> str:
                return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                      text=True).stdout

            # The cards and a job's name: the view has its data, not only a frame.
            wait_until(lambda: "demo/0" in (screen := capture()) and "train-resnet50" in screen, 30,
                       "rig top to draw the cards and jobs", capture)
            time.sleep(1.5)  # one more refresh, so the capture is a whole frame, not one mid-draw
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True, check=True).stdout
            (self.out / "top-80x24.txt").write_text(screen)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
        metrics = subprocess.run(["curl", "-s", f"http://127.0.0.1:{self.metrics_port}/metrics"],
                                 capture_output=True, text=True, check=True).stdout
        check = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True)
        (self.out / "promtool.txt").write_text(
            f"$ curl -s http://127.0.0.1:PORT/metrics | promtool check metrics\n{check.stdout}{check.stderr}"
            f"(exit {check.returncode}{'' if check.stdout or check.stderr else ': no problems found'}; "
            f"{len(metrics.splitlines())} lines of metrics checked)\n")

    # --- cleanup -------------------------------------------------------------------------
    def kill_jobs(self) -> None:
        listed = json.loads(self.rig("jobs", "--json", "-n", "500", check=False).stdout or "[]")
        alive = [str(j["id"]) for j in listed if j["state"] in ("PENDING", "RUNNING")]
        if alive:
            self.rig("kill", *alive, check=False)

    def remove_user(self, name: str) -> None:
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            return
        for pid in processes(lambda p: p.stat().st_uid == uid):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)

    def delete_keys(self) -> None:
        for key in self.redis.scan_iter(match=f"{PREFIX}*", count=1000):
            self.redis.delete(key)

    def cleanup(self) -> list[int]:
        """Tear everything down; the pids still alive of the node's processes or the users' (none)."""
        try:
            self.kill_jobs()
        finally:
            self.rig("down", check=False)
        for name in self.made_users:
            self.remove_user(name)
        self.delete_keys()
        marker = f"RIG_HOME={self.home}".encode()
        left = processes(lambda p: marker in (p / "environ").read_bytes().split(b"\0"))
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.shared, ignore_errors=True)
        shutil.rmtree(GATEWAY_DIR, ignore_errors=True)
        return left


def processes(match: Callable[[Path], bool]) -> list[int]:
    """The pids of /proc entries ``match`` holds for (vanished ones skipped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if match(entry):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def main(out: Path) -> int:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing or not SYSTEM_PYTHON.exists():
        say(f"needs root, /usr/bin/python3 and {', '.join(TOOLS)} (missing: {', '.join(missing) or 'none'}; "
            "apt-get install chromium tmux prometheus)")
        return 2
    if not RIG.exists():
        say(f"no {RIG}: make the checkout's venv first (README, Install)")
        return 2
    redis_url = os.environ.get("RIG_DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(redis_url, socket_timeout=5).ping()
    except (redis.RedisError, ValueError) as exc:
        say(f"Redis at {redis_url} does not answer ({exc}); start it or set RIG_DEMO_REDIS_URL")
        return 2
    lock = LOCK.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"another show_mixed_load runs on this host (it holds {LOCK}); wait for it to end")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    demo = Demo(out, redis_url)
    demo.remove_leftovers()
    demo.venv = user_venv(REPO)
    try:
        demo.make_users()
        demo.up()
        jobs = demo.load()
        say(f"submitted {sum(map(len, jobs.values()))} jobs: {json.dumps(jobs)}")
        wait_until(lambda: all(demo.state(j) == "PENDING" for j in jobs["waiting"]), 30, "the waiting jobs", demo.job_list)
        wait_until(demo.settled_forecast(jobs["waiting"]), 60, "a settled forecast of the waiting jobs", demo.job_list)
        demo.screenshot("/", "web-page.png")
        demo.screenshot("/tasks", "flower-tasks.png", height=1250)  # all 11 rows and the footer
        demo.screenshot("/tasks?state=FAILURE", "flower-failed.png", height=600)
        demo.renders()
    finally:
        left = demo.cleanup()
    if left:
        say(f"processes left behind: {left}")
        return 1
    say(f"done in {time.monotonic() - started:.0f} s; nothing left behind; see {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "screens").resolve()))
