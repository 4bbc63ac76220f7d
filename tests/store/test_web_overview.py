"""rig's web page data (rig.web.overview), its history (rig.timeline) and its login rules
(rig.web.server's WSGI app), on fakeredis and on a real Redis. The page in a real browser:
tests/e2e/test_web_page.py."""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import pytest

from rig import timeline
from rig.client import Client
from rig.config import load_settings
from rig.forecast import forecast
from rig.forecast_store import NOT_MADE_YET, publish
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.testing.web_load import HOSTILE_NAME, mixed_load
from rig.waiting import NO_DISPATCHER
from rig.web.overview import ERRORS_SHOWN, WAITING_SHOWN, overview
from rig.web.server import LOGIN_NEEDED, authorised, make_app

LOGIN = ("admin", "s3cret:with-colon")


@pytest.fixture
def client(redis_client, key_prefix, tmp_path) -> Client:
    settings = load_settings(key_prefix=key_prefix, home=tmp_path / "home", node_name="gpu1")
    return Client(settings, redis_client=redis_client)


def call(app, path: str, login: tuple[str, str] | None = None, header: str | None = None,
         method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    """One request through the WSGI app: (status, headers, body)."""
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(),
                               "SERVER_NAME": "t", "SERVER_PORT": "1", "wsgi.url_scheme": "http"}
    if login is not None:
        header = "Basic " + base64.b64encode(":".join(login).encode()).decode()
    if header is not None:
        environ["HTTP_AUTHORIZATION"] = header
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got.update(status=status, headers=dict(headers))

    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def test_the_overview_shows_what_the_cli_shows(client: Client):
    load = mixed_load(client)
    data = json.loads(json.dumps(overview(client, login="admin")))  # what the page gets
    assert data["login"] == "admin"
    cards = {c["id"]: c for c in data["cards"]}
    assert sorted(cards) == ["gpu1/0", "gpu1/1", "gpu2/0", "gpu2/1"]
    # The bar's three figures are the ledger's: reserved + free = usable on a card with no
    # foreign use; the jobs on each card are named.
    for card in cards.values():
        assert card["reserved"] + card["free"] == card["usable"]
    assert [j["name"] for j in cards["gpu2/0"]["running"]] == ["llm-finetune-7b"]
    assert not any(j["over"] for c in cards.values() for j in c["running"])
    assert cards["gpu1/0"]["utilization"] == 97 and cards["gpu1/0"]["temperature"] == 71
    assert sorted(j["id"] for j in data["running"]) == sorted(load.running)
    # The head of the queue, high priority first, each with the one explanation (rig.waiting).
    waiting = data["waiting"]
    assert [j["id"] for j in waiting["jobs"]] == load.waiting and waiting["total"] == 3
    assert [j["position"] for j in waiting["jobs"]] == [1, 2, 3]
    first = waiting["jobs"][0]
    assert first["why"] == client.why_waiting(client.get(first["id"]))
    assert "needs 70.0 GiB" in first["why"] and "no dispatcher is running" in first["why"]
    # No dispatcher runs: no estimated start, and that is what the page says instead of a time.
    assert all(j["estimated_start"] is None and j["estimated_start_text"] == f"unknown ({NO_DISPATCHER})"
               for j in waiting["jobs"])
    # The error queue with why each ended, and the users table of three users.
    assert data["errors"]["total"] == 2
    assert {j["id"]: j["failure"] for j in data["errors"]["jobs"]} == dict(zip(load.failed, ["cuda_oom", "timeout"], strict=True))
    assert "CUDA out of memory" in data["errors"]["jobs"][-1]["why"]
    assert [u["user"] for u in data["users"]] == ["alice", "bob", "carol"]
    assert all(u["running"] == 1 and u["waiting"] == 1 for u in data["users"])
    # A hostile name arrives as the characters it is (the page puts it in as text); no
    # environment or command is sent.
    hostile = next(j for j in waiting["jobs"] if j["id"] == load.hostile)
    assert hostile["name"] == HOSTILE_NAME
    assert not any("env" in j or "command" in j for j in data["running"] + waiting["jobs"])
    assert data["history"]["since"] is not None and len(data["history"]["ended_per_hour"]) == 1
    before = data["history"]["ended_before_first"]
    assert before == {"by": before["by"], "succeeded": 3, "failed": 2, "cancelled": 0}
    # Taken inside the first sample's minute: by that moment, not before the minute began.
    assert data["history"]["since"] <= before["by"] < data["history"]["since"] + 60


