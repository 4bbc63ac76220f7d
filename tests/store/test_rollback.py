"""Redis restarted from an older RDB snapshot (rig.rollback): jobs that finished and were
archived after the snapshot come back as waiting or assigned, and the id counter goes back.
Each test runs its own redis-server, saves a snapshot, SIGKILLs it and starts it again on the
same folder (never the shared Redis)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from rig.archive import Archive, default_url
from rig.archiving import archive_pass
from rig.clock import shared_now
from rig.config import load_settings
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.rollback import check, note, server_run, unchecked
from rig.testing.sentinel_set import free_port, redis_server_binary
from tests.store.conftest import add_cards
from workers.dispatcher import Dispatcher
from workers.health import HealthChecker, HealthReport

PREFIX = "rb:"


@dataclass
class Server:
    """A private redis-server that keeps its RDB file in ``folder`` across restarts."""

    folder: Path
    port: int
    proc: subprocess.Popen | None = None

    def start(self) -> redis.Redis:
        self.proc = subprocess.Popen([redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, decode_responses=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return client
            except (redis.ConnectionError, redis.BusyLoadingError):
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)  # polling its port: a starting server has no event to await

    def crash_and_restart(self) -> redis.Redis:
        """SIGKILL (no save on the way out), then start again: it loads its last snapshot."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        return self.start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    try:
        redis_server_binary()
    except Exception:  # noqa: BLE001 - no binary here: the test cannot run
        pytest.skip("no redis-server binary")
    srv = Server(tmp_path / "redis", free_port())
    srv.folder.mkdir()
    srv.start()
    yield srv
    if srv.proc is not None:
        srv.proc.kill()
        srv.proc.wait(10)


def _installation(server: Server, name: str = "inst-test") -> tuple[redis.Redis, Keys, Ledger]:
    """A client of ``server``, the keys, and a ledger with one 40 GiB card on n1, in an
    installation created now."""
    client = redis.Redis(port=server.port, decode_responses=True)
    keys = Keys(PREFIX)
    client.hset(keys.installation, mapping={"id": name, "created_at": shared_now(client)})
    return client, keys, add_cards(_ledger(client), 1, 40)


def _ledger(client: redis.Redis) -> Ledger:
    return Ledger(client, Keys(PREFIX))


def _submit(ledger: Ledger, name: str) -> Job:
    return ledger.store.create(Job(id=0, name=name, user="ann", command=["true"], gpu_memory=10 * GIB, gpus=1,
                                   priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/w",
                                   created_at=shared_now(ledger.r)))


def _finish(ledger: Ledger, job_id: int) -> None:
    code, _ = ledger.transition(job_id, JobState.SUCCEEDED, fields={"exit_code": 0, "node": "n1"})
    assert code == 1


def _archive_all(client: redis.Redis, archive: Archive) -> None:
    report = archive_pass(client, Keys(PREFIX), archive, after_seconds=0.0, keep=0, now=shared_now(client) + 1)
    assert report is not None


def _reserved(ledger: Ledger) -> dict[int, int]:
    return ledger.holdings("n1", 0)


def test_jobs_archived_after_the_snapshot_are_not_run_again_and_their_ids_not_reused(server, tmp_path):
    client, keys, ledger = _installation(server)
    waiting = _submit(ledger, "waiting")  # PENDING in the snapshot
    placed = _submit(ledger, "placed")  # ASSIGNED in the snapshot: cards held for it
    ok, _ = ledger.reserve(placed.id, "n1", [0], 10 * GIB)
    assert ok
    client.save()
    # After the snapshot: both finish and are archived; job 3 is submitted and still waits at
    # the crash (not archived: lost with Redis); job 4 runs, finishes and is archived.
    _finish(ledger, waiting.id)
    _finish(ledger, placed.id)
    lost = _submit(ledger, "lost")
    later = _submit(ledger, "later")
    _finish(ledger, later.id)
    with Archive(default_url(tmp_path), PREFIX) as archive:
        _archive_all(client, archive)
        archived = {job_id: archive.record(job_id, job.instance) for job_id, job in
                    ((waiting.id, waiting), (placed.id, placed), (later.id, later))}
        assert all(r is not None and r["state"] == "SUCCEEDED" for r in archived.values())

        client = server.crash_and_restart()
        ledger = _ledger(client)
        assert ledger.store.get(waiting.id).state is JobState.PENDING  # the snapshot is back
        assert ledger.store.get(placed.id).state is JobState.ASSIGNED and _reserved(ledger)
        assert int(client.get(keys.next_job_id)) == placed.id

        _archive_all(client, archive)  # the pass checks first

        assert ledger.store.ids_in_state(JobState.PENDING) == [] and ledger.store.ids_in_state(JobState.ASSIGNED) == []
        assert not client.exists(keys.job(waiting.id)) and not client.exists(keys.job(placed.id))
        assert client.zcard(keys.pending) == 0 and _reserved(ledger) == {}  # never placed, cards free
        for job_id, record in archived.items():  # the archive's record is the job's record
            assert archive.record(job_id, record["instance"]) == record
        assert int(client.get(keys.next_job_id)) == later.id
        assert _submit(ledger, "new").id == later.id + 1  # no id an archived job has
        line = note(client, keys)
        assert line is not None and "Redis went back to an older copy" in line
        assert f"2 job(s) it held again as waiting or running had already finished ({waiting.id}, {placed.id})" in line
        assert f"job ids went back to {placed.id}" in line and f"up to {later.id}" in line
        assert f"1 job(s) with ids {lost.id}-{later.id} submitted after that copy and not archived" in line

        assert not check(client, keys, archive)  # repaired: the next pass finds nothing


