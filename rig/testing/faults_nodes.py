"""Fault scenarios about node names and the commands that act on a node (issue 11.1, 11.7).

Each runs the real CLI (``rig up --daemon``, ``rig down``, ``rig forget-node``) from rig homes of
its own on this machine, against one Redis under one key prefix, with fake cards; jobs are the
usual traced, gated ones (rig.testing.faults).

- ``two-homes-one-name``: two ``rig up --node a`` from two homes started at the same moment
  (a 24 GB card and a 48 GB one): exactly one wins; the other is refused with one line naming
  the holder (host, home, pid, since) and exit 10; a second try while jobs run changes nothing
  (card and node records, jobs); each job runs once; ``rig status`` counts the owner's workers.
- ``crashed-owner-taken-over``: the owner is SIGKILLed: another home takes the name at once
  (same host, the pid is gone); a claim of another host is refused until it expires, then taken.
- ``down-from-other-home``: ``rig down --node a`` and ``rig recover --node a`` from another home
  are refused naming the owner and what to type where; the node is not marked stopped and its
  job runs on; ``rig down`` without ``--node`` in the owner's home names the node it runs.
- ``sigkill-lone-node``: the only node's ``rig up`` is SIGKILLed while a job runs (its workers
  follow it, and mark the node stopped as they go): ``rig status`` says ``stopped since T (its
  rig up (pid N) died; `rig up` adopts its running jobs)`` (``--json`` state ``stopped``), the
  job runs on in its first attempt; ``rig up`` again reads up at once and adopts the job, which
  ends once.
- ``supervisor-sigkill-beside-others``: node b's ``rig up`` alone is SIGKILLed while its job runs
  and node a runs the health checks: b reads stopped, never down, past health.timeout, so a never
  runs b's job again beside its first attempt (a breaker saw one run twice); b's ``rig up`` again
  adopts it and it ends once.
- ``name-taken-over-adopts``: home A's ``rig up`` is SIGKILLed while two jobs run; home B takes
  the name and adopts both (never re-runs them); B starts a third, then stops cleanly
  (``rig down``); two jobs end while the node is down; A takes the name back and concludes each
  from the files it was started with (A's or B's log_dir). Each job's marker has one line, all
  succeed with exit 0, nothing stays reserved.
- ``password-changed``: Redis' password changes under a running node: ``rig status`` says the
  node cannot authenticate; control.log does not fill with tracebacks; the node comes back
  when the password it has works again, and its job ends once.
- ``forget-stopped-node``: ``rig forget-node`` of a node merely stopped is refused, saying which
  waiting job it would fail (and its failure class); nothing changes; ``--force`` fails it with
  class ``unschedulable`` and a reason naming the node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rig.models import JobState
from rig.node_claim import holder
from rig.nodes import NodeRegistry
from rig.stack import pid_file, settings_env
from rig.supervision import node_processes
from rig.testing.faults import Scenario, ScenarioResult, _free_port, _wait
from rig.testing.harness import RigHarness, delete_prefix, new_prefix

#: Fields of a card record that only its registration writes (telemetry fields change by themselves).
CARD_FIELDS = ("total", "uuid", "model", "allowed", "max_jobs")
#: Fields of a node record that only its registration (or rig down) writes.
NODE_FIELDS = ("host", "pid", "started_at", "fake_spec", "cards", "stopped_at")


class Home:
    """One rig home whose node is run by the real CLI (a RigHarness for its client and reads,
    never its in-process Stack)."""

    def __init__(self, root: Path, label: str, *, node: str, fake_gpus: str, prefix: str, **overrides) -> None:
        self.label = label
        self.home = root / label
        self.home.mkdir(parents=True, exist_ok=True)
        values = {"telemetry_interval": 0.5, "health": {"check_interval": 1.0, "timeout": 4.0}, **overrides}
        self.harness = RigHarness(self.home, fake_gpus=fake_gpus, prefix=prefix, node_name=node,
                                  flower_port=_free_port(), **values)
        self.settings = self.harness.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        self.env = {**env, **settings_env(self.settings), "RIG_ADMINS": _me()}
        self.rig = str(Path(sys.executable).parent / "rig")

    def cli(self, *args: str, timeout: float = 150, unset: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        env = {**{k: v for k, v in self.env.items() if k not in unset}, **(env or {})}
        return subprocess.run([self.rig, *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=self.home)

    def up(self, *, beat: bool = False) -> subprocess.CompletedProcess:
        """``rig up --daemon``; with ``beat``, this node runs the cluster's periodic checks."""
        return self.cli("up", "--daemon", "--no-flower", "--no-metrics", *(() if beat else ("--no-beat",)))

    def supervisor(self) -> int | None:
        try:
            return int(pid_file(self.settings).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def down(self) -> subprocess.CompletedProcess:
        return self.cli("down", timeout=90)

    def sigkill_up(self) -> int:
        """SIGKILL this home's ``rig up`` and wait for its workers to follow it (rig.supervision);
        returns the killed pid."""
        supervisor = self.supervisor()
        assert supervisor is not None
        os.kill(supervisor, signal.SIGKILL)
        _wait(lambda: not node_processes(self.settings.node_name, self.home), 30, "the dead rig up's workers to stop")
        return supervisor


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _one_line(result: subprocess.CompletedProcess) -> str:
    """The command's error line (what the operator sees), or all its output if not one line."""
    text = (result.stderr or result.stdout).strip()
    return text.removeprefix("rig: error: ")


def _snapshot(h: RigHarness, node: str) -> dict[str, object]:
    """The registration-written fields of ``node``'s record and card records."""
    r, k = h.redis, h.keys
    cards = sorted(c for c in r.smembers(k.cards) if c.split("/")[0] == node)
    snap: dict[str, object] = {"node": r.hmget(k.node(node), list(NODE_FIELDS))}
    for cid in cards:
        snap[cid] = r.hmget(k.card(node, cid.split("/")[1]), list(CARD_FIELDS))
    return snap


def _close(sc: Scenario, homes: list[Home]) -> None:
    for home in homes:
        try:
            home.down()
        except subprocess.TimeoutExpired:
            pass
    sc.close()
    try:
        delete_prefix(sc.node.redis, sc.node.prefix)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def _simultaneous(*calls) -> list[subprocess.CompletedProcess]:  # noqa: ANN002
    """Run the calls at the same moment (threads behind one barrier); their results in order."""
    results: list[subprocess.CompletedProcess | None] = [None] * len(calls)
    gate = threading.Barrier(len(calls))

    def run(i: int) -> None:
        gate.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


# -- scenarios ---------------------------------------------------------------------------------
def two_homes_one_name(workdir: Path) -> ScenarioResult:
    prefix = new_prefix()
    homes = [Home(workdir, "home24", node="a", fake_gpus="1x24G", prefix=prefix),
             Home(workdir, "home48", node="a", fake_gpus="1x48G", prefix=prefix)]
    sc = Scenario(workdir, "two homes, one node name", "rig up --node a from two homes at once",
                  node=homes[0].harness)
    try:
        first = _simultaneous(homes[0].up, homes[1].up)
        won = [i for i, r in enumerate(first) if r.returncode == 0]
        if len(won) != 1:
            sc.result.problems.append(f"{len(won)} of 2 simultaneous rig up won the name: "
                                      f"{[(r.returncode, _one_line(r)) for r in first]}")
            return sc.result
        owner, other = homes[won[0]], homes[1 - won[0]]
        sc.node = owner.harness  # jobs and counts through the owner's view
        refused = first[1 - won[0]]
        line = _one_line(refused)
        sc.result.notes.append(f"the loser ({other.label}) said: {line}")
        pid = owner.supervisor()
        if refused.returncode != 10 or f"home {owner.home.resolve()}, pid {pid}, since " not in line \
                or "\n" in line:
            sc.result.problems.append(f"the loser's refusal (exit {refused.returncode}) does not name the holder "
                                      f"in one line: {line!r}")
        want_total = 24 if owner.label == "home24" else 48
        card = owner.harness.client.ledger.card("a", 0)
        if round(card.total / 2**30) != want_total:
            sc.result.problems.append(f"card a/0 shows {card.total / 2**30:.0f} GiB, the owner's is {want_total}")
        ids = [sc.submit(gpu_memory="6G") for _ in range(3)]  # all 3 fit whichever card won
        sc.wait_running(ids)
        before = _snapshot(owner.harness, "a")
        again = other.cli("up", "--no-flower", "--no-metrics", "--no-beat")  # in the foreground this time
        if again.returncode != 10:
            sc.result.problems.append(f"a second try was not refused with exit 10: {again.returncode} {_one_line(again)}")
        after = _snapshot(owner.harness, "a")
        if before != after:
            sc.result.problems.append(f"the refused rig up changed the records: {before} -> {after}")
        if other.supervisor() is not None:
            sc.result.problems.append("the refused home has a live rig up pid file")
        nodes = {n.name: n for n in NodeRegistry(owner.harness.redis, owner.harness.keys).read()}
        if nodes["a"].workers != 2 or nodes["a"].state != "up":
            sc.result.problems.append(f"rig status: node a {nodes['a'].state} with {nodes['a'].workers} "
                                      "worker(s), want up with 2 (card0, control)")
        sc.finish(timeout=120)
        return sc.result
    finally:
        _close(sc, homes)


def crashed_owner_taken_over(workdir: Path) -> ScenarioResult:
    import json

    prefix = new_prefix()
    a, b = (Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix),
            Home(workdir, "homeB", node="a", fake_gpus="1x80G", prefix=prefix))
    sc = Scenario(workdir, "crashed owner of a name taken over", "SIGKILL of the owner; a remote claim expiring",
                  node=a.harness)
    try:
        if a.up().returncode != 0:
            sc.result.problems.append("home A's rig up failed")
            return sc.result
        a.sigkill_up()  # its claim stays in Redis until it expires (or its workers give it up)
        if holder(a.harness.redis, a.harness.keys, "a") is None:
            sc.result.notes.append("the dead owner's claim had expired already (slow machine)")
        took = b.up()  # at once: same host, the owner's pid is gone
        if took.returncode != 0:
            sc.result.problems.append(f"the dead owner's name was not taken over: {_one_line(took)}")
            return sc.result
        found = holder(b.harness.redis, b.harness.keys, "a")
        if found is None or found.home != str(b.home.resolve()):
            sc.result.problems.append(f"after the takeover the name is held by {found}")
        sc.node = b.harness
        jid = sc.submit(gpu_memory="10G")
        sc.finish(timeout=90)
        if sc.result.lost:
            return sc.result
        if b.down().returncode != 0:
            sc.result.problems.append("rig down of the new owner failed")
        # A claim of another host (never provably dead from here) must expire first.
        key = b.harness.keys.node_owner("a")
        remote = json.dumps({"host": "elsewhere.example", "pid": 4242, "start": 1, "home": "/srv/rig",
                             "run_dir": "/srv/rig/run", "install": "/opt/rig"}, sort_keys=True)
        # Long enough that the refused `rig up` below meets it live on a loaded host (it took
        # more than 4 s there, found the claim expired and took the name).
        b.harness.redis.set(key, f"{remote}|{time.time():.3f}", px=15000)
        refused = b.up()
        line = _one_line(refused)
        mine = holder(b.harness.redis, b.harness.keys, "a")
        if refused.returncode == 0 and mine is not None and mine.home == str(b.home.resolve()):
            # On a very loaded host (CI at load 15) rig up took longer than the claim's life: it
            # found the claim expired and took the name, as it should. Nothing else to check.
            sc.result.notes.append("the remote claim expired before rig up read it (slow machine)")
            if b.down().returncode != 0:
                sc.result.problems.append("rig down of the new owner failed")
            return sc.result
        if refused.returncode != 10 or "host elsewhere.example, home /srv/rig, pid 4242" not in line:
            sc.result.problems.append(f"a live remote claim was not refused naming it: {refused.returncode} {line}")
        sc.result.notes.append(f"remote owner: {line}")
        _wait(lambda: not b.harness.redis.exists(key), 30, "the remote claim to expire")
        if b.up().returncode != 0:
            sc.result.problems.append("the expired remote claim was not taken over")
        if jid not in sc.job_ids:
            sc.result.problems.append("job bookkeeping lost")
        return sc.result
    finally:
        _close(sc, [a, b])


