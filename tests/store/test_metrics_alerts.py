"""The Prometheus exporter (rig.metrics) and threshold alerts (rig.alerts) on a real Redis."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.alerts import AlertManager, AlertRules, deliver, evaluate, fragmentation, waiting_jobs
from rig.client import Client
from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.memory import GIB
from rig.metrics import RigCollector
from rig.models import Job, JobState, Priority, waiting_since
from rig.nodes import NodeRegistry
from rig.pools import cluster_pools, encode
from rig.web.server import start_web_server
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


@pytest.fixture
def client(real_redis, key_prefix, tmp_path, monkeypatch) -> Client:
    monkeypatch.chdir(tmp_path)  # no stray rig.toml
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home")
    return Client(settings, redis_client=real_redis)


def add_card(client: Client, index: int, *, utilization=None, temperature=None, used=None,
             max_jobs: int = 2) -> None:
    client.ledger.register_card(
        "n1", GpuReading(index=index, uuid=f"u{index}", model="A100", total=100 * GIB,
                         used=used, utilization=utilization, temperature=temperature),
        max_jobs=max_jobs, reserve_fraction=0.2, allowed=True, fake=True)  # usable 80 GiB


def reading(client: Client, index: int, **values) -> None:
    client.ledger.record_reading(
        "n1", GpuReading(index=index, uuid=f"u{index}", model="A100", total=100 * GIB, **values))


def make_job(client: Client, gib: int, priority: Priority = Priority.MEDIUM, *,
             age: float = 0.0, gpus: int = 1, pool: str | None = None) -> Job:
    return client.store.create(Job(
        id=0, name="t", user="u", command=["true"], gpu_memory=gib * GIB, gpus=gpus,
        priority=priority, state=JobState.PENDING, workdir="/", created_at=time.time() - age,
        pool=pool))


def start(client: Client, job: Job, card: int) -> str:
    ok, token = client.ledger.reserve(job.id, "n1", [card], job.gpu_memory)
    assert ok, token
    assert client.ledger.claim(job.id, token, "w")[0]
    return token


def end(client: Client, job: Job, card: int, state: JobState, failure: str | None = None) -> None:
    token = start(client, job, card)
    fields = {"failure": failure} if failure else {}
    code, _ = client.ledger.transition(job.id, state, token=token, fields=fields,
                                       error_queue=state in (JobState.FAILED, JobState.TIMEOUT))
    assert code == 1


def heartbeat(client: Client, name: str, role: str) -> None:
    beat = {"role": role, "node": "n1", "card": None, "pid": 1, "jobs": 0, "seen_at": time.time()}
    client.r.set(client.keys.worker(name), json.dumps(beat), ex=60)
    client.r.sadd(client.keys.workers, name)


# -- metrics -------------------------------------------------------------------------------------
@pytest.fixture
def busy(client: Client) -> Client:
    """2 cards; one RUNNING, one ASSIGNED, one SUCCEEDED, one FAILED, one TIMEOUT, two waiting."""
    add_card(client, 0, utilization=50, temperature=70, used=30 * GIB)
    add_card(client, 1, utilization=0, temperature=90)
    end(client, make_job(client, 5, Priority.LOW, age=20), 0, JobState.SUCCEEDED)
    end(client, make_job(client, 5, Priority.LOW, age=30), 0, JobState.FAILED, "cuda_oom")
    end(client, make_job(client, 5, Priority.LOW, age=40), 0, JobState.TIMEOUT, "timeout")
    start(client, make_job(client, 30, Priority.HIGH, age=10), 0)  # RUNNING on card 0
    assigned = make_job(client, 60, Priority.MEDIUM)
    assert client.ledger.reserve(assigned.id, "n1", [1], assigned.gpu_memory)[0]  # ASSIGNED
    make_job(client, 40, Priority.MEDIUM, age=100)
    make_job(client, 25, Priority.LOW, age=50)
    heartbeat(client, "card0@n1", "card")
    heartbeat(client, "card1@n1", "card")
    heartbeat(client, "control@n1", "control")
    return client


def test_collector_renders_rig_state(busy: Client):
    registry = CollectorRegistry()
    registry.register(RigCollector(busy))
    text = generate_latest(registry).decode()
    assert 'rig_jobs{state="RUNNING"} 1.0' in text
    assert "rig_scrape_success 1.0" in text

    def value(name: str, **labels) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("rig_jobs", state="PENDING") == 2
    assert value("rig_jobs", state="ASSIGNED") == 1
    assert value("rig_jobs", state="SUCCEEDED") == 1
    assert value("rig_jobs", state="FAILED") == 1
    assert value("rig_jobs", state="TIMEOUT") == 1
    assert value("rig_jobs_by_priority", state="RUNNING", priority="high") == 1
    assert value("rig_jobs_by_priority", state="RUNNING", priority="low") == 0
    assert value("rig_jobs_by_priority", state="ASSIGNED", priority="medium") == 1
    assert value("rig_jobs_by_priority", state="PENDING", priority="low") == 1
    assert value("rig_waiting_jobs", priority="medium") == 1
    assert value("rig_waiting_jobs", priority="high") == 0
    assert value("rig_oldest_wait_seconds", priority="medium") == pytest.approx(100, abs=5)
    assert value("rig_oldest_wait_seconds", priority="high") == 0

    card0 = {"node": "n1", "card": "0", "model": "A100"}
    card1 = {"node": "n1", "card": "1", "model": "A100"}
    assert value("rig_card_usable_bytes", **card0) == 80 * GIB
    assert value("rig_card_reserved_bytes", **card0) == 30 * GIB
    assert value("rig_card_free_bytes", **card0) == 50 * GIB
    assert value("rig_card_used_bytes", **card0) == 30 * GIB
    assert value("rig_card_used_bytes", **card1) is None  # no reading: no sample
    assert value("rig_card_foreign_bytes", **card1) == 0
    assert value("rig_card_reserved_bytes", **card1) == 60 * GIB
    assert value("rig_card_utilization_ratio", **card0) == 0.5
    assert value("rig_card_total_bytes", **card0) == 100 * GIB
    assert value("rig_card_temperature_celsius", **card1) == 90
    assert value("rig_card_healthy", **card1) == 1
    assert value("rig_card_jobs", **card0) == 1
    assert value("rig_card_max_jobs", **card0) == 2

    assert value("rig_workers_alive", role="card") == 2
    assert value("rig_workers_alive", role="control") == 1
    assert value("rig_error_queue_length") == 2
    assert value("rig_recent_failures", failure="cuda_oom") == 1
    assert value("rig_recent_failures", failure="timeout") == 1
    # Free: card 0 50 GiB, card 1 20 GiB; the smallest waiting request is 25 GiB.
    assert value("rig_fragmentation_ratio") == pytest.approx(20 / 70)
    # Waits 10, 20, 30, 40 s (nearest rank): p50 = 20, p95 = 40.
    assert value("rig_dispatch_latency_samples") == 4
    assert value("rig_dispatch_latency_seconds", q="0.5") == pytest.approx(20, abs=2)
    assert value("rig_dispatch_latency_seconds", q="0.95") == pytest.approx(40, abs=2)
    # The histogram counts each job's first start as it happens (claim.lua): waits 10..40 s.
    assert value("rig_job_start_wait_seconds_count") == 4
    assert value("rig_job_start_wait_seconds_bucket", le="+Inf") == 4
    assert value("rig_job_start_wait_seconds_bucket", le="5.0") == 0
    assert value("rig_job_start_wait_seconds_bucket", le="60.0") == 4
    assert value("rig_job_start_wait_seconds_sum") == pytest.approx(100, abs=5)

    # Counters: 7 submitted, 4 started, 3 ended (by state and failure class).
    assert value("rig_jobs_submitted_total") == 7
    assert value("rig_jobs_started_total") == 4
    assert value("rig_jobs_requeued_total") == 0
    assert value("rig_jobs_ended_total", state="SUCCEEDED", failure="none") == 1
    assert value("rig_jobs_ended_total", state="FAILED", failure="cuda_oom") == 1
    assert value("rig_jobs_ended_total", state="TIMEOUT", failure="timeout") == 1
    assert value("rig_jobs_ended_total", state="CANCELLED", failure="none") == 0

    # Per user: the one user "u" runs 1 job (30 GiB), holds 30 + 60 GiB, has 2 waiting.
    assert value("rig_user_running_jobs", user="u") == 1
    assert value("rig_user_reserved_bytes", user="u") == 90 * GIB
    assert value("rig_user_waiting_jobs", user="u") == 2


def test_collector_without_redis_reports_scrape_failure(key_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(key_prefix=key_prefix, redis_url="redis://127.0.0.1:1/0",
                             home=tmp_path / "home")
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5,
                       retry=Retry(NoBackoff(), 0))
    registry = CollectorRegistry()
    registry.register(RigCollector(Client(settings, redis_client=dead)))
    assert registry.get_sample_value("rig_scrape_success") == 0
    assert registry.get_sample_value("rig_jobs", {"state": "PENDING"}) is None


def test_metrics_server_serves_and_stops(busy: Client):
    server = start_web_server(busy, "127.0.0.1", 0, ("rig", "secret"))  # /metrics: no login
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        assert 'rig_waiting_jobs{priority="low"} 1.0' in body
    finally:
        server.shutdown()
        server.server_close()


def frag(client: Client) -> float:
    """rig.alerts.fragmentation over the cards, waiting jobs and reservations now."""
    cards = client.ledger.cards()
    pools = cluster_pools(NodeRegistry(client.r, client.keys).read()).pools
    return fragmentation(cards, waiting_jobs(client), client.ledger.holdings_of(cards), pools)


def test_fragmentation_is_zero_when_nothing_waits(client: Client):
    add_card(client, 0)
    assert frag(client) == 0.0
    job = make_job(client, 90)  # more than all the free memory: full, not fragmented
    assert frag(client) == 0.0
    client.ledger.transition(job.id, JobState.CANCELLED, mode="cancel")
    add_card(client, 1)  # 2 x 80 GiB free: a 90 GiB request fits neither even emptied: no
    make_job(client, 90)  # repacking could make room, so it is not fragmentation
    assert frag(client) == 0.0


def test_a_full_server_with_a_queue_is_not_fragmented(client: Client):
    """Each card's free block (10 GiB, 20 in all) is smaller than the waiting request (30 GiB),
    and so is all of it together: the cards are full. It read 100 % and alerted (seen live:
    "fragmentation 100%: 24.0 GiB of 24.0 GiB free memory sits in blocks smaller than the
    smallest waiting request (70.0 GiB)" under a 4-card job with the next one waiting)."""
    add_card(client, 0)
    add_card(client, 1)
    start(client, make_job(client, 70), 0)
    start(client, make_job(client, 70), 1)
    make_job(client, 30)
    assert frag(client) == 0.0
    assert "fragmentation" not in keys_of(evaluate(client, AlertRules(max_fragmentation=0.0)))
    make_job(client, 15)  # fits in the 20 GiB free together, in neither card, and neither 70 GiB
    assert frag(client) == 0.0  # job can move to the other card: full, not fragmented



def test_a_card_at_its_job_cap_has_no_free_memory_for_fragmentation(client: Client):
    """A card that runs its maximum of jobs (max_task_per_gpu) takes none, whatever memory it has
    left: that memory is not free for a waiting job. It counted: 20 GiB of a full card read as
    "fragmentation 40%: 20.0 GiB of 50.0 GiB free memory sits in blocks smaller than ..." while
    the 25 GiB job fitted card 1; and a capped card's large block hid real fragmentation."""
    add_card(client, 0, max_jobs=1)
    start(client, make_job(client, 60), 0)  # 20 GiB left, at its cap of 1 job
    add_card(client, 1)
    start(client, make_job(client, 50), 1)  # 30 GiB left, takes one more job
    small = make_job(client, 25)
    assert frag(client) == 0.0
    assert "fragmentation" not in keys_of(evaluate(client, AlertRules(max_fragmentation=0.3)))
    registry = CollectorRegistry()
    registry.register(RigCollector(client))
    assert registry.get_sample_value("rig_fragmentation_ratio") == 0.0

    client.ledger.transition(small.id, JobState.CANCELLED, mode="cancel")
    add_card(client, 2, max_jobs=3)
    start(client, make_job(client, 25), 2)
    start(client, make_job(client, 25), 2)  # 30 GiB left: two blocks of 30 GiB open
    make_job(client, 40)  # neither holds 40; card 2 would, one 25 GiB job moved to card 1
    assert frag(client) == 1.0
    alerts = {a.key: a for a in evaluate(client, AlertRules(max_fragmentation=0.5))}
    assert "60.0 GiB of 60.0 GiB free memory" in alerts["fragmentation"].message, alerts


# -- alerts --------------------------------------------------------------------------------------
class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.close()


def keys_of(alerts) -> set[str]:
    return {a.key for a in alerts}


def test_hot_card_alerts_once_then_resolves(client: Client, receiver: Receiver):
    add_card(client, 0, temperature=90, utilization=10)
    add_card(client, 1, temperature=60, utilization=10)
    manager = AlertManager(client, AlertRules(), webhook_url=receiver.url)

    first = manager.run()
    assert keys_of(first) == {"temperature:n1/0"}
    assert manager.run() == []  # still hot: no second message
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]
    assert "n1/0" in body["text"] and "90 C" in body["text"]
    assert body["alerts"][0]["key"] == "temperature:n1/0"
    assert body["alerts"][0]["status"] == "firing"
    assert body["alerts"][0]["severity"] == "critical"
    assert set(manager.active()) == {"temperature:n1/0"}

    reading(client, 0, temperature=70, utilization=10)
    resolved = manager.run()
    assert [(a.key, a.status) for a in resolved] == [("temperature:n1/0", "resolved")]
    assert len(receiver.bodies) == 2
    assert receiver.bodies[1]["alerts"][0]["status"] == "resolved"
    # The resolved line says the value now, not the firing one again.
    assert resolved[0].message.startswith("resolved: card n1/0 is at 70 C now"), resolved[0].message
    assert "(fired: card n1/0 (A100) is at 90 C" in resolved[0].message
    assert manager.run() == [] and len(receiver.bodies) == 2
    assert manager.active() == {}


