"""JobHandle.get() of a failed, killed or timed-out @rig.task call: RemoteError shows the
remote traceback only when the job printed one; otherwise the end of its output, said to be so."""

from __future__ import annotations

import pytest

from rig.client import JobHandle, RemoteError
from rig.errors import InvalidInput, LogMissing
from rig.memory import GIB
from rig.models import Job, JobState, Priority


class StubClient:
    def __init__(self, state: JobState, reason: str, log: str | Exception) -> None:
        self.job = Job(id=7, name="train", user="u", command=["x"], gpu_memory=GIB, gpus=1,
                       priority=Priority.MEDIUM, state=state, reason=reason, workdir="/", created_at=0.0, kind="python")
        self._log = log

    def wait(self, job_id, timeout=None, instance=None):  # noqa: ANN001, ANN201
        return self.job

    def read_log(self, job_id, attempt=None):  # noqa: ANN001, ANN201
        if isinstance(self._log, Exception):
            raise self._log
        return self._log


def _raised(client: StubClient) -> RemoteError:
    with pytest.raises(RemoteError) as err:
        JobHandle(client, 7, client.job).get()
    return err.value


def test_a_cancelled_calls_output_is_not_called_its_traceback():
    """Breaker: a killed call said '--- remote traceback (job 7) ---\\nTerminated'."""
    err = _raised(StubClient(JobState.CANCELLED, "cancelled by root", "step 1\nTerminated\n"))
    assert err.traceback == "" and err.output == "step 1\nTerminated"
    assert str(err) == ("job 7 ended CANCELLED: cancelled by root\n"
                        "--- end of its output, no traceback (job 7) ---\nstep 1\nTerminated")


def test_a_printed_traceback_is_the_remote_traceback():
    err = _raised(StubClient(JobState.FAILED, "exit code 1", "hello\nTraceback (most recent call last):\n  x\nValueError: b\n"))
    assert err.traceback == "Traceback (most recent call last):\n  x\nValueError: b"
    assert "--- remote traceback (job 7) ---" in str(err)


def test_a_log_that_cannot_be_read_still_raises_the_jobs_end():
    err = _raised(StubClient(JobState.TIMEOUT, "time limit exceeded", LogMissing("job 7's log is on node b")))
    assert str(err) == "job 7 ended TIMEOUT: time limit exceeded"


@pytest.mark.parametrize("timeout", ["x", -1, True, float("nan")])
def test_a_timeout_that_is_no_number_of_seconds_is_refused_in_one_line(timeout):
    """Breaker: wait(timeout="x") raised a TypeError from inside the wait; get(-1) said
    'still PENDING after -1 s'."""
    client = StubClient(JobState.PENDING, "", "")
    with pytest.raises(InvalidInput, match=r"^timeout must be a number of seconds, 0 or more \(None: until the job "
                                           r"ends\); got "):
        JobHandle(client, 7, client.job).get(timeout)


def test_ctrl_c_while_waiting_says_the_job_goes_on(capsys):
    client = StubClient(JobState.RUNNING, "", "")

    def interrupted(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    client.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        JobHandle(client, 7, client.job).wait()
    assert capsys.readouterr().err == "rig: job 7 goes on (only the waiting stopped); .kill() or `rig kill 7` stops it\n"


def test_a_log_attempt_out_of_range_names_the_keyword(tmp_path):
    """Breaker: handle.log(attempt=9) said 'pick --attempt 1..1'."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    handle = client.submit(["true"], gpu_memory="1G")
    client.r.hset(client.keys.job(handle.id), mapping={"log_path": str(tmp_path / "1.log")})
    with pytest.raises(InvalidInput) as err:
        handle.log(attempt=9)
    assert "--attempt" not in str(err.value) and "attempt 1.." in str(err.value)


@pytest.mark.parametrize(("kind", "stored", "expected"), [
    ("python", None, RemoteError), ("python", "gAROLg==", None)])
def test_a_call_that_succeeded_without_storing_a_result_raises_instead_of_returning_none(kind, stored, expected):
    """Breaker (brkapi): a @rig.task function that called sys.exit(0) or os._exit(0) ended
    SUCCEEDED with no result stored, and .get() returned None as if the function had returned
    it (a returned None is stored too: ``gAROLg==`` is its pickle)."""
    client = StubClient(JobState.SUCCEEDED, "exit code 0", "step 1\n")
    client.job.kind = kind
    client.result_of = lambda job_id: stored  # type: ignore[attr-defined]
    if expected is None:
        assert JobHandle(client, 7, client.job).get() is None
        return
    err = _raised(client)
    assert str(err) == ("job 7 ended SUCCEEDED: exit code 0, but stored no result: the function ended its "
                        "process before it returned (sys.exit(0), os._exit(0) or an exec); let it return its "
                        "value instead\n--- end of its output, no traceback (job 7) ---\nstep 1")


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.PENDING])
def test_a_command_job_has_no_result_and_says_so(state):
    """Breaker (pyapi): `h.result` of a rig.submit command returned None, read as a value the
    command returned; it says at once (never waiting) that a command has none."""
    client = StubClient(state, "exit code 1", "")
    client.job.kind = "command"
    for read in (lambda h: h.result, lambda h: h.get(timeout=0.01)):
        with pytest.raises(InvalidInput, match="job 7 runs a command, which has no return value"):
            read(JobHandle(client, 7, client.job))


def test_a_wait_that_times_out_says_why_the_job_has_not_started(tmp_path):
    """Breaker (brkapi): ``.delay()`` with rig down, then ``.get(timeout=3)`` said only 'job 69
    is still PENDING after 3 s'; now the sentence rig show gives follows it."""
    import fakeredis

    from rig.client import Client
    from rig.config import load_settings

    client = Client(load_settings(home=tmp_path, key_prefix="t:", redis_url="redis://127.0.0.1:1/0"),
                    redis_client=fakeredis.FakeRedis(decode_responses=True))
    handle = client.submit(["true"], gpu_memory="1G", kind="python", extra={"payload": "eA=="})  # as @rig.task's
    with pytest.raises(TimeoutError) as err:
        handle.get(timeout=0.1)
    said = str(err.value)
    assert said.startswith(f"job {handle.id} is still PENDING after 0.1 s: ")
    assert said.endswith(client.why_waiting(client.get(handle.id)))
