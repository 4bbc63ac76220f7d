"""A Redis that refuses writes (full, read-only, MISCONF) is an outage everywhere, and a Redis
that may lose rig's data is said to (rig.redis_writes). The refusals are real ones: a private
redis-server of this test's own with maxmemory 1 (never CONFIG SET on the shared Redis)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from rig import estimates
from rig import redis_writes as W
from rig.client import Client
from rig.config import load_settings
from rig.errors import RedisFull, RedisRefusesWrites, RedisUnavailable
from rig.gpus.base import GpuReading
from rig.keys import Keys
from rig.ledger import Ledger
from rig.memory import GIB
from rig.models import Job, JobState, Priority
from rig.redis_conn import redis_cli, redis_cli_note, suggest_cli, unavailable

OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")


# -- what counts as a refusal -----------------------------------------------------------------------
@pytest.mark.parametrize(("exc", "kind"), [
    (OOM, W.FULL),
    (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: abc, on "
                         "@user_script:1."), W.FULL),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), W.READ_ONLY),
    (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently "
                         "unable to persist to disk."), W.CANNOT_PERSIST),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
    (redis.ConnectionError("refused"), None),
])
def test_refusal_kinds(exc, kind):
    assert W.refusal(exc) == kind
    assert W.is_outage(exc) is (kind is not None or isinstance(exc, redis.ConnectionError))


def test_refused_errors_are_rig_outages_with_one_line():
    full = W.refused_error("redis://:secret@h:1/0", OOM)
    assert isinstance(full, RedisFull) and isinstance(full, RedisUnavailable) and full.exit_code == 5
    assert "secret" not in str(full) and "\n" not in str(full)
    assert "is full (maxmemory reached, policy noeviction)" in str(full) and "maxmemory" in str(full)
    ro = W.refused_error("redis://h:1/0", redis.exceptions.ReadOnlyError("x"))
    assert type(ro) is RedisRefusesWrites and "read-only replica" in str(ro) and "primary" in str(ro)


class _FakeInfo:
    """A client whose CONFIG GET and INFO answers are given (CONFIG may be refused)."""

    def __init__(self, config: dict[str, str] | None, memory: dict, persistence: dict | None = None) -> None:
        self.config, self.memory, self.persistence = config, memory, persistence or {}

    def config_get(self, name: str) -> dict[str, str]:
        if self.config is None:
            raise redis.ResponseError("ERR unknown command 'CONFIG'")
        return {name: self.config[name]} if name in self.config else {}

    def info(self, section: str) -> dict:
        return {"memory": self.memory, "persistence": self.persistence, "replication": {"role": "master"}}[section]


def test_warnings_evicting_policy_and_no_persistence():
    memory = {"used_memory": 10, "maxmemory": 0, "maxmemory_policy": "allkeys-lru"}
    client = _FakeInfo({"maxmemory-policy": "allkeys-lru", "save": "", "appendonly": "no"}, memory)
    lines = W.warnings(client, url=URL)  # type: ignore[arg-type]
    assert len(lines) == 2
    assert "allkeys-lru" in lines[0] and "noeviction" in lines[0]
    assert "no RDB save, no AOF" in lines[1]
    # Kept on disk by either: nothing said. The private Redis: persistence not asked.
    assert W.warnings(_FakeInfo({"maxmemory-policy": "noeviction", "save": "3600 1", "appendonly": "no"},
                                memory), url=URL) == []  # type: ignore[arg-type]
    assert len(W.warnings(client, url=URL, private=True)) == 1  # type: ignore[arg-type]


#: rig's Redis in these tests: not the 127.0.0.1:6379 a bare `redis-cli` would act on.
URL = "redis://:secret@10.0.0.7:6400/3"


def test_the_commands_rig_suggests_name_rigs_redis_and_hide_its_password():
    """A tester copied `redis-cli CONFIG SET appendonly yes` as printed: it acted on
    127.0.0.1:6379, maybe another installation. Every suggested command names rig's URL."""
    memory = {"used_memory": 10, "maxmemory": 0, "maxmemory_policy": "allkeys-lru"}
    client = _FakeInfo({"maxmemory-policy": "allkeys-lru", "save": "", "appendonly": "no"}, memory)
    lines = W.warnings(client, url=URL)  # type: ignore[arg-type]
    full = W.refused_error(URL, redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."))
    for line in [*lines, str(full)]:
        assert "`redis-cli -u redis://:PASSWORD@10.0.0.7:6400/3 CONFIG SET " in line, line
        assert "secret" not in line, line
    assert redis_cli("redis://10.0.0.7:6400/0", "PING") == "redis-cli -u redis://10.0.0.7:6400/0 PING"
    assert redis_cli("unix:///run/r.sock?db=2", "PING") == "redis-cli -s /run/r.sock -n 2 PING"


@pytest.fixture
def sentinels_answering(monkeypatch):
    """The sentinels as rig.sentinel_url asks them: those in the returned set answer (SENTINEL
    MASTERS), every other is down. No network: the 10.0.0.x of these tests are no hosts."""
    alive: set[tuple[str, int]] = {("10.0.0.1", 26379)}
    monkeypatch.setattr("rig.sentinel_url._ask_sentinel",
                        lambda hp, _kwargs: ("masters", {"mymaster": {}}) if hp in alive else ("down", ""))
    return alive


def test_the_redis_cli_line_behind_sentinel_says_how_to_find_the_master(sentinels_answering):
    """redis-cli cannot follow Sentinel: the line names the master by role and a note gives the
    one command that finds it, with no password of either kind printed. The line is only the
    command (callers quote it in backticks); the note goes after the closing backtick."""
    url = "sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/2?sentinel_password=sp"
    assert redis_cli(url, "PING") == "redis-cli -h MASTER -p PORT -n 2 -a PASSWORD PING"
    note = ("(MASTER PORT: the master's address, from `redis-cli -h 10.0.0.1 -p 26379 -a SENTINEL_PASSWORD "
            "SENTINEL get-master-addr-by-name mymaster`)")
    assert redis_cli_note(url) == note
    assert suggest_cli(url, "PING") == f"`redis-cli -h MASTER -p PORT -n 2 -a PASSWORD PING` {note}"
    plain = redis_cli("sentinel://10.0.0.1:26379/mymaster", "INFO memory")
    assert plain == "redis-cli -h MASTER -p PORT INFO memory"
    assert " -a " not in redis_cli_note("sentinel://10.0.0.1:26379/mymaster")
    assert "pw" not in note and "sp" not in note.replace("SENTINEL", "")
    # Plain URLs: no note, the quoted line is all.
    assert redis_cli_note("redis://10.0.0.7:6400/0") == ""
    assert suggest_cli("redis://10.0.0.7:6400/0", "PING") == "`redis-cli -u redis://10.0.0.7:6400/0 PING`"


def test_the_hint_behind_sentinel_names_a_sentinel_that_answers(sentinels_answering):
    """The AOF hint (`turn on AOF (... from `redis-cli -h S ...`)`) named the first listed
    sentinel, dead or not: the copied line said "Connection refused". It names the first that
    answers now; with none answering it says so, naming those listed."""
    url = "sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/0"
    client = _FakeInfo({"maxmemory-policy": "noeviction", "save": "", "appendonly": "no"},
                       {"used_memory": 10, "maxmemory": 0, "maxmemory_policy": "noeviction"})
    sentinels_answering.clear()
    sentinels_answering.add(("10.0.0.3", 26379))  # the first two are dead
    [aof] = W.warnings(client, url=url)  # type: ignore[arg-type]
    assert "turn on AOF (`redis-cli -h MASTER -p PORT -a PASSWORD CONFIG SET appendonly yes` (MASTER PORT: the " \
           "master's address, from `redis-cli -h 10.0.0.3 -p 26379 SENTINEL get-master-addr-by-name mymaster`)" \
           in aof, aof
    sentinels_answering.clear()
    note = redis_cli_note(url)
    assert note == ("(MASTER PORT: the master's address, from `redis-cli -h HOST -p PORT SENTINEL "
                    "get-master-addr-by-name mymaster` on a sentinel; none of those listed answers now: "
                    "10.0.0.1:26379, 10.0.0.2:26379, 10.0.0.3:26379)")


def test_the_hung_redis_message_behind_sentinel_quotes_only_the_command(sentinels_answering):
    """Issue 15: the parenthetical was inside the backticks (`redis-cli ... ping (MASTER ...`)."""
    url = "sentinel://10.0.0.1:26379/mymaster/0"
    line = str(unavailable(url, redis.TimeoutError("Timeout reading from socket")))
    assert "check it with `redis-cli -h MASTER -p PORT ping` (MASTER PORT: the master's address, from " in line
    full = str(W.refused_error(url, redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")))
    assert "(`redis-cli -h MASTER -p PORT CONFIG SET maxmemory <size>` (MASTER PORT: " in full


def test_warnings_without_config_read_info_and_guess_nothing():
    memory = {"used_memory": 10, "maxmemory": 100, "maxmemory_policy": "volatile-lru"}
    lines = W.warnings(_FakeInfo(None, memory, {"aof_enabled": 0}), url=URL)  # type: ignore[arg-type]
    assert len(lines) == 1 and "volatile-lru" in lines[0]  # save unknown: no persistence line


def test_full_notice_says_the_figures():
    full = _FakeInfo({}, {"used_memory": 3 * 2**20, "maxmemory": 2**20, "maxmemory_policy": "noeviction"})
    line = W.full_notice(full)  # type: ignore[arg-type]
    assert line is not None and line.startswith("Redis is full (used 3")
    assert "of maxmemory 1" in line and "policy noeviction)" in line
    roomy = _FakeInfo({}, {"used_memory": 3, "maxmemory": 2**20, "maxmemory_policy": "noeviction"})
    assert W.full_notice(roomy) is None  # type: ignore[arg-type]
    assert W.refusal_notice(full) == line and W.refuses_writes(full)  # type: ignore[arg-type]
    watch = W.FullWatch("n1")
    assert watch.check(full, speaks=False) == []  # type: ignore[arg-type]
    assert [a.status for a in watch.check(full, speaks=True)] == ["firing"]  # type: ignore[arg-type]
    assert watch.check(full, speaks=True) == []  # type: ignore[arg-type]
    assert [a.status for a in watch.check(roomy, speaks=False)] == ["resolved"]  # type: ignore[arg-type]


def test_a_failed_rdb_save_that_stops_writes_is_said():
    """MISCONF: the last RDB save failed and stop-writes-on-bgsave-error is on (its default, so
    also assumed when CONFIG is refused); with it off, Redis takes writes: nothing said."""
    memory = {"used_memory": 3, "maxmemory": 0, "maxmemory_policy": "noeviction"}
    failed = {"rdb_last_bgsave_status": "err"}
    for config in (None, {"stop-writes-on-bgsave-error": "yes", "save": "3600 1"}):
        line = W.refusal_notice(_FakeInfo(config, memory, failed))  # type: ignore[arg-type]
        assert line is not None and "MISCONF" in line
    off = {"stop-writes-on-bgsave-error": "no", "save": "3600 1"}
    assert W.refusal_notice(_FakeInfo(off, memory, failed)) is None  # type: ignore[arg-type]
    assert W.refusal_notice(_FakeInfo(None, memory, {"rdb_last_bgsave_status": "ok"})) is None  # type: ignore[arg-type]


def test_an_aof_that_cannot_be_written_is_said():
    """A full disk under an AOF: Redis refuses every write (no setting turns it off), though
    its last RDB save (none) is fine; `rig status` said nothing of it."""
    memory = {"used_memory": 3, "maxmemory": 0, "maxmemory_policy": "noeviction"}
    failing = {"aof_enabled": 1, "aof_last_write_status": "err", "rdb_last_bgsave_status": "ok"}
    line = W.refusal_notice(_FakeInfo(None, memory, failing))  # type: ignore[arg-type]
    assert line is not None and "AOF" in line and "MISCONF" in line
    assert W.refusal_notice(_FakeInfo(None, memory, {**failing, "aof_last_write_status": "ok"})) is None  # type: ignore[arg-type]
    err = W.refused_error("redis://h:1/0", redis.ResponseError("MISCONF Errors writing to the AOF file: No space "
                                                               "left on device"))
    assert "could not write to its AOF file (MISCONF)" in str(err) and "snapshot" not in str(err)


# -- against a real, private, full Redis ---------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(folder: Path, *extra: str) -> tuple[str, subprocess.Popen]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return url, proc
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[str]:
    url, proc = _start_redis(tmp_path / "redis")
    yield url
    proc.terminate()
    proc.wait(10)


def _fill(url: str, full: bool) -> None:
    redis.Redis.from_url(url).config_set("maxmemory", 1 if full else 0)


def test_submit_on_a_full_redis_raises_rigs_error_and_burns_no_id(private_redis, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(redis_url=private_redis, key_prefix="full:", home=tmp_path / "home")
    client = Client(settings)
    first = client.submit("true", gpu_memory="1G")
    _fill(private_redis, True)
    for _ in range(3):
        with pytest.raises(RedisFull, match=r"is full \(used .* of maxmemory 1 B, policy noeviction\)"):
            client.submit_many([{"command": ["true"], "gpu_memory": "1G"}] * 300)
    with pytest.raises(RedisFull):
        client.submit("true", gpu_memory="1G")
    assert "Redis is full (used" in client.status().notices[0]  # reads still work
    _fill(private_redis, False)
    after = client.submit_many([{"command": ["true"], "gpu_memory": "1G"}] * 2)
    assert [h.id for h in after] == [first.id + 1, first.id + 2]  # no id burnt
    assert not any("Redis is full" in n for n in client.status().notices)


def test_rig_submit_on_a_full_redis_is_one_line_exit_5(private_redis, tmp_path, monkeypatch):
    from rig.cli.submit import main

    monkeypatch.chdir(tmp_path)
    for name, value in {"RIG_REDIS_URL": private_redis, "RIG_KEY_PREFIX": "full:",
                        "RIG_HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    _fill(private_redis, True)
    result = CliRunner().invoke(main, ["--gpu-memory", "1G", "--", "true"])
    assert result.exit_code == 5, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rig: error: Redis at ") and "is full (used" in lines[0]
    assert "submitted" not in result.output


def test_card_runner_keeps_a_jobs_ending_until_redis_takes_it(private_redis, tmp_path):
    from workers.card_runner import CardRunner
    from workers.outcomes import AttemptEnd

    settings = load_settings(redis_url=private_redis, key_prefix="full:", home=tmp_path / "home",
                             node_name="n1")
    r = redis.Redis.from_url(private_redis, decode_responses=True)
    ledger = Ledger(r, Keys("full:"))
    ledger.register_card("n1", GpuReading(index=0, uuid="u", model="m", total=80 * GIB),
                         max_jobs=4, reserve_fraction=0.0, allowed=True, fake=True)
    job = ledger.store.create(Job(id=0, name="f", user="u", command=["true"], gpu_memory=GIB, gpus=1,
                                  priority=Priority.MEDIUM, state=JobState.PENDING, workdir="/",
                                  created_at=time.time()))
    ok, token = ledger.reserve(job.id, "n1", [0], GIB)
    assert ok and ledger.claim(job.id, token, "card0@n1")[0]
    runner = CardRunner(settings, "n1", 0, "card0@n1")
    _fill(private_redis, True)
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(runner._finish(job.id, token, AttemptEnd(exit_code=0))))
    try:
        thread.start()
        # A full Redis refuses a script only before its first write (transition.lua's first
        # removes), and the ending's run history rides in that script (rig.ledger.Writes): it
        # may be taken at once, or once there is room; never given up, never taken in part.
        thread.join(1.5)
        _fill(private_redis, False)
        thread.join(15)
        assert not thread.is_alive()
    finally:
        runner.shutdown.set()
        _fill(private_redis, False)
    final = ledger.store.get(job.id)
    assert final.state is JobState.SUCCEEDED and final.exit_code == 0
    assert done == [JobState.SUCCEEDED]  # recorded by this ending, not found "already ended"
    kept = estimates.read_own(r, Keys("full:"), user="u", name="f", template=None, command=[])["name"]
    assert len(kept) == 1  # its run time kept for backfill
    assert ledger.holdings("n1", 0) == {}


def test_a_batch_whose_transaction_is_refused_takes_no_id(monkeypatch):
    """Redis took the id counter's step but refused the records (the batch pushed it over
    maxmemory while queued): the ids must not be gone. Here the transaction's EXEC is refused."""
    import fakeredis

    from rig.store import JobStore

    client = fakeredis.FakeRedis(decode_responses=True)
    store = JobStore(client, Keys("burn:"))

    def refused(self, raise_on_error=True):  # noqa: ANN001, ANN202, ARG001
        self.reset()
        raise OOM

    monkeypatch.setattr(redis.client.Pipeline, "execute", refused)
    jobs = [(Job(id=0, name="b", user="u", command=["true"], gpu_memory=GIB, gpus=1, priority=Priority.LOW,
                 state=JobState.PENDING, workdir="/", created_at=time.time()), None) for _ in range(500)]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        store.create_many(jobs)
    monkeypatch.undo()
    assert client.get(store.keys.next_job_id) in (None, "0")
    assert [j.id for j in store.create_many(jobs[:2])] == [1, 2]


def test_a_read_only_replica_is_one_line_too(private_redis, tmp_path, monkeypatch):
    """rig pointed at a replica: its writes are refused (READONLY); rig's error says so, not
    "full", and the CLI exits 5 with that one line."""
    from rig.cli.submit import main

    primary_port = private_redis.rsplit(":", 1)[1].split("/")[0]
    replica_url, replica = _start_redis(tmp_path / "replica", "--replicaof", "127.0.0.1", primary_port)
    try:
        monkeypatch.chdir(tmp_path)
        client = Client(load_settings(redis_url=replica_url, key_prefix="ro:", home=tmp_path / "home"))
        with pytest.raises(RedisRefusesWrites, match="read-only replica") as caught:
            client.submit("true", gpu_memory="1G")
        assert not isinstance(caught.value, RedisFull)
        for name, value in {"RIG_REDIS_URL": replica_url, "RIG_KEY_PREFIX": "ro:",
                            "RIG_HOME": str(tmp_path / "home")}.items():
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(main, ["--gpu-memory", "1G", "--", "true"])
        assert result.exit_code == 5 and len(result.output.strip().splitlines()) == 1, result.output
        assert "read-only replica" in result.output
        assert W.refuses_writes(redis.Redis.from_url(replica_url))
    finally:
        replica.terminate()
        replica.wait(10)


def test_beat_waits_through_a_refused_write_and_fails_on_others(monkeypatch):
    """workers.beat: an outage in a tick (redbeat does not retry a refused write) returns the
    retry interval, said once; any other error still ends beat."""
    from redbeat import RedBeatScheduler

    from workers.beat import OUTAGE_RETRY_S, RigBeatScheduler

    scheduler = RigBeatScheduler.__new__(RigBeatScheduler)
    scheduler.lock_key = None  # no lock to take in this test
    raised: list[BaseException] = [OOM]

    def tick(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202, ARG001
        if raised:
            raise raised.pop()
        return 1.5

    monkeypatch.setattr(RedBeatScheduler, "tick", tick)
    assert scheduler.tick() == OUTAGE_RETRY_S and scheduler._outage is not None
    assert scheduler.tick() == 1.5 and scheduler._outage is None
    raised.append(redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    with pytest.raises(redis.ResponseError):
        scheduler.tick()


def test_a_redis_whose_disk_is_full_still_answers_rigs_views(tmp_path):
    """The private Redis keeps its AOF under RIG_HOME: with that disk full it refuses every
    write and PING too (Redis does so on purpose), and every rig view (`rig status`, `jobs`,
    `show`, `log`: their connection check is a PING) failed with the refusal, exactly when the
    operator needed them. The check lets readers on; `rig status` says why writes fail."""
    from rig.redis_conn import check

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    proc = None
    try:
        url, proc = _start_redis(disk, "--appendonly", "yes", "--appendfsync", "everysec")
        client = redis.Redis.from_url(url, decode_responses=True)
        client.set("rig-test:job", "kept")
        with open(disk / "filler", "wb") as filler:  # the rest of the disk: a job's log
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"x" * 65536)
                    filler.flush()
        deadline = time.monotonic() + 10
        while W.refusal(_write_refused(client)) is None:  # the AOF write fails: writes refused
            assert time.monotonic() < deadline, "Redis never refused a write on a full disk"
            time.sleep(0.1)
        with pytest.raises(redis.ResponseError, match="MISCONF"):
            client.ping()
        check(client, url)  # no error: it answers
        assert client.get("rig-test:job") == "kept"
        (notice,) = [n for n in W.notices(client, url=url) if "refuses writes" in n]
        assert "AOF" in notice
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _write_refused(client: redis.Redis) -> BaseException:
    try:
        client.set("rig-test:probe", "x" * 4096)
    except redis.ResponseError as exc:
        return exc
    return Exception("taken")