def test_queue_length_failure_rate_and_fragmentation(client: Client):
    add_card(client, 0)
    for _ in range(3):
        make_job(client, 1, Priority.HIGH)
    assert keys_of(evaluate(client, AlertRules(max_queue=2))) == {"queue_length:high"}
    assert evaluate(client, AlertRules(max_queue=3)) == []

    # 2 of 5 ended jobs failed (40 % > 20 %); a cancelled job does not count.
    for _ in range(3):
        end(client, make_job(client, 1), 0, JobState.SUCCEEDED)
    end(client, make_job(client, 1), 0, JobState.FAILED, "nonzero_exit")
    end(client, make_job(client, 1), 0, JobState.TIMEOUT, "timeout")
    cancelled = make_job(client, 1)
    client.ledger.transition(cancelled.id, JobState.CANCELLED, mode="cancel")
    for job_id in client.store.pending_head(10):  # empty the queue again
        client.ledger.transition(job_id, JobState.CANCELLED, mode="cancel")
    now = time.time()
    alerts = evaluate(client, AlertRules(), now)
    assert keys_of(alerts) == {"failure_rate"}
    assert "40%" in alerts[0].message and "2 of 5" in alerts[0].message
    assert evaluate(client, AlertRules(min_ended=6), now) == []
    assert evaluate(client, AlertRules(), now + 16 * 60) == []  # outside the 15 min window

    # A failure rate that clears says the rate now (the window has moved past the failures).
    manager = AlertManager(client, AlertRules())
    assert keys_of(manager.update(evaluate(client, AlertRules(), now), now)) == {"failure_rate"}
    later = now + 16 * 60
    (resolved,) = manager.update(evaluate(client, AlertRules(), later), later)
    assert resolved.message.startswith("resolved: 0% of jobs failed or timed out"), resolved.message
    assert "(0 of 0 ended" in resolved.message and "(fired: 40% of jobs" in resolved.message

    add_card(client, 1)
    start(client, make_job(client, 30), 0)
    start(client, make_job(client, 30), 1)
    # 50 GiB free on each card, 60 asked: stranded, and one 30 GiB job moved would make room.
    big = make_job(client, 60)
    assert keys_of(evaluate(client, AlertRules(), now)) == {"failure_rate", "fragmentation"}
    client.ledger.transition(big.id, JobState.CANCELLED, mode="cancel")


