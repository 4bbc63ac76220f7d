"""A real node: Celery workers on 8 fake cards, real Redis, real subprocess jobs."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rig.celery_config import TASK_START_JOB, card_queue
from rig.memory import GIB
from rig.models import TERMINAL_STATES, JobState
from tests.integration.harness import RigHarness

pytestmark = [pytest.mark.slow, pytest.mark.background]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    harness = RigHarness(tmp_path_factory.mktemp("rig-home"), fake_gpus="8x80G", max_task_per_gpu=4)
    harness.up()
    yield harness
    harness.cleanup()


class LedgerSampler(threading.Thread):
    """Reads every card's ledger entry continuously and records any broken invariant."""

    def __init__(self, node: RigHarness) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.samples = 0

    def run(self) -> None:
        import redis

        r = redis.Redis.from_url(self.node.settings.redis_url, decode_responses=True)
        keys = self.node.keys
        ids = sorted(r.smembers(keys.cards))
        while not self.stop.is_set():
            pipe = r.pipeline(transaction=True)  # one consistent snapshot of all cards
            for cid in ids:
                node, _, index = cid.rpartition("/")
                pipe.hgetall(keys.card(node, index))
                pipe.hgetall(keys.card_jobs(node, index))
            replies = pipe.execute()
            for cid, card, holds in zip(ids, replies[::2], replies[1::2], strict=True):
                reserved, jobs = int(card["reserved"]), int(card["jobs"])
                if reserved > int(card["usable"]):
                    self.violations.append(f"{cid}: reserved {reserved} > usable {card['usable']}")
                if jobs > int(card["max_jobs"]):
                    self.violations.append(f"{cid}: {jobs} jobs > max {card['max_jobs']}")
                if reserved != sum(int(v) for v in holds.values()) or jobs != len(holds):
                    self.violations.append(f"{cid}: counters disagree with holdings {holds}")
            self.samples += 1
            time.sleep(0.005)


def test_200_random_jobs_never_oversubscribe_and_see_their_cards(node, tmp_path):
    trace = tmp_path / "trace.txt"
    rng = random.Random(7)
    sampler = LedgerSampler(node)
    sampler.start()
    submitted = {}
    script = ('echo "$RIG_JOB_ID $CUDA_VISIBLE_DEVICES $(date +%s.%N) start" >> "$TRACE"; '
              'sleep "$DUR"; echo "$RIG_JOB_ID $CUDA_VISIBLE_DEVICES $(date +%s.%N) end" >> "$TRACE"')
    for _ in range(200):
        gib = rng.choice([1, 2, 5, 10, 20, 30, 40, 70])
        gpus = 2 if rng.random() < 0.1 else 1
        handle = node.client.submit(
            script, gpu_memory=f"{gib}G", gpus=gpus, priority=rng.choice(["high", "medium", "low"]),
            env={"TRACE": str(trace), "DUR": f"{rng.uniform(0.05, 0.4):.2f}"},
        )
        submitted[handle.id] = (gib * GIB, gpus)
    finals = {jid: node.client.wait(jid, timeout=240) for jid in submitted}
    sampler.stop.set()
    sampler.join()

    assert sampler.samples > 50
    assert sampler.violations == []
    assert {j.state for j in finals.values()} == {JobState.SUCCEEDED}
    # Every job ran exactly once, on exactly the cards its record names.
    starts: dict[int, list[str]] = defaultdict(list)
    intervals = []
    open_at: dict[int, float] = {}
    for line in trace.read_text().splitlines():
        jid, cvd, stamp, what = line.split()
        jid = int(jid)
        if what == "start":
            starts[jid].append(cvd)
            open_at[jid] = float(stamp)
        else:
            intervals.append((open_at[jid], float(stamp), jid, cvd))
    assert sorted(starts) == sorted(submitted)
    for jid, seen in starts.items():
        assert len(seen) == 1, f"job {jid} started {len(seen)} times"
        assert seen[0] == ",".join(map(str, finals[jid].cards))
        assert len(finals[jid].cards) == submitted[jid][1]
    # Independent of the ledger: from the jobs' own clocks, no card ever held more than its
    # usable memory or more than max_task_per_gpu jobs at once.
    usable = int(80 * GIB * 0.95)
    events = []
    for start, end, jid, cvd in intervals:
        for card in cvd.split(","):
            events.append((start, 1, card, jid))
            events.append((end, -1, card, jid))
    load: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for _, delta, card, jid in sorted(events, key=lambda e: (e[0], e[1])):
        load[card] += delta * submitted[jid][0]
        count[card] += delta
        assert load[card] <= usable and count[card] <= 4
    # Nothing left reserved.
    for card in node.client.ledger.cards():
        assert card.reserved == 0 and card.jobs == 0