def down_from_other_home(workdir: Path) -> ScenarioResult:
    prefix = new_prefix()
    a, b = (Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix),
            Home(workdir, "homeB", node="a", fake_gpus="1x80G", prefix=prefix))
    sc = Scenario(workdir, "rig down of a node from another home", "rig down / recover --node a from home B",
                  node=a.harness)
    try:
        if a.up().returncode != 0:
            sc.result.problems.append("home A's rig up failed")
            return sc.result
        jid = sc.submit(gpu_memory="10G")
        sc.wait_running([jid])
        supervisor = a.supervisor()
        for args in (("down", "--node", "a"), ("recover", "--node", "a")):
            result = b.cli(*args)
            line = _one_line(result)
            sc.result.notes.append(f"rig {' '.join(args)} from home B: {line}")
            if result.returncode != 10 or f"home {a.home.resolve()}" not in line \
                    or f"RIG_HOME={a.home.resolve()} rig {args[0]} --node a" not in line:
                sc.result.problems.append(f"rig {' '.join(args)} from home B was not refused naming the owner "
                                          f"and what to type: {result.returncode} {line}")
        nodes = {n.name: n for n in NodeRegistry(a.harness.redis, a.harness.keys).read()}
        if nodes["a"].state != "up" or nodes["a"].stopped_at is not None:
            sc.result.problems.append(f"node a is {nodes['a'].state} after rig down from another home")
        if supervisor is None or a.supervisor() != supervisor or sc.node.client.get(jid).state is not JobState.RUNNING:
            sc.result.problems.append("the owner's rig up or its job did not run on")
        plain = a.cli("down", unset=("RIG_NODE_NAME",))  # no --node: the default name is the host's, not a
        line = _one_line(plain)
        sc.result.notes.append(f"rig down (no --node) in home A: {line}")
        if plain.returncode == 0 or "`rig down --node a`" not in line or a.supervisor() != supervisor:
            sc.result.problems.append(f"rig down without --node did not name the running node a: {line}")
        sc.finish(timeout=90)
        stop = a.cli("down", "--node", "a")

        # The instant rig down returns, the node must read stopped: its record, heartbeat and
        # name claim say so (a heartbeat or claim a winding-down worker renewed after the stop
        # mark once read "up" for up to health.timeout s).
        r, k = a.harness.redis, a.harness.keys
        pipe = r.pipeline(transaction=True)
        pipe.get(k.node_alive("a"))
        pipe.get(k.node_owner("a"))
        pipe.hmget(k.node("a"), "stopped_at", "last_seen")
        alive, owner, (stopped_at, last_seen) = pipe.execute()
        node = {n.name: n for n in NodeRegistry(r, k).read()}["a"]
        if stop.returncode != 0 or node.state != "stopped" or alive is not None or owner is not None:
            sc.result.problems.append(f"right after rig down --node a returned ({stop.returncode} {_one_line(stop)}): "
                                      f"node {node.state}, heartbeat {alive!r}, name claim {owner!r}, "
                                      f"stopped_at {stopped_at} last_seen {last_seen}")
        return sc.result
    finally:
        _close(sc, [a, b])


