"""One archive per cluster: which archive the cluster's finished jobs go to, recorded in Redis.

The first node up (or the first archiving pass) records its ``archive_url`` (password left out)
under ``archive:url`` with SET NX; it never flips after that. Only a control worker whose own
archive is that one runs the archiving pass (rig.archiving); a node configured for another one
is told at ``rig up`` in one line and does not archive; a reader that set another one itself is
told so in one line (rig.history) instead of "no job"; a reader that set none reads this one.
URLs are compared by identity (rig.archive.same_archive: port, trailing slash and password
make no difference), never as text.

Moving on purpose (a single-node operator changes ``archive_url``): ``rig up`` re-records the
cluster's archive when no other node is up (:func:`check_at_up` calls :func:`claim` with
``alone``) and says so with the old archive's job count, on the terminal too.

A SQLite archive is one host's (rig.archive_host): its record says which (``archive:host``,
written with ``archive:url`` in one script; a record of an older rig gets the host of the first
node that opens the file, :func:`settle_host`). On another host the same path is another file:
there ``rig up`` says so in one line and the node comes up without archiving (the archive's
host archives every node's finished jobs: nothing is lost, nothing split), its passes never
open the file (:func:`require_cluster`), and readers say where the archive is
(:func:`not_here`). A move records the archive it left (``archive:previous``), so a job id
found in neither Redis nor the archive is told it may be there (rig.history).

Also here, because the pass and ``rig status`` share them: when the pass last succeeded
(``archive:ok_at``, epoch s), the passes' interval and, while they fail, why and since when
(``archive:pass``, :func:`note_pass`, :func:`late`), and how many jobs the pass moved into the
archive (``archive:held``: present from the first batch on; a lower bound, it was a flag ``1``
before), so a SQLite file deleted under rig, or an archive recreated empty, is told from one
never written (:func:`emptied`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from rig.archive import (
    Archive,
    ArchiveEmptied,
    ArchiveMissing,
    ArchiveRefused,
    ArchiveUnreachable,
    count_jobs,
    one_line,
    safe_url,
    same_archive,
    slashes_note,
    sqlite_path,
    unmasked,
)
from rig.archive_host import Host, parse, this_host
from rig.errors import ConfigError
from rig.keys import Keys

if TYPE_CHECKING:
    from rig.config import Settings


class NotClusterArchive(ConfigError):
    """This node's archive is not the cluster's: it does not archive (exit 6 for a command)."""


class ArchiveOnOtherHost(ArchiveMissing):
    """The cluster's archive is a SQLite file on another host: not readable from here (a
    reader lists Redis' jobs with one warning, as for a missing file, and says where it is)."""


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def cluster_url(client: redis.Redis, keys: Keys) -> str | None:
    """The cluster's archive (no password), or None when none is recorded yet."""
    return _text(client.get(keys.archive_url))


def archive_of(client: redis.Redis, keys: Keys, settings: Settings) -> str:
    """The archive a node or reader uses: its own ``archive_url`` when it set one, else the
    cluster's recorded one (whatever its RIG_HOME or working folder: a `rig up` from a folder
    without the rig.toml must not move the cluster's archive to a SQLite file), else the one
    this home remembers for this Redis (:func:`restore`: Redis lost its data), else the
    default (a SQLite file in its home). Only an ``archive_url`` set on purpose moves the
    cluster's archive (:func:`claim`)."""
    if set_here(settings):
        return settings.archive_location
    cluster = cluster_url(client, keys) or restore(client, keys, settings)
    return unmasked(cluster) if cluster else settings.archive_location


def set_here(settings: Settings) -> bool:
    """Did this rig set an ``archive_url`` itself (not the cluster's record, not the default)?"""
    return bool(settings.archive_url and settings.archive_url.strip())


#: In a node's run folder: the cluster's archive record (URL and host) as its last `rig up` saw it.
MEMORY_FILE = "archive-record.json"