def test_kill_ends_the_whole_tree_and_frees_memory(node, tmp_path):
    marker = "377.123"
    handle = node.client.submit(
        f"sleep {marker} & (sleep {marker} &); sh -c 'sleep {marker}' & sleep {marker}",
        gpu_memory="30G", name="tree",
    )
    node.wait_for_state(handle.id, {JobState.RUNNING})
    deadline = time.monotonic() + 10
    while len(_processes_with(marker)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)  # the job's shell needs a moment to fork its children
    assert len(_processes_with(marker)) >= 4
    job = node.client.kill(handle.id)
    assert job.state is JobState.CANCELLED
    assert job.reason.startswith("cancelled by")
    assert _processes_with(marker) == []
    card = node.client.ledger.card(job.node, job.cards[0])
    assert handle.id not in node.client.ledger.holdings(job.node, job.cards[0])
    assert card.reserved == sum(node.client.ledger.holdings(job.node, job.cards[0]).values())


def test_refused_and_unknown_jobs(node):
    from rig.errors import JobNotFound, Unschedulable

    before = node.client.store.count_by_state()
    with pytest.raises(Unschedulable, match="largest card offers 76.0 GiB"):
        node.client.submit("true", gpu_memory="80G")  # 80 GiB > 76 GiB usable
    with pytest.raises(Unschedulable, match="needs 9 cards"):
        node.client.submit("true", gpu_memory="1G", gpus=9)
    assert node.client.store.count_by_state() == before  # nothing half-written
    with pytest.raises(JobNotFound):
        node.client.kill(999999)


def test_duplicate_start_message_runs_nothing_twice(node, tmp_path):
    runs = tmp_path / "runs.txt"
    handle = node.client.submit(f'echo run >> {runs}; sleep 1', gpu_memory="1G")
    node.wait_for_state(handle.id, {JobState.RUNNING})
    job = node.client.get(handle.id)
    # Celery redelivers (visibility timeout, reconnect restore): simulate it twice.
    for _ in range(2):
        node.client.celery.send_task(TASK_START_JOB, args=[job.id, str(job.assignments)],
                                     queue=card_queue(job.node, job.cards[0]))
    final = node.client.wait(handle.id, timeout=30)
    assert final.state is JobState.SUCCEEDED and final.attempt == 1
    node.client.celery.send_task(TASK_START_JOB, args=[job.id, str(job.assignments)],
                                 queue=card_queue(job.node, job.cards[0]))
    probe = node.client.submit("true", gpu_memory="1G")  # a later job: the queue was served
    assert node.client.wait(probe.id, timeout=30).state is JobState.SUCCEEDED
    assert runs.read_text().splitlines() == ["run"]


def test_missing_command_fails_with_reason_in_log(node):
    handle = node.client.submit(["definitely-not-a-command-xyz", "--flag"], gpu_memory="1G")
    job = node.client.wait(handle.id, timeout=30)
    assert job.state is JobState.FAILED and job.exit_code == 127
    assert "command not found" in job.reason
    log = Path(job.log_paths[0]).read_text()
    assert "definitely-not-a-command-xyz" in log
    card = node.client.ledger.card(job.node, job.cards[0])
    assert handle.id not in node.client.ledger.holdings(job.node, job.cards[0]) and card