def sigkill_lone_node(workdir: Path) -> ScenarioResult:
    import json

    from rig.nodes import clock

    prefix = new_prefix()
    a = Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix)
    sc = Scenario(workdir, "the only node's rig up SIGKILLed", "SIGKILL of rig up; nobody to declare it down",
                  node=a.harness)
    status_env = {"COLUMNS": "400"}
    try:
        if a.up().returncode != 0:
            sc.result.problems.append("rig up failed")
            return sc.result
        jid = sc.submit(gpu_memory="10G")
        sc.wait_running([jid])
        supervisor = a.sigkill_up()
        registry = NodeRegistry(a.harness.redis, a.harness.keys)
        # Its workers, stopping because their rig up died, mark the node stopped (as rig down
        # would), saying why: nobody has to declare it down, and no one may run its job again.
        _wait(lambda: registry.read()[0].state == "stopped", 30, "node a to read stopped")
        node = registry.read()[0]
        text = a.cli("status", env=status_env)
        flat = " ".join(text.stdout.split())  # the node's line heads its card table and may wrap
        line = flat[flat.find("node a:"):].split(" ┏")[0][:300]  # up to its table's top edge
        sc.result.notes.append(f"rig status: {line}")
        want = (f"node a: stopped since {clock(node.stopped_at)} (its rig up (pid {supervisor}) died; "
                "`rig up` adopts its running jobs)")
        if node.down_since is not None or want not in line or "(rig down)" in line or node.presumed_down:
            sc.result.problems.append(f"rig status of the SIGKILLed lone node: {line!r} (down_since {node.down_since})")
        as_json = json.loads(a.cli("status", "--json").stdout or "{}")
        if [(n.get("name"), n.get("state")) for n in as_json.get("nodes", [])] != [("a", "stopped")]:
            sc.result.problems.append(f"rig status --json: {as_json.get('nodes')}")
        job = a.harness.client.get(jid)
        if job.state is not JobState.RUNNING or job.attempt != 1:
            sc.result.problems.append(f"job {jid} after the SIGKILL: {job.state.value}, attempt {job.attempt}")
        if a.up().returncode != 0:
            sc.result.problems.append("rig up after the SIGKILL failed")
            return sc.result
        node = registry.read()[0]
        if node.state != "up" or node.presumed_down:
            sc.result.problems.append(f"node a back: {node.state}, presumed_down {node.presumed_down}")
        sc.finish(timeout=90)
        return sc.result
    finally:
        _close(sc, [a])