def test_a_card_marks_a_job_over_its_declaration_as_rig_status_does(client: Client):
    load = mixed_load(client)
    client.store.update(load.running[0], overuse=1)
    cards = {c["id"]: c for c in overview(client, login="admin")["cards"]}
    assert [(j["id"], j["over"]) for j in cards["gpu1/0"]["running"]] == [(load.running[0], True)]


def test_each_waiting_job_has_the_forecasts_estimated_start(client: Client):
    load = mixed_load(client)
    client.r.set(client.keys.sched_leader, "someone", px=60_000)  # a dispatcher runs
    # The running jobs have earlier runs: alice's takes ~1 h, bob's 2-card job ~40 min,
    # carol's ~2 h.
    for job_id, expected in zip(load.running, (3600.0, 2400.0, 7200.0), strict=True):
        client.store.update(job_id, expected_seconds=expected)
    alice, bob, _carol = (client.get(i) for i in load.running)
    data = overview(client, login="admin")  # the leader has stored no forecast yet: it says so
    assert all(j["estimated_start_short"] == "not yet" and j["estimated_at"] is None
               and j["estimated_start_text"] == f"not estimated yet ({NOT_MADE_YET})" for j in data["waiting"]["jobs"])
    publish(client.r, client.keys, forecast(client))  # what the leading dispatcher does (workers.forecaster)
    data = overview(client, login="admin")
    rows = {j["id"]: j for j in data["waiting"]["jobs"]}
    eval_70b, vit, hostile = (rows[i] for i in load.waiting)
    # The two jobs aged to high take gpu2's two cards when bob's job ends; the low one alice's.
    assert eval_70b["estimated_start"] == vit["estimated_start"] == pytest.approx(bob.started_at + 2400, abs=0.01)
    assert hostile["estimated_start"] == pytest.approx(alice.started_at + 3600, abs=0.01)
    assert eval_70b["estimated_start_short"].startswith("~") and "in ~40 min" in eval_70b["estimated_start_text"]
    assert eval_70b["estimated_at"] == pytest.approx(data["now"], abs=5)


def test_the_waiting_list_is_bounded_and_the_total_is_said(client: Client):
    mixed_load(client)
    extra = WAITING_SHOWN + 2
    client.store.create_many([(Job(id=0, name=f"w{i}", user="dave", command=["true"], gpu_memory=75 * GIB,
                                   gpus=1, priority=Priority.LOW, state=JobState.PENDING, workdir="/",
                                   created_at=time.time()), None) for i in range(extra)])
    data = overview(client, login="admin")
    assert len(data["waiting"]["jobs"]) == WAITING_SHOWN and data["waiting"]["total"] == 3 + extra


def test_a_waiting_job_is_sent_with_when_it_last_entered_the_queue(client: Client):
    """The page's "waited" column reads waiting_since (rig.models.waiting_since, the one rule):
    a job that went back to the queue showed its wait from its submission."""
    fresh, back = (client.store.create(Job(id=0, name=n, user="dave", command=["true"], gpu_memory=GIB, gpus=1,
                                           priority=Priority.LOW, state=JobState.PENDING, workdir="/",
                                           created_at=time.time() - 300)) for n in ("fresh", "back"))
    client.store.update(back.id, queued_at=time.time() - 5)  # as transition.lua stamps a requeue
    rows = {j["id"]: j for j in overview(client, login="admin")["waiting"]["jobs"]}
    assert rows[fresh.id]["waiting_since"] == pytest.approx(fresh.created_at)
    assert rows[back.id]["waiting_since"] == pytest.approx(time.time() - 5, abs=2)


