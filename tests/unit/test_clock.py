"""rig.clock with injected clocks: Redis' TIME is the reference for stored timestamps, durations
are monotonic, a wall-clock step changes neither, and a skewed node is reported (issue 11.4)."""

from __future__ import annotations

import time

import fakeredis
import pytest
import redis

from rig import clock
from rig import estimates as E
from rig.alerts import evaluate
from rig.cli.render import node_title
from rig.client import Client
from rig.clock import SharedClock, event_time, shared_now, skew_note, use_clock
from rig.config import load_settings
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.nodes import NodeRegistry
from rig.store import JobStore
from workers.outcomes import AttemptEnd, conclude

REDIS_T0 = 1_800_000_000.0


class Fake:
    """A machine's two clocks and Redis' clock, moved by hand."""

    def __init__(self, skew: float = 0.0) -> None:
        self.mono = 1000.0
        self.redis = REDIS_T0
        self.skew = skew  # this machine's wall clock minus Redis'
        self.calls = 0
        self.down = False

    def wall(self) -> float:
        return self.redis + self.skew

    def source(self) -> float:
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("Redis away")
        return self.redis

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.redis += seconds

    def clock(self, refresh_s: float = clock.REFRESH_S) -> SharedClock:
        return SharedClock(self.source, monotonic=lambda: self.mono, wall=self.wall, refresh_s=refresh_s)


@pytest.fixture(autouse=True)
def _fresh_clocks():
    clock.reset()
    yield
    clock.reset()


def test_shared_now_is_redis_time_whatever_the_local_clock():
    for skew in (120.0, -120.0, 0.0):
        fake = Fake(skew)
        c = fake.clock()
        assert c.now() == REDIS_T0
        fake.advance(75.0)
        assert c.now() == REDIS_T0 + 75.0
        assert c.offset() == skew


def test_a_wall_clock_step_changes_neither_shared_time_nor_durations():
    fake = Fake()
    c = fake.clock()
    start = c.now()
    fake.advance(11.0)
    fake.skew += 30.0  # the machine's clock steps 30 s forward; monotonic and Redis do not
    assert c.now() - start == pytest.approx(11.0)
    assert fake.calls == 1  # no round trip per timestamp


def test_refreshes_after_refresh_s_and_keeps_counting_through_an_outage():
    fake = Fake()
    c = fake.clock(refresh_s=30.0)
    c.now()
    fake.down = True
    fake.advance(31.0)
    assert c.now() == REDIS_T0 + 31.0  # the old anchor, carried on by the monotonic clock
    calls = fake.calls
    fake.advance(1.0)
    c.now()
    assert fake.calls == calls  # no new TIME before RETRY_S: an outage costs no timeouts
    fake.down = False
    fake.advance(clock.RETRY_S)
    assert c.now() == REDIS_T0 + 32.0 + clock.RETRY_S and fake.calls == calls + 1
    assert c.now(refresh=False) == REDIS_T0 + 32.0 + clock.RETRY_S


def test_before_any_answer_the_wall_clock_is_used():
    fake = Fake(skew=5.0)
    fake.down = True
    c = fake.clock()
    assert c.now() == REDIS_T0 + 5.0
    assert c.from_wall(123.0) == 123.0


def test_event_times_convert_monotonic_and_wall_readings():
    fake = Fake(skew=120.0)
    c = fake.clock()
    c.now()
    ended_mono = fake.mono + 75.0
    fake.advance(175.0)  # written 100 s after it happened (an outage)
    assert c.at_monotonic(ended_mono) == REDIS_T0 + 75.0
    assert c.from_wall(REDIS_T0 + 75.0 + 120.0) == REDIS_T0 + 75.0  # a file mtime of the skewed node


def test_skew_note():
    assert skew_note(1.9, 2.0) is None and skew_note(None, 2.0) is None
    assert "120.0 s ahead of Redis'" in skew_note(120.0, 2.0)
    assert "120.0 s behind Redis'" in skew_note(-120.0, 2.0)


@pytest.fixture
def fake_redis() -> redis.Redis:
    return fakeredis.FakeRedis(decode_responses=True)


def _skewed(client: redis.Redis, skew: float) -> SharedClock:
    """This process's clock for ``client``: Redis' real TIME, a local wall clock off by ``skew``."""
    c = SharedClock(lambda: clock.redis_time(client), wall=lambda: time.time() + skew)
    use_clock(client, c)
    return c