def forget_stopped_node(workdir: Path) -> ScenarioResult:
    prefix = new_prefix()
    pools = {"only-b": ["b"]}
    a, b = (Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix, pools=pools),
            Home(workdir, "homeB", node="b", fake_gpus="1x80G", prefix=prefix, pools=pools))
    sc = Scenario(workdir, "forget-node of a node merely stopped", "rig down on b; rig forget-node b",
                  node=a.harness)
    try:
        if a.up(beat=True).returncode != 0 or b.up().returncode != 0:
            sc.result.problems.append("rig up failed")
            return sc.result
        if b.down().returncode != 0:
            sc.result.problems.append("rig down on b failed")
        # The cluster check (a's beat) takes b's cards out of placement.
        _wait(lambda: not any(c.eligible for c in a.harness.client.ledger.cards() if c.node == "b"), 30,
              "the stopped node's cards to leave placement")
        stranded = sc.submit(gpu_memory="10G", pool="only-b")
        served = sc.submit(gpu_memory="10G")
        sc.wait_running([served])
        refused = a.cli("forget-node", "b")
        line = _one_line(refused)
        sc.result.notes.append(f"rig forget-node b: {line}")
        if refused.returncode != 10 or f"FAIL waiting job(s) {stranded} (failure class unschedulable" not in line \
                or "--force" not in line:
            sc.result.problems.append(f"forget-node of a stopped node was not refused saying what it would do: "
                                      f"{refused.returncode} {line}")
        job = sc.node.client.get(stranded)
        names = {n.name for n in NodeRegistry(a.harness.redis, a.harness.keys).read()}
        if job.state is not JobState.PENDING or "b" not in names:
            sc.result.problems.append(f"the refused forget changed something: job {job.state.value}, nodes {names}")
        forced = a.cli("forget-node", "b", "--force")
        sc.result.notes.append(f"--force: {forced.stdout.strip()}")
        job = sc.node.client.get(stranded)
        # Failed by forget-node (and said there), or, in the same moment, by the dispatcher's pass
        # that found the pool without cards once b's were gone: unschedulable either way.
        said_by_forget = "node b was forgotten" in (job.reason or "") and f"job {stranded} FAILED" in forced.stdout
        said_by_pass = "in pool 'only-b': no cards are registered" in (job.reason or "")
        if forced.returncode != 0 or job.state is not JobState.FAILED or job.failure != "unschedulable" \
                or not (said_by_forget or said_by_pass):
            sc.result.problems.append(f"--force: exit {forced.returncode}, job {job.state.value} class {job.failure} "
                                      f"reason {job.reason!r}")
        sc.finish(timeout=90)
        return sc.result
    finally:
        _close(sc, [a, b])


