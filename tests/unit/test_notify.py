import threading

from rig import notify
from rig.notify import BackgroundSender


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
    seen = []

    def send(item):
        if item == 0:
            gate.wait(5)
        seen.append((item, threading.current_thread().name))

    sender = BackgroundSender(send)
    sender.put(0)  # taken by the thread, which blocks
    while sender._queue.qsize():  # noqa: SLF001 - wait until the thread holds item 0
        pass
    sender.put(1)  # fills the backlog of 1
    sender.put(2)  # no room: delivered here, at once
    assert (2, threading.current_thread().name) in seen
    gate.set()
    assert sender.flush(5)
    assert [i for i, _ in seen] == [2, 0, 1]
