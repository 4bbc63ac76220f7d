"""The archive: finished jobs' records, moved out of Redis into a SQL database (rig.archiving
moves them; this module is all the SQL there is).

Two back ends with one schema: SQLite (the standard library's ``sqlite3``, WAL mode) in a file,
by default ``$RIG_HOME/archive.sqlite3``, and PostgreSQL (psycopg 3, imported only when the URL
asks for it). Their differences are the placeholder (``?`` / ``%s``), how a connection is
opened (:class:`_Dialect`) and how a transaction serializes writers or reads one snapshot
(:meth:`Archive._transaction`).

A row is one job: the fields accounting needs as real columns (rig.accounting computes the
figures, the same way for a job still in Redis) and the whole Redis hash as JSON (``record``),
from which :meth:`Archive.get` rebuilds the job with ``Job.from_redis``: the one parser.

Key: (prefix, id, instance). Job ids restart at 1 when Redis loses its data, so an id alone
would make a new job 5 collide with an archived job 5; ``instance`` (models.new_job_instance)
tells them apart, and ``prefix`` keeps two installations on one database apart. Writing a row
again replaces it (an upsert): archiving the same job twice is harmless, and a job that was
retried after a first copy was written is archived again with its final record.

The usage rollup (``rig_usage``): per installation, group (``dim``: user, name, template, pool,
node; ``grp``: its value), UTC day (rig.accounting.day_of) and outcome (state, failure; '' for
none), the sums rig usage adds up (rig.accounting.Sums). It is written in the same transaction
as the jobs' rows (:meth:`Archive.add`): a job's row replaced takes its old sums away and adds
its new ones, so the rollup is always exactly the sums of the rows (a rolled-back batch changes
neither; a job archived twice counts once). Writers are serialized (SQLite: BEGIN IMMEDIATE;
PostgreSQL: a transaction-level advisory lock), so two passes at once cannot both miss the
other's row. An archive written before the rollup existed gets it built from its rows, once,
when it is first opened by this version (logged, and said by ``rig usage``).

Times are epoch seconds (float); memory in bytes; durations in seconds.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rig import packed
from rig.accounting import (
    DAY,
    GROUPS,
    Accounting,
    Sums,
    Tally,
    accounting_of,
    day_of,
    first_whole_day,
    group_value,
    merge_into,
    tally,
)
from rig.errors import ConfigError
from rig.models import Job, JobState

log = logging.getLogger(__name__)

TABLE = "rig_jobs"

#: Columns, in insert order, with their SQL types (valid in SQLite and PostgreSQL alike).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("prefix", "TEXT NOT NULL"),
    ("id", "BIGINT NOT NULL"),
    ("instance", "TEXT NOT NULL"),  # '' for a record older than instances
    ("owner", "TEXT NOT NULL"),  # the job's user ("user" is a reserved word in PostgreSQL)
    ("name", "TEXT NOT NULL"),
    ("template", "TEXT"),
    ("pool", "TEXT"),
    ("node", "TEXT"),
    ("state", "TEXT NOT NULL"),
    ("failure", "TEXT"),  # rig.failures.FailureClass value, NULL when it succeeded
    ("submitted_at", "DOUBLE PRECISION NOT NULL"),
    ("started_at", "DOUBLE PRECISION"),  # the last attempt's start
    ("ended_at", "DOUBLE PRECISION"),
    ("gpu_memory", "BIGINT NOT NULL"),  # declared bytes per card
    ("gpus", "INTEGER NOT NULL"),
    ("exit_code", "INTEGER"),
    ("attempts", "INTEGER NOT NULL"),
    ("wait_seconds", "DOUBLE PRECISION"),  # submission -> first start; NULL if it never started
    ("card_seconds", "DOUBLE PRECISION NOT NULL"),  # sum over attempts of cards x seconds run
    ("reserved_byte_seconds", "DOUBLE PRECISION NOT NULL"),  # declared bytes x cards x seconds
    ("used_byte_seconds", "DOUBLE PRECISION"),  # measured mean bytes x cards x seconds; NULL: never measured
    ("vram_peak", "BIGINT"),  # the highest measured peak of its attempts (bytes per card)
    ("vram_mean", "BIGINT"),  # the last measured attempt's mean (bytes per card)
    ("record", "TEXT NOT NULL"),  # the Redis hash as a JSON object, packed (rig.packed: zlib)
    ("archived_at", "DOUBLE PRECISION NOT NULL"),
    # JSON {node: [card_s, reserved_byte_s, used_byte_s]} when its attempts ran on several nodes
    # (rig.accounting.Accounting.node_split); NULL: all on ``node``. Added to older tables on open.
    ("node_split", "TEXT"),
)
#: Columns added after the first release: (name, type), added by ALTER TABLE when missing.
_ADDED = (("node_split", "TEXT"),)
KEY = ("prefix", "id", "instance")
_NAMES = tuple(name for name, _ in COLUMNS)

_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    + ", ".join(f"{n} {t}" for n, t in COLUMNS)
    + f", PRIMARY KEY ({', '.join(KEY)}))",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_by_id ON {TABLE} (prefix, id)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_by_submitted ON {TABLE} (prefix, submitted_at)",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_by_ended ON {TABLE} (prefix, ended_at)",
)
_UPSERT = (
    f"INSERT INTO {TABLE} ({', '.join(_NAMES)}) VALUES ({', '.join('?' for _ in _NAMES)}) "
    f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET "
    + ", ".join(f"{n} = excluded.{n}" for n in _NAMES if n not in KEY)
)
#: What rig usage reads of a row: the figures' inputs, never the record.
_USAGE_COLUMNS = ("id", "instance", "owner", "name", "template", "pool", "node", "state", "failure",
                  "submitted_at", "ended_at", "wait_seconds", "card_seconds", "reserved_byte_seconds",
                  "used_byte_seconds", "node_split")

USAGE_TABLE = "rig_usage"
#: The rollup's columns: its key, then the sums (rig.accounting.Sums' fields, in order).
_ROLLUP_KEY = ("prefix", "dim", "day", "grp", "state", "failure")
_ROLLUP_SUMS = ("jobs", "card_seconds", "reserved_byte_seconds", "used_byte_seconds", "used_jobs", "wait_seconds",
                "waited_jobs")
_ROLLUP_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {USAGE_TABLE} (prefix TEXT NOT NULL, dim TEXT NOT NULL, day BIGINT NOT NULL, "
    "grp TEXT NOT NULL, state TEXT NOT NULL, failure TEXT NOT NULL, jobs BIGINT NOT NULL, "
    "card_seconds DOUBLE PRECISION NOT NULL, reserved_byte_seconds DOUBLE PRECISION NOT NULL, "
    "used_byte_seconds DOUBLE PRECISION NOT NULL, used_jobs BIGINT NOT NULL, "
    "wait_seconds DOUBLE PRECISION NOT NULL, waited_jobs BIGINT NOT NULL, "
    f"PRIMARY KEY ({', '.join(_ROLLUP_KEY)}))"
)
_ROLLUP_ADD = (
    f"INSERT INTO {USAGE_TABLE} ({', '.join(_ROLLUP_KEY + _ROLLUP_SUMS)}) "
    f"VALUES ({', '.join('?' for _ in _ROLLUP_KEY + _ROLLUP_SUMS)}) "
    f"ON CONFLICT ({', '.join(_ROLLUP_KEY)}) DO UPDATE SET "
    + ", ".join(f"{n} = {USAGE_TABLE}.{n} + excluded.{n}" for n in _ROLLUP_SUMS)
)
#: A rollup query's sums, in Sums' order (SUM of NULL-free columns).
_ROLLUP_SELECT = ", ".join(f"SUM({n})" for n in _ROLLUP_SUMS)
#: The same sums straight from the jobs' rows: Sums.of mirrored (COUNT(*) jobs; used and wait
#: summed over their non-NULL values and counted).
_ROWS_SELECT = ("COUNT(*), SUM(card_seconds), SUM(reserved_byte_seconds), SUM(used_byte_seconds), "
                "COUNT(used_byte_seconds), SUM(wait_seconds), COUNT(wait_seconds)")
#: The jobs table's column for each --by group.
_GROUP_COLUMN = {"user": "owner", "name": "name", "template": "template", "pool": "pool", "node": "node"}
#: PostgreSQL: the advisory lock key that serializes archive writers (any 64-bit constant).
_PG_WRITE_LOCK = zlib.crc32(b"rig_jobs rig_usage writers")

PSYCOPG_HINT = "install it with: pip install 'psycopg[binary]' (or pip install 'rig[postgres]')"


def default_url(home: Path) -> str:
    """The archive when none is configured: a SQLite file in rig's own folder."""
    return f"sqlite:///{(home / 'archive.sqlite3').expanduser()}"


