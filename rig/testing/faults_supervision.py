"""Fault scenarios about a node's own processes (issue 10.3 and the private Redis's restarts).

Each runs the real CLI, ``rig up --daemon``, in a private rig home with fake cards and rig's own
private Redis on a free port, so the supervisor, its children and its Redis are exactly what an
operator gets; jobs are the usual traced, gated ones (rig.testing.faults).

- ``supervisor-sigkill``: SIGKILL of ``rig up`` while jobs run. No worker outlives it; the next
  ``rig up`` stops what is left (its private Redis), says so in one line and runs exactly one
  worker per card and one control worker; the jobs are adopted, not run again; ``rig down``
  leaves no rig process.
- ``down-after-crash``: SIGKILL of ``rig up``, with a worker that survived it (a marked stand-in
  process: real workers die with their supervisor). ``rig down`` stops it and the private
  Redis, says so, and leaves the running job alone; the next ``rig up`` adopts the job.
- ``redis-restart-fails``: the private Redis dies and its first restarts fail (its port is
  taken for a while). The node keeps trying with backoff, says so once, comes back by itself,
  and nothing is lost.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from rig.models import JobState
from rig.redis_conn import ensure_password_file, home_password_file
from rig.stack import pid_file, settings_env
from rig.supervision import (
    NODE_PROCESS,
    SUPERVISOR_PID,
    SUPERVISOR_START,
    node_mark,
    node_processes,
)
from rig.testing.faults import Scenario, ScenarioResult, _free_port, _wait
from rig.testing.harness import RigHarness
from workers.process_tree import is_alive, proc_start_time

#: One worker per card (2 fake cards), one control worker, beat, Flower.
EXPECTED = {"card0": 1, "card1": 1, "control": 1, "beat": 1, "flower": 1, "gateway": 1}


class DaemonNode:
    """A node run by the real ``rig up --daemon`` (a RigHarness for its client and counts,
    never its in-process Stack)."""

    def __init__(self, workdir: Path, **overrides) -> None:
        home = workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        # The private Redis's password exists before the clients resolve it (rig up reuses it).
        ensure_password_file(home_password_file(home))
        url = f"redis://127.0.0.1:{_free_port()}/0"
        self.harness = RigHarness(home, fake_gpus="2x80G", redis_url=url, node_name="supnode",
                                  flower_port=_free_port(), **overrides)
        self.settings = self.harness.settings
        self.home = home
        self.up_log = self.settings.rig_log_dir / "up.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        self.env = {**env, **settings_env(self.settings)}
        self.rig = str(Path(sys.executable).parent / "rig")
        self.mark = node_mark(self.settings.node_name, home)
        self.cwd = workdir  # where the operator types rig commands

    def cli(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run([self.rig, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.cwd)

    def up(self, *extra: str) -> subprocess.CompletedProcess:
        result = self.cli("up", "--daemon", "--no-metrics", *extra)
        if result.returncode != 0:
            raise RuntimeError(f"rig up failed: {result.stdout}{result.stderr}")
        return result

    def supervisor(self) -> int:
        return int(pid_file(self.settings).read_text().split()[0])

    def processes(self) -> Counter:
        """label -> how many of ``fleet`` have it."""
        return Counter(label for label, _pid in self.fleet())

    def fleet(self) -> list[tuple[str, int]]:
        """(label, pid) of the live processes of this node's rig: card0, control, beat, flower,
        redis. Found by their command lines (a worker's names its log file in this home;
        the private Redis's its port), not by rig's own marks, so a rig without them is
        measured the same way."""
        logs = str(self.settings.rig_log_dir)
        port = self.settings.redis_url.rsplit(":", 1)[1].split("/")[0]
        found: list[tuple[str, int]] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or not is_alive(int(entry), None):
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            line = " ".join(argv)
            if "redis-server" in argv[0] and f":{port}" in line:
                found.append(("redis", int(entry)))
            elif "workers.app" in argv:
                for arg in argv:
                    if arg.startswith(logs) or arg.startswith(f"--log_file_prefix={logs}"):
                        found.append((Path(arg.rpartition("=")[2]).stem, int(entry)))
                        break
            elif arg_marked(int(entry), self.mark):
                found += [(p.label, p.pid) for p in node_processes(self.settings.node_name, self.home)
                          if p.pid == int(entry)]
        return found

    def workers(self) -> Counter:
        return Counter({k: v for k, v in self.processes().items() if k != "redis"})

    def log_since(self, offset: int) -> str:
        return self.up_log.read_bytes()[offset:].decode(errors="replace") if self.up_log.exists() else ""

    def log_size(self) -> int:
        return self.up_log.stat().st_size if self.up_log.exists() else 0

    def stop_all(self) -> None:
        """Cleanup after a scenario, whatever state it left: rig down, then its keys."""
        try:
            self.cli("down", timeout=90)
        except subprocess.TimeoutExpired:
            pass


def _scenario(workdir: Path, name: str, faults: str, **overrides) -> tuple[Scenario, DaemonNode]:
    node = DaemonNode(workdir, **overrides)
    return Scenario(workdir, name, faults, node=node.harness), node


def _close(sc: Scenario, node: DaemonNode) -> None:
    node.stop_all()
    sc.close()


# -- scenarios ---------------------------------------------------------------------------------
def supervisor_sigkilled(workdir: Path) -> ScenarioResult:
    """SIGKILL of ``rig up --daemon`` with jobs running; ``rig up`` again; ``rig down``."""
    sc, node = _scenario(workdir, "rig up SIGKILLed, rig up again", "SIGKILL of the rig up supervisor")
    try:
        node.up()
        ids = [sc.submit(gpu_memory="30G") for _ in range(4)]
        sc.wait_running(ids)
        os.kill(node.supervisor(), signal.SIGKILL)
        try:  # the workers follow their supervisor (PR_SET_PDEATHSIG / parent watch)
            _wait(lambda: not node.workers(), 20, "the dead rig up's workers to stop")
        except TimeoutError:
            sc.result.problems.append(f"workers outlived their rig up: {dict(node.workers())}")
        mark = node.log_size()
        node.up()
        said = [line for line in node.log_since(mark).splitlines() if "left by a rig up" in line]
        if len(said) != 1:
            sc.result.problems.append(f"rig up did not say once what it found: {said}")
        sc.result.notes.append(said[0] if said else "-")
        running = dict(node.processes())
        if running != {**EXPECTED, "redis": 1}:
            sc.result.problems.append(f"after the second rig up: {running}, want {EXPECTED} + redis")
        sc.finish()
        down = node.cli("down")
        if down.returncode != 0 or node.processes():
            sc.result.problems.append(f"rig down left {dict(node.processes())}: {down.stdout}{down.stderr}")
        return sc.result
    finally:
        _close(sc, node)


def down_after_supervisor_crash(workdir: Path) -> ScenarioResult:
    """SIGKILL of ``rig up`` and a worker that survived it; ``rig down``; ``rig up``."""
    sc, node = _scenario(workdir, "rig down after rig up was SIGKILLed", "SIGKILL of rig up; a surviving worker")
    stand_in: subprocess.Popen | None = None
    try:
        node.up("--no-flower")
        jid = sc.submit(gpu_memory="30G")
        sc.wait_running([jid])
        supervisor = node.supervisor()
        # A worker that did not follow its supervisor (as before this fix): marked like one.
        stand_in = subprocess.Popen(
            ["sleep", "300"], env={**node.env, NODE_PROCESS: node_mark(node.settings.node_name, node.home),
                                   "RIG_ROLE": "card", "RIG_CARD_INDEX": "7", SUPERVISOR_PID: str(supervisor),
                                   SUPERVISOR_START: str(proc_start_time(supervisor))})
        _wait(lambda: node.processes().get("card7") == 1, 10, "the stand-in to be seen")
        os.kill(supervisor, signal.SIGKILL)
        _wait(lambda: set(node.workers()) == {"card7"}, 20, "the real workers to follow rig up")
        job = node.harness.client.get(jid)  # its wrapper, the leader of its session
        down = node.cli("down")
        sc.result.notes.append(down.stdout.strip())
        if down.returncode != 0 or "left: card7" not in down.stdout or "redis" not in down.stdout:
            sc.result.problems.append(f"rig down said: {down.stdout}{down.stderr}")
        if node.processes():
            sc.result.problems.append(f"rig down left {dict(node.processes())}")
        if stand_in.wait(10) != -signal.SIGTERM:
            sc.result.problems.append(f"the stand-in ended with {stand_in.returncode}")
        if not job.pid or not is_alive(job.pid, job.proc_start):
            sc.result.problems.append(f"rig down stopped the running job (pid {job.pid})")
        node.up("--no-flower")  # adopts the job
        sc.finish()
        return sc.result
    finally:
        if stand_in is not None and stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()
        _close(sc, node)


def arg_marked(pid: int, mark: str) -> bool:
    """Does ``pid`` carry this node's RIG_NODE_PROCESS mark (the stand-in of a worker)?"""
    try:
        return f"{NODE_PROCESS}={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


class PortTaker:
    """Holds a TCP port on loopback, accepting and at once closing connections (a client gets
    a clean error, never a hang), until ``release``."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                continue

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def redis_restart_fails(workdir: Path) -> ScenarioResult:
    """The private Redis is SIGKILLed and its port taken for ~3 s: its restarts fail; rig up
    keeps trying with backoff, says so once, and it comes back on its data."""
    sc, node = _scenario(workdir, "private Redis: restart fails for a while", "SIGKILL of redis; port taken ~3 s")
    taker: PortTaker | None = None
    try:
        node.up("--no-flower", "--no-beat")
        ids = [sc.submit(gpu_memory="50G") for _ in range(4)]  # 2 run, 2 wait
        sc.wait_running(ids[:2])
        time.sleep(1.2)  # the AOF's once-a-second fsync covers the submissions
        supervisor = node.supervisor()
        server = next(pid for label, pid in node.fleet() if label == "redis")
        mark = node.log_size()
        os.kill(supervisor, signal.SIGSTOP)  # so the port is taken before it can restart Redis
        try:
            os.kill(server, signal.SIGKILL)
            _wait(lambda: "redis" not in node.processes(), 10, "redis-server to die")
            taker = PortTaker(int(node.settings.redis_url.rsplit(":", 1)[1].split("/")[0]))
        finally:
            os.kill(supervisor, signal.SIGCONT)
        _wait(lambda: "did not restart" in node.log_since(mark), 30, "rig up to report the failed restart")
        time.sleep(3.0)  # the outage: several attempts fail meanwhile
        taker.release()
        taker = None
        _wait(lambda: "is back" in node.log_since(mark), 60, "the private Redis to come back")
        text = node.log_since(mark)
        failed = [line for line in text.splitlines() if "did not restart" in line]
        back = [line for line in text.splitlines() if "is back" in line]
        sc.result.notes += failed[:1] + back[:1]
        if len(failed) != 1:
            sc.result.problems.append(f"the failure was said {len(failed)} times (once per change wanted)")
        if not back or "failed restart" not in back[0]:
            sc.result.problems.append(f"no line saying it came back after failing: {back}")
        sc.finish(timeout=240)
        if not is_alive(supervisor, None):
            sc.result.problems.append("rig up did not survive the failed restarts")
        return sc.result
    finally:
        if taker is not None:
            taker.release()
        _close(sc, node)





def hung_card_worker(workdir: Path) -> ScenarioResult:
    """A card worker stopped with SIGSTOP (hung, not dead) while its jobs run: rig up sees it
    silent for health.timeout, kills it and starts another, which adopts the jobs; each runs
    once and ends."""
    from rig.keys import card_worker_name

    sc = Scenario(workdir, "card worker hung (SIGSTOP)", "SIGSTOP of card0's worker", fake_gpus="2x80G",
                  health={"check_interval": 1.0, "timeout": 3.0})
    try:
        sc.node.up()
        ids = [sc.submit(gpu_memory="50G") for _ in range(2)]
        sc.wait_running(ids)
        name = card_worker_name(sc.node.name, 0)
        victim = sc.node.worker_pid(name)
        os.kill(victim, signal.SIGSTOP)
        began = time.monotonic()

        def replaced() -> bool:
            try:
                return sc.node.worker_pid(name) != victim
            except LookupError:
                return False

        _wait(replaced, 60, "a new card0 worker")
        sc.result.notes.append(f"hung worker replaced after {time.monotonic() - began:.1f} s")
        finals = sc.finish()
        not_ok = [jid for jid in ids if jid not in finals or finals[jid].state is not JobState.SUCCEEDED
                  or finals[jid].attempt != 1]  # adopted, never stopped and re-run
        if not_ok:
            sc.result.problems.append(f"jobs that did not succeed once: {[(j, finals[j].state.value, finals[j].attempts) for j in not_ok if j in finals]}")
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("supervisor-sigkill", supervisor_sigkilled),
    ("down-after-crash", down_after_supervisor_crash),
    ("redis-restart-fails", redis_restart_fails),
    ("hung-card-worker", hung_card_worker),
]
