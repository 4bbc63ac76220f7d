import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from rig import notify
from rig.client import Client
from rig.config import load_settings
from rig.notify import BackgroundSender


@pytest.fixture(autouse=True)
def fresh_sender():
    """Each test starts with no process-wide sender (as a forked child does)."""
    notify._reset()  # noqa: SLF001
    yield
    notify.flush(5)
    notify._reset()  # noqa: SLF001


def _notify_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "rig-notify" and t.is_alive()}


def test_sends_in_order_off_the_callers_thread_and_flush_waits():
    seen: list[tuple[int, str]] = []
    gate = threading.Event()

    def send(item):
        gate.wait(5)
        seen.append((item, threading.current_thread().name))

    sender = BackgroundSender(send)
    for i in range(5):
        sender.put(i)  # returns at once although send() is blocked
    assert seen == []
    gate.set()
    assert sender.flush(5)
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"rig-notify"}


def test_flush_with_nothing_queued_returns_at_once():
    assert notify.flush(5)  # no sender yet
    sender = BackgroundSender(lambda item: None)
    sender.put(1)
    assert sender.flush(5)
    start = time.monotonic()
    assert sender.flush(5)
    assert time.monotonic() - start < 0.05


def test_a_failing_send_is_logged_and_the_next_one_still_goes(caplog):
    seen = []

    def send(item):
        if item == "bad":
            raise ConnectionError("broker down")
        seen.append(item)

    sender = BackgroundSender(send)
    sender.put("bad")
    sender.put("good")
    assert sender.flush(5)
    assert seen == ["good"]
    assert "could not send a submission message" in caplog.text


def test_a_full_backlog_sends_on_the_callers_thread(monkeypatch):
    monkeypatch.setattr(notify, "MAX_BACKLOG", 1)
    gate = threading.Event()
    taken = threading.Event()
    seen = []

    def send(item):
        if item == 0:
            taken.set()
            gate.wait(5)
        seen.append((item, threading.current_thread().name))

    sender = BackgroundSender(send)
    sender.put(0)  # taken by the thread, which blocks
    assert taken.wait(5)
    sender.put(1)  # fills the backlog of 1
    sender.put(2)  # no room: delivered here, at once
    assert (2, threading.current_thread().name) in seen
    gate.set()
    assert sender.flush(5)
    assert [i for i, _ in seen] == [2, 0, 1]


def test_senders_and_clients_share_one_thread(monkeypatch, tmp_path):
    before = _notify_threads()
    seen: list[tuple[str, int]] = []

    def record(tag):
        return lambda item: seen.append((tag, threading.get_ident()))

    a, b = BackgroundSender(record("a")), BackgroundSender(record("b"))
    for _ in range(3):
        a.put(1)
        b.put(2)
    clients = [Client(load_settings(home=tmp_path)) for _ in range(2)]
    job = SimpleNamespace(id=7, name="j", user="u", gpu_memory=1, gpus=1, priority=None)
    for i, client in enumerate(clients):
        monkeypatch.setattr(client, "_send_submitted", record(f"client{i}"))
        client._notify_submitted(job)  # noqa: SLF001
    assert clients[0].flush(5)
    assert [tag for tag, _ in seen] == ["a", "b"] * 3 + ["client0", "client1"]
    assert len({ident for _, ident in seen}) == 1
    assert threading.get_ident() not in {ident for _, ident in seen}
    assert len(_notify_threads() - before) == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_thread_is_drained_on_the_callers_thread():
    gate = threading.Event()
    seen = []

    def send(item):
        if item == "die":
            gate.wait(5)
            raise SystemExit  # a BaseException ends the thread (silently)
        seen.append((item, threading.current_thread().name))

    sender = BackgroundSender(send)
    sender.put("die")
    sender.put(1)
    sender.put(2)
    thread = notify._dispatcher._thread  # noqa: SLF001
    gate.set()
    thread.join(5)
    assert not thread.is_alive()
    start = time.monotonic()
    assert sender.flush(5)
    assert time.monotonic() - start < 1
    me = threading.current_thread().name
    assert seen == [(1, me), (2, me)]


