"""rig's web page in a real headless browser (Debian's chromium; .ci/run installs it): the
node's HTTP server (rig.web.server) on a free port against a real Redis holding a mixed load of
three users (rig.testing.web_load: records written through the real ledger, no workers). The
DOM is read after the page's script fetched /api/overview and drew it; also the login rules and
/metrics through the same server."""

from __future__ import annotations

import base64
import html
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.testing.web_load import HOSTILE_NAME, MixedLoad, mixed_load
from rig.web.server import LOGIN_NEEDED, start_web_server
from tests.conftest import REDIS_URL
from tests.store.test_web_overview import FROZEN_LINE, freeze_a_node_without_cards

pytestmark = [pytest.mark.slow, pytest.mark.redis]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROMTOOL = shutil.which("promtool")
LOGIN = ("admin", "page-test-password")


@pytest.fixture(scope="module")
def page_server(tmp_path_factory) -> Iterator[tuple[str, MixedLoad]]:
    """One server and one load for every test of the module: (base URL, the load)."""
    import uuid

    import redis

    from tests.conftest import REAL_REDIS, delete_prefix

    if not REAL_REDIS:
        pytest.skip(f"no Redis at {REDIS_URL}")
    prefix = f"rigtest:{uuid.uuid4().hex[:10]}:"
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    home = tmp_path_factory.mktemp("web-home")
    client = Client(load_settings(key_prefix=prefix, redis_url=REDIS_URL, home=home), redis_client=r)
    try:
        load = mixed_load(client)
        freeze_a_node_without_cards(client)  # node gpu3: its Redis came back empty
        server = start_web_server(client, "127.0.0.1", 0, LOGIN)
        try:
            yield f"127.0.0.1:{server.server_port}", load
        finally:
            server.shutdown()
            server.server_close()
    finally:
        delete_prefix(r, prefix)
        r.close()


def browse(url: str, profile: Path, *extra: str, zone: str | None = None) -> subprocess.CompletedProcess:
    """Chromium headless on ``url``, with its own profile folder (never another run's), given
    5 s of virtual time for the page's script to fetch and draw; ``zone``: the browser's TZ."""
    import os

    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=90, env={**os.environ, "TZ": zone} if zone else None)


