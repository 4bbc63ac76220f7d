"""`rig log -f` through the gateway (a user who cannot read the log folder): a log cut to its cap
and a log deleted and made again by its keeper are followed as when the follower reads the file
itself (rig.cli.logview.CutFollower, fed by the gateway's log_look: rig.gateway.server), and an
older gateway without log_look is still followed as before, without a traceback.

A real gateway on a real Unix socket in this process (over fakeredis), the real keeper's copy
(rig.logkeeper.LogCopy) writing numbered lines, a scripted job record; each poll's sleep is where
the test's next moment happens, so nothing waits on the clock."""

from __future__ import annotations

import io
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest

from rig import logkeeper, logspace
from rig.cli.logview import CutFollower, show_log
from rig.client import Client
from rig.config import load_settings
from rig.gateway import wire
from rig.gateway.client import GatewayClient
from rig.gateway.server import Gateway, Peer, bind
from rig.logkeeper import LogCopy
from rig.memory import GIB
from rig.models import Job, JobState, Priority

MADE_AGAIN = "was deleted and made again"
MARKER = b"bytes of output were cut here"
CAP = 64 * 1024


@pytest.fixture
def gateway(tmp_path) -> Iterator[tuple[Gateway, GatewayClient, int]]:
    """A gateway serving this test's user, and one job of that user's, its client and its id."""
    settings = load_settings(home=tmp_path / "home", key_prefix="rigtest:gatefollow:", admins=[])
    gw = Gateway(settings, Client(settings, redis_client=fakeredis.FakeRedis(decode_responses=True)))
    path = Path(f"/tmp/rig-test-gateways/{os.getpid()}-follow.sock")
    server = bind(path, gw)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    me = os.getuid()
    answer = gw.handle(Peer(os.getpid(), me, os.getgid()), {"op": "submit", "args": wire.encode(
        {"command": ["true"], "options": {"gpu_memory": "1G", "workdir": "/tmp"}})})
    assert answer["ok"], answer
    job_id = wire.decode(answer["result"])["job"].id
    client = GatewayClient(settings, path)
    yield gw, client, job_id
    client.close()
    server.shutdown()
    server.server_close()
    path.unlink(missing_ok=True)


class Keeper:
    """The card's keeper of one log, the real LogCopy, fed numbered lines."""

    def __init__(self, log: Path, cap: int = 1 << 20) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.copy = LogCopy(log, cap)
        self.n = 0

    def write(self, lines: int) -> None:
        for _ in range(lines):
            self.copy.feed(b"line-%06d %s\n" % (self.n, b"y" * 40))
            self.n += 1

    def looks_at_once(self, yes: bool) -> None:
        self.copy._check_at = 0.0 if yes else float("inf")


def _log(gw: Gateway, job_id: int) -> Path:
    log = gw.settings.job_log_dir / str(job_id) / "attempt-1.log"
    gw.client.store.update(job_id, log_paths=[str(log)])  # what the gateway lets its owner read
    return log


def _follow(log: Path, moments: list[Callable[[], None] | None], *, client: GatewayClient | None = None,
            job_id: int = 0) -> tuple[bytes, list[str], dict]:
    """Follow the job, directly or (``client``) through the gateway: before poll i ``moments[i]``
    runs; the record is final at the last moment. Returns (stdout, rig's lines, counts)."""
    counts = {"gets": 0, "sleeps": 0, "requests": 0}
    final_at = len(moments) - 1

    def get() -> Job:
        i = counts["gets"]
        counts["gets"] += 1
        if i < len(moments) and moments[i] is not None:
            moments[i]()
        state = JobState.SUCCEEDED if i >= final_at else JobState.RUNNING
        return Job(id=job_id or 7, name="t", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                   priority=Priority.MEDIUM, state=state, workdir="/", created_at=time.time(), node="n1", cards=[0],
                   attempt=1, log_paths=[str(log)], exit_code=0 if state is JobState.SUCCEEDED else None)

    def sleep(seconds: float) -> None:
        assert seconds > 0
        counts["sleeps"] += 1
        assert counts["sleeps"] < 100, "the follower does not end"

    out, said = io.BytesIO(), []
    if client is None:
        show_log(get, attempt=None, follow=True, out=out, say=said.append, sleep=sleep)
    else:
        call = client.call

        def counted(op: str, **args):  # noqa: ANN202
            counts["requests"] += 1
            return call(op, **args)

        client.call = counted  # type: ignore[method-assign]
        show_log(get, attempt=None, follow=True, out=out, say=said.append, sleep=sleep,
                 open_log=lambda path: client.open_log(job_id, path),
                 exists=lambda path: client.log_exists(job_id, path))
    return out.getvalue(), said, counts