def _password_redis(workdir: Path, port: int, password: str) -> subprocess.Popen:
    """A redis-server without persistence on ``port`` that wants ``password``."""
    from rig.testing.throwaway_redis import start_redis

    return start_redis(port, workdir, password=password)


def _pings(client) -> bool:  # noqa: ANN001 - redis.Redis
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def password_changed(workdir: Path) -> ScenarioResult:
    """The operator changes Redis' password (and drops the clients) while a job runs, and the
    node still has the old one: `rig status` (with the new password) says the node cannot
    authenticate; its control.log grows by a line now and then, not by tracebacks; once the
    old password works again the node comes back and the job ends once."""
    import redis

    port = _free_port()
    server = _password_redis(workdir / "redis", port, "old-pass")
    prefix = new_prefix()
    a = Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix,
             redis_url=f"redis://:old-pass@127.0.0.1:{port}/0")
    sc = Scenario(workdir, "Redis password changed under a node", "CONFIG SET requirepass; CLIENT KILL",
                  node=a.harness)
    new_env = {"RIG_REDIS_URL": f"redis://:new-pass@127.0.0.1:{port}/0", "COLUMNS": "1000"}
    admin = redis.Redis(port=port, password="old-pass", decode_responses=True)
    try:
        if a.up().returncode != 0:
            sc.result.problems.append("rig up failed")
            return sc.result
        jid = sc.submit(gpu_memory="10G")
        sc.wait_running([jid])
        admin.config_set("requirepass", "new-pass")
        admin = redis.Redis(port=port, password="new-pass", decode_responses=True)
        admin.client_kill_filter(_type="normal", skipme=True)
        said: list[str] = []

        def status_says() -> bool:
            out = a.cli("status", env=new_env).stdout
            said[:] = [line.strip() for line in out.splitlines() if "cannot authenticate" in line]
            return bool(said)

        _wait(status_says, 60, "rig status to say the node cannot authenticate")
        sc.result.notes.append(f"rig status: {said[0]}")
        log = a.settings.rig_log_dir / "control.log"
        before = log.stat().st_size
        time.sleep(6.0)  # a measured interval, not a synchronisation
        rate = (log.stat().st_size - before) / 6.0
        sc.result.notes.append(f"control.log grew {rate:.0f} B/s while refused")
        if rate > 200:
            sc.result.problems.append(f"control.log grew {rate:.0f} B/s while Redis refused the node")
        admin.config_set("requirepass", "old-pass")  # the operator puts the old password back
        _wait(lambda: "cannot authenticate" not in a.cli("status", env={"COLUMNS": "1000"}).stdout
              and any(n.state == "up" for n in NodeRegistry(a.harness.redis, a.harness.keys).read()), 90,
              "the node to come back")
        sc.finish(timeout=120)
        return sc.result
    finally:
        _close(sc, [a])
        server.kill()
        server.wait()