@dataclass(frozen=True)
class _Dialect:
    """How one back end differs: its placeholder and how it connects."""

    name: str
    placeholder: str

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


_SQLITE = _Dialect("sqlite", "?")
_POSTGRES = _Dialect("postgresql", "%s")


class ArchiveMissing(ConfigError):
    """The SQLite file is gone or replaced (deleted or moved while rig was up)."""


class ArchiveEmptied(ArchiveMissing):
    """The archive holds none of this cluster's jobs though the cluster archived some to it: a
    database dropped and recreated (rig made its tables again), or an empty file put in place."""


def missing(path: Path) -> ArchiveMissing:
    return ArchiveMissing(f"archive missing at {path} (deleted or moved?): put the file back; finished jobs "
                          "stay in Redis until it is there")


class ArchiveUnreadable(ArchiveMissing):
    """The SQLite file is there but this process cannot read it (its permissions, a mount): a
    reader lists Redis' jobs with one warning, as for a missing file. Its text is the OS's."""


def may_exist(path: Path) -> bool:
    """False only when ``path`` is known not to exist. One this user cannot see (a RIG_HOME of
    another user's, mode 0700: Path.exists raised PermissionError out of `rig jobs`) may: opening
    it says why it cannot be read (rig.archive.cannot_read), which readers note in one line."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def cannot_read(path: Path, exc: OSError) -> ArchiveUnreadable:
    """Why ``path`` cannot be opened to read, in the OS's words (``exc``), and what to do. The
    file's owner is named only when it is not this user and the OS said "permission denied"
    (rig keeps the file its owner's only: it holds jobs' environments), a fact, not a guess."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EACCES:
        try:
            owner = path.stat().st_uid
        except OSError:
            owner = None
        if owner is not None and owner != os.geteuid():
            reason += (f"; it is uid {owner}'s only: it holds jobs' environments, so only its owner "
                       "(the cluster's) reads the archived jobs")
    return ArchiveUnreadable(f"archive {path} cannot be read by this user ([Errno {exc.errno}] {reason}); "
                             "read it as its owner, or fix its permissions")


#: The first bytes of every SQLite database file (an empty file is a new, empty database).
SQLITE_HEADER = b"SQLite format 3\x00"