FROZEN_LINE = "node gpu3 joined installation abc, but this Redis holds no rig installation: `rig recover --stop`"


def freeze_a_node_without_cards(client: Client, node: str = "gpu3") -> None:
    """What a node whose Redis came back empty writes (rig.installation): its mark, no cards."""
    from rig.nodes import NodeRegistry

    NodeRegistry(client.r, client.keys).beat(node, ttl=600, source="test")
    client.r.sadd(client.keys.nodes, node)
    client.r.hset(client.keys.node(node), mapping={"installation_mismatch": FROZEN_LINE, "started_at": time.time()})


def test_every_node_is_listed_and_a_frozen_one_says_so(client: Client):
    mixed_load(client)
    freeze_a_node_without_cards(client)
    nodes = {n["name"]: n for n in overview(client, login="admin")["nodes"]}
    assert sorted(nodes) == ["gpu1", "gpu2", "gpu3"]
    frozen = nodes["gpu3"]
    assert frozen["cards"] == 0 and frozen["label"] == "FROZEN" and frozen["since"] is None
    assert frozen["alerts"] == [f"FROZEN: {FROZEN_LINE}"]  # rig status' words (rig.nodes.NodeInfo.describe)
    up = nodes["gpu1"]
    assert up["label"] == "up" and up["alerts"] == up["warnings"] == [] and up["cards"] == 2


def test_the_error_queue_shows_the_newest_failures_and_the_total(client: Client):
    load = mixed_load(client)
    late = client.store.create_many([(Job(id=0, name=f"late{i}", user="dave", command=["true"], gpu_memory=GIB,
                                          gpus=1, priority=Priority.LOW, state=JobState.FAILED, workdir="/",
                                          created_at=time.time()), None) for i in range(ERRORS_SHOWN)])
    newest = [j.id for j in late]
    now = time.time()
    for i, job_id in enumerate(newest):  # ended after the load's two failures
        client.r.zadd(client.keys.errors, {str(job_id): now + 100 + i})
    errors = overview(client, login="admin")["errors"]
    assert errors["total"] == ERRORS_SHOWN + 2
    assert [j["id"] for j in errors["jobs"]] == newest[::-1]  # the load's old failures are the hidden ones
    assert not set(load.failed) & {j["id"] for j in errors["jobs"]}


def test_an_empty_installation_gives_an_empty_page(client: Client):
    data = overview(client, login="admin")
    assert data["cards"] == [] and data["running"] == [] and data["waiting"]["jobs"] == []
    assert data["history"] == {"error": None, "since": None, "ended_per_hour": [], "ended_before_first": None, "memory": [],
                               "memory_hours": timeline.MEMORY_HOURS}