def _card_log_says(home: Home, text: str) -> bool:
    """Does any worker log of ``home`` contain ``text``?"""
    for path in home.settings.rig_log_dir.glob("card*.log"):
        try:
            if text in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def name_taken_over_adopts(workdir: Path) -> ScenarioResult:
    prefix = new_prefix()
    a, b = (Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix),
            Home(workdir, "homeB", node="a", fake_gpus="1x80G", prefix=prefix))
    sc = Scenario(workdir, "node name taken over by another home adopts its jobs",
                  "SIGKILL of A's rig up, B takes the name; rig down of B, jobs end, A takes it back",
                  node=a.harness)
    gates = {n: workdir / f"go-{n}" for n in (2, 3)}
    marks: dict[int, Path] = {}

    def submit(n: int, gate: Path) -> int:
        mark = workdir / f"mark-{n}"
        body = f'echo ran >> "{mark}"; while [ ! -f "{gate}" ]; do sleep 0.05; done'
        jid = sc.submit(body, gpu_memory="10G")
        marks[jid] = mark
        return jid

    try:
        if a.up().returncode != 0:
            sc.result.problems.append("home A's rig up failed")
            return sc.result
        j1, j2 = submit(1, sc.go), submit(2, gates[2])
        sc.wait_running([j1, j2])
        a.sigkill_up()
        took = b.up()
        if took.returncode != 0:
            sc.result.problems.append(f"home B could not take the name over: {_one_line(took)}")
            return sc.result
        sc.node = b.harness
        # B's card worker adopts both at its start (its log says so), never starting them again.
        try:
            _wait(lambda: all(_card_log_says(b, f"job {j}: adopting running pid") for j in (j1, j2)), 60,
                  "home B to adopt the running jobs")
        except TimeoutError:
            sc.result.problems.append(f"home B did not adopt jobs {j1}, {j2} (see {b.settings.rig_log_dir})")
        j3 = submit(3, gates[3])  # started under B's log_dir
        sc.wait_running([j3])
        if b.cli("down", "--node", "a", timeout=90).returncode != 0:
            sc.result.problems.append("rig down --node a of home B failed")
        for gate in gates.values():
            gate.touch()  # jobs 2 and 3 end while no worker watches them
        _wait(lambda: all(len(_trace_ends(sc.trace, j)) >= 1 for j in (j2, j3)), 60,
              "jobs 2 and 3 to end while the node is down")
        back = a.up()
        if back.returncode != 0:
            sc.result.problems.append(f"home A could not take the name back: {_one_line(back)}")
            return sc.result
        sc.node = a.harness
        finals = sc.finish(timeout=120)
        for jid, mark in marks.items():
            lines = mark.read_text().splitlines() if mark.exists() else []
            job = finals.get(jid)
            if len(lines) != 1:
                sc.result.problems.append(f"job {jid} ran {len(lines)} times (marker lines)")
            if job is None or job.state is not JobState.SUCCEEDED or job.exit_code != 0:
                sc.result.problems.append(f"job {jid}: {job.state.value if job else 'unfinished'} "
                                          f"exit {job.exit_code if job else None} ({job.reason if job else ''})")
        card = a.harness.client.ledger.card("a", 0)
        if card.reserved:
            sc.result.problems.append(f"card a/0 keeps {card.reserved} bytes reserved")
        return sc.result
    finally:
        _close(sc, [a, b])