def test_ids_restarting_in_a_redis_that_came_back_empty_are_not_taken_for_a_rollback(server, tmp_path):
    client, keys, ledger = _installation(server, "inst-old")
    old = _submit(ledger, "old")
    _finish(ledger, old.id)
    with Archive(default_url(tmp_path), PREFIX) as archive:
        _archive_all(client, archive)
        for key in client.scan_iter(f"{PREFIX}*"):  # Redis loses everything: its copy is empty
            client.delete(key)
        client.save()
        client = server.crash_and_restart()
        client.hset(keys.installation, mapping={"id": "inst-new", "created_at": shared_now(client)})
        found = check(client, keys, archive)
        assert not found and client.get(keys.next_job_id) is None and note(client, keys) is None
        assert _submit(_ledger(client), "again").id == 1  # README: ids restart at 1


def test_a_restarted_redis_is_unchecked_until_checked_and_nothing_is_placed_or_concluded_lost_meanwhile(
        server, tmp_path):
    client, keys, ledger = _installation(server)
    with Archive(default_url(tmp_path), PREFIX) as archive:
        check(client, keys, archive)
        assert not unchecked(client, keys, 60.0)
        waiting = _submit(ledger, "running")  # RUNNING in the snapshot
        ok, token = ledger.reserve(waiting.id, "n1", [0], 10 * GIB)
        assert ok and ledger.claim(waiting.id, token, "card0@n1")[0]
        assert ledger.store.get(waiting.id).state is JobState.RUNNING
        client.save()
        _finish(ledger, waiting.id)
        _archive_all(client, archive)
        client = server.crash_and_restart()  # the stamp is back, with the old server's run_id
        assert unchecked(client, keys, 60.0)
        assert not unchecked(client, keys, -21.0)  # past overdue_after: an unreadable archive stops nothing

        settings = load_settings(redis_url=f"redis://127.0.0.1:{server.port}/0", key_prefix=PREFIX,
                                 home=tmp_path / "home")
        calls: list[str] = []
        cannot = Dispatcher(settings, client=client, check_rollback=lambda: calls.append("check") is not None)
        assert not cannot._checked() and calls == ["check"]  # this node cannot check: it places nothing
        health = HealthChecker(settings, client)
        job = ledger.store.get(waiting.id)
        report = HealthReport()
        health._lost(job, "test", report)
        assert report.lost == [] and ledger.store.get(waiting.id).state is JobState.RUNNING  # not retried

        can = Dispatcher(settings, client=client, check_rollback=lambda: bool(check(client, keys, archive)) or True)
        assert can._checked() and not unchecked(client, keys, 60.0)
        assert not client.exists(keys.job(waiting.id))  # ended as archived, forgotten: nothing to place
        assert can.dispatch_pass() == 0


def test_the_dispatcher_sees_a_restart_in_its_leader_check_even_without_a_connection_error(server, tmp_path):
    client, keys, ledger = _installation(server)
    with Archive(default_url(tmp_path), PREFIX) as archive:
        settings = load_settings(redis_url=f"redis://127.0.0.1:{server.port}/0", key_prefix=PREFIX,
                                 home=tmp_path / "home")
        checks: list[str] = []

        def check_now() -> bool:
            checks.append(server_run(client) or "")
            check(client, keys, archive)
            return True

        dispatcher = Dispatcher(settings, client=client, check_rollback=check_now)
        assert not dispatcher._lead() and dispatcher._checked() and dispatcher._lead()  # checked at start
        waiting = _submit(ledger, "waiting")
        client.save()
        _finish(ledger, waiting.id)
        _archive_all(client, archive)
        server.crash_and_restart()  # the dispatcher's client reconnects on its own: no error
        assert not dispatcher._lead()  # the leader check's INFO: another run_id, so no pass
        assert dispatcher._checked() and len(checks) == 2 and checks[0] != checks[1]
        assert not client.exists(keys.job(waiting.id)) and dispatcher._lead()


def test_a_copy_that_moved_after_the_archived_end_is_a_new_run_and_left_alone(server, tmp_path):
    client, keys, ledger = _installation(server)
    with Archive(default_url(tmp_path), PREFIX) as archive:
        job = _submit(ledger, "job")
        client.save()
        _finish(ledger, job.id)
        _archive_all(client, archive)
        client = server.crash_and_restart()
        ledger = _ledger(client)
        # Nobody could check for longer than rig.rollback.unchecked waits: it was placed again.
        ok, _ = ledger.reserve(job.id, "n1", [0], 10 * GIB)
        assert ok and float(client.hget(keys.job(job.id), "assigned_at")) > archive.finished_among([job.id])[
            (job.id, job.instance)][1]
        assert not check(client, keys, archive).stale
        assert ledger.store.get(job.id).state is JobState.ASSIGNED and ledger.holdings("n1", 0)


def test_rig_status_and_rig_why_say_placement_waits_for_the_check_after_a_restart(server, tmp_path):
    """While the dispatcher places nothing (unchecked), `rig status` says so and `rig why` does
    not say "fits now" alone; once checked, neither says it."""
    from rig.client import Client

    client, keys, ledger = _installation(server)
    job = _submit(ledger, "waits")
    client.save()
    client = server.crash_and_restart()
    settings = load_settings(redis_url=f"redis://127.0.0.1:{server.port}/0", key_prefix=PREFIX,
                             home=tmp_path / "home")
    api = Client(settings, redis_client=client)
    said = "not yet checked against the archive"
    assert any(said in n for n in api.status().notices)
    assert said in (api.why_waiting(api.store.get(job.id)) or "")
    with Archive(default_url(tmp_path), PREFIX) as archive:
        check(client, keys, archive)
    assert not any(said in n for n in api.status().notices)
    assert said not in (api.why_waiting(api.store.get(job.id)) or "")