def test_failed_job_exit_code_and_wait_and_workdir(node, tmp_path):
    (tmp_path / "data.txt").write_text("payload\n")
    handle = node.client.submit("cat data.txt; pwd; exit 3", gpu_memory="1G", workdir=tmp_path)
    job = handle.wait(timeout=30)
    assert job.state is JobState.FAILED and job.exit_code == 3
    assert Path(job.log_paths[0]).read_text().splitlines() == ["payload", str(tmp_path)]


def test_train_delay_runs_function_in_fresh_process_on_its_card(node):
    from tests.integration import sample_tasks

    handle = sample_tasks.probe.apply_async((21,), client=node.client)
    result = handle.get(timeout=60)
    assert handle.result == result  # the property waits the same way
    job = handle.record
    assert result["double"] == 42
    assert result["cuda_visible_devices"] == ",".join(map(str, job.cards))
    assert result["device_order"] == "PCI_BUS_ID"
    assert result["pid"] != os.getpid()
    assert result["job_id"] == str(handle.id)
    assert job.priority.value == "high" and job.gpu_memory == 2 * GIB and job.kind == "python"
    from rig.client import RemoteError

    failing = sample_tasks.explode.apply_async(client=node.client)
    with pytest.raises(RemoteError, match="FAILED") as err:
        failing.get(timeout=60)
    assert "ValueError: boom from inside the job" in err.value.traceback
    assert err.value.traceback.startswith("Traceback (most recent call last)")
    assert "boom from inside the job" in failing.log()


def test_sigkill_of_a_card_worker_loses_nothing(node, tmp_path):
    runs = tmp_path / "runs.txt"
    go = tmp_path / "go"
    handle = node.client.submit(
        f'echo run >> {runs}; while [ ! -f {go} ]; do sleep 0.05; done', gpu_memory="1G",
    )
    node.wait_for_state(handle.id, {JobState.RUNNING})
    job = node.client.get(handle.id)
    name = f"card{job.cards[0]}@testnode"
    old_pid = node.worker_pid(name)
    os.kill(old_pid, signal.SIGKILL)
    # The supervisor restarts the worker; it adopts the running job.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if node.worker_pid(name) != old_pid:
                break
        except LookupError:
            pass
        time.sleep(0.1)
    assert node.worker_pid(name) != old_pid
    go.touch()
    final = node.client.wait(handle.id, timeout=60)
    assert final.state is JobState.SUCCEEDED
    assert runs.read_text().splitlines() == ["run"]
    assert handle.id not in node.client.ledger.holdings(final.node, final.cards[0])


def _processes_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != "Z":
            found.append(int(entry))
    return found


def test_all_terminal_states_known():
    assert TERMINAL_STATES == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}