def _memory_of(settings: Settings) -> str:
    """Which cluster a remembered record is of: its Redis (no password) and key prefix."""
    return f"{safe_url(settings.redis_url)}|{settings.key_prefix}"


def remember(client: redis.Redis, keys: Keys, settings: Settings) -> None:
    """At `rig up`, once the archive is claimed: keep the cluster's record (``archive:url`` and
    ``archive:host``) in this node's run folder for :func:`restore`. Best effort."""
    url = cluster_url(client, keys)
    if url is None:
        return
    data = {"cluster": _memory_of(settings), "url": url, "host": _text(client.get(keys.archive_host)) or ""}
    path = settings.run_dir / MEMORY_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{MEMORY_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def restore(client: redis.Redis, keys: Keys, settings: Settings) -> str | None:
    """When Redis holds no record of the cluster's archive (it came back empty) and this home
    remembers one for this Redis and prefix (:func:`remember`): record it again, with its host,
    as the first node's `rig up` or pass would otherwise record its own default (a SQLite file
    in its home: a new, empty history hiding every archived job, and a SQLite archive of
    another host taken for this host's). Returns the cluster's archive now, or None."""
    data = _remembered(settings)
    if data is None:
        return None
    try:
        recorded = client.eval(_RECORD, 2, keys.archive_url, keys.archive_host, str(data["url"]),
                               str(data.get("host") or ""))
    except redis.RedisError:
        return None  # a reader that may not write: it reads the default, as before
    return _text(recorded)


#: archive:url SET NX and, only when it was set, archive:host set (ARGV[2]) or deleted (''):
#: a node never reads a new URL beside an old one's host. Returns the recorded URL.
_RECORD = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  if ARGV[2] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[2]) end
end
return redis.call('GET', KEYS[1])
"""


def host_record(url: str) -> str:
    """The ``archive:host`` value for archive ``url`` recorded by this host: this host for a
    SQLite file, '' (none) for PostgreSQL, which every host reaches alike."""
    return this_host().record(safe_url(url)) if sqlite_path(url) is not None else ""


#: Replace a key's value only if it is still the one read (KEYS[1]; ARGV: read, new).
_REPLACE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) end
"""


def record_if_absent(client: redis.Redis, keys: Keys, url: str) -> str:
    """Record ``url`` (and, for SQLite, this host) as the cluster's archive unless one is; the
    cluster's archive (no password). A record holding a password (an older rig's safe_url left
    a ``password=`` option as given), which any user's rig status shows, is masked."""
    recorded = _text(client.eval(_RECORD, 2, keys.archive_url, keys.archive_host, safe_url(url), host_record(url)))
    if recorded is not None and safe_url(recorded) != recorded:
        client.eval(_REPLACE, 1, keys.archive_url, recorded, safe_url(recorded))
        recorded = safe_url(recorded)
    return recorded or safe_url(url)


def archive_host(client: redis.Redis, keys: Keys) -> Host | None:
    """The host whose disk holds the cluster's SQLite archive; None for PostgreSQL, for no
    record, and for a record without a host (an older rig's) or with a host recorded for
    another URL (left by an older rig's move)."""
    cluster = cluster_url(client, keys)
    raw = _text(client.get(keys.archive_host))
    if cluster is None or raw is None or sqlite_path(cluster) is None:
        return None
    found = parse(raw)
    return found[0] if found is not None and same_archive(found[1], cluster) else None


def settle_host(client: redis.Redis, keys: Keys, url: str) -> None:
    """After this node opened ``url``, the cluster's SQLite archive, here and found it whole: a
    record without a host (an older rig's) gets this one (the first such node's is kept)."""
    cluster = cluster_url(client, keys)
    if sqlite_path(url) is None or cluster is None or not same_archive(cluster, url):
        return
    if archive_host(client, keys) is None:
        stale = client.exists(keys.archive_host)  # a host for another URL: replaced, not kept
        client.set(keys.archive_host, this_host().record(cluster), nx=not stale)


