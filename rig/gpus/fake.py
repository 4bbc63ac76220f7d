"""Fake cards for machines without an NVIDIA driver (and for tests).

A spec lists groups of identical cards: ``8x80G``, ``2x24G,1x48G``, or ``4`` (4 x 80 GiB).
The model is named ``Fake GPU``; temperature reads 35 C. A card's UUID names its node,
``GPU-fake-<node>-0003``, so fake cards are unique across a cluster as real ones are.

Jobs can "use" memory on a fake card, so rig's closed-loop accounting can be exercised without
a GPU: a process writes the bytes it uses into ``<usage_dir>/<card index>/<pid>`` (rig gives
jobs the folder as $RIG_FAKE_GPU_DIR; ``python -m rig.fakeuse 12G 30`` does it for you). Files
of dead processes are ignored and removed. Utilisation reads 100 % while any process uses the
card, else 0.

A job run as another user (a root node running its submitter's jobs) cannot write the shared
folder (nor, often, even pass through $RIG_HOME), so the card worker gives it a folder of its
own, ``<jobs_dir>/job-<id>`` (:func:`job_usage_dir`: made by the worker, owned by the job's uid,
mode 0700, so no other user can write or read it) as its $RIG_FAKE_GPU_DIR, with the same
``<card>/<pid>`` files, and removes it when the attempt ends (:func:`drop_job_usage_dir`). For a
root node ``jobs_dir`` is ``/run/rig/fake-gpus-<digest of usage_dir>`` (:func:`jobs_dir_for`:
the folder every user reaches for the gateway's socket; 0711: passable, not listable), else
``<usage_dir>/jobs``. The backend sums them with the shared ones. It reads a job's folder
without following links (a job's user could plant one to a file of root's) and never deletes in it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

from rig.config import default_node_name
from rig.errors import ConfigError, InvalidInput
from rig.gpus.base import GpuReadError, GpuReading
from rig.memory import GIB, MIB, format_memory, parse_memory

_GROUP = re.compile(r"^\s*(?:(?P<count>\d+)\s*[xX*]\s*)?(?P<size>[0-9.]+\s*[a-zA-Z]*)?\s*$")
DEFAULT_CARD = 80 * GIB
#: The smallest fake card: 256 MiB, the least any CUDA card had. A smaller one (``1x1K``) is a
#: slip; no job's memory would ever fit it.
MIN_FAKE_CARD = 256 * MIB


def parse_fake_spec(spec: str) -> list[int]:
    """``"2x24G,1x48G"`` -> card sizes in bytes, in index order."""
    sizes: list[int] = []
    for group in str(spec).split(","):
        match = _GROUP.match(group)
        if not group.strip() or not match or not (match["count"] or match["size"]):
            raise ConfigError(f"fake_gpus: cannot read {spec!r}; write it like 8x80G or 2x24G,1x48G")
        if match["count"] and not match["size"]:
            raise ConfigError(f"fake_gpus: {group.strip()!r} has no card size; write it like 8x80G")
        if match["size"] and not match["count"] and group.strip().isdigit():
            count, size = int(group), DEFAULT_CARD  # "4" means four default cards
        else:
            count = int(match["count"] or 1)
            try:
                size = parse_memory(match["size"], what="fake_gpus")
            except InvalidInput as err:  # its words say what is wrong with the size (unit, under 1 MiB)
                raise ConfigError(f"{err} (fake_gpus {group.strip()!r}: write it like 8x80G or 2x24G,1x48G)") from None
            if size < MIN_FAKE_CARD:
                raise ConfigError(f"fake_gpus: a card of {format_memory(size)} in {group.strip()!r} is smaller "
                                  f"than any GPU; give at least {format_memory(MIN_FAKE_CARD)}, e.g. 8x80G")
        if count < 1 or count > 64:
            raise ConfigError(f"fake_gpus: {count} cards in {group.strip()!r}; use 1 to 64")
        sizes.extend([size] * count)
    return sizes


class FakeGpuBackend:
    """Cards that exist only in rig's imagination; everything reads as idle and cool."""

    kind = "fake"

    def __init__(self, spec: str, usage_dir: str | os.PathLike[str] | None = None,
                 node: str | None = None) -> None:
        self.spec = spec
        self._sizes = parse_fake_spec(spec)
        self.usage_dir = Path(usage_dir) if usage_dir else None
        #: Where the folders of jobs run as other users are (jobs_dir_for).
        self.jobs_dir = jobs_dir_for(self.usage_dir) if self.usage_dir else None
        #: The node these cards belong to (it goes into their UUIDs); by default the node name
        #: rig's settings default to: RIG_NODE_NAME, else the host name.
        self.node = node or os.environ.get("RIG_NODE_NAME") or default_node_name()

    def count(self) -> int:
        return len(self._sizes)

    def read(self, index: int) -> GpuReading:
        if not 0 <= index < len(self._sizes):
            raise GpuReadError(f"fake card {index} does not exist ({self.spec})")
        size = self._sizes[index]
        processes = self._processes(index)
        return GpuReading(
            index=index,
            uuid=f"GPU-fake-{self.node}-{index:04d}",
            model=f"Fake GPU {size // GIB}GB",
            total=size,
            used=sum(processes.values()),
            utilization=100 if processes else 0,
            temperature=35,
            processes=processes,
        )

    def _processes(self, index: int) -> dict[int, int]:
        """pid -> bytes, from the usage files of live processes on this card: the shared
        folder's and each job's own (job_usage_dir)."""
        if self.usage_dir is None:
            return {}
        found = self._shared(index)
        try:
            jobs = [e for e in os.scandir(self.jobs_dir) if e.is_dir(follow_symlinks=False)] if self.jobs_dir else []
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            jobs = []
        for folder in jobs:
            found.update(_job_files(Path(folder.path) / str(index)))
        return found

    def _shared(self, index: int) -> dict[int, int]:
        """pid -> bytes from the shared folder (files of dead processes are removed)."""
        assert self.usage_dir is not None
        folder = self.usage_dir / str(index)
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return {}
        found: dict[int, int] = {}
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if not os.path.exists(f"/proc/{pid}"):
                Path(entry.path).unlink(missing_ok=True)
                continue
            try:
                found[pid] = int(Path(entry.path).read_text().strip() or 0)
            except (OSError, ValueError):
                continue
        return found

    def read_all(self) -> list[GpuReading]:
        return [self.read(i) for i in range(len(self._sizes))]

    def close(self) -> None:
        pass