def test_samples_are_one_a_minute_and_bounded(client: Client):
    r, keys = client.r, client.keys
    mixed_load(client)  # writes one sample now
    now = time.time()
    minute = int(now // 60 * 60)
    for _ in range(3):  # passes in the same minute replace the minute's sample
        timeline.record(r, keys, client.ledger.cards(), now)
    assert r.zcount(keys.timeline, minute, minute) == 1
    # A day later, the old samples are gone with the first write; the key expires by itself.
    timeline.record(r, keys, [], now + timeline.TIMELINE_WINDOW_S + 120)
    assert r.zcard(keys.timeline) == 1 and 0 < r.ttl(keys.timeline) <= timeline.TIMELINE_WINDOW_S


def test_history_counts_ended_jobs_from_the_real_counters(client: Client):
    r, keys = client.r, client.keys
    now = time.time()
    mixed_load(client)  # 3 succeeded, 1 failed, 1 timed out, sampled at `now`
    before = timeline.read(r, keys, now)[-1]
    assert (before.succeeded, before.failed, before.cancelled) == (3, 2, 0)
    assert before.reserved == sum(c.reserved for c in client.ledger.cards())
    r.hincrby(keys.metrics_counters, "ended:SUCCEEDED:", 4)
    later = now + 120  # another minute than mixed_load's sample, whenever it ran
    timeline.record(r, keys, client.ledger.cards(), later)
    hours = timeline.ended_per_hour(timeline.read(r, keys, later), later)
    assert sum(h.succeeded for h in hours) == 4  # the growth between samples, not the totals


def test_the_cluster_health_pass_writes_the_sample(client: Client):
    from workers.health import HealthChecker

    mixed_load(client)
    client.r.delete(client.keys.timeline)
    assert HealthChecker(client.settings, client.r).run_cluster() is not None
    (sample,) = timeline.read(client.r, client.keys, time.time())
    assert sample.succeeded == 3 and sample.reserved == sum(c.reserved for c in client.ledger.cards())


def test_a_history_key_of_another_type_fails_only_the_history(client: Client, caplog, monkeypatch):
    from workers.health import HealthChecker

    mixed_load(client)
    client.r.delete(client.keys.timeline)
    client.r.set(client.keys.timeline, "garbage")
    status, _, body = call(make_app(client, LOGIN), "/api/overview", LOGIN)
    data = json.loads(body)
    assert status.startswith("200") and data["waiting"]["total"] == 3
    assert data["history"]["error"].startswith("the history could not be read: ")
    assert data["history"]["ended_per_hour"] == [] and "\n" not in data["history"]["error"]
    # The health pass replaces rig's own key, saying so in one line, once (not at every pass).
    monkeypatch.setattr(timeline, "_wrong_type_said", timeline.Throttle())
    for _ in range(2):
        client.r.set(client.keys.timeline, "garbage")
        assert HealthChecker(client.settings, client.r).run_cluster() is not None
        assert len(timeline.read(client.r, client.keys, time.time())) == 1
    said = [r for r in caplog.records if "held another type" in r.getMessage()]
    assert len(said) == 1 and "Traceback" not in caplog.text


def test_a_redis_that_does_not_answer_is_one_line_in_the_data(tmp_path):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    app = make_app(Client(load_settings(home=tmp_path / "home"), redis_client=dead), LOGIN)
    assert call(app, "/", LOGIN)[0].startswith("200")  # the page itself needs no Redis
    status, headers, body = call(app, "/api/overview", LOGIN)
    assert status.startswith("503") and headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]
    assert error.startswith("cannot read rig's state: ") and "\n" not in error
    assert call(app, "/metrics")[0].startswith("200")  # rig_scrape_success 0, as before


def test_a_hung_redis_is_said_as_one_that_does_not_answer():
    """A Redis stopped with SIGSTOP takes connections (the kernel's backlog) and answers none:
    rig is up there, so the CLI must not say to start it (the page's probe says `does not answer`)."""
    import redis

    from rig.redis_conn import unavailable

    url = "redis://127.0.0.1:6399/0"
    hung = str(unavailable(url, redis.TimeoutError("Timeout reading from socket")))
    assert "does not answer" in hung and "hung" in hung and "rig up" not in hung and "\n" not in hung
    assert "start rig with `rig up`" in str(unavailable(url, redis.TimeoutError("Timeout connecting to server")))