def test_a_broker_that_stops_answering_is_given_up_at_exit_without_a_warning(caplog):
    """Nothing of a job is lost when its 'submitted' message is not sent (rig.notify's doc), so
    the exit hook never reports messages as dropped; it stops waiting once none goes out."""
    import logging

    gate = threading.Event()
    sender = BackgroundSender(lambda item: gate.wait(5))
    for i in range(3):
        sender.put(i)
    try:
        start = time.monotonic()
        with caplog.at_level(logging.DEBUG, logger="rig.notify"):
            notify._flush_at_exit(0.2)  # noqa: SLF001
        assert time.monotonic() - start < 2
    finally:
        gate.set()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "not sent at exit (broker not answering); the jobs are queued, nothing is lost" in caplog.text
    assert sender.flush(5)


def test_a_slow_backlog_is_sent_in_full_at_exit(caplog):
    """Seen: '1383 submission message(s) still unsent ... dropped' after a big submit_many: the
    exit hook gave up after a fixed 5 s while messages were still going out."""
    sent = []
    sender = BackgroundSender(lambda item: (time.sleep(0.02), sent.append(item)))
    for i in range(30):  # ~0.6 s of sending, three times the stall limit below
        sender.put(i)
    notify._flush_at_exit(0.2)  # noqa: SLF001
    assert sent == list(range(30))
    assert "unsent" not in caplog.text and "dropped" not in caplog.text


def test_announce_sends_one_message_per_priority_before_it_returns():
    from rig.models import Job, JobState, Priority

    class FakeCelery:
        def __init__(self) -> None:
            self.sent: list[tuple] = []

        def send_task(self, name, args, queue, retry, argsrepr):  # noqa: ANN001
            self.sent.append((name, args, queue, argsrepr))

    def job(i: int, prio: Priority) -> Job:
        return Job(id=i, name="sweep", user="ana", command=["true"], gpu_memory=2**30, gpus=1,
                   priority=prio, state=JobState.PENDING, workdir="/", created_at=0.0)

    celery = FakeCelery()
    jobs = [job(i, Priority.LOW) for i in range(12, 1012)] + [job(1012, Priority.HIGH)]
    assert notify.announce(celery, jobs) == 2
    assert celery.sent == [
        ("rig.submitted", [12], Priority.LOW.queue, "jobs 12-1011 (1000) 'sweep' by ana, low"),
        ("rig.submitted", [1012], Priority.HIGH.queue, "job 1012 'sweep' by ana: 1.0 GiB x 1, high")]

    class Down:
        def send_task(self, *a, **k):  # noqa: ANN002, ANN003
            raise ConnectionError("broker gone")

    assert notify.announce(Down(), jobs[:1]) == 0  # logged at debug, never raised: the job is queued


def test_a_forked_child_flushes_at_once_and_sends_on_its_own():
    gate = threading.Event()
    parent_seen = []

    def slow(item):
        gate.wait(5)
        parent_seen.append(item)

    sender = BackgroundSender(slow)
    for i in range(3):
        sender.put(i)  # the thread holds 0, 1 and 2 wait: the child must neither wait nor send them
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: always leaves through os._exit, never back into pytest
        code = 1
        try:
            os.close(read_end)
            start = time.monotonic()
            notify._flush_at_exit()  # noqa: SLF001 - what a normal exit runs
            elapsed = time.monotonic() - start
            child_seen = []
            child = BackgroundSender(lambda item: child_seen.append((item, threading.current_thread().name)))
            child.put("from the child")
            flushed = child.flush(5)
            os.write(write_end, json.dumps({
                "elapsed": elapsed, "flushed": flushed, "seen": child_seen,
            }).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    gate.set()
    assert os.waitstatus_to_exitcode(status) == 0
    assert report["elapsed"] < 0.5
    assert report["flushed"]
    assert report["seen"] == [["from the child", "rig-notify"]]
    assert sender.flush(5)
    assert parent_seen == [0, 1, 2]
