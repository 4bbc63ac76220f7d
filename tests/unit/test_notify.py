"""The "submitted" messages (rig/notify.py): sent before a submit call returns, one per
priority; never left pending, never "dropped"."""

from __future__ import annotations

from rig import notify


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


def test_nothing_is_ever_pending():
    assert notify.flush(0) is True