def test_a_redis_that_never_replies_is_answered_within_seconds(tmp_path):
    """A Redis that accepts connections but never replies (a host gone without a FIN; under
    Sentinel, the fail-over window): /metrics says rig_redis_up 0 and the data says so in one
    line, each within about a second, not after the client's reply timeout and retries."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the backlog; nothing ever reads or answers
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        app = make_app(Client(load_settings(home=tmp_path / "home", redis_url=url)), LOGIN)
        began = time.monotonic()
        status, _, body = call(app, "/metrics")
        assert status.startswith("200") and b"rig_redis_up 0.0" in body and b"rig_scrape_success 0.0" in body
        status, _, body = call(app, "/api/overview", LOGIN)
        assert status.startswith("503")
        assert json.loads(body)["error"].startswith(f"cannot read rig's state: Redis does not answer at {url}")
        assert time.monotonic() - began < 4.0
    finally:
        silent.close()


def test_a_bug_in_the_data_is_one_line_and_a_logged_traceback(client: Client, monkeypatch, caplog):
    import rig.web.overview

    def broken(_client: Client, *, login: str) -> dict:
        raise ValueError("a record the page cannot read\nsecond line")

    monkeypatch.setattr(rig.web.overview, "overview", broken)
    status, _, body = call(make_app(client, LOGIN), "/api/overview", LOGIN)
    assert status.startswith("500")
    assert json.loads(body)["error"] == ("rig's page could not be made (ValueError: a record the page cannot "
                                         "read); the traceback is in rig up's log")
    assert "Traceback" in caplog.text


# -- the login rules ---------------------------------------------------------------------------
def test_page_and_data_need_the_admin_login_and_metrics_does_not(client: Client):
    mixed_load(client)
    app = make_app(client, LOGIN)
    for path in ("/", "/api/overview"):
        status, headers, body = call(app, path)
        assert status.startswith("401")
        # The browser's login prompt on the page only: on the data, Chromium's fetch would fail
        # outright and the open page could not say that the login was refused.
        assert headers["WWW-Authenticate"].startswith("Basic realm=") if path == "/" else "WWW-Authenticate" not in headers
        assert body.decode() == LOGIN_NEEDED
        for wrong in (("admin", "nope"), ("root", LOGIN[1]), ("admin", LOGIN[1] + "x"), ("", "")):
            assert call(app, path, wrong)[0].startswith("401"), wrong
        for garbage in ("Basic !!!", "Bearer abc", "Basic " + base64.b64encode(b"no-colon").decode()):
            assert call(app, path, header=garbage)[0].startswith("401"), garbage
    status, headers, body = call(app, "/", LOGIN)
    assert status.startswith("200") and b"<title>rig</title>" in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    status, headers, body = call(app, "/api/overview", LOGIN)
    assert status.startswith("200") and json.loads(body)["waiting"]["total"] == 3
    status, _, body = call(app, "/metrics")
    assert status.startswith("200") and b"rig_waiting_jobs" in body
    assert call(app, "/anything-else", LOGIN)[0].startswith("404")
    assert call(app, "/api/overview", LOGIN, method="POST")[0].startswith("405")


def test_head_is_headers_only_and_reads_no_redis(client: Client, monkeypatch):
    import rig.web.overview

    def unread(_client: Client, *, login: str) -> dict:
        raise AssertionError("HEAD read rig's state")

    monkeypatch.setattr(rig.web.overview, "overview", unread)
    app = make_app(client, LOGIN)
    for path in ("/", "/api/overview"):
        status, headers, body = call(app, path, LOGIN, method="HEAD")
        assert status.startswith("200") and body == b"" and headers["Cache-Control"] == "no-store"
    status, headers, body = call(app, "/", method="HEAD")
    assert status.startswith("401") and body == b"" and int(headers["Content-Length"]) > 0


def test_authorised_compares_user_and_password():
    def header(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert authorised(header("rig:pa:ss"), "rig", "pa:ss")  # a password may hold a colon
    assert authorised(header("rïg:pässword"), "rïg", "pässword")  # UTF-8 both sides
    assert not authorised(header("rig:pa"), "rig", "pa:ss")
    assert not authorised(None, "rig", "x") and not authorised("basic", "rig", "x")
    # An empty login never lets anyone in, even one sent empty (issue 14 item 2, #1).
    assert not authorised(header(":"), "", "") and not authorised(None, "", "")
    assert not authorised(header("admin:"), "admin", "")


def test_the_page_has_no_outside_asset_and_never_writes_data_as_html():
    from rig.web.server import page_html

    page = page_html().decode()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "<link" not in page and "src=" not in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page and "document.write" not in page