def test_idle_cards_while_a_fitting_job_waits(client: Client):
    add_card(client, 0, max_jobs=1)
    blocker = make_job(client, 10)
    start(client, blocker, 0)
    add_card(client, 1)
    make_job(client, 90, age=300)  # waits long but fits no card: no idle alert
    rules = AlertRules(max_fragmentation=1.0)
    assert "idle_cards" not in keys_of(evaluate(client, rules))
    fresh = make_job(client, 20, age=5)  # fits card 1 but has not waited long
    assert "idle_cards" not in keys_of(evaluate(client, rules))
    now = time.time() + 120
    alerts = {a.key: a for a in evaluate(client, rules, now)}
    assert "idle_cards" in alerts
    assert "n1/1" in alerts["idle_cards"].message and "n1/0" not in alerts["idle_cards"].message
    assert f"job {fresh.id}" in alerts["idle_cards"].message


def test_idle_cards_are_only_cards_of_the_waiting_jobs_pool(client: Client):
    """A job submitted to a pool can never start on a card outside it: an idle card there is no
    card it would fit, and the alert said it was (a tester's finding: `--pool p0` waiting for
    card 0 while card 1 idled read "idle card(s) n1/1 while job 2 ... would fit")."""
    NodeRegistry(client.r, client.keys).register("n1", ttl=30, backend="fake", cards=2,
                                                 pools=encode({"p0": ["n1:0"], "p1": ["n1:1"]}))
    add_card(client, 0, max_jobs=1)
    start(client, make_job(client, 10), 0)  # card 0 takes no second job
    add_card(client, 1)
    waiting = make_job(client, 20, age=300, pool="p0")
    rules = AlertRules(max_fragmentation=1.0)
    assert "idle_cards" not in keys_of(evaluate(client, rules))
    other = make_job(client, 20, age=300, pool="p1")  # this one would fit card 1
    alerts = {a.key: a for a in evaluate(client, rules)}
    assert f"job {other.id}" in alerts["idle_cards"].message, alerts
    assert f"job {waiting.id}" not in alerts["idle_cards"].message