def not_an_archive(path: Path) -> ArchiveUnreadable | None:
    """The error for a ``path`` that holds something other than a SQLite database (a folder, a
    text file put in its place), which no permission would let rig use: SQLite said "disk I/O
    error" or "file is not a database" and rig's advice was to fix permissions. None when it
    is a database, empty, absent or cannot be read here (the open says why)."""
    what = None
    try:
        if path.is_dir():
            what = "a folder"
        else:
            with path.open("rb") as file:
                head = file.read(len(SQLITE_HEADER))
            what = "not a SQLite database" if head and head != SQLITE_HEADER else None
    except OSError:
        return None
    if what is None:
        return None
    return ArchiveUnreadable(f"archive {path} is {what}, not rig's archive: move it aside and put the archive "
                             "file back there, or set archive_url (RIG_ARCHIVE_URL) to the archive's file")


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``path`` (``mode=ro``: nothing is created or
    written, so a read-only file, mount or an immutable file reads). ArchiveUnreadable, with
    the OS's reason, when it cannot be opened (SQLite's own "unable to open" hides that)."""
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30.0, check_same_thread=False,
                               isolation_level=None)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # opens the file (and a WAL's -shm) now
    except sqlite3.Error as exc:
        # Why, in the OS's words, only now that SQLite failed (see _connect).
        try:
            os.close(os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            raise missing(path) from None
        except OSError as os_exc:
            raise cannot_read(path, os_exc) from None
        if (wrong := not_an_archive(path)) is not None:
            raise wrong from None
        raise ArchiveUnreadable(f"archive {path} cannot be read by this user ({exc}); read it as its owner, "
                                "or fix the permissions of it and its folder (SQLite reads a WAL archive's "
                                f"{path.name}-shm beside it)") from None
    return conn


def _connect(url: str, *, create: bool = True, home: Path | None = None,
             readonly: bool = False) -> tuple[_Dialect, Any]:
    """Open ``url``: ``sqlite:///ABSOLUTE/PATH`` or ``postgresql://...``. Bad URLs, a folder that
    does not exist, a missing file when not ``create`` and a missing psycopg each raise
    ConfigError saying what to do. Missing folders are made only inside ``home`` (rig's own
    folder): a mistyped path elsewhere is said, not made. ``readonly`` (SQLite): open an
    existing file to read only (_open_readonly); PostgreSQL ignores it.

    An existing SQLite file is opened by SQLite alone, never by a raw open and close here, unless
    SQLite failed and the reason is looked for (see its docstring): POSIX advisory locks belong
    to the process, and closing ANY descriptor of the file drops every lock this process holds
    on it, a live connection's too (sqlite.org, "How To Corrupt An SQLite Database File" 2.2).
    A second archive opened in one process while the first read or wrote lost rows (seen live)."""
    path = sqlite_path(url)
    if path is not None:
        if not path.is_absolute() or str(path) == "/":
            raise ConfigError(f"archive_url {url!r}: give an absolute path{slashes_note(url)}, e.g. "
                              "sqlite:////var/lib/rig/archive.sqlite3")
        if create and home is not None and path.parent.is_relative_to(home.expanduser()):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"archive {path}: cannot make its folder ({exc}); fix RIG_HOME's permissions") from None
        if not path.parent.is_dir():
            raise ConfigError(f"archive {path}: its folder {path.parent} does not exist; create it, or fix "
                              "archive_url (RIG_ARCHIVE_URL)")
        if not create and not may_exist(path):
            raise missing(path)
        if readonly:
            return _SQLITE, _open_readonly(path)
        try:
            # Records hold the jobs' environments (tokens): the file is its owner's only, and
            # SQLite gives its -wal and -shm files the same mode. Made only where none is
            # (O_EXCL): an existing file is never opened and closed here (see its docstring).
            if not os.path.lexists(path):
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
                except FileExistsError:
                    pass  # made meanwhile by another process: its own descriptor, not ours
            conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False, isolation_level=None)
            # WAL: readers (rig show, rig usage) never wait for the archiving pass, nor it for them.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable at each checkpoint, never corrupt
        except (OSError, sqlite3.Error) as exc:
            if (wrong := not_an_archive(path)) is not None:
                raise wrong from None  # a folder or another file in its place: said for what it is
            if isinstance(exc, sqlite3.Error):  # SQLite's words hide the OS's ("readonly database")
                try:
                    os.close(os.open(path, os.O_RDWR))
                except OSError as os_exc:
                    exc = os_exc
            # The OS's reason as it is (permissions, an immutable file, a read-only mount).
            raise ConfigError(f"archive {path}: cannot open it to write ({exc}); make it and its folder writable "
                              "to this user, or set archive_url to a file you may write") from None
        return _SQLITE, conn
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg
        except ImportError:
            raise ConfigError(f"archive_url is a PostgreSQL URL but psycopg is not installed; {PSYCOPG_HINT}") from None
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:
            # The server did not answer, refused us, or has no such database (now): maybe a
            # moment's outage, not certainly a mistake; callers that can go on without the
            # archive (rig up, readers) catch ArchiveUnreachable. A login it refused is no
            # outage: ArchiveRefused (rig up refuses; readers warn as for any unreachable one).
            reason = without_passwords(one_line(exc), url)
            if login_refused(exc):
                raise ArchiveRefused(url, reason) from None
            raise ArchiveUnreachable(url, reason) from None
        except psycopg.Error as exc:
            raise ConfigError(f"archive {safe_url(url)}: cannot connect ({without_passwords(one_line(exc), url)}); "
                              "check archive_url") from None
        return _POSTGRES, conn
    raise ConfigError(f"archive_url {safe_url(url)!r}: expected sqlite:////ABSOLUTE/PATH or postgresql://USER@HOST/DB")


class ArchiveUnreachable(ConfigError):
    """The PostgreSQL server did not let us in now (down, refusing, no such database): unlike
    a malformed URL or a missing psycopg, possibly a passing outage. ``reason``: its first line."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"archive {safe_url(url)}: cannot connect ({reason}); check archive_url and that "
                         "the server is up")
        self.url = url
        self.reason = reason


class ArchiveRefused(ArchiveUnreachable):
    """The PostgreSQL server answered and refused the login (a wrong or missing password, a
    role it does not know): an operator's mistake, which ``rig up`` refuses (exit 6), while a
    reader (another user without the password) still lists Redis' jobs with one warning."""

    def __init__(self, url: str, reason: str) -> None:  # noqa: D107 - its own words, the same fields
        ConfigError.__init__(self, f"archive {safe_url(url)}: the server refused the login ({reason}); fix the "
                                   "user or password in archive_url (RIG_ARCHIVE_URL), ~/.pgpass or PGPASSWORD, "
                                   "then run rig up again")
        self.url = url
        self.reason = reason


