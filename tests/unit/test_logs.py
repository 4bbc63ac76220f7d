"""Job log size cap (with a real appending child process) and log folder retention."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rig.logs import (
    RetentionPolicy,
    SweepReport,
    enforce_size_cap,
    human_size,
    marker_text,
    sweep_job_logs,
)

# Shared by the test and the child: line i's exact bytes (some with multi-byte UTF-8).
LINE_SRC = (
    "def line(i):\n"
    "    return ('L%07d ' % i + 'é日本🙂'[: i % 5] * (i % 3) + 'x' * (i % 23) + '\\n').encode()\n"
)
_ns: dict = {}
exec(LINE_SRC, _ns)
line = _ns["line"]

LINE_RE = re.compile(rb"L(\d{7}) ")
MARKER_RE = re.compile(
    rb"\[rig: (\d+) bytes of output were cut here to keep this log under ([^\]]+)\]\n"
)

# Appends numbered lines ("ab", one flushed write each) until the parent closes our stdin,
# then one last line, and prints that line's number.
CHILD = LINE_SRC + """
import select, sys
i = 0
with open(sys.argv[1], "ab") as f:
    while True:
        f.write(line(i))
        f.flush()
        if i % 32 == 0 and select.select([sys.stdin], [], [], 0)[0]:
            break
        i += 1
    i += 1
    f.write(line(i))  # written after the parent's last call: must end the file