def rows(dom: str) -> dict[int, str]:
    """Job id -> the text of each table row the page drew for that job (rows of several
    tables joined)."""
    out: dict[int, str] = {}
    for job_id, inner in re.findall(r'<tr data-job="(\d+)">(.*?)</tr>', dom, flags=re.S):
        text = html.unescape(re.sub(r"<[^>]+>", " ", inner))
        out[int(job_id)] = out.get(int(job_id), "") + " ".join(text.split())
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_the_page_in_a_browser_shows_cards_queues_and_escapes_names(page_server, tmp_path):
    address, load = page_server
    user, password = LOGIN
    # The login in the URL: Chromium answers the server's basic-auth challenge with it, and the
    # page's own fetch (to the origin, without the login) is sent the same credentials.
    # A browser in another zone than the server's: the page says both (rig's own times in the browser's).
    done = browse(f"http://{user}:{password}@{address}/", tmp_path / "profile", "--dump-dom", zone="Asia/Kathmandu")
    dom = done.stdout
    assert "<title>rig</title>" in dom, done.stderr[-2000:]
    assert f"logged in as {user}" in dom and 'id="problem-text"' not in dom, dom[-3000:]
    for card in ("gpu1/0", "gpu1/1", "gpu2/0", "gpu2/1"):
        assert f'data-card="{card}"' in dom, card
    # A node without cards is drawn too; FROZEN is a red banner in rig status' words.
    frozen = re.search(r'data-node="gpu3"><h3>(.*?)</h3>', dom, flags=re.S)
    assert frozen and "FROZEN" in frozen.group(1) and "0 card(s)" in frozen.group(1), dom[:3000]
    assert f'<div class="banner bad node-alert">FROZEN: {html.escape(FROZEN_LINE, quote=False)}</div>' in dom
    assert '<p class="warn">no cards registered' not in dom
    assert "util 97%" in dom and "temp 71C" in dom and "8: sweep-lr-0.003 (carol)" in dom
    drawn = rows(dom)
    for job_id in load.running:
        assert "running" in drawn[job_id], drawn.get(job_id)
    waiting = drawn[load.waiting[0]]
    assert "eval-70b" in waiting and "needs 70.0 GiB on 1 card" in waiting and "no dispatcher is running" in waiting
    # Its estimated start: none without a dispatcher (the cell's title says why).
    assert "<th class=\"num\">est. start</th>" in dom and " unknown " in waiting, waiting
    failed = drawn[load.failed[0]]
    assert "prep-data" in failed and "FAILED" in failed and "cuda_oom" in failed and "CUDA out of memory" in failed
    assert "TIMEOUT" in drawn[load.failed[1]]
    # The hostile name is shown as its characters; none of it became an element or ran.
    assert HOSTILE_NAME in drawn[load.hostile]
    assert html.escape(HOSTILE_NAME, quote=False) in dom
    assert "<img" not in dom and "pwned" not in dom.split("</title>")[0]
    # Three users in the users table, the history's note.
    for name in ("alice", "bob", "carol"):
        assert f"<td>{name}</td>" in dom
    assert "samples since" in dom
    if time.localtime().tm_gmtoff != 20700:
        server_zone = time.strftime("%z")
        assert (f"(times in your zone, UTC+05:45; in the server's sentences, its zone, UTC{server_zone[:3]}:"
                f"{server_zone[3:]})") in dom
    # The jobs that ended before the first sample are said beside the bars, not lost.
    assert "not in the bars: 3 succeeded, 2 failed, 0 cancelled by " in dom and "when the first sample was taken" in dom
    # One time format on the page: hours without a leading zero, in the header as in the charts
    # and estimated starts ("2:21:21 PM", "~3:20 PM"; was "03:20 PM" beside "2:21:21 PM").
    assert not re.search(r"(?<![\d:])0\d:\d\d(:\d\d)?\s?[AP]M", dom), re.findall(r"\d\d:\d\d\s?[AP]M", dom)[:5]

    shot = tmp_path / "page.png"
    browse(f"http://{user}:{password}@{address}/", tmp_path / "profile2", "--window-size=1400,1900",
           f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one


def evaluate_in_page(url: str, ready: str, expression: str, *, width: int, height: int, profile: Path,
                     timeout: float = 60.0) -> object:
    """Open ``url`` in headless Chromium in a ``width`` x ``height`` window, wait until the
    JavaScript ``ready`` is true (the page's script drew), and return ``expression``'s value. The
    DevTools protocol over --remote-debugging-pipe (fd 3 to the browser, fd 4 from it; messages
    end in NUL): measurements --dump-dom cannot give (sizes after layout)."""
    import json
    import os

    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def on_fds_3_and_4() -> None:
        reads, writes = os.dup(to_browser_r), os.dup(from_browser_w)  # out of 3/4's way first
        os.dup2(reads, 3)
        os.dup2(writes, 4)

    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--remote-debugging-pipe", "about:blank"],
        preexec_fn=on_fds_3_and_4, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pending = b""
    sent = 0

    def call(method: str, params: dict, session: str | None = None) -> dict:
        nonlocal pending, sent
        sent += 1
        message = {"id": sent, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(to_browser_w, json.dumps(message).encode() + b"\0")
        while True:  # events and other answers are skipped
            while b"\0" not in pending:
                chunk = os.read(from_browser_r, 65536)
                assert chunk, "chromium closed its DevTools pipe"
                pending += chunk
            raw, pending = pending.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == sent:
                assert "error" not in answer, answer
                return answer["result"]

    def value(session: str, js: str) -> object:
        return call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session)["result"].get("value")

    try:
        target = call("Target.createTarget", {"url": url, "width": width, "height": height, "newWindow": True})
        session = call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        deadline = time.monotonic() + timeout
        while value(session, ready) is not True:
            assert time.monotonic() < deadline, f"the page never got to: {ready}"
            time.sleep(0.1)
        return value(session, expression)
    finally:
        proc.kill()
        proc.wait()
        os.close(to_browser_w)
        os.close(from_browser_r)


#: What sticks out of a window, sideways: the page's own width, and the elements whose right
#: edge passes the window's, outside a table's scrolling box.
SIDEWAYS = """JSON.stringify({
  page: document.documentElement.scrollWidth, window: window.innerWidth,
  out: [...document.querySelectorAll("main *, header *")]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5 && !e.closest(".scroll"))
    .map(e => `${e.tagName.toLowerCase()}.${e.className.baseVal ?? e.className}#${e.id}`).slice(0, 10),
  boxed: [...document.querySelectorAll("table")].map(t => t.parentElement.classList.contains("scroll")),
  scrolled: [...document.querySelectorAll(".scroll")].filter(b => b.scrollWidth > b.clientWidth).length})"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_at_480_px_tables_scroll_in_their_own_box_and_the_page_never_sideways(page_server, tmp_path):
    """A phone-sized window: the tables of running, waiting and failed jobs ran off the side and
    the whole page scrolled sideways (601 px wide in a 480 px window)."""
    import json

    address, _ = page_server
    got = json.loads(evaluate_in_page(
        f"http://{LOGIN[0]}:{LOGIN[1]}@{address}/", "!!document.querySelector('#waiting table')", SIDEWAYS,
        width=480, height=900, profile=tmp_path / "profile"))
    assert got["out"] == [] and got["page"] <= got["window"], got
    assert got["boxed"] and all(got["boxed"]), got
    assert got["scrolled"] > 0, got  # a table wider than the window is there, scrolling in its box


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_without_the_login_the_browser_gets_no_page(page_server, tmp_path):
    address, _ = page_server
    done = browse(f"http://{address}/", tmp_path / "profile", "--dump-dom")
    assert "logged in as" not in done.stdout and 'data-card="' not in done.stdout
    wrong = browse(f"http://{LOGIN[0]}:wrong@{address}/", tmp_path / "profile2", "--dump-dom")
    assert "logged in as" not in wrong.stdout and 'data-card="' not in wrong.stdout


def test_the_login_rules_and_metrics_over_http(page_server):
    address, _ = page_server
    for path in ("/", "/api/overview"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{address}{path}", timeout=10)
        assert refused.value.code == 401 and refused.value.read().decode() == LOGIN_NEEDED
        assert ("WWW-Authenticate" in refused.value.headers) == (path == "/")
    head = urllib.request.Request(f"http://{address}/api/overview", method="HEAD",
                                  headers={"Authorization": "Basic " + base64.b64encode(":".join(LOGIN).encode()).decode()})
    with urllib.request.urlopen(head, timeout=10) as response:  # headers only, at once
        assert response.status == 200 and response.read() == b""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:  # no login
        text = response.read().decode()
    assert 'rig_waiting_jobs{priority="high"} 1.0' in text
    if PROMTOOL is None:
        pytest.skip("promtool (Debian's prometheus) is not installed; .ci/run installs it")
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), checked.stdout + checked.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")
def test_a_redis_that_does_not_answer_is_said_on_the_page(tmp_path):
    """Redis down (or a wrong URL) while the page is open: the page loads and says so in one
    line, with what to expect (it retries)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    server = start_web_server(Client(load_settings(home=tmp_path / "home"), redis_client=dead), "127.0.0.1", 0, LOGIN)
    try:
        done = browse(f"http://{LOGIN[0]}:{LOGIN[1]}@127.0.0.1:{server.server_port}/", tmp_path / "profile",
                      "--dump-dom")
    finally:
        server.shutdown()
        server.server_close()
    problem = re.search(r'id="problem-text">([^<]*)<', done.stdout)
    assert problem, done.stdout[-2000:]
    assert problem.group(1).startswith("cannot read rig's state: ") and "retrying every 5 s" in problem.group(1)