def not_here(client: redis.Redis, keys: Keys, url: str) -> Host | None:
    """The archive's host when ``url`` is the cluster's SQLite archive and that host is not this
    one (the same path here is another file), else None."""
    if sqlite_path(url) is None:
        return None
    cluster = cluster_url(client, keys)
    if cluster is None or not same_archive(cluster, url):
        return None
    host = archive_host(client, keys)
    return host if host is not None and host.id != this_host().id else None


def on_other_host(host: Host, url: str) -> str:
    """The words for a SQLite archive on ``host``, seen from this one (no advice)."""
    mine = this_host()
    # Two hosts of one name (cloned machines, containers) are told apart by their machine ids.
    theirs, ours = (f"{host.name}, machine id {host.id[:12]}", f"{mine.name}, machine id {mine.id[:12]}") \
        if host.name == mine.name else (host.name, mine.name)
    return (f"this cluster archives finished jobs to a SQLite file on host {theirs} ({safe_url(url)}), "
            f"which this host ({ours}) cannot share")


#: What to do when a cluster of several hosts needs one archive all of them use.
SHARED_ARCHIVE = ('for one archive every node writes and reads, set archive_url = "postgresql://USER@HOST/DB" '
                  "(RIG_ARCHIVE_URL) on every node")


def reader_not_here(host: Host, url: str) -> ArchiveOnOtherHost:
    """The error of a reader on another host than the SQLite archive's."""
    return ArchiveOnOtherHost(f"{on_other_host(host, url)}: read archived jobs on {host.name}, or "
                              f"{SHARED_ARCHIVE}")


def require_cluster(client: redis.Redis, keys: Keys, url: str, *, record: bool = True) -> None:
    """Before an archiving pass: record ``url`` if no archive is recorded (only with
    ``record``: once the archive opened); raise NotClusterArchive (its line: elsewhere())
    when the cluster's archive is another one, or is a SQLite file on another host (never
    opened here: the same path is another file)."""
    cluster = record_if_absent(client, keys, url) if record else cluster_url(client, keys)
    if cluster is not None and not same_archive(cluster, url):
        raise NotClusterArchive(elsewhere(cluster, url))
    if (host := not_here(client, keys, url)) is not None:
        raise NotClusterArchive(f"{on_other_host(host, url)}: {host.name}'s control workers archive")


def elsewhere(cluster: str, own: str) -> str:
    """The one line for a node or reader whose archive is not the cluster's."""
    return (f"this cluster archives finished jobs to {cluster} but this rig's archive_url is "
            f"{safe_url(own)}{slashes_note(own)}: set archive_url (RIG_ARCHIVE_URL) to {cluster}, or `rig down` "
            "every node and `rig up` with the new one to move the cluster to it")


def claim(client: redis.Redis, keys: Keys, url: str, *, alone: bool) -> str | None:
    """At ``rig up`` of a node with a control worker: record ``url`` as the cluster's archive
    if none is, or re-record it when this node is the only one up (the operator moved it).
    Returns the line to show (a move, or this node will not archive), None when all agree."""
    cluster = record_if_absent(client, keys, url)
    if same_archive(cluster, url):
        return None
    if alone:
        pipe = client.pipeline(transaction=True)
        pipe.set(keys.archive_url, safe_url(url))
        if host := host_record(url):
            pipe.set(keys.archive_host, host)
        else:
            pipe.delete(keys.archive_host)
        pipe.set(keys.archive_previous, cluster)  # its jobs are there: rig show of one says so
        pipe.delete(keys.archive_held)  # the new archive has not held anything yet
        pipe.execute()
        return f"archive: this cluster's finished jobs now go to {safe_url(url)} (they went to {cluster})"
    return f"warning: this node will not archive: {elsewhere(cluster, url)}"


def claim_at_up(client: redis.Redis, keys: Keys, url: str, node: str) -> str | None:
    """claim() for ``rig up`` of ``node``: alone when no other node is alive (rig.nodes)."""
    from rig.nodes import NodeRegistry

    others_up = any(n.alive and n.name != node for n in NodeRegistry(client, keys).read())
    return claim(client, keys, url, alone=not others_up)