def _same(a: bytes, b: bytes) -> bool:
    """The same output, but for the clock times in the keeper's own lines."""
    def clockless(text: bytes) -> bytes:
        return re.sub(rb"[0-9]{2}:[0-9]{2}:[0-9]{2}", b"T", text)
    return clockless(a) == clockless(b)


def _numbers(text: bytes) -> list[int]:
    return [int(n) for n in re.findall(rb"^line-(\d+) ", text, re.M)]


def _both(gw: Gateway, client: GatewayClient, job_id: int,
          script: Callable[[Keeper, Path], list[Callable[[], None] | None]], cap: int = 1 << 20):
    """The same scripted job followed directly, then through the gateway (a fresh log each)."""
    results = []
    for via in (None, client):
        log = _log(gw, job_id)
        shutil.rmtree(log.parent, ignore_errors=True)
        keeper = Keeper(log, cap)
        results.append((*_follow(log, script(keeper, log), client=via, job_id=job_id), keeper))
        keeper.copy.close()
    return results


def test_a_log_made_again_is_followed_from_its_start_as_when_read_directly(gateway):
    gw, client, job_id = gateway

    def script(keeper: Keeper, log: Path) -> list[Callable[[], None] | None]:
        keeper.write(10)

        def deleted_and_made_again() -> None:
            shutil.rmtree(log.parent)
            keeper.looks_at_once(True)
            keeper.write(10)  # the keeper makes the log again: more than the follower had read

        return [None, lambda: keeper.write(10), deleted_and_made_again, *[None] * 6, lambda: keeper.write(10)]

    (direct, said_d, _, keeper_d), (gated, said_g, counts, keeper_g) = _both(gw, client, job_id, script)
    assert _same(gated, direct)
    assert _numbers(gated) == list(range(keeper_g.n))  # every line once, in order: the new file's first too
    assert gated.count(b"[rig: this log was deleted") == 1
    assert sum(MADE_AGAIN in line for line in said_g) == 1
    assert [line.split(" (seen at")[0] for line in said_g] == [line.split(" (seen at")[0] for line in said_d]
    # No spin: one sleep a poll, and a poll is a few requests (a look, and exists while reopening).
    assert counts["sleeps"] == counts["gets"] - 1
    assert counts["requests"] <= 2 * counts["gets"] + 4, counts


def test_a_log_gone_a_while_before_it_is_made_again(gateway):
    """Deleted, and the keeper has not made it again at the next polls: the follower waits,
    says nothing, and then reads the new file from its start."""
    gw, client, job_id = gateway
    log = _log(gw, job_id)
    keeper = Keeper(log)
    keeper.write(3)

    def deleted() -> None:
        shutil.rmtree(log.parent)
        keeper.looks_at_once(False)

    def made_again() -> None:
        keeper.looks_at_once(True)
        keeper.write(3)

    text, said, counts = _follow(log, [None, deleted, None, None, made_again, None, lambda: keeper.write(2)],
                                 client=client, job_id=job_id)
    assert _numbers(text) == list(range(8))
    assert sum(MADE_AGAIN in line for line in said) == 1
    assert not [line for line in said if "waiting for" in line or "left no log" in line], said
    assert counts["sleeps"] == counts["gets"] - 1
    keeper.copy.close()