#: A root node's run folder, which every user passes through to reach the gateway's socket
#: (rig.gateway.paths.SYSTEM_SOCKET's folder).
SYSTEM_RUN = Path("/run/rig")
#: Bytes read of a usage file at most (a number).
_MOST = 32


def jobs_dir_for(usage_dir: Path, euid: int | None = None) -> Path:
    """Where the usage folders of jobs run as other users go: for a root node (``euid`` 0,
    default: this process'), under SYSTEM_RUN, named for ``usage_dir`` (two installations on one
    host keep theirs apart), since $RIG_HOME may be closed to other users; else
    ``usage_dir/jobs`` (such a node runs every job as itself)."""
    if (os.geteuid() if euid is None else euid) == 0:
        digest = hashlib.sha256(os.fsencode(str(Path(usage_dir).absolute()))).hexdigest()[:12]
        return SYSTEM_RUN / f"fake-gpus-{digest}"
    return Path(usage_dir) / "jobs"


def job_usage_dir(jobs_dir: Path, job_id: int, uid: int, gid: int) -> Path:
    """Make (afresh) the folder a job run as ``uid`` writes its fake-card usage into, and
    return it: ``jobs_dir/job-<id>``, owned by ``uid``:``gid``, mode 0700; ``jobs_dir`` is made
    0711 (passable, not listable: a job finds only its own). The caller (the card worker, root
    when it runs jobs as their submitters) makes it before the job starts; a folder left by an
    earlier attempt is removed first (without following its links)."""
    if not jobs_dir.parent.exists():
        jobs_dir.parent.mkdir(parents=True, mode=0o755)
        os.chmod(jobs_dir.parent, 0o755)  # whatever the umask: others pass through it
    folder = jobs_dir / f"job-{int(job_id)}"
    drop_job_usage_dir(jobs_dir, job_id)
    for _try in range(3):  # another card's worker may remove jobs_dir, empty, in between
        jobs_dir.mkdir(exist_ok=True)
        os.chmod(jobs_dir, 0o711)
        try:
            folder.mkdir(mode=0o700)
            break
        except FileNotFoundError:
            continue
    else:
        folder.mkdir(mode=0o700)  # raises: say why
    if (uid, gid) != (os.geteuid(), os.getegid()):
        os.chown(folder, uid, gid)
    return folder


def job_usage_dirs(jobs_dir: Path, older_than: float = 0.0) -> dict[int, Path]:
    """job id -> its usage folder (:func:`job_usage_dir`) under ``jobs_dir``, for the folders
    unchanged for ``older_than`` seconds (mtime; a folder made afresh by a new attempt is young).
    Entries not named ``job-<id>`` are not listed."""
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(jobs_dir))
    except OSError:
        return found  # no such folder: no job used fake memory as another user
    cutoff = time.time() - older_than
    for entry in entries:
        name = entry.name
        if not name.startswith("job-") or not name[4:].isdigit():
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime > cutoff:
                continue
        except OSError:
            continue
        found[int(name[4:])] = Path(entry.path)
    return found


def job_usage_in_use(folder: Path) -> bool:
    """Does a live process still have a usage file in this job folder (any card)?"""
    if folder.is_symlink():
        return False
    try:
        cards = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    return any(_job_files(Path(card.path)) for card in cards)


def drop_job_usage_dir(jobs_dir: Path, job_id: int) -> None:
    """Remove a job's usage folder, if any (its attempt ended): shutil.rmtree does not follow
    the links a job may have left in it."""
    folder = jobs_dir / f"job-{int(job_id)}"
    if folder.is_symlink():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        jobs_dir.rmdir()  # the last one: nothing left behind in /run/rig
    except OSError:
        pass  # other jobs' folders are there (or it is gone)


def _job_files(folder: Path) -> dict[int, int]:
    """pid -> bytes from one job's card folder: regular files named by a live pid, opened
    without following links; anything else is skipped (never removed: the folder is the job's)."""
    if folder.is_symlink():
        return {}  # planted: it would lead this reader (root) elsewhere
    try:
        entries = [e for e in os.scandir(folder) if e.name.isdigit() and e.is_file(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return {}
    found: dict[int, int] = {}
    for entry in entries:
        pid = int(entry.name)
        if not os.path.exists(f"/proc/{pid}"):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found[pid] = int(os.read(fd, _MOST).decode().strip() or 0)
        except (OSError, ValueError):
            pass
        finally:
            os.close(fd)
    return found