def check_at_up(client: redis.Redis, keys: Keys, url: str, prefix: str, node: str, *, home: Path) -> list[str]:
    """``rig up`` of a node with a control worker: open its archive (ConfigError, exit 6, for a
    certain mistake: a malformed URL, no psycopg, an unwritable folder, a login the server
    refused: ArchiveRefused) and claim_at_up. A
    server that does not answer now is a warning, not a refusal: the node runs jobs, finished
    jobs stay in Redis and each pass retries (rig.archiving). Returns the lines to say."""
    lines: list[str] = []
    try:
        with Archive(url, prefix, home=home) as archive:
            if (gone := emptied(client, keys, archive)) is not None and same_archive(cluster_url(client, keys) or url, url):
                lines.append(f"warning: {gone}")
            elif gone is None:
                settle_host(client, keys, url)  # an older rig's record: the file is this host's
    except ArchiveRefused:
        raise  # the server answered: a wrong password is the operator's to fix, not an outage
    except ArchiveUnreachable as exc:
        lines.append(f"warning: archive {safe_url(url)} unreachable now ({exc.reason}): finished jobs stay in "
                     "Redis until it answers")
    before = cluster_url(client, keys)
    line = claim_at_up(client, keys, url, node)
    if line:
        if before is not None and not same_archive(before, url) and line.startswith("archive:"):
            # A move hides the old archive's jobs from every reader: how many, if cheap to know.
            held = count_jobs(unmasked(before), prefix)
            line = (f"warning: {line.removeprefix('archive: ')}: the {'' if held is None else f'{held:,} '}"
                    f"job(s) in {before} are no longer shown by rig jobs/show/usage (set archive_url back "
                    "to read them)")
        lines.append(line)
    return lines


def check_node_at_up(client: redis.Redis, keys: Keys, settings: Settings) -> list[str]:
    """:func:`check_at_up` of the archive this node uses (:func:`archive_of`). An archive_url
    set here that cannot be used is the operator's mistake: ConfigError (exit 6), as before. The
    cluster's archive, used because none is set here, that cannot be used from this node (a
    SQLite file of another host, a PostgreSQL login this user lacks) stops nothing: one warning
    line; the node runs jobs, does not archive (its passes skip, saying why), and moves nothing."""
    fresh = cluster_url(client, keys) is None  # no record yet: this rig up makes the first
    restored = None if set_here(settings) or not fresh else restore(client, keys, settings)
    lines = [f"archive: Redis held no record of this cluster's archive (it lost its data?): {restored} recorded "
             "again, as this node last saw it"] if restored else []
    if not set_here(settings) and (moved := moved_since(client, keys, settings)):
        lines.append(moved)
    lines += _check_node_at_up(client, keys, settings)
    if fresh and not restored and (foreign := unknown_history(client, keys, settings)):
        lines.append(foreign)
    remember(client, keys, settings)
    return lines


def unknown_history(client: redis.Redis, keys: Keys, settings: Settings) -> str | None:
    """At the `rig up` that first records the cluster's archive: the warning line when that
    archive already holds jobs under this key prefix that this node never saw archived there
    (:func:`remember`), else None. Rows are told apart by key prefix only, so a second rig
    cluster (its own Redis) with the same key_prefix and archive_url (the default ``rig:`` and
    a team's one PostgreSQL database) would list, show and count the first one's jobs as its
    own, and the first the second's, without a word."""
    cluster = cluster_url(client, keys)
    known = _remembered(settings)
    if cluster is None or (known is not None and same_archive(str(known["url"]), cluster)):
        return None
    held = count_jobs(unmasked(cluster), settings.key_prefix)
    if not held:
        return None
    return (f"warning: archive {cluster} already holds {held:,} job(s) under key prefix {settings.key_prefix!r} that "
            "this node never saw this cluster archive: if another rig cluster (another Redis) archives there with "
            "the same key_prefix, rig jobs/show/usage of each show the other's jobs as its own: give each cluster "
            "its own key_prefix (RIG_KEY_PREFIX) or database; if they are this cluster's (Redis and this node's run "
            "folder both lost their data), nothing to do")