#: SQLSTATE class 28: invalid authorization specification (28000), invalid password (28P01).
_LOGIN_SQLSTATES = ("28000", "28P01")


def login_refused(exc: BaseException) -> bool:
    """Did the server refuse the login (rather than not answer)? By SQLSTATE where psycopg has
    one, else by libpq's words (a refusal before any SQLSTATE: no password offered at all)."""
    if getattr(exc, "sqlstate", None) in _LOGIN_SQLSTATES:
        return True
    text = str(exc)
    if "password authentication failed" in text or "no password supplied" in text \
            or "authentication failed for user" in text:
        return True
    return "role \"" in text and "does not exist" in text


def one_line(error: BaseException | str) -> str:
    """An error's text as one line, for rig's one-line archive warnings: its lines folded into
    one and runs of spaces made one (psycopg's "connection ... failed:\nFATAL:  database ...
    does not exist" keeps its cause, the FATAL line, and no longer breaks the warning in two);
    an exception without text gives its class name."""
    text = " ".join(str(error).split())
    return text or (type(error).__name__ if isinstance(error, BaseException) else "")


def unreadable(exc: BaseException) -> bool:
    """Is ``exc`` the archive failing to be read (missing file, server gone, database error),
    as opposed to a configuration mistake or a bug? Readers list Redis' jobs and warn then."""
    return isinstance(exc, (ArchiveMissing, ArchiveUnreachable)) or is_database_error(exc)


def identity(url: str) -> str:
    """``url`` as one archive's identity, for telling whether two URLs name the same archive:
    PostgreSQL: scheme, user, host (lower case), port (default 5432) and database (default:
    the user's name), never the password nor query options; SQLite: the path resolved
    (symbolic links, ``..``). Any other text is returned as it is (safe_url)."""
    path = sqlite_path(url)
    if path is not None:
        return f"sqlite:///{os.path.realpath(path.expanduser())}"
    if url.startswith(("postgresql://", "postgres://")):
        from urllib.parse import unquote, urlsplit

        try:
            part = urlsplit(url)
            port = part.port or 5432
        except ValueError:
            return safe_url(url)
        user = unquote(part.username or "")
        host = (part.hostname or "").lower()
        database = unquote(part.path.strip("/")) or user
        return f"postgresql://{user}@{host}:{port}/{database}"
    return safe_url(url)


def same_archive(one: str, other: str) -> bool:
    """Do URLs ``one`` and ``other`` (either may be a recorded safe_url) name the same archive?"""
    return identity(one) == identity(other)


def count_jobs(url: str, prefix: str) -> int | None:
    """How many jobs of installation ``prefix`` the archive at ``url`` holds (one COUNT, opening
    nothing new: no table or file is made), or None when it cannot be read now."""
    try:
        dialect, conn = _connect(url, create=False)
    except ConfigError:
        return None
    try:
        cur = conn.cursor()
        cur.execute(dialect.sql(f"SELECT COUNT(*) FROM {TABLE} WHERE prefix = ?"), (prefix,))
        return int(cur.fetchone()[0])
    except Exception as exc:  # noqa: BLE001 - no table (never written), a lost connection: unknown
        if is_database_error(exc):
            return None
        raise
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - it is dropped either way
            pass


def is_database_error(exc: BaseException) -> bool:
    """Is ``exc`` the archive database's own (SQLite's or psycopg's), e.g. a lost connection?"""
    import sys

    psycopg = sys.modules.get("psycopg")
    return isinstance(exc, sqlite3.Error) or (psycopg is not None and isinstance(exc, psycopg.Error))


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (absolute: four slashes in all), None for others."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def slashes_note(url: str) -> str:
    """For a SQLite URL with a relative path (three slashes: ``sqlite:///tmp/x`` is ``tmp/x``,
    relative), the words that say so and give the absolute one (four slashes); else ''. Said
    wherever such a URL is refused or compared with the cluster's."""
    path = sqlite_path(url)
    if path is None or path.is_absolute():
        return ""
    return (f" (sqlite:/// with three slashes is a relative path, {path}; an absolute one takes four: "
            f"sqlite:////{path})")


#: What safe_url puts where a password was.
MASK = "***"


def _server_parts(url: str) -> tuple[str, str, str, str] | None:
    """A server URL's (scheme and ``//``, user info, host part, the rest from the path on),
    split as urllib.parse does (the host follows the last ``@`` before the path); None for a
    SQLite URL (a path, which may hold ``:`` and ``@``: a RIG_HOME ``/srv/a:b@c``) or text
    without ``//``."""
    if sqlite_path(url) is not None:
        return None
    scheme, sep, rest = url.partition("//")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, _, host = rest[:end].rpartition("@")
    return scheme + sep, userinfo, host, rest[end:]


def _joined(scheme: str, userinfo: str, host: str, rest: str) -> str:
    return f"{scheme}{userinfo}@{host}{rest}" if userinfo else f"{scheme}{host}{rest}"


def _query_mapped(rest: str, change: Callable[[str], str | None]) -> str:
    """``rest`` (a URL's path on) with each query option (``name=value``) changed by ``change``
    (None: left out)."""
    path, mark, tail = rest.partition("?")
    if not mark:
        return rest
    query, hash_mark, fragment = tail.partition("#")
    options = [kept for option in query.split("&") if (kept := change(option)) is not None]
    return path + ("?" + "&".join(options) if options else "") + hash_mark + fragment


def _is_password(option: str) -> bool:
    """Is this query option a password (libpq reads ``?password=...`` too)?"""
    return option.lower().startswith("password=")