def test_a_log_renamed_away_is_not_taken_for_one_made_again(gateway):
    """`mv attempt-1.log elsewhere` and another file put in its place: the keeper writes on into
    the renamed file (it still has a name), which the gateway cannot reach. The follower must not
    say the log was made again nor print the stranger file as the job's output: it says what
    happened in one line and follows that attempt no further."""
    gw, client, job_id = gateway
    log = _log(gw, job_id)
    keeper = Keeper(log)
    keeper.write(3)

    def renamed() -> None:
        log.rename(log.with_name("kept.log"))
        log.write_bytes(b"a stranger's file\n")
        keeper.looks_at_once(True)
        keeper.write(3)  # into kept.log: the keeper makes nothing again

    text, said, counts = _follow(log, [None, renamed, None, None, lambda: keeper.write(2), None],
                                 client=client, job_id=job_id)
    assert _numbers(text) == [0, 1, 2] and b"stranger" not in text
    assert not any(MADE_AGAIN in line for line in said), said
    assert sum("was renamed away or replaced by another file" in line for line in said) == 1, said
    assert counts["sleeps"] == counts["gets"] - 1
    assert _numbers(log.with_name("kept.log").read_bytes()) == list(range(8))
    keeper.copy.close()


@pytest.mark.parametrize("fast", [False, True], ids=["read-before-cut", "cut-before-read"])
def test_a_log_cut_to_its_cap_is_followed_as_when_read_directly(gateway, fast, monkeypatch):
    """The keeper cuts the log in place (head, marker, newest output). Read before the cut:
    every line once; a fast writer, whose output was cut before it was read: the marker where
    the file has it, then the lines on without a gap, to the job's last. rig's note that the
    log was cut comes through the gateway too."""
    gw, client, job_id = gateway
    read_note = logspace.read_note
    # The follower's process cannot read the note itself (as a user outside the log folder);
    # the gateway reads it through its own descriptor.
    monkeypatch.setattr(logspace, "read_note",
                        lambda path: read_note(path) if str(path).startswith("/proc/self/fd/") else {})
    step = 2000 if fast else 300  # lines between two polls: ~110 kB (past the cap) or ~16 kB

    def script(keeper: Keeper, log: Path) -> list[Callable[[], None] | None]:
        return [None, *[(lambda: keeper.write(step)) for _ in range(6)], lambda: keeper.write(5)]

    (direct, said_d, _, _), (gated, said, counts, keeper) = _both(gw, client, job_id, script, cap=CAP)
    assert keeper.copy.cut > 0, "the log was never cut: the test tests nothing"
    assert _same(gated, direct)
    assert sum("log cut:" in line for line in said) == 1, said  # the one line after the attempt
    numbers = _numbers(gated)
    assert numbers == sorted(set(numbers)) and numbers[-1] == keeper.n - 1
    if fast:
        parts = gated.split(MARKER)
        assert len(parts) > 2, "no marker for output cut before it was read"
        for part in parts:
            if found := _numbers(part):
                assert found == list(range(found[0], found[-1] + 1))
    else:
        assert numbers == list(range(keeper.n)) and MARKER not in gated
    assert counts["sleeps"] == counts["gets"] - 1


def test_an_older_gateway_without_log_look_is_followed_as_before(gateway, monkeypatch):
    gw, client, job_id = gateway
    del gw.ops["log_look"]  # what a gateway of an earlier rig answers: no such operation
    log = _log(gw, job_id)
    keeper = Keeper(log)
    keeper.write(5)
    text, said, counts = _follow(log, [None, lambda: keeper.write(5), None, lambda: keeper.write(5)],
                                 client=client, job_id=job_id)
    assert _numbers(text) == list(range(15))
    assert not [line for line in said if "Traceback" in line or "no operation" in line], said
    assert counts["sleeps"] == counts["gets"] - 1
    keeper.copy.close()