def test_reserved_but_idle_card_after_its_grace_time(client: Client):
    add_card(client, 0, utilization=0, temperature=50)
    start(client, make_job(client, 10), 0)
    now = time.time()
    rules = AlertRules()
    assert evaluate(client, rules, now) == []  # first seen now
    assert evaluate(client, rules, now + 300) == []
    alerts = evaluate(client, rules, now + 601)
    assert keys_of(alerts) == {"reserved_idle:n1/0"}
    assert "10.0 GiB reserved" in alerts[0].message
    reading(client, 0, utilization=40, temperature=50)
    assert evaluate(client, rules, now + 700) == []
    assert client.r.hlen(f"{client.keys.prefix}alerts:since") == 0  # the clock restarts
    reading(client, 0, utilization=0, temperature=50)
    assert evaluate(client, rules, now + 800) == []


def test_the_cards_of_a_stopped_node_are_not_alerted_on_by_their_last_readings(client: Client):
    """Nothing reads the cards of a stopped node: its last temperature is no card "at 95 C" now,
    and its jobs, running on (adopted on return), were "reserved but read 0% utilisation" for as
    long as it stayed stopped."""
    nodes = NodeRegistry(client.r, client.keys)
    nodes.register("n1", ttl=30, backend="fake", cards=1)
    add_card(client, 0, utilization=0, temperature=95)
    add_card(client, 1)
    start(client, make_job(client, 10), 0)
    now = time.time()
    rules = AlertRules()
    assert keys_of(evaluate(client, rules, now)) == {"temperature:n1/0"}
    manager = AlertManager(client, rules)
    manager.update(evaluate(client, rules, now), now)
    assert nodes.mark_stopped("n1")
    assert evaluate(client, rules, now + 601) == []
    (resolved,) = manager.update(evaluate(client, rules, now + 601), now + 601)
    assert resolved.message.startswith("resolved: node n1 is stopped: nothing reads card n1/0 now"), resolved
    make_job(client, 20, age=300)  # would fit the stopped node's card 1: it is no idle card
    assert "idle_cards" not in keys_of(evaluate(client, AlertRules(max_fragmentation=1.0), now + 601))