def _remembered(settings: Settings) -> dict | None:
    """This home's memory of the cluster's archive record (:func:`remember`) for this Redis and
    prefix, or None."""
    try:
        data = json.loads((settings.run_dir / MEMORY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("cluster") != _memory_of(settings) or not data.get("url"):
        return None
    return data


def moved_since(client: redis.Redis, keys: Keys, settings: Settings) -> str | None:
    """At `rig up` of a node that set no archive_url: the line saying that the cluster's archive
    is another one than this node last saw (moved while it was down: by a `rig up` alone with
    another archive_url, or by an older rig that took its own default for a move), else None.
    The node follows the record either way; the jobs of the archive it knew are no longer shown."""
    known, cluster = _remembered(settings), cluster_url(client, keys)
    if known is None or cluster is None or same_archive(str(known["url"]), cluster):
        return None
    return (f"warning: this cluster's finished jobs now go to {cluster}, but this node last saw them go to "
            f"{known['url']}: its jobs are no longer shown by rig jobs/show/usage; if that move was not meant, "
            f"`rig down` every node and `rig up` with archive_url = \"{unmasked(str(known['url']))}\" (RIG_ARCHIVE_URL)")


def _check_node_at_up(client: redis.Redis, keys: Keys, settings: Settings) -> list[str]:
    """check_node_at_up's checks (its doc), once the record is what it will be."""
    url = archive_of(client, keys, settings)
    if (host := not_here(client, keys, url)) is not None:
        # Not refused: the archive's host archives every node's jobs; this node runs jobs.
        return [f"warning: this node does not archive: {on_other_host(host, url)}; {host.name}'s control workers "
                f"archive every node's finished jobs, and rig jobs/show/usage on this host do not see archived "
                f"ones: {SHARED_ARCHIVE}"]
    configured = set_here(settings)
    try:
        return check_at_up(client, keys, url, settings.key_prefix, settings.node_name, home=settings.home)
    except ConfigError as exc:
        if configured or cluster_url(client, keys) is None:
            raise
        return [f"warning: this node does not archive: the cluster's archive {safe_url(url)} cannot be used "
                f"here ({one_line(exc)[:300]}); set archive_url (RIG_ARCHIVE_URL) to it as this node reaches it"]


def mark_pass_ok(client: redis.Redis, keys: Keys, now: float) -> None:
    """After a pass that finished: when (epoch s)."""
    client.set(keys.archive_ok_at, repr(now))


def mark_held(client: redis.Redis, keys: Keys) -> None:
    """Before the archive is first given jobs: from now on a missing SQLite file is a loss."""
    client.set(keys.archive_held, "0", nx=True)


def add_held(client: redis.Redis, keys: Keys, jobs: int) -> None:
    """After ``jobs`` jobs moved into the archive (committed there, gone from Redis): counted,
    so an archive found empty later is told from one never written (:func:`emptied`)."""
    if jobs:
        client.incrby(keys.archive_held, jobs)


def held_jobs(client: redis.Redis, keys: Keys) -> bool:
    """Has the cluster's archive ever been given jobs (so a missing SQLite file is a loss)?"""
    return bool(client.exists(keys.archive_held))


def held_count(client: redis.Redis, keys: Keys) -> int:
    """How many jobs the cluster moved into its archive (a lower bound: ``archive:held`` was a
    flag, 1, before rig counted), 0 when none or unknown."""
    try:
        return int(_text(client.get(keys.archive_held)) or 0)
    except ValueError:
        return 0


def emptied(client: redis.Redis, keys: Keys, archive: Archive) -> ArchiveEmptied | None:
    """The error for an archive that holds none of this cluster's jobs though the cluster moved
    some there (a PostgreSQL database dropped and recreated: its tables made again, empty),
    else None. Such an archive is not used as the history: the pass leaves jobs in Redis,
    readers warn, rig up and rig status say it."""
    held = held_count(client, keys)
    if held <= 0 or not archive.empty():
        return None
    return ArchiveEmptied(
        f"archive {safe_url(archive.url)} holds none of this cluster's jobs but {held:,} were archived to it "
        "(database dropped and recreated, or the file replaced?): finished jobs stay in Redis; restore it, or "
        f"to start a new history there, `{_cli(client, 'DEL ' + keys.archive_held)}`")


def _cli(client: redis.Redis, command: str) -> str:
    """rig.redis_conn.redis_cli for ``client``'s Redis (its URL read back from the client)."""
    from rig.redis_conn import client_url, redis_cli

    url = client_url(client)
    return redis_cli(url, command) if url else f"redis-cli -h MASTER -p PORT {command}"


#: archive:pass' fields that describe a run of skipped passes (a pass that succeeds deletes them).
_SKIP_FIELDS = ("skips", "skipped_since", "skipped_at", "reason", "url")


def note_pass(client: redis.Redis, keys: Keys, now: float, *, interval: float, node: str,
              skipped: str | None = None, url: str = "") -> None:
    """After a pass of the cluster's archive by ``node`` (its ``interval``, s, is the one rig
    status measures lateness by): ``skipped`` None, it succeeded (the skips are forgotten);
    else why it was skipped, one line (counted, with the first skip's time kept, epoch s)."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.archive_pass, mapping={"interval": repr(float(interval)), "node": node})
    if skipped is None:
        pipe.hdel(keys.archive_pass, *_SKIP_FIELDS)
    else:
        pipe.hset(keys.archive_pass, mapping={"skipped_at": repr(now), "reason": skipped, "url": safe_url(url)})
        pipe.hsetnx(keys.archive_pass, "skipped_since", repr(now))
        pipe.hincrby(keys.archive_pass, "skips", 1)
    pipe.execute()


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def skipping(state: dict[str, str], now: float, interval: float) -> str | None:
    """The line for passes being skipped (``state``: archive:pass), once two were in a row or
    the first is one ``interval`` (s) old without a pass succeeding since; else None."""
    skips, since = _number(state.get("skips")) or 0, _number(state.get("skipped_since"))
    if not skips or since is None or (skips < 2 and now - since <= interval):
        return None
    from rig.nodes import clock  # the time of day today, with its date on another day

    reason, url = state.get("reason") or "unknown", state.get("url") or ""
    where = f" ({url})" if url and url not in reason else ""
    return f"archiving skipped since {clock(since)}: {reason}{where}"


def overdue_after(interval: float) -> float:
    """How long (s) without a successful pass, passes ``interval`` s apart, counts as late."""
    return 3 * interval + 60


def late(client: redis.Redis, keys: Keys, now: float, interval: float, *, control_up: bool = True) -> str | None:
    """A line for ``rig status`` when passes are skipped (:func:`skipping`: why, since when) or
    no pass succeeded for over 3 intervals + a minute (a pass failing, or its lock held), None
    when on time or never run. The interval is the archiving node's (archive:pass), else
    ``interval`` (this reader's, s). ``control_up``: is any control worker alive (they run the
    passes)? If not, that is why."""
    state = {_text(k) or "": _text(v) or "" for k, v in client.hgetall(keys.archive_pass).items()}
    interval = _number(state.get("interval")) or interval
    skipped = skipping(state, now, interval)
    ok_at = _number(_text(client.get(keys.archive_ok_at)))
    ago = None if ok_at is None else now - ok_at
    if ago is None or ago <= overdue_after(interval):
        return skipped if control_up else None
    if skipped and control_up:
        return skipped
    if not control_up:
        return (f"archiving last succeeded {ago / 60:.0f} min ago: no control worker is up to run it "
                "(`rig up` on a node starts one)")
    return (f"archiving last succeeded {ago / 60:.0f} min ago: see the control workers' log "
            "(control.log in rig's log folder) for why passes are skipped")