def supervisor_sigkill_beside_others(workdir: Path) -> ScenarioResult:
    prefix = new_prefix()
    a = Home(workdir, "homeA", node="a", fake_gpus="1x80G", prefix=prefix)
    b = Home(workdir, "homeB", node="b", fake_gpus="1x80G", prefix=prefix)
    sc = Scenario(workdir, "one node's rig up SIGKILLed beside another", "SIGKILL of b's rig up alone (its job runs on)",
                  node=a.harness)
    try:
        if b.up().returncode != 0:
            sc.result.problems.append("b's rig up failed")
            return sc.result
        sc.node = b.harness
        jid = sc.submit(gpu_memory="60G")  # on b: a is not up yet
        sc.wait_running([jid])
        if a.up(beat=True).returncode != 0:  # a runs the cluster's health checks, and could run the job
            sc.result.problems.append("a's rig up failed")
            return sc.result
        sc.node = a.harness
        b.sigkill_up()
        registry = NodeRegistry(a.harness.redis, a.harness.keys)
        _wait(lambda: _info(registry, "b").state == "stopped", 30, "node b to read stopped")
        # A declared-down node is one silent for health.timeout, confirmed a pass later: a's
        # health passes (every check_interval) have had time for that, with room for a slow host.
        health = a.settings.health
        time.sleep(health.timeout + 4 * health.check_interval + 2)
        node, job = _info(registry, "b"), a.harness.client.get(jid)
        if node.state != "stopped" or node.down_since is not None:
            sc.result.problems.append(f"node b after its rig up's SIGKILL: {node.describe} (down_since {node.down_since})")
        if job.state is not JobState.RUNNING or job.attempt != 1 or job.node != "b":
            sc.result.problems.append(f"job {jid} while b's rig up is gone: {job.state.value}, attempt {job.attempt} "
                                      f"on {job.node} (its first attempt still runs on b)")
        if b.up().returncode != 0:
            sc.result.problems.append("b's rig up after the SIGKILL failed")
            return sc.result
        if _info(registry, "b").state != "up":
            sc.result.problems.append(f"node b back: {_info(registry, 'b').describe}")
        finals = sc.finish(timeout=90)
        final = finals.get(jid)
        if final is None or final.state is not JobState.SUCCEEDED or final.attempt != 1:
            sc.result.problems.append(f"job {jid}: {final.state.value if final else 'unfinished'}, "
                                      f"attempt {final.attempt if final else None}")
        return sc.result
    finally:
        _close(sc, [a, b])


def _info(registry: NodeRegistry, name: str):  # noqa: ANN202 - rig.nodes.NodeInfo
    return next(n for n in registry.read() if n.name == name)


def _trace_ends(trace: Path, job_id: int) -> list[str]:
    """The trace's end lines of job ``job_id``."""
    try:
        lines = trace.read_text().splitlines()
    except OSError:
        return []
    return [line for line in lines if line.startswith(f"{job_id} ") and line.endswith(" end")]


SCENARIOS = [
    ("two-homes-one-name", two_homes_one_name),
    ("crashed-owner-taken-over", crashed_owner_taken_over),
    ("down-from-other-home", down_from_other_home),
    ("sigkill-lone-node", sigkill_lone_node),
    ("supervisor-sigkill-beside-others", supervisor_sigkill_beside_others),
    ("forget-stopped-node", forget_stopped_node),
    ("password-changed", password_changed),
    ("name-taken-over-adopts", name_taken_over_adopts),
]