def test_webhook_down_is_logged_not_raised(client: Client, caplog):
    add_card(client, 0, temperature=95)
    logger = logging.getLogger("rig.test.alerts")
    dead_url = "http://127.0.0.1:1/hook"
    with caplog.at_level(logging.INFO, logger="rig.test.alerts"):
        sent = AlertManager(client, webhook_url=dead_url, logger=logger).run()
        assert keys_of(sent) == {"temperature:n1/0"}
        assert deliver(sent, dead_url, logger) is False
        assert deliver(sent, None, logger) is True
    messages = [r.getMessage() for r in caplog.records]
    assert any("could not post" in m for m in messages)
    assert any("temperature:n1/0" in m and "95 C" in m for m in messages)


def test_thresholds_come_from_the_config(monkeypatch):
    from rig.alerts import AlertRules
    from rig.config import load_settings

    monkeypatch.setenv("RIG_ALERTS__MAX_QUEUE", "7")
    monkeypatch.setenv("RIG_ALERTS__MAX_TEMPERATURE", "70")
    rules = AlertRules(**load_settings().alerts.model_dump())
    assert rules.max_queue == 7 and rules.max_temperature == 70 and rules.max_fragmentation == 0.5


def test_counters_and_histogram_only_grow(client: Client):
    """Counters and the start-wait histogram live in Redis and are fed as things happen: a
    requeue, a second attempt's start, a cancel and many more ended jobs never make them fall
    (the old histogram was rebuilt from the last 200 started jobs at each scrape)."""
    add_card(client, 0, max_jobs=4)

    def value(name: str, **labels) -> float:
        registry = CollectorRegistry()
        registry.register(RigCollector(client, latency_window=2))
        return registry.get_sample_value(name, labels) or 0.0

    assert value("rig_jobs_submitted_total") == 0
    assert value("rig_job_start_wait_seconds_count") == 0
    assert value("rig_jobs_ended_total", state="SUCCEEDED", failure="none") == 0

    retried = make_job(client, 1, age=3)
    token = start(client, retried, 0)
    assert client.ledger.transition(retried.id, JobState.PENDING, token=token)[0] == 1  # a retry
    assert value("rig_jobs_requeued_total") == 1
    start(client, retried, 0)  # its second attempt: started again, but not a first start
    assert value("rig_jobs_started_total") == 2
    assert value("rig_job_start_wait_seconds_count") == 1
    assert value("rig_job_start_wait_seconds_bucket", le="5.0") == 1
    assert value("rig_job_start_wait_seconds_bucket", le="1.0") == 0

    cancelled = make_job(client, 1)
    client.ledger.transition(cancelled.id, JobState.CANCELLED, mode="cancel")
    assert value("rig_jobs_ended_total", state="CANCELLED", failure="none") == 1
    assert value("rig_jobs_requeued_total") == 1  # a cancel is no requeue

    counts = []
    for _ in range(5):  # more started jobs than the window of 2
        end(client, make_job(client, 1), 0, JobState.SUCCEEDED)
        counts.append(value("rig_job_start_wait_seconds_count"))
    assert counts == [2, 3, 4, 5, 6]
    assert value("rig_dispatch_latency_samples") == 2  # the window gauge stays a window
    assert value("rig_jobs_submitted_total") == 7
    assert value("rig_jobs_ended_total", state="SUCCEEDED", failure="none") == 5
    failed = make_job(client, 1)
    end(client, failed, 0, JobState.FAILED)  # no class recorded
    assert value("rig_jobs_ended_total", state="FAILED", failure="unknown") == 1
    # Buckets are cumulative and end at the count.
    bounds = [value("rig_job_start_wait_seconds_bucket", le=b) for b in ("0.05", "1.0", "60.0", "+Inf")]
    assert bounds == sorted(bounds) and bounds[-1] == value("rig_job_start_wait_seconds_count") == 7