def test_log_look_reads_only_the_callers_own_logs(gateway):
    """The look is authorised as log_read is: another user's job, a path the record does not
    name, or one outside the log folder is refused in one line."""
    gw, client, job_id = gateway
    log = _log(gw, job_id)
    Keeper(log).write(2)
    stranger = gw.handle(Peer(os.getpid(), 40001, 40001), {"op": "log_look", "args": wire.encode(
        {"job_id": job_id, "path": str(log)})})
    assert not stranger["ok"] and stranger["error"]["type"] == "PermissionDenied", stranger
    for path in ("/etc/shadow", str(log.with_name("attempt-2.log"))):
        answer = gw.handle(Peer(os.getpid(), os.getuid(), os.getgid()),
                           {"op": "log_look", "args": wire.encode({"job_id": job_id, "path": path})})
        assert not answer["ok"] and "no log of job" in answer["error"]["message"], answer


@pytest.fixture(autouse=True)
def _keeper_looks_when_told(monkeypatch):
    monkeypatch.setattr(logkeeper, "UNLINK_CHECK_S", 0.0)


TRUNCATED = "was truncated by something other than rig"


@pytest.mark.parametrize("written_after", [3, 40])  # the file shorter than the place reached, or longer again
def test_a_log_truncated_by_a_copy_truncate_rotation_is_read_again_from_its_start(gateway, written_after):
    """`cp attempt-1.log attempt-1.log.1; : > attempt-1.log` while the job prints: a tester's
    follower printed `tick 13`, an empty line, `tick 26` (14-25 lost, nothing said). Directly and
    through the gateway, the new file is read from its start, with one line on stderr."""
    gw, client, job_id = gateway

    def script(keeper: Keeper, log: Path) -> list[Callable[[], None] | None]:
        def rotated() -> None:
            shutil.copy(log, log.with_name(log.name + ".1"))
            os.truncate(log, 0)
            keeper.write(written_after)  # the keeper writes O_APPEND: from the new start

        return [None, lambda: keeper.write(20), rotated, None, lambda: keeper.write(3), None]

    for output, said, _, keeper in _both(gw, client, job_id, script):
        assert _numbers(output) == list(range(keeper.n)), output  # every line once, in order
        assert sum(TRUNCATED in line for line in said) == 1, said


def test_a_cut_in_the_middle_of_a_look_repeats_no_line(gateway, monkeypatch):
    """The keeper cuts the log while a look reads it, just before the look reads the data (a
    loaded host, where a thread can stall there: CI saw 972 lines shown twice). The data is read
    first and the checks after it (rig.cli.logview.LogSource.look), so the cut shows in the checks
    and the data read at the old place in the new file is dropped: every line once, in order, to
    the last, directly and through the gateway."""
    gw, client, job_id = gateway
    real_pread = os.pread
    armed: list[Keeper] = []
    fired: list[int] = []

    def pread(fd: int, size: int, offset: int) -> bytes:
        if armed and size > CutFollower.TAIL:  # the look's read of the data (the others are short)
            keeper = armed.pop()
            cut_before = keeper.copy.cut
            keeper.write(800)  # ~42 kB past the follower's place at ~37 kB: cut to 48 kB once
            fired.append(keeper.copy.cut - cut_before)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)

    def script(keeper: Keeper, log: Path) -> list[Callable[[], None] | None]:
        return [None, lambda: keeper.write(700), lambda: armed.append(keeper), lambda: keeper.write(100),
                lambda: keeper.write(5)]

    for text, _said, _counts, keeper in _both(gw, client, job_id, script, cap=CAP):
        assert fired.pop(0) > 0, "no cut during the look: the test tests nothing"
        numbers = _numbers(text)
        assert numbers == sorted(set(numbers)), "a line repeated or out of order"
        # The cut took only output it had read (the head's end to ~32 kB): nothing is missing.
        assert numbers == list(range(keeper.n)) and MARKER not in text