def safe_url(url: str) -> str:
    """``url`` without its password, for messages and for what rig records in Redis: the one in
    the user info (``user:pw@host``) and a ``password=`` query option each become ``***``. A
    SQLite URL stays as it is (its path is no password, and the cluster's record must name
    that very file). :func:`unmasked` makes it a URL to connect with again."""
    parts = _server_parts(url)
    if parts is None:
        return url
    scheme, userinfo, host, rest = parts
    if ":" in userinfo:
        userinfo = f"{userinfo.split(':', 1)[0]}:{MASK}"
    return _joined(scheme, userinfo, host,
                   _query_mapped(rest, lambda option: f"password={MASK}" if _is_password(option) else option))


def _passwords(url: str) -> list[str]:
    """The passwords a server URL holds, as written: in its user info and ``password=`` options."""
    parts = _server_parts(url)
    if parts is None:
        return []
    _, userinfo, _, rest = parts
    found = [userinfo.split(":", 1)[1]] if ":" in userinfo else []
    query = rest.partition("?")[2].partition("#")[0]
    return found + [option.split("=", 1)[1] for option in query.split("&") if _is_password(option)]


def without_passwords(text: str, url: str) -> str:
    """``text`` (an error about ``url``, in libpq's words) with each password ``url`` holds
    masked, as written and percent-decoded: libpq quotes the part it cannot parse, e.g.
    ``invalid percent-encoded token: "pa%zz"``, ``unexpected spaces found in "pa ss"``."""
    from urllib.parse import unquote

    for secret in sorted({s for raw in _passwords(url) for s in (raw, unquote(raw)) if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def unmasked(recorded: str) -> str:
    """A URL safe_url gave, as one to connect to: its masked passwords left out, so libpq takes
    the password from ~/.pgpass or PGPASSWORD. Any other URL is returned as it is."""
    parts = _server_parts(recorded)
    if parts is None:
        return recorded
    scheme, userinfo, host, rest = parts
    return _joined(scheme, userinfo.removesuffix(f":{MASK}"), host,
                   _query_mapped(rest, lambda option: None if option == f"password={MASK}" else option))


class Archive:
    """Archived jobs of one installation (key prefix) in one database. Thread-safe (one lock
    around the connection); each write is one transaction."""

    def __init__(self, url: str, prefix: str, *, create: bool = True, home: Path | None = None,
                 readonly: bool = False) -> None:
        """``create``: make a missing SQLite file (else ArchiveMissing); ``home``: rig's folder,
        the only place where missing folders are made. ``readonly``: a reader's open (rig
        show, jobs, usage, status): a SQLite file is opened read-only and written never, unless
        it lacks this version's tables (an older rig's file): then it is opened to write, as
        the writer would, to add them, and ArchiveUnreadable says why when it cannot be."""
        self.url = url
        self.prefix = prefix
        self.path = sqlite_path(url)
        self._lock = threading.Lock()
        #: (jobs summed, seconds) when this open built the usage rollup of an older archive.
        self.rollup_built: tuple[int, float] | None = None
        if readonly and self.path is not None:
            self.dialect, self._conn = _connect(url, create=False, readonly=True)
            self._identity = _identity(self.path)
            if self._schema_current():
                return
            self._conn.close()  # an older rig's file: opened to write, once, to add the tables
            try:
                self._open_writable(create=False, home=home)
            except ArchiveMissing:
                raise
            except ConfigError as exc:
                raise ArchiveUnreadable(f"archive {self.path} was written by an older rig and adding this "
                                        f"version's tables to it failed here ({one_line(exc)}); "
                                        "`rig up` of this version adds them") from None
        else:
            self._open_writable(create=create, home=home)

    def _open_writable(self, *, create: bool, home: Path | None) -> None:
        """Connect to write, and make or update the tables (the writer's open)."""
        self.dialect, self._conn = _connect(self.url, create=create, home=home)
        #: The SQLite file opened, as (device, inode): check_file() tells it from a new one.
        self._identity = _identity(self.path) if self.path is not None else None
        with self._transaction() as cur:
            for statement in _SCHEMA:
                cur.execute(statement)
        self._add_columns()
        self._ensure_rollup()

    def _schema_current(self) -> bool:
        """Does this SQLite file hold every table and column this version reads?"""
        if not self._has_rollup():
            return False
        have = {row[1] for row in self._query(f"PRAGMA table_info({TABLE})")}
        return bool(have) and all(name in have for name, _ in _ADDED)

    def _add_columns(self) -> None:
        """Give a table made by an older rig the columns added since (another process doing
        the same at once is harmless: its duplicate column is ignored)."""
        if self.dialect is _SQLITE:
            have = {row[1] for row in self._query(f"PRAGMA table_info({TABLE})")}
        else:
            have = {row[0] for row in self._query("SELECT column_name FROM information_schema.columns "
                                                  "WHERE table_name = ?", (TABLE,))}
        for name, kind in _ADDED:
            if name not in have:
                try:
                    with self._transaction() as cur:
                        cur.execute(f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}")
                except Exception as exc:  # noqa: BLE001 - only "it is there now" is expected
                    if "duplicate" not in str(exc).lower() and "already exists" not in str(exc).lower():
                        raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def close_quietly(self) -> None:
        """Close a connection that may already be broken."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - it is being dropped either way
            pass

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self, mode: str = "") -> Iterator[Any]:
        """A cursor inside BEGIN ... COMMIT (ROLLBACK on any error). ``mode`` "write": the
        archive's writers one at a time (see the module doc); "snapshot": every read inside
        sees one state of the database (SQLite's WAL read transaction; PostgreSQL's
        REPEATABLE READ)."""
        with self._lock:
            cur = self._conn.cursor()
            if self.dialect is _SQLITE:
                cur.execute("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")
            else:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if mode == "snapshot" else "BEGIN")
                if mode == "write":
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_WRITE_LOCK,))
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _query(self, text: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            cur = self._conn.cursor()
            cur.execute(self.dialect.sql(text), tuple(params))
            return list(cur.fetchall())

    def check_file(self) -> None:
        """Raise ArchiveMissing unless the SQLite file opened is still at its path (a deleted or
        moved file keeps taking writes through the open connection, lost). PostgreSQL: no-op."""
        if self.path is not None and _identity(self.path) != self._identity:
            raise missing(self.path)

    # -- writing ------------------------------------------------------------------------------
    def add(self, entries: Iterable[tuple[Job, dict[str, str]]], *, now: float) -> int:
        """Write each (job, its Redis hash) in one transaction: all or none. Returns how many.
        A job already there is replaced (same prefix, id and instance): see the module doc.
        Raises ArchiveMissing, writing nothing, when the SQLite file is not the one opened."""
        made = [self._row(job, raw, now) for job, raw in entries]
        if made:
            self.check_file()
            with self._transaction("write") as cur:
                before = self._stored(cur, [(acc.id, acc.instance) for _, acc in made])
                cur.executemany(self.dialect.sql(_UPSERT), [row for row, _ in made])
                self._roll(cur, [acc for _, acc in made], before)
        return len(made)

    def _stored(self, cur: Any, keys: Sequence[tuple[int, str]]) -> list[Accounting]:
        """Inside a transaction: the accounting rows already archived under ``keys``."""
        wanted = set(keys)
        return [acc for acc in self._accounting_of_ids(cur, sorted({jid for jid, _ in keys}))
                if (acc.id, acc.instance) in wanted]

    def _accounting_of_ids(self, cur: Any, ids: Sequence[int]) -> list[Accounting]:
        """Inside a transaction: the accounting rows archived under any of ``ids`` (sorted),
        whatever their instance, and maybe others between them. One range query per run of
        ids with gaps of at most _RUN_GAP: a range is an index range scan on (prefix, id)
        whatever the planner knows, where PostgreSQL without statistics (autovacuum off, a
        fresh bulk load) answered 500-id IN lists by reading every row of the prefix (2.3 s per
        100,000 rows, 20 times for Redis' 10,000 finished jobs)."""
        out: list[Accounting] = []
        for low, high in _runs(ids, _RUN_GAP):
            cur.execute(self.dialect.sql(f"SELECT {', '.join(_USAGE_COLUMNS)} FROM {TABLE} WHERE prefix = ? "
                                         "AND id >= ? AND id <= ?"), (self.prefix, low, high))
            out += [_accounting(row) for row in cur.fetchall()]
        return out

    def _roll(self, cur: Any, added: Sequence[Accounting], removed: Sequence[Accounting] = (),
              prefix: str | None = None) -> None:
        """Inside the transaction that wrote the rows: add ``added``'s sums to the rollup and
        take ``removed``'s away (rows replaced), every group, each job on its day; under
        ``prefix`` (default: this installation's)."""
        deltas: dict[tuple[str, int], Tally] = {}
        for rows, sign in ((added, 1), (removed, -1)):
            by_day: dict[int, list[Accounting]] = {}
            for acc in rows:
                by_day.setdefault(day_of(acc.ended_at), []).append(acc)
            for day, day_rows in by_day.items():
                for dim in GROUPS:
                    tally(day_rows, dim, sign, into=deltas.setdefault((dim, day), {}))
        params = [(prefix or self.prefix, dim, day, grp, state, failure or "", sums.jobs, sums.card_seconds,
                   sums.reserved_byte_seconds, sums.used_byte_seconds, sums.used_jobs, sums.wait_seconds,
                   sums.waited_jobs)
                  for (dim, day), found in deltas.items() for grp, parts in found.items()
                  for (state, failure), sums in parts.items()]
        cur.executemany(self.dialect.sql(_ROLLUP_ADD), params)
        if removed:  # a group whose last job was replaced by another outcome's: gone, not a line of 0
            cur.executemany(self.dialect.sql(
                f"DELETE FROM {USAGE_TABLE} WHERE {' AND '.join(f'{n} = ?' for n in _ROLLUP_KEY)} AND jobs = 0"),
                [p[:len(_ROLLUP_KEY)] for p in params])

    def _ensure_rollup(self) -> None:
        """Make the usage rollup if this database has none, summing the rows already archived
        (every installation's), once: in one write transaction, so another process opening
        the archive at once waits and then finds it made (see the module doc)."""
        if self._has_rollup():
            return
        began = time.monotonic()
        try:
            with self._transaction("write") as cur:
                if self._has_rollup(cur):
                    return
                cur.execute(_ROLLUP_SCHEMA)
                jobs = self._build_rollup(cur)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            # Another process holds the write lock past the 30 s timeout: most likely it is
            # building these sums (a minute or more per million jobs), once.
            raise ConfigError(f"archive {self.path}: busy (another rig process is writing it, e.g. summing an "
                              "older archive's jobs for rig usage, once); try again in a minute") from None
        if self.dialect is _POSTGRES:  # its planner's statistics, should autovacuum be off
            with self._transaction() as cur:
                cur.execute(f"ANALYZE {TABLE}, {USAGE_TABLE}")
        self.rollup_built = (jobs, time.monotonic() - began)
        if jobs:
            log.warning("archive: summed the %d job(s) archived by an older rig into %s, once (%.1f s): "
                        "rig usage reads those sums from now on", jobs, USAGE_TABLE, self.rollup_built[1])

    def _has_rollup(self, cur: Any = None) -> bool:
        if self.dialect is _SQLITE:
            text, params = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (USAGE_TABLE,)
        else:
            text, params = "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() " \
                           "AND tablename = ?", (USAGE_TABLE,)
        if cur is None:
            return bool(self._query(text, params))
        cur.execute(self.dialect.sql(text), params)
        return bool(cur.fetchall())

    def _build_rollup(self, cur: Any, page: int = 20_000) -> int:
        """Sum every archived row into the rollup (each installation's under its prefix), a
        page of rows at a time in key order; returns how many rows."""
        cur.execute(f"SELECT DISTINCT prefix FROM {TABLE}")
        prefixes = [row[0] for row in cur.fetchall()]
        done = 0
        for prefix in prefixes:
            after: tuple[int, str] = (-(2**62), "")
            while True:
                cur.execute(self.dialect.sql(
                    f"SELECT {', '.join(_USAGE_COLUMNS)} FROM {TABLE} WHERE prefix = ? AND (id, instance) > (?, ?) "
                    "ORDER BY id, instance LIMIT ?"), (prefix, *after, page))
                rows = [_accounting(row) for row in cur.fetchall()]
                if not rows:
                    break
                self._roll(cur, rows, prefix=prefix)
                done += len(rows)
                after = (rows[-1].id, rows[-1].instance)
        return done

    def _row(self, job: Job, raw: dict[str, str], now: float) -> tuple[tuple, Accounting]:
        """The row to write for ``job`` and its accounting (the row's usage columns)."""
        acc = accounting_of(job)
        peaks = [a.get("vram_peak") for a in job.attempts if isinstance(a.get("vram_peak"), int | float)]
        means = [a.get("vram_mean") for a in job.attempts if isinstance(a.get("vram_mean"), int | float)]
        return (self.prefix, job.id, job.instance or "", job.user, job.name, job.template, job.pool, acc.node,
                job.state.value, job.failure, job.created_at, job.started_at, job.ended_at, job.gpu_memory,
                job.gpus, job.exit_code, len(job.attempts), acc.wait_seconds, acc.card_seconds,
                acc.reserved_byte_seconds, acc.used_byte_seconds, int(max(peaks)) if peaks else None,
                int(means[-1]) if means else None, packed.pack(raw), now,
                json.dumps(acc.node_split) if acc.node_split else None), acc

    # -- reading ------------------------------------------------------------------------------
    def get(self, job_id: int) -> Job | None:
        """The archived job ``job_id`` (the newest submitted, should ids have restarted), or None."""
        rows = self._query(f"SELECT record FROM {TABLE} WHERE prefix = ? AND id = ? "
                           "ORDER BY submitted_at DESC LIMIT 1", (self.prefix, job_id))
        return _job(rows[0][0]) if rows else None

    def get_instance(self, job_id: int, instance: str) -> Job | None:
        """The archived job ``job_id`` whose instance starts with ``instance`` (the newest
        submitted of those), or None."""
        rows = self._query(f"SELECT record FROM {TABLE} WHERE prefix = ? AND id = ? AND instance LIKE ? "
                           "ORDER BY submitted_at DESC LIMIT 1",
                           (self.prefix, job_id, instance.replace("%", "").replace("_", "") + "%"))
        return _job(rows[0][0]) if rows else None

    def get_other(self, job_id: int, instance: str) -> Job | None:
        """The archived job ``job_id`` of another instance than ``instance`` (the newest
        submitted of those: ids restarted after Redis lost its data), or None."""
        rows = self._query(f"SELECT record FROM {TABLE} WHERE prefix = ? AND id = ? AND instance <> ? "
                           "ORDER BY submitted_at DESC LIMIT 1", (self.prefix, job_id, instance))
        return _job(rows[0][0]) if rows else None

    def record(self, job_id: int, instance: str) -> dict[str, str] | None:
        """The stored record (the Redis hash, as JSON) of one archived job, or None."""
        rows = self._query(f"SELECT record FROM {TABLE} WHERE prefix = ? AND id = ? AND instance = ?",
                           (self.prefix, job_id, instance))
        return _record(rows[0][0]) if rows else None

    def list(self, *, state: JobState | None = None, user: str | None = None, since: float | None = None,
             limit: int = 50) -> list[Job]:
        """Archived jobs, newest submitted first: of one state, one user, submitted at or after
        ``since`` (epoch s), at most ``limit``."""
        where, params = self._where(state=state, user=user, since=since)
        rows = self._query(f"SELECT record FROM {TABLE} WHERE {where} ORDER BY submitted_at DESC, id DESC "
                           "LIMIT ?", (*params, limit))
        return [_job(r[0]) for r in rows]

    def count(self) -> int:
        return int(self._query(f"SELECT COUNT(*) FROM {TABLE} WHERE prefix = ?", (self.prefix,))[0][0])

    def empty(self) -> bool:
        """Does it hold no job of this installation? (One index probe, not a COUNT.)"""
        return not self._query(f"SELECT 1 FROM {TABLE} WHERE prefix = ? LIMIT 1", (self.prefix,))

    def keys_among(self, ids: Sequence[int]) -> list[tuple[int, str]]:
        """(id, instance) of the archived jobs whose id is one of ``ids``."""
        return list(self.finished_among(ids))

    def finished_among(self, ids: Sequence[int]) -> dict[tuple[int, str], tuple[str, float | None]]:
        """{(id, instance): (archived state, ended_at (epoch s) or None)} of the archived jobs
        whose id is one of ``ids``."""
        wanted = set(ids)
        out: dict[tuple[int, str], tuple[str, float | None]] = {}
        for low, high in _runs(sorted(wanted), _RUN_GAP):
            out |= {(int(i), str(inst)): (str(state), None if ended is None else float(ended))
                    for i, inst, state, ended in self._query(
                        f"SELECT id, instance, state, ended_at FROM {TABLE} WHERE prefix = ? AND id >= ? AND id <= ?",
                        (self.prefix, low, high)) if int(i) in wanted}
        return out

    def ids_above(self, job_id: int, *, submitted_since: float) -> tuple[int, int]:
        """(the highest id, how many distinct ids) of the archived jobs with an id above ``job_id``
        submitted at or after ``submitted_since`` (epoch s on Redis' clock: one installation's
        jobs); (0, 0) when none."""
        rows = self._query(f"SELECT MAX(id), COUNT(DISTINCT id) FROM {TABLE} WHERE prefix = ? AND id > ? "
                           "AND submitted_at >= ?", (self.prefix, job_id, submitted_since))
        highest, count = rows[0] if rows else (None, 0)
        return int(highest or 0), int(count or 0)

    def accounting(self, *, since: float | None = None) -> list[Accounting]:
        """The accounting figures of every archived job that ended at or after ``since``."""
        where, params = self._where(ended_since=since)
        rows = self._query(f"SELECT {', '.join(_USAGE_COLUMNS)} FROM {TABLE} WHERE {where}", params)
        return [_accounting(row) for row in rows]

    def usage(self, *, since: float | None, groups: Sequence[str],
              besides: AbstractSet[tuple[int, str]] = frozenset()) -> dict[str, Tally]:
        """The sums (rig.accounting.Tally) of the archived jobs that ended at or after ``since``
        (epoch s; None: all), per group of ``groups``, leaving out the jobs keyed (id, instance)
        in ``besides`` (counted from Redis). Read in one snapshot: whole days from the rollup,
        the part-day before them summed by the database from the rows, and the rows of
        ``besides`` taken away; the same figures as rig.accounting.tally over accounting()."""
        out: dict[str, Tally] = {}
        groups = tuple(dict.fromkeys(groups))
        with self._transaction("snapshot") as cur:
            for by in groups:
                found = out[by] = self._rollup_sums(cur, by, since)
                if since is not None:
                    self._part_day_sums(cur, by, since, found)
            ids = sorted({jid for jid, _ in besides})
            twice = [acc for acc in self._accounting_of_ids(cur, ids) if (acc.id, acc.instance) in besides
                     and (since is None or (acc.ended_at is not None and acc.ended_at >= since))]
            for by in groups:
                tally(twice, by, -1, into=out[by])
        return out

    def _rollup_sums(self, cur: Any, by: str, since: float | None) -> Tally:
        """The rollup's sums of ``by`` over the whole days at or after ``since`` (all: None)."""
        where, params = "prefix = ? AND dim = ?", [self.prefix, by]
        if since is not None:
            where += " AND day >= ?"
            params.append(first_whole_day(since))
        cur.execute(self.dialect.sql(f"SELECT grp, state, failure, {_ROLLUP_SELECT} FROM {USAGE_TABLE} "
                                     f"WHERE {where} GROUP BY grp, state, failure"), params)
        found: Tally = {}
        _add_sums(found, cur.fetchall())
        return found

    def _part_day_sums(self, cur: Any, by: str, since: float, into: Tally) -> None:
        """Add the sums of the jobs that ended at or after ``since`` but before its first whole
        day (first_whole_day) into ``into``, summed by the database (a job that ran on several
        nodes, grouped by node: split here, as rig.accounting.per_node does)."""
        column = _GROUP_COLUMN[by]
        window = "prefix = ? AND ended_at >= ? AND ended_at < ?"
        params = (self.prefix, since, first_whole_day(since) * DAY)
        split = " AND node_split IS NULL" if by == "node" else ""
        cur.execute(self.dialect.sql(f"SELECT {column}, state, failure, {_ROWS_SELECT} FROM {TABLE} "
                                     f"WHERE {window}{split} GROUP BY {column}, state, failure"), params)
        _add_sums(into, cur.fetchall())
        if by == "node":
            cur.execute(self.dialect.sql(f"SELECT {', '.join(_USAGE_COLUMNS)} FROM {TABLE} "
                                         f"WHERE {window} AND node_split IS NOT NULL"), params)
            tally([_accounting(row) for row in cur.fetchall()], "node", into=into)

    def _where(self, *, state: JobState | None = None, user: str | None = None, since: float | None = None,
               ended_since: float | None = None) -> tuple[str, list[Any]]:
        clauses, params = ["prefix = ?"], [self.prefix]
        for column, value in (("state", state.value if state else None), ("owner", user)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        for column, value in (("submitted_at", since), ("ended_at", ended_since)):
            if value is not None:
                clauses.append(f"{column} >= ?")
                params.append(value)
        return " AND ".join(clauses), params


#: Ids this far apart or less are read by one range query (_accounting_of_ids): a range
#: also returns the archived jobs between them, at most this many per gap.
_RUN_GAP = 16


def _runs(ids: Sequence[int], gap: int) -> list[tuple[int, int]]:
    """Sorted ``ids`` as (low, high) runs whose neighbours are at most ``gap`` apart."""
    runs: list[tuple[int, int]] = []
    for jid in ids:
        if runs and jid - runs[-1][1] <= gap:
            runs[-1] = (runs[-1][0], jid)
        else:
            runs.append((jid, jid))
    return runs


def _accounting(row: Sequence[Any]) -> Accounting:
    """An Accounting from a row of _USAGE_COLUMNS."""
    return Accounting(*row[:-1], _split(row[-1]))


def _add_sums(into: Tally, rows: Iterable[Sequence[Any]]) -> None:
    """Add rows of (group value, state, failure, then Sums' fields in order) into ``into``
    (PostgreSQL's SUM of a BIGINT is a Decimal: every figure is converted)."""
    found: Tally = {}
    for grp, state, failure, jobs, card_s, reserved, used, used_n, wait, waited in rows:
        sums = Sums(int(jobs), float(card_s), float(reserved), float(used or 0.0), int(used_n),
                    float(wait or 0.0), int(waited))
        found.setdefault(group_value(grp), {}).setdefault((state, failure or None), Sums()).add(sums)
    merge_into(into, found)


def _split(text: str | None) -> dict[str, tuple[float, float, float | None]] | None:
    """The node_split column, parsed (rig.accounting.Accounting.node_split)."""
    return {node: tuple(share) for node, share in json.loads(text).items()} if text else None


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _record(text: str) -> dict[str, str]:
    """A row's record: packed JSON (rig.packed), or plain JSON as a person may have written it."""
    return packed.unpack(text) if text.startswith(packed.TAG) else json.loads(text)


def _job(record: str) -> Job:
    return Job.from_redis(_record(record))
