#!/usr/bin/env python3
"""Where a job's time goes: submit -> dispatcher -> card worker -> exec -> exit -> release.

Starts a private redis-server on a spare port (no persistence, nothing else on it, so its
command counts are rig's alone) and a throwaway node on it (8 x 80 GB fake cards,
max_task_per_gpu 4, real Celery workers, no Flower, no beat), with RIG_TRACE_DIR set so the
workers mark each job's stages (rig.jobtrace). Then (a phase given 0 jobs is skipped):

  0. with --submit-calls N: N submit() calls one after another, the caller's CPU per call;

  1. timeline: N sequential jobs on an idle node (each ``sh -c 'date +%s.%N > FILE'``, as in
     scripts/bench_dispatch.py); per stage, the median and p90 of the step from the stage
     before, and the cumulative median from the submit() call;
  2. Redis round trips: MONITOR over K of those jobs, each command attributed to the process
     that sent it (its TCP port -> pid, with ss), minus the same node's idle traffic; commands
     run inside a Lua script are counted apart (they are no round trip);
  3. throughput: M tiny jobs (``true``) in one submit_many(): completions/s, the CPU each
     process spent per job (utime+stime deltas from /proc; the job processes themselves as
     the card workers' reaped children), and INFO commandstats deltas per job, minus an idle
     period of the same length; then the card workers' CPU per job by step, exactly, from the
     thread CPU time each mark carries (a job runs on a thread of its own), and what the rest of
     the card workers spent beside those threads; and the dispatcher passes per job.

    .venv/bin/python scripts/profile_job_path.py [--jobs 30] [--monitor-jobs 5] [--tiny-jobs 500] [--submit-calls N]
        [--port 6391] [--py-spy DIR [--py-spy-gil]] [--home-in DIR]

With ``--py-spy DIR`` a py-spy raw profile of the control worker and of one card worker is
recorded during phase 3 (py-spy must be installed in the venv).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

#: (stage, what it is, the stage its step is measured from: the first of them a job has)
STAGES = [
    ("submit", "submit() called", None),
    ("wake", "dispatcher woke (BLPOP returned)", "submit"),
    ("submitted", "submit() returned (record stored, dispatcher woken, Flower message sent)", "submit"),
    ("reserved", "reservation done (Lua)", "wake"),
    ("sent", "start message sent (Celery; before the start list)", "reserved"),
    ("received", "card worker task began (Celery; before the start list)", "sent"),
    ("taken", "card worker took the start off its list (BLMOVE; pushed by the reservation)", "reserved"),
    ("claimed", "claim done (Lua)", ("received", "taken")),
    ("read", "record read", "claimed"),
    ("checked", "start checks done", "read"),
    ("keeper", "log keeper forked", "checked"),
    ("popen", "Popen returned", "keeper"),
    ("exec", "job's first instruction", "popen"),
    ("recorded", "pid recorded (worker, beside the job)", "popen"),
    ("exit_seen", "exit seen (the job: sh + date)", "exec"),
    ("outcome", "outcome gathered", "exit_seen"),
    ("concluded", "concluded, reservation released", "outcome"),
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime+stime, cutime+cstime) of ``pid`` in clock ticks."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0, 0
    f = data[data.rfind(")") + 2:].split()
    return int(f[11]) + int(f[12]), int(f[13]) + int(f[14])


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children = defaultdict(list)
    for line in out.split("\n"):
        if line.strip():
            p, pp = map(int, line.split())
            children[pp].append(p)
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            found.append(c)
            todo.append(c)
    return found


def role_of_pids(stack) -> dict[int, str]:  # noqa: ANN001
    """pid -> role: the stack's children and what they started (keeper servers)."""
    roles = {os.getpid(): "client"}
    for child in stack.children:
        if child.proc is None:
            continue
        roles[child.proc.pid] = child.name
        for pid in descendants(child.proc.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "logkeeper" in cmd:
                roles.setdefault(pid, "keeper-server")
            elif "celery" in cmd:
                roles.setdefault(pid, child.name)
    return roles


def group(role: str) -> str:
    return "card workers" if role.startswith("card") else role


def port_owners(port: int) -> dict[int, int]:
    """local TCP port -> pid, for connections to the redis port."""
    out = subprocess.run(["ss", "-tnpH", f"dport = :{port}"], capture_output=True, text=True).stdout
    owners = {}
    for line in out.split("\n"):
        m = re.search(r"\S+:(\d+)\s+\S+:" + str(port) + r"\s+users:\(\(\"[^\"]*\",pid=(\d+)", line)
        if m:
            owners[int(m.group(1))] = int(m.group(2))
    return owners


def main() -> int:  # noqa: C901, PLR0915
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--monitor-jobs", type=int, default=5)
    parser.add_argument("--tiny-jobs", type=int, default=500)
    parser.add_argument("--submit-calls", type=int, default=0,
                        help="first time this many submit() calls alone: the caller's CPU per call")
    parser.add_argument("--port", type=int, default=6391)
    parser.add_argument("--py-spy", metavar="DIR")
    parser.add_argument("--py-spy-gil", action="store_true",
                        help="sample only the thread holding the GIL (default: every thread on a CPU)")
    parser.add_argument("--home-in", metavar="DIR", default=None,
                        help="make the throwaway rig home (job logs, pid and exit files) in DIR (default: the "
                             "system's temporary folder). On this host creating a file on the ext4 root costs "
                             "0.03-1 ms of CPU depending on the other tenants' I/O; /dev/shm takes that out")
    parser.add_argument("--dump-monitor", metavar="FILE", help="write the MONITOR lines of phase 2, with senders")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="rig-profile-", dir=args.home_in))
    trace_dir = home / "trace"
    trace_dir.mkdir()
    os.environ["RIG_TRACE_DIR"] = str(trace_dir)  # before rig.jobtrace is imported; workers inherit it
    from rig import jobtrace
    from rig.client import Client
    from rig.config import load_settings
    from rig.models import JobState
    from rig.stack import Stack, UpOptions

    url = f"redis://127.0.0.1:{args.port}/0"
    settings = load_settings(home=home, redis_url=url, key_prefix=f"rigprof:{uuid.uuid4().hex[:6]}:",
                             fake_gpus="8x80G", node_name="prof", max_task_per_gpu=4)
    stack = Stack(settings, UpOptions(no_flower=True, no_beat=True, no_metrics=True), say=lambda m: None)
    redis_proc = subprocess.Popen(
        ["redis-server", "--port", str(args.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(home)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis.from_url(url, decode_responses=True)
    up = False
    try:
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if redis_proc.poll() is not None or int(r.info("server")["process_id"]) != redis_proc.pid:
            print(f"port {args.port} is taken by another Redis: choose another with --port", file=sys.stderr)
            return 1
        up = True
        stack.up()
        missing = stack.wait_ready(timeout=180)
        if missing:
            print(f"workers did not start: {missing}", file=sys.stderr)
            return 1
        client = Client(settings)
        for _ in range(3):
            client.submit("true", gpu_memory="1G").wait(60)  # warm every connection
        roles = role_of_pids(stack)
        stamps = home / "stamps"
        stamps.mkdir()

        # -- 0. submit() alone ---------------------------------------------------------------
        if args.submit_calls:
            # This thread's CPU (time.thread_time: user + system) around the calls alone; the
            # node runs the jobs (`true`) meanwhile in its own processes.
            cpu0, wall0 = time.thread_time(), time.monotonic()
            calls = [client.submit("true", gpu_memory="1G") for _ in range(args.submit_calls)]
            cpu_call = (time.thread_time() - cpu0) * 1000 / args.submit_calls
            wall_call = (time.monotonic() - wall0) * 1000 / args.submit_calls
            for handle in calls:
                handle.wait(600)  # the node idle again before the next phase
            print(f"\n## 0. {args.submit_calls} submit() calls one after another: {cpu_call:.3f} ms of the "
                  f"caller's CPU and {wall_call:.3f} ms wall per call")

        # -- 1. timeline ----------------------------------------------------------------
        def one_job() -> int:
            jobtrace_begin = time.time()
            handle = client.submit(["sh", "-c", f'date +%s.%N > {stamps}/"$RIG_JOB_ID"'], gpu_memory="2G")
            jobtrace.mark(handle.id, "submitted")
            begins[handle.id] = jobtrace_begin
            handle.wait(60)
            time.sleep(0.05)  # let the worker's last marks land
            return handle.id

        begins: dict[int, float] = {}
        if args.jobs:
            ids = [one_job() for _ in range(args.jobs)]
            marks = read_marks(trace_dir)
            for jid in ids:
                marks[jid]["submit"] = begins[jid]
                marks[jid]["exec"] = float((stamps / str(jid)).read_text())
            wakes = sorted(t for jid, stage, t in _raw(trace_dir) if stage == "wake")
            for jid in ids:
                # The wake that led to the reservation: the last one before it.
                reserved = marks[jid].get("reserved")
                before = [w for w in wakes if reserved is not None and w <= reserved]
                if before and before[-1] >= marks[jid]["submit"]:
                    marks[jid]["wake"] = before[-1]
            print(f"\n## 1. Timeline of {len(ids)} sequential jobs on an idle node (ms)\n")
            print("| stage | step median | step p90 | from submit() median |")
            print("|---|---|---|---|")
            for stage, label, after_stage in STAGES:
                steps, totals = [], []
                for jid in ids:
                    m = marks[jid]
                    if stage not in m:
                        continue
                    befores = (after_stage,) if isinstance(after_stage, str) else after_stage or ()
                    prev = next((m[b] for b in befores if b in m), None)
                    if prev is not None:
                        steps.append((m[stage] - prev) * 1000)
                    totals.append((m[stage] - m["submit"]) * 1000)
                if totals:
                    print(f"| {label} (`{stage}`) | {statistics.median(steps) if steps else 0:.2f} | "
                          f"{pct(steps, 0.9) if steps else 0:.2f} | {statistics.median(totals):.2f} |")
            exec_lat = [(marks[j]["exec"] - marks[j]["submit"]) * 1000 for j in ids]
            print(f"\nsubmit -> first instruction: p50 {statistics.median(exec_lat):.1f} ms, "
                  f"p99 {pct(exec_lat, 0.99):.1f} ms, max {max(exec_lat):.1f} ms")

        # -- 2. Redis commands per job, by process ---------------------------------------
        if args.monitor_jobs:
            idle_counts, idle_s = monitor(r, args.port, lambda: time.sleep(2.0), roles)
            busy_counts, busy_s = monitor(r, args.port, lambda: [one_job() for _ in range(args.monitor_jobs)], roles,
                                          dump=args.dump_monitor)
            n = args.monitor_jobs
            print(f"\n## 2. Redis commands per job, by sender ({n} sequential jobs under MONITOR, "
                  f"{busy_s:.2f} s; idle traffic of the same length subtracted)\n")
            print("| sender | commands per job (round trips and pipelined) | inside Lua | top commands |")
            print("|---|---|---|---|")
            for who in sorted({k[0] for k in busy_counts}):
                outside = Counter({k[2]: v for k, v in busy_counts.items() if k[0] == who and not k[1]})
                inside = sum(v for k, v in busy_counts.items() if k[0] == who and k[1])
                idle_out = Counter({k[2]: v * busy_s / idle_s for k, v in idle_counts.items()
                                    if k[0] == who and not k[1]})
                net = {c: outside[c] - idle_out.get(c, 0) for c in outside}
                net_total = sum(net.values()) / n
                idle_in = sum(v * busy_s / idle_s for k, v in idle_counts.items() if k[0] == who and k[1])
                top = ", ".join(f"{c} {v / n:.1f}" for c, v in sorted(net.items(), key=lambda x: -x[1])[:8]
                                if v / n >= 0.5)
                print(f"| {who} | {net_total:.1f} | {(inside - idle_in) / n:.1f} | {top} |")

        # -- 3. throughput, CPU and commandstats -----------------------------------------
        if args.tiny_jobs:
            roles = role_of_pids(stack)
            redis_pid = redis_proc.pid
            pids = {**roles, redis_pid: "redis-server"}

            hz = os.sysconf("SC_CLK_TCK")

            def snapshot() -> tuple[dict[int, tuple[int, int]], dict[str, int], float]:
                stats = r.info("commandstats")
                used = r.info("cpu")
                ticks = {p: cpu_ticks(p) for p in pids}
                ticks[redis_pid] = (round((used["used_cpu_sys"] + used["used_cpu_user"]) * hz), 0)
                return (ticks,
                        {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}, time.monotonic())

            spies = []
            if args.py_spy:
                out = Path(args.py_spy)
                out.mkdir(parents=True, exist_ok=True)
                control = next(p for p, role in roles.items() if role == "control" and _is_main(p, roles))
                card = next(p for p, role in roles.items() if role == "card0" and _is_main(p, roles))
                spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                for pid, name in ((control, "control"), (card, "card0")):
                    spies.append(subprocess.Popen(
                        [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250", "--threads",
                         *(["--gil"] if args.py_spy_gil else []), "--output", str(out / f"{name}.txt"), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                time.sleep(1.0)
            before = snapshot()
            tiny = {"command": ["true"], "gpu_memory": "1G", "priority": "low"}
            begin = time.monotonic()
            handles = client.submit_many([tiny] * args.tiny_jobs)
            finals = [client.wait(h.id, timeout=600) for h in handles]
            took = time.monotonic() - begin
            after = snapshot()
            for spy in spies:
                spy.send_signal(2)
            for spy in spies:
                spy.wait(30)
            time.sleep(0.5)
            idle_before = snapshot()
            time.sleep(min(took, 10.0))
            idle_after = snapshot()
            ok = sum(1 for f in finals if f.state is JobState.SUCCEEDED)
            n = args.tiny_jobs
            print(f"\n## 3. {n} tiny jobs (`true`) in one submit_many(): all ended after {took:.2f} s = "
                  f"{n / took:.0f} jobs/s; succeeded {ok}/{n}\n")
            wall0, wall1 = time.time() - (time.monotonic() - begin), time.time() - (time.monotonic() - begin - took)
            scale = (after[2] - before[2]) / (idle_after[2] - idle_before[2])
            rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for pid, role in pids.items():
                busy = [a - b for a, b in zip(after[0].get(pid, (0, 0)), before[0].get(pid, (0, 0)), strict=True)]
                idle = [a - b for a, b in zip(idle_after[0].get(pid, (0, 0)), idle_before[0].get(pid, (0, 0)), strict=True)]
                rows[group(role)][0] += (busy[0] - idle[0] * scale) / hz * 1000 / n
                rows[group(role)][1] += busy[1] / hz * 1000 / n
            print("| process | CPU ms per job (idle subtracted) | reaped children's CPU ms per job |")
            print("|---|---|---|")
            total = 0.0
            for name, (own, kids) in sorted(rows.items(), key=lambda x: -x[1][0] - x[1][1]):
                total += own + (kids if name != "client" else 0)
                print(f"| {name} | {own:.2f} | {kids:.2f} |")
            keepers = sum(cpu for jid, stage, t, _p, _t, cpu in _raw_full(trace_dir)
                          if stage == "keeper_end" and wall0 <= t <= wall1 + 1.0) * 1000 / n
            if keepers:  # reaped by the kernel: in no row above (rig.logkeeper marks its own CPU)
                total += keepers
                print(f"| log keepers (one per job, their own CPU) | {keepers:.2f} | |")
            print(f"| all (wall {took / n * 1000:.2f} ms per job x 2 cores = {took / n * 2000:.2f}) | {total:.2f} | |")
            passes = sum(1 for jid, stage, t in _raw(trace_dir) if stage == "wake" and wall0 <= t <= wall1)
            print(f"\nDispatcher passes (wake-ups that ran a pass): {passes} for {n} jobs = {passes / n:.2f} per job")
            steps, taking = thread_cpu(trace_dir, {h.id for h in handles}, pids)
            if steps:
                on_threads = sum(sum(v) for v in steps.values()) / n
                print("\nThe card workers' CPU per job by step, on each job's own thread (rig.jobtrace's thread "
                      "CPU time; ms):\n")
                print("| step | mean | median | p90 |")
                print("|---|---|---|---|")
                for name, values in steps.items():
                    print(f"| {name} | {sum(values) / len(values):.3f} | {statistics.median(values):.3f} | "
                          f"{pct(values, 0.9):.3f} |")
                cards = rows["card workers"][0]
                print(f"| the jobs' threads, all steps | {on_threads:.3f} | | |")
                print(f"| the taking threads (BLMOVE, thread start) | {taking:.3f} | | |")
                print(f"| the rest of the card workers (Celery's loop, heartbeat, kill listener, GC, ...) "
                      f"| {cards - on_threads - taking:.3f} | | |")
            calls = Counter()
            for cmd, v in after[1].items():
                calls[cmd] += v - before[1].get(cmd, 0)
            for cmd, v in idle_after[1].items():
                calls[cmd] -= (v - idle_before[1].get(cmd, 0)) * scale
            calls = Counter({k: v for k, v in calls.items() if v / n >= 0.05})
            print(f"\nRedis commands per job (INFO commandstats, Lua's inner commands included): "
                  f"{sum(calls.values()) / n:.1f}")
            print(", ".join(f"{k} {v / n:.1f}" for k, v in calls.most_common()))
            if args.py_spy:
                print(f"\npy-spy raw profiles in {args.py_spy} (control.txt, card0.txt)")
        return 0
    finally:
        if up:
            stack.down()
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def _is_main(pid: int, roles: dict[int, str]) -> bool:
    """The worker's main process (not a child it started)."""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return roles.get(ppid) != roles.get(pid)


def _raw(trace_dir: Path):
    for jid, stage, t, _pid, _tid, _cpu in _raw_full(trace_dir):
        yield jid, stage, t


def _raw_full(trace_dir: Path):
    """(job id or None, stage, epoch s, pid, thread id, thread CPU s) of every mark."""
    for f in trace_dir.glob("*.trace"):
        for line in f.read_text().splitlines():
            jid, stage, t, pid, *thread = line.split()  # an older rig's marks carry no thread
            tid, cpu = (int(thread[0]), float(thread[1])) if len(thread) == 2 else (0, float("nan"))
            yield (None if jid == "-" else int(jid)), stage, float(t), int(pid), tid, cpu


#: A card worker's marks of one job on the job's own thread, in order ("ended": the thread's last).
THREAD_STAGES = ["claimed", "read", "checked", "keeper", "popen", "recorded", "exit_seen", "outcome",
                 "concluded", "ended"]


def thread_cpu(trace_dir: Path, ids: set[int], roles: dict[int, str]) -> tuple[dict[str, list[float]], float]:
    """The card workers' CPU per job by step, from the thread CPU time in each mark: {step:
    [ms per job]} for the steps on the job's own thread (from its start to ``claimed``, then
    between marks), and the CPU of the taking threads (BLMOVE loop), in ms per job."""
    # A job's thread handles that job alone, and thread ids are reused once a thread ends: its
    # marks are keyed by the job too. The taking thread marks "taken" for every job it takes.
    by_thread: dict[tuple[int, int, int | None], list[tuple[str, float]]] = defaultdict(list)
    takers: dict[tuple[int, int], list[float]] = defaultdict(list)
    for jid, stage, _t, pid, tid, cpu in _raw_full(trace_dir):
        if group(roles.get(pid, "")) != "card workers" or jid not in ids:
            continue
        if cpu != cpu:  # NaN: marks without thread CPU (an older rig)
            continue
        if stage == "taken":
            takers[(pid, tid)].append(cpu)
        elif stage in THREAD_STAGES:
            by_thread[(pid, tid, jid)].append((stage, cpu))
    steps: dict[str, list[float]] = defaultdict(list)
    taking = 0.0
    for cpus in takers.values():
        if len(cpus) > 1:  # the first take's CPU since the thread began is not this run's
            taking += (cpus[-1] - cpus[0]) * 1000 * len(cpus) / (len(cpus) - 1)
    for marks in by_thread.values():
        prev, prev_cpu = "thread start", 0.0
        for st, cpu in sorted(marks, key=lambda m: THREAD_STAGES.index(m[0])):
            steps[f"{prev} -> {st}"].append((cpu - prev_cpu) * 1000)
            prev, prev_cpu = st, cpu
    return steps, taking / max(1, len(ids))


def read_marks(trace_dir: Path) -> dict[int, dict[str, float]]:
    marks: dict[int, dict[str, float]] = defaultdict(dict)
    for jid, stage, t in _raw(trace_dir):
        if jid is not None:
            marks[jid].setdefault(stage, t)
    return marks


def monitor(r: redis.Redis, port: int, work, roles: dict[int, str],  # noqa: ANN001
            dump: str | None = None) -> tuple[Counter, float]:
    """Run ``work()`` under MONITOR; count commands by (sender role, inside Lua, command)."""
    lines: list[str] = []
    stop = threading.Event()
    conn = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)

    def reader() -> None:
        with conn.monitor() as m:
            ready.set()
            for cmd in m.listen():
                if stop.is_set():
                    break
                lines.append((cmd.get("client_port"), cmd.get("client_type"), cmd["command"], cmd["time"]))

    ready = threading.Event()
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.1)
    begin = time.monotonic()
    work()
    took = time.monotonic() - begin
    stop.set()
    r.ping()  # one more line so the reader sees the stop
    thread.join(5)
    owners = port_owners(port)
    counts: Counter = Counter()
    out = open(dump, "w") if dump else None  # noqa: SIM115
    for client_port, ctype, command, when in lines:
        if ctype == "lua":
            inside, port_no = True, None
        else:
            inside = False
            try:
                port_no = int(client_port)
            except (TypeError, ValueError):
                port_no = None
        pid = owners.get(port_no) if port_no else None
        who = group(roles.get(pid, "?")) if pid else ("(lua)" if inside else "?")
        counts[(who, inside, command.split(" ", 1)[0].upper().strip('"'))] += 1
        if out:
            out.write(f"{when:.6f} {who:14s} {'  lua ' if inside else ''}{command[:200]}\n")
    if out:
        out.close()
    return counts, took


if __name__ == "__main__":
    sys.exit(main())