def test_per_user_gauges(client: Client):
    add_card(client, 0, max_jobs=4)
    ana = client.store.create(Job(id=0, name="t", user="ana", command=["true"], gpu_memory=4 * GIB, gpus=1, created_at=time.time(),
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/"))
    start(client, ana, 0)
    for _ in range(2):
        client.store.create(Job(id=0, name="t", user="bob", command=["true"], gpu_memory=GIB, gpus=1, created_at=time.time(),
                                priority=Priority.LOW, state=JobState.PENDING, workdir="/"))
    registry = CollectorRegistry()
    registry.register(RigCollector(client))

    def value(name: str, user: str) -> float | None:
        return registry.get_sample_value(name, {"user": user})

    assert value("rig_user_running_jobs", "ana") == 1
    assert value("rig_user_reserved_bytes", "ana") == 4 * GIB
    assert value("rig_user_waiting_jobs", "ana") == 0  # a series, not a gap
    assert value("rig_user_running_jobs", "bob") == 0
    assert value("rig_user_reserved_bytes", "bob") == 0
    assert value("rig_user_waiting_jobs", "bob") == 2


def test_node_problems_are_metrics_and_alerts_alike(client: Client):
    """rig_node_problem{node,problem} and rig's own alerts come from one function
    (rig.alerts.node_problems): a node's lost jobs and clock show in both, a sound node is 0."""
    from rig.nodes import NodeRegistry

    nodes = NodeRegistry(client.r, client.keys)
    nodes.register("n1", ttl=60, backend="fake", cards=1)
    nodes.register("n2", ttl=60, backend="fake", cards=1)
    client.r.hset(client.keys.node("n1"), mapping={"unrecorded_jobs": "Redis lost 2 jobs it ran",
                                                   "clock_skew": "clock 120.0 s ahead of Redis'"})
    registry = CollectorRegistry()
    registry.register(RigCollector(client))

    def value(node: str, problem: str) -> float | None:
        return registry.get_sample_value("rig_node_problem", {"node": node, "problem": problem})

    assert value("n1", "unrecorded_jobs") == 1 and value("n1", "clock_skew") == 1
    assert value("n1", "redis_auth") == 0 and value("n1", "installation") == 0
    assert all(value("n2", p) == 0 for p in ("redis_auth", "installation", "unrecorded_jobs", "clock_skew"))
    assert {"unrecorded_jobs:n1", "clock_skew:n1"} <= keys_of(evaluate(client))


def test_no_fragmentation_where_no_repacking_could_make_room(client: Client):
    """98 GiB free in 6-36 GiB pieces against a 70 GiB request read "fragmentation 100%", though
    every running job was 44 GiB or more and none could move to make a 70 GiB block: the cards
    are full for it. Where moving a job would make room, the same 100 % is true fragmentation."""
    for index, gib in enumerate((44, 50, 54, 74)):  # 36 + 30 + 26 + 6 = 98 GiB free
        add_card(client, index)
        start(client, make_job(client, gib), index)
    make_job(client, 70)
    assert frag(client) == 0.0
    assert "fragmentation" not in keys_of(evaluate(client, AlertRules(max_fragmentation=0.5)))
    registry = CollectorRegistry()
    registry.register(RigCollector(client))
    assert registry.get_sample_value("rig_fragmentation_ratio") == 0.0

    add_card(client, 4, max_jobs=3)  # two 20 GiB jobs (40 free): one of them fits card 0's 36
    start(client, make_job(client, 20), 4)
    start(client, make_job(client, 20), 4)
    assert frag(client) == 1.0
    alerts = {a.key: a for a in evaluate(client, AlertRules(max_fragmentation=0.5))}
    assert "138.0 GiB of 138.0 GiB free memory" in alerts["fragmentation"].message, alerts


def test_no_fragmentation_where_only_another_pools_cards_could_make_room(client: Client):
    """A 50 GiB job of pool p0 (card 0, full with a 70 GiB job) waited while card 1 (pool p1)
    had 50 GiB free in two pieces a move would join: "fragmentation 100%" said memory was lost
    to how jobs are spread, though no repacking gives the p0 job a card it may use."""
    NodeRegistry(client.r, client.keys).register("n1", ttl=30, backend="fake", cards=3,
                                                 pools=encode({"p0": ["n1:0"], "p1": ["n1:1-2"]}))
    add_card(client, 0)
    start(client, make_job(client, 70), 0)
    add_card(client, 1, max_jobs=3)
    start(client, make_job(client, 30), 1)  # 50 GiB free on card 1 ...
    add_card(client, 2)
    start(client, make_job(client, 45), 2)  # ... and 35 on card 2: the 30 GiB job would move there
    waiting = make_job(client, 60, pool="p0")
    assert frag(client) == 0.0
    assert "fragmentation" not in keys_of(evaluate(client, AlertRules(max_fragmentation=0.5)))
    registry = CollectorRegistry()
    registry.register(RigCollector(client))
    assert registry.get_sample_value("rig_fragmentation_ratio") == 0.0
    client.store.update(waiting.id, pool="p1")  # the same job of pool p1: repacking makes room
    assert frag(client) == 1.0


def test_a_job_on_several_cards_is_not_moved_to_make_room(client: Client):
    add_card(client, 0)
    add_card(client, 1, max_jobs=1)
    add_card(client, 2)
    two = make_job(client, 20, gpus=2)
    ok, token = client.ledger.reserve(two.id, "n1", [0, 1], two.gpu_memory)
    assert ok, token
    start(client, make_job(client, 50), 0)  # cards 0 and 1 at their job caps
    start(client, make_job(client, 55), 2)  # 25 GiB free: the 2-card job's 20 would fit it
    make_job(client, 65)  # card 1 would take it only if the 2-card job left it alone
    assert frag(client) == 0.0


def test_cards_held_for_a_waiting_job_are_not_idle_cards(client: Client):
    """Three 8-card jobs held every card, a 30 GiB job waited past the threshold, and the alert
    said "idle card(s) vm/4.. while job 21 ... would fit": the dispatcher kept those cards idle
    for the big job on purpose (its record's held_cards). A card held for the job itself counts."""
    add_card(client, 0)
    start(client, make_job(client, 70), 0)  # card 0 busy, card 1 idle
    add_card(client, 1)
    big = make_job(client, 80, gpus=2, age=600)
    client.store.update(big.id, held_at=time.time() - 500, held_cards="n1/0,n1/1")
    small = make_job(client, 30, age=300)
    rules = AlertRules(max_fragmentation=1.0)
    assert "idle_cards" not in keys_of(evaluate(client, rules))
    client.store.update(big.id, held_cards="n1/0")  # its hold moved off card 1
    alerts = {a.key: a for a in evaluate(client, rules)}
    assert "n1/1" in alerts["idle_cards"].message and f"job {small.id}" in alerts["idle_cards"].message
    client.store.update(small.id, held_at=time.time() - 10, held_cards="n1/1")  # held for itself
    assert f"job {small.id}" in {a.key: a for a in evaluate(client, rules)}["idle_cards"].message
    client.store.update(big.id, held_cards="n1/1")  # and for the big job too
    assert "idle_cards" not in keys_of(evaluate(client, rules))


def test_a_requeued_job_has_waited_since_it_went_back(client: Client):
    """A job that ran 14 s, was lost and went back to the queue showed "waited 51s" (from its
    submission) in rig top, the web page and rig_oldest_wait_seconds: it waits since it last
    entered the queue (its record's queued_at, set by the requeue)."""
    add_card(client, 0)
    requeued = make_job(client, 10, age=300)
    token = start(client, requeued, 0)
    back = time.time() - 20
    code, _ = client.ledger.transition(requeued.id, JobState.PENDING, token=token, now=back)
    assert code == 1
    record = client.store.get(requeued.id)
    assert record.queued_at == pytest.approx(back)
    assert waiting_since(record.created_at, record.queued_at) == pytest.approx(back)
    assert waiting_since(record.created_at, None) == record.created_at  # an older record
    assert client.status().oldest_wait[Priority.MEDIUM] == pytest.approx(20, abs=3)
    registry = CollectorRegistry()
    registry.register(RigCollector(client))
    assert registry.get_sample_value("rig_oldest_wait_seconds", {"priority": "medium"}) == pytest.approx(20, abs=3)
    rules = AlertRules(max_fragmentation=1.0, idle_wait_seconds=60)
    assert "idle_cards" not in keys_of(evaluate(client, rules))  # 300 s old, waiting 20 s

    later = make_job(client, 10, age=100)  # never went back: the longest wait now
    assert client.status().oldest_wait[Priority.MEDIUM] == pytest.approx(100, abs=3)
    alerts = {a.key: a for a in evaluate(client, rules)}
    assert f"job {later.id}" in alerts["idle_cards"].message and "waited 100 s" in alerts["idle_cards"].message
    assert [j.since for j in waiting_jobs(client)] == [pytest.approx(back), pytest.approx(later.created_at)]