def test_a_skewed_node_is_reported_in_status_and_alerts_and_cleared_when_fixed(fake_redis):
    keys = Keys("clk:")
    nodes = NodeRegistry(fake_redis, keys)
    skewed = _skewed(fake_redis, 120.0)
    nodes.register("n1", ttl=5.0, backend="fake", cards=0)
    info = nodes.read()[0]
    assert info.clock_skew and "ahead of Redis'" in info.clock_skew
    assert abs(float(fake_redis.hget(keys.node("n1"), "clock_offset")) - 120.0) < 1.0
    # "up since" is on Redis' clock, never 2 minutes in the future
    assert abs(info.started_at - clock.redis_time(fake_redis)) < 1.0
    assert "ahead of Redis'" in node_title(info, "n1", 0)
    client = Client(load_settings(key_prefix="clk:"), redis_client=fake_redis)
    assert any(a.key == "clock_skew:n1" for a in evaluate(client))
    skewed.wall = time.time  # time sync fixed
    nodes.beat("n1", ttl=5.0, source="test")
    assert nodes.read()[0].clock_skew is None


def test_timestamps_of_a_skewed_node_are_on_redis_clock(fake_redis):
    """Placed, started and ended by a node 2 minutes ahead: 0 <= placed <= started <= ended on
    Redis' clock, the runtime is the one measured, and the duration history gets it too."""
    keys = Keys("clk:")
    ledger = Ledger(fake_redis, keys)
    store = JobStore(fake_redis, keys)
    ledger.register_card("n1", GpuReading(index=0, uuid="G0", model="m", total=40 * GIB),
                         max_jobs=2, reserve_fraction=0.0, allowed=True, fake=True)
    _skewed(fake_redis, 120.0)
    job = store.create(Job(id=0, name="clk", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                           priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/", created_at=0.0))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok
    assert ledger.claim(job.id, token, "w")[0]
    running = store.get(job.id)
    now = clock.redis_time(fake_redis)
    for ts in (running.created_at, running.assigned_at, running.started_at):
        assert abs(ts - now) < 1.0, (ts, now)
    assert running.created_at <= running.assigned_at <= running.started_at
    # It ended 75 s after its start; Redis hears of it only now (it was away).
    ended_at = running.started_at + 75.0
    conclude(ledger, running, token, AttemptEnd(exit_code=0, ended_at=ended_at, runtime=75.0))
    done = store.get(job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.ended_at == pytest.approx(ended_at, abs=0.01)
    assert done.attempts[-1]["ended_at"] == pytest.approx(ended_at, abs=0.01)
    assert E.read_own(fake_redis, keys, user="u", name="clk", template=None, command=["x"])["name"] == [75.0]


def test_event_time_needs_no_redis(fake_redis):
    c = _skewed(fake_redis, -30.0)
    c.measure()
    mono = time.monotonic()
    assert event_time(fake_redis, mono=mono) == pytest.approx(shared_now(fake_redis), abs=0.5)
    assert event_time(fake_redis, wall=time.time() - 30.0) == pytest.approx(clock.redis_time(fake_redis), abs=0.5)


def test_celery_now_and_task_expiry_are_on_redis_clock(fake_redis, monkeypatch):
    """Beat stamps periodic tasks with an expiry from app.now(); the control worker that takes
    one, on another node, checks it: both on Redis' clock, so a beat 2 minutes behind neither
    has its tasks expire on arrival at a node 2 minutes ahead nor stalls after a takeover."""
    from datetime import datetime, timedelta, timezone

    from celery import Celery
    from celery.worker import request as celery_request

    from workers import celery_clock

    monkeypatch.setattr(celery_request.Request, "maybe_expire", celery_request.Request.maybe_expire)
    app = Celery("clk")
    app.conf.timezone = "UTC"
    _skewed(fake_redis, 120.0)  # this worker's machine is 2 minutes ahead

    class Ahead(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206 - Celery's own check reads this
            return datetime.now(tz) + timedelta(seconds=120)

    monkeypatch.setattr(celery_request, "datetime", Ahead)
    celery_clock.install(app, lambda: fake_redis)
    assert app.now().timestamp() == pytest.approx(clock.redis_time(fake_redis), abs=1.0)

    class Req:
        id = "t1"
        maybe_expire = celery_request.Request.maybe_expire

    sent = datetime.fromtimestamp(clock.redis_time(fake_redis), tz=timezone.utc)
    fresh, stale = Req(), Req()
    fresh.expires = sent + timedelta(seconds=5)  # type: ignore[attr-defined]
    stale.expires = sent - timedelta(seconds=5)  # type: ignore[attr-defined]
    assert not fresh.maybe_expire()  # the wall clock here says it expired 115 s ago
    assert stale.maybe_expire()
    celery_request.revoked_tasks.discard("t1")