def test_log_follow_streams_until_the_job_ends(node, tmp_path):
    import subprocess
    import sys

    from rig.stack import settings_env

    go = tmp_path / "go"
    handle = node.client.submit(
        f"echo first; while [ ! -f {go} ]; do sleep 0.02; done; echo second; exit 0", gpu_memory="1G")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(node.settings)}
    follower = subprocess.Popen([str(Path(sys.executable).parent / "rig"), "log", "-f", str(handle.id)],
                                env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout.readline() == "first\n"  # streamed while the job still runs
        assert node.client.get(handle.id).state is JobState.RUNNING
        go.touch()
        rest = follower.stdout.read()
        assert follower.wait(30) == 0
        assert rest == "second\n"
    finally:
        follower.kill()


def _rig_cli(node, *args: str):
    import subprocess
    import sys

    from rig.stack import settings_env

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(node.settings)}
    return subprocess.run([str(Path(sys.executable).parent / "rig"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_error_queue_retry_and_attempt_logs_from_the_cli(node):
    handle = node.client.submit('echo "attempt $RIG_ATTEMPT"; [ "$RIG_ATTEMPT" -ge 3 ]',
                                gpu_memory="2G", retries=1, name="flaky")
    job = handle.wait(timeout=60)
    assert job.state is JobState.FAILED and job.attempt == 2
    assert [Path(p).read_text() for p in job.log_paths] == ["attempt 1\n", "attempt 2\n"]
    errors = _rig_cli(node, "errors")
    assert errors.returncode == 0 and "flaky" in errors.stdout and "nonzero_exit" in errors.stdout
    assert _rig_cli(node, "log", str(job.id), "--attempt", "1").stdout == "attempt 1\n"
    shown = _rig_cli(node, "show", str(job.id)).stdout
    assert "attempt 1" in shown and "attempt 2" in shown and "error queue" in shown
    retried = _rig_cli(node, "retry", str(job.id), "--gpu-memory", "3G")
    assert retried.returncode == 0, retried.stderr
    again = node.client.wait(job.id, timeout=60)
    assert again.state is JobState.SUCCEEDED and again.attempt == 3 and again.gpu_memory == 3 * GIB
    assert Path(again.log_paths[-1]).read_text() == "attempt 3\n"
    assert job.id not in node.client.store.error_ids()
    not_in_queue = _rig_cli(node, "retry", str(job.id))
    assert not_in_queue.returncode == 2 and "not in the error queue" in not_in_queue.stderr


def test_errors_clear_and_time_limit(node):
    handle = node.client.submit("sleep 30", gpu_memory="1G", time_limit="1s")
    job = handle.wait(timeout=60)
    assert job.state is JobState.TIMEOUT and job.failure == "timeout"
    assert job.id in node.client.store.error_ids()
    cleared = _rig_cli(node, "errors", "--clear", str(job.id))
    assert cleared.returncode == 0 and job.id not in node.client.store.error_ids()
    assert node.client.get(job.id).state is JobState.TIMEOUT


def test_health_reclaims_a_zombie_reservation(node):
    from workers.health import HealthChecker

    ledger = node.client.ledger
    card = ledger.cards()[5]
    # A reservation nobody holds (as if a release had been lost).
    node.redis.hset(node.keys.card_jobs(card.node, card.index), "999999", 7 * GIB)
    node.redis.hincrby(node.keys.card(card.node, card.index), "reserved", 7 * GIB)
    node.redis.hincrby(node.keys.card(card.node, card.index), "jobs", 1)
    # This pass, or the node's own (its beat's, every check_interval) when that one holds the
    # cluster lock at this moment (None: a loaded CI host): either way it is reclaimed.
    checker, deadline = HealthChecker(node.settings, node.redis), time.monotonic() + 30
    while True:
        report = checker.run_once()
        if report is not None:
            assert (card.id, 999999, 7 * GIB) in report.reclaimed or "999999" not in \
                node.redis.hkeys(node.keys.card_jobs(card.node, card.index))
        if not node.redis.hexists(node.keys.card_jobs(card.node, card.index), "999999"):
            break
        assert time.monotonic() < deadline, "the zombie reservation was never reclaimed"
        time.sleep(0.1)
    after = ledger.card(card.node, card.index)
    assert after.reserved == card.reserved and after.jobs == card.jobs


def test_health_stops_an_orphan_of_an_ended_job(node, tmp_path):
    import subprocess

    from workers.health import HealthChecker

    done = node.client.submit("true", gpu_memory="1G").wait(timeout=30)
    env = {**os.environ, "RIG_KEY_PREFIX": node.settings.key_prefix, "RIG_NODE_NAME": node.settings.node_name,
           "RIG_REDIS_URL": node.settings.redis_url, "RIG_JOB_ID": str(done.id), "RIG_ATTEMPT": "1"}
    orphan = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        # This node's check runs here, or in its control worker (every check_interval) when that
        # one holds the node's lock: either way the orphan must be stopped.
        deadline = time.monotonic() + 30
        while orphan.poll() is None and time.monotonic() < deadline:
            report = HealthChecker(node.settings, node.redis).run_local()
            if report is not None and orphan.pid in report.orphans_stopped:
                break
            time.sleep(0.2)
        assert orphan.wait(10) != 0
    finally:
        orphan.kill()


def test_json_output_for_scripts(node):
    import json

    done = node.client.submit("true", gpu_memory="3G", name="jsonjob").wait(timeout=30)
    status = json.loads(_rig_cli(node, "status", "--json").stdout)
    assert len(status["cards"]) == 8 and {"reserved", "free", "usable", "running"} <= set(status["cards"][0])
    assert set(status["waiting"]) == {"high", "medium", "low"}
    assert any(w["role"] == "control" for w in status["workers"])
    listed = json.loads(_rig_cli(node, "jobs", "--json", "--state", "succeeded").stdout)
    assert any(j["id"] == done.id and j["state"] == "SUCCEEDED" for j in listed)
    shown = json.loads(_rig_cli(node, "show", str(done.id), "--json").stdout)
    assert shown["name"] == "jsonjob" and shown["gpu_memory"] == 3 * GIB and shown["in_error_queue"] is False
    assert json.loads(_rig_cli(node, "errors", "--json").stdout) is not None
    metrics = json.loads(_rig_cli(node, "metrics", str(done.id), "--json").stdout)
    assert metrics["attempts"][0]["outcome"] == "succeeded"


def test_cartpole_rl_job_end_to_end(node, tmp_path):
    """The seed's smoke test (M29): a real RL training job through rig, PENDING -> RUNNING ->
    SUCCEEDED, its log and its model file."""
    import json
    import sys

    pytest.importorskip("torch", reason=".ci/run installs torch==2.13.0 (CPU) for this test")
    pytest.importorskip("gymnasium")
    script = Path(__file__).resolve().parents[2] / "examples" / "cartpole" / "train.py"
    handle = node.client.submit([sys.executable, str(script), "--episodes", "40", "--out", "model.pt"],
                                gpu_memory="2G", name="cartpole", workdir=tmp_path)
    seen: list[str] = [handle._job.state.value]  # as submitted; the watch may first see it RUNNING
    job = node.client.wait(handle.id, timeout=240, on_change=lambda j: seen.append(j.state.value))
    assert job.state is JobState.SUCCEEDED, handle.log()
    assert seen[0] == "PENDING" and "RUNNING" in seen and seen[-1] == "SUCCEEDED"
    report = json.loads(handle.log().strip().splitlines()[-1])
    assert report["episodes"] == 40 and report["final_average_return"] > 0
    assert (tmp_path / "model.pt").stat().st_size > 0
    assert "device cpu (CUDA_VISIBLE_DEVICES=" in handle.log()


def test_metrics_counters_follow_real_jobs(node):
    """The counters and the start-wait histogram are fed by the real path (store, card worker's
    claim, the outcome's transition), not only by the ledger calls of the store tests."""
    from prometheus_client import CollectorRegistry

    from rig.metrics import RigCollector

    def sample(name: str, **labels) -> float:
        registry = CollectorRegistry()
        registry.register(RigCollector(node.client))
        return registry.get_sample_value(name, labels) or 0.0

    names = [("rig_jobs_submitted_total", {}), ("rig_jobs_started_total", {}),
             ("rig_job_start_wait_seconds_count", {}),
             ("rig_jobs_ended_total", {"state": "SUCCEEDED", "failure": "none"}),
             ("rig_jobs_ended_total", {"state": "FAILED", "failure": "nonzero_exit"})]
    before = [sample(name, **labels) for name, labels in names]
    ok = [node.client.submit("true", gpu_memory="1G") for _ in range(3)]
    bad = node.client.submit("exit 3", gpu_memory="1G", retries=0)
    assert {h.wait(timeout=60).state for h in ok} == {JobState.SUCCEEDED}
    assert bad.wait(timeout=60).state is JobState.FAILED
    after = [sample(name, **labels) for name, labels in names]
    assert [b - a for a, b in zip(before, after, strict=True)] == [4, 4, 4, 3, 1]