print(i)
"""


def lines(start: int, stop: int) -> bytes:
    return b"".join(line(i) for i in range(start, stop))


def markers(data: bytes) -> list[int]:
    return [int(m.group(1)) for m in MARKER_RE.finditer(data)]


def last_line_number(path: Path) -> int:
    """Number of the last complete line now in the file (-1 if none yet)."""
    with open(path, "rb") as f:
        f.seek(max(os.fstat(f.fileno()).st_size - 8192, 0))
        data = f.read()
    numbers = [int(m.group(1)) for m in LINE_RE.finditer(data[: data.rfind(b"\n") + 1])]
    return max(numbers, default=-1)


def is_whole_line(raw: bytes) -> bool:
    m = LINE_RE.match(raw)
    return bool(m) and raw == line(int(m.group(1)))


def is_line_start(raw: bytes) -> bool:
    if len(raw) >= 8 and raw[1:8].isdigit():
        return line(int(raw[1:8])).startswith(raw)
    return re.fullmatch(rb"L\d{0,7}", raw) is not None


def count_broken_lines(data: bytes) -> int:
    """Check for garbage: no NULs; each line a marker, a whole numbered line or, rarely, the
    start of a numbered line followed by a whole later one (a write the cap saw half done,
    whose rest was lost: the documented race). Returns how many lines are of that last kind.
    """
    assert b"\x00" not in data
    broken = 0
    for raw in data.splitlines(keepends=True):
        if MARKER_RE.fullmatch(raw) or is_whole_line(raw):
            continue
        splits = [m.start() for m in LINE_RE.finditer(raw) if is_whole_line(raw[m.start() :])]
        assert splits and is_line_start(raw[: splits[0]]), raw
        broken += 1
    if not broken:
        data.decode("utf-8")
    return broken


def assert_well_formed(data: bytes) -> None:
    """No NULs, valid UTF-8, every line a whole numbered line or a marker."""
    assert b"\x00" not in data
    data.decode("utf-8")
    assert data.endswith(b"\n")
    for raw in data.splitlines(keepends=True):
        if MARKER_RE.fullmatch(raw) or raw == b"\n":
            continue
        m = LINE_RE.match(raw)
        assert m and raw == line(int(m.group(1))), raw


# --------------------------------------------------------------------------------------------
# enforce_size_cap
# --------------------------------------------------------------------------------------------


def test_human_size():
    assert human_size(64 * 1024**2) == "64.0 MiB"
    assert human_size(8 * 1024) == "8.0 KiB"
    assert human_size(1536 * 1024**2) == "1.5 GiB"
    assert human_size(512) == "512 B"


def test_under_cap_or_missing_is_untouched(tmp_path):
    path = tmp_path / "attempt-1.log"
    assert enforce_size_cap(path, 1024) == 0
    assert not path.exists()
    path.write_bytes(lines(0, 10))
    assert enforce_size_cap(path, 1024) == 0
    assert path.read_bytes() == lines(0, 10)
    with pytest.raises(ValueError):
        enforce_size_cap(path, 0)


def test_cut_keeps_head_marker_tail_on_line_boundaries(tmp_path):
    path = tmp_path / "attempt-1.log"
    original = lines(0, 5000)
    path.write_bytes(original)
    cap = 8 * 1024

    removed = enforce_size_cap(path, cap)

    data = path.read_bytes()
    assert len(data) <= cap
    m = MARKER_RE.search(data)
    assert m and int(m.group(1)) == removed and m.group(2) == b"8.0 KiB"
    head, tail = data[: m.start()], data[m.end() :]
    assert original.startswith(head) and head.endswith(b"\n")
    assert cap // 4 - 100 < len(head) <= cap // 4
    assert original.endswith(tail) and original[-len(tail) - 1 : -len(tail)] == b"\n"
    assert removed == len(original) - len(head) - len(tail)
    assert_well_formed(data)


def test_repeated_cuts_add_up_in_one_marker_and_appends_land_after_tail(tmp_path):
    path = tmp_path / "attempt-1.log"
    cap = 16 * 1024
    total_removed = 0
    with open(path, "ab") as writer:  # opened once, like the job's stdout
        for chunk in range(6):
            writer.write(lines(chunk * 2000, (chunk + 1) * 2000))
            writer.flush()
            total_removed += enforce_size_cap(path, cap)
            assert path.stat().st_size <= cap
        writer.write(b"after the cut\n")
        writer.flush()
    data = path.read_bytes()
    assert markers(data) == [total_removed]
    assert data.startswith(lines(0, 50))
    assert data.endswith(line(11999) + b"after the cut\n")
    assert b"\x00" not in data


def test_multibyte_text_without_newlines_is_not_split(tmp_path):
    path = tmp_path / "attempt-1.log"
    original = ("é日本🙂" * 20000).encode()  # 1-, 2-, 3- and 4-byte characters, no newline
    path.write_bytes(original)

    removed = enforce_size_cap(path, 10_000, keep_head=3001)

    data = path.read_bytes()
    assert len(data) <= 10_000
    text = data.decode("utf-8")  # strict: a split character would raise
    head, marker, tail = text.partition(f"\n[rig: {removed} bytes of output were cut here")
    assert marker and original.decode().startswith(head) and len(head.encode()) <= 3001
    assert original.decode().endswith(tail.split("]\n", 1)[1])


def test_keep_head_zero_and_oversized_keep_head(tmp_path):
    path = tmp_path / "attempt-1.log"
    path.write_bytes(lines(0, 3000))
    removed = enforce_size_cap(path, 4096, keep_head=0)
    data = path.read_bytes()
    assert data.startswith(marker_text(removed, 4096, newline_before=False))
    assert len(data) <= 4096

    with open(path, "ab") as writer:  # cutting again adds up, also with no head at all
        writer.write(lines(3000, 4000))
    removed += enforce_size_cap(path, 4096, keep_head=0)
    data = path.read_bytes()
    assert data.startswith(marker_text(removed, 4096, newline_before=False))
    assert markers(data) == [removed] and data.endswith(line(3999))

    path.write_bytes(lines(0, 3000))
    enforce_size_cap(path, 4096, keep_head=10**6)
    data = path.read_bytes()
    assert len(data) <= 4096 and markers(data) and data.startswith(lines(0, 10))


def test_cap_while_a_child_process_appends(tmp_path):
    path = tmp_path / "attempt-1.log"
    path.touch()
    cap = 64 * 1024
    worst_marker = len(marker_text(10**18, cap, newline_before=True))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        cuts, seen_before_last_call = 0, -1
        deadline = time.monotonic() + 60
        while cuts < 25:
            while path.stat().st_size <= cap:  # bounded poll: wait for the child to fill it
                assert proc.poll() is None, "writer died"
                assert time.monotonic() < deadline, "writer too slow"
            seen_before_last_call = last_line_number(path)  # written before the call began
            cuts += enforce_size_cap(path, cap) > 0
        assert proc.poll() is None  # the child was writing all along
        out, _ = proc.communicate(timeout=60)  # closes the child's stdin: its cue to stop
    finally:
        proc.kill()
    assert proc.returncode == 0
    last = int(out)

    data = path.read_bytes()
    written_since = len(lines(seen_before_last_call + 1, last + 1))
    assert len(data) <= cap + worst_marker + written_since
    assert len(markers(data)) == 1
    assert data.startswith(lines(0, 100))
    assert data.endswith(line(last))
    assert count_broken_lines(data) <= 2

    enforce_size_cap(path, cap)  # the supervisor's last call, after the job ended
    data = path.read_bytes()
    assert len(data) <= cap
    assert len(markers(data)) == 1
    assert data.startswith(lines(0, 100))
    assert data.endswith(line(last))
    assert count_broken_lines(data) <= 2
    tail = data[MARKER_RE.search(data).end() :]
    numbers = [int(n) for n in LINE_RE.findall(tail)]
    assert numbers == sorted(set(numbers))  # tail in order, no duplicates


# --------------------------------------------------------------------------------------------
# sweep_job_logs
# --------------------------------------------------------------------------------------------

NOW = 1_700_000_000.0
DAY = 86400
POLICY = RetentionPolicy(job_days=7, error_days=30)


def make_job(log_dir: Path, name: str, age_days: float, size: int = 100) -> Path:
    folder = log_dir / name
    folder.mkdir(parents=True)
    for file, content in (("attempt-1.log", b"x" * size), ("attempt-1.exit", b"0\n")):
        (folder / file).write_bytes(content)
        os.utime(folder / file, (NOW - age_days * DAY, NOW - age_days * DAY))
    return folder


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_sweep_normal_young_running_error(tmp_path):
    make_job(tmp_path, "1", age_days=8, size=1000)  # finished, old -> deleted
    make_job(tmp_path, "2", age_days=6)  # finished, young -> kept
    make_job(tmp_path, "3", age_days=100)  # running -> never deleted
    make_job(tmp_path, "4", age_days=10)  # error, within error_days -> kept
    make_job(tmp_path, "5", age_days=31, size=500)  # error, too old -> deleted
    make_job(tmp_path, "6", age_days=8, size=10)  # record missing -> like finished
    freed = sum(size_of(tmp_path / n) for n in ("1", "5", "6"))
    status = {3: "running", 4: "error", 5: "error", 6: "unknown"}
    asked: list[int] = []

    def protected(job_id: int, _instance: str | None = None) -> str | None:
        asked.append(job_id)
        return status.get(job_id)

    report = sweep_job_logs(tmp_path, POLICY, now=NOW, protected=protected)

    assert report == SweepReport(deleted=[1, 5, 6], kept_running=[3], kept_error=[4],
                                 bytes_freed=freed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "3", "4"]
    assert 2 not in asked  # young folders need no lookup


def test_sweep_age_is_newest_file(tmp_path):
    folder = make_job(tmp_path, "7", age_days=20)
    (folder / "attempt-2.log").write_bytes(b"new")
    os.utime(folder / "attempt-2.log", (NOW - DAY, NOW - DAY))
    report = sweep_job_logs(tmp_path, POLICY, now=NOW, protected=lambda *_: None)
    assert report.deleted == [] and folder.exists()


def test_sweep_ignores_other_names_and_symlinks(tmp_path):
    log_dir = tmp_path / "logs"
    outside = make_job(tmp_path, "outside", age_days=100)
    for name in ("tmp", "12a", "-3", "١٢"):  # the last: Arabic-Indic digits
        make_job(log_dir, name, age_days=100)
    (log_dir / "13").write_bytes(b"a file, not a folder")
    os.symlink(outside, log_dir / "99", target_is_directory=True)
    asked: list[int] = []

    report = sweep_job_logs(log_dir, POLICY, now=NOW,
                            protected=lambda job_id, _instance: asked.append(job_id))

    assert report == SweepReport([], [], [], 0)
    assert asked == []
    assert (outside / "attempt-1.log").exists() and (log_dir / "99").is_symlink()
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(
        ["tmp", "12a", "-3", "١٢", "13", "99"])


def test_sweep_symlink_inside_a_job_folder_is_not_followed(tmp_path):
    log_dir = tmp_path / "logs"
    outside = make_job(tmp_path, "outside", age_days=100)
    folder = make_job(log_dir, "8", age_days=100)
    os.symlink(outside / "attempt-1.log", folder / "link.log")
    os.utime(folder / "link.log", (NOW - 100 * DAY,) * 2, follow_symlinks=False)
    report = sweep_job_logs(log_dir, POLICY, now=NOW, protected=lambda *_: None)
    assert report.deleted == [8]
    assert (outside / "attempt-1.log").read_bytes() == b"x" * 100


def test_sweep_survives_vanishing_folders_and_missing_dir(tmp_path):
    make_job(tmp_path, "1", age_days=100)
    make_job(tmp_path, "2", age_days=100, size=7)

    def protected(job_id: int, _instance: str | None = None) -> None:
        if job_id == 1:
            shutil.rmtree(tmp_path / "1")  # someone else removed it meanwhile
        return None

    report = sweep_job_logs(tmp_path, POLICY, now=NOW, protected=protected)
    assert report.deleted == [2] and report.bytes_freed == 7 + 2
    empty = sweep_job_logs(tmp_path / "nope", POLICY, now=NOW, protected=lambda *_: None)
    assert empty == SweepReport()
