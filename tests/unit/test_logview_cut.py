"""`rig log -f` through a log cut in place to its cap (rig.logs.enforce_size_cap: the head, a
marker line, the newest output): the follower goes on from the same output, never repeats or
skips a line it could still read, prints the marker where output it had not read was cut, and
ends with the job's last line (a tester's finding: it stopped showing output at the cap)."""

from __future__ import annotations

import io
import json
import os
import random
import re
from pathlib import Path

import pytest

from rig.cli.logview import CutFollower
from rig.logs import enforce_size_cap, find_marker

CAP = 64 * 1024


class Job:
    """A job writing numbered lines into its log, and the keeper's cut (to 3/4 of the cap)."""

    def __init__(self, path: Path) -> None:
        self.path, self.n, self.cut = path, 0, 0

    def write_until(self, size: int) -> None:
        with self.path.open("ab") as f:
            while self.path.stat().st_size < size:
                f.write(f"line-{self.n:06d} {'y' * 40}\n".encode())
                f.flush()
                self.n += 1

    def cut_to_cap(self, note: bool) -> None:
        self.cut += enforce_size_cap(self.path, CAP * 3 // 4, stated_cap=CAP)
        if note:  # what the keeper leaves beside the log (rig.logspace)
            self.path.with_suffix(".note").write_text(json.dumps({"cap_cut": self.cut, "cap": CAP}))


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line-(\d+) ", text, flags=re.M)]


def _follow(tmp_path: Path, steps: list[tuple[int, bool]], note: bool) -> tuple[str, Job]:
    """Each step: the job writes until the file has ``size`` bytes, the keeper cuts if asked,
    then the follower copies what it finds."""
    path = tmp_path / "attempt-1.log"
    path.write_bytes(b"")
    job, out = Job(path), io.BytesIO()
    with path.open("rb") as fh:
        follower = CutFollower(fh, str(path))
        for size, cut in steps:
            job.write_until(size)
            if cut:
                job.cut_to_cap(note)
            follower.copy(out)
    return out.getvalue().decode(), job


def test_a_cut_after_everything_was_read_loses_nothing(tmp_path):
    text, job = _follow(tmp_path, [(40_000, False), (60_000, False), (70_000, True), (90_000, False)], note=False)
    assert _numbers(text) == list(range(job.n))  # every line once, in order: nothing of it was cut unread
    assert "bytes of output were cut here" not in text


def test_output_cut_before_it_was_read_is_the_marker(tmp_path):
    """A fast writer: between two looks the job writes far past the cap and the file is cut,
    twice; the follower's place (30 kB, past the head) is still inside the cut file, so only the
    keeper's note tells it was cut."""
    text, job = _follow(tmp_path, [(30_000, False), (200_000, True), (230_000, True), (240_000, False)], note=True)
    numbers = _numbers(text)
    assert numbers == sorted(set(numbers)), "a line repeated or out of order"
    assert numbers[-1] == job.n - 1, "the job's last line is missing"
    # Each cut of output it had not read yet is the marker, as in the file; between them
    # the lines run on without a gap.
    parts = text.split("bytes of output were cut here")
    assert len(parts) == 3, text[:200]  # both cuts took output it had not read
    for part in parts:
        if found := _numbers(part):
            assert found == list(range(found[0], found[-1] + 1))
    assert _numbers(parts[0])[0] == 0 and _numbers(parts[-1])[-1] == job.n - 1


def test_without_the_note_a_file_shrunk_under_it_is_a_cut(tmp_path):
    """Where the note cannot be read (another user's log folder), a file shorter than the place
    reached is the sign: the follower read to 60 kB, the job wrote on and the log was cut to 48 kB."""
    text, job = _follow(tmp_path, [(60_000, False), (66_000, True), (80_000, False)], note=False)
    numbers = _numbers(text)
    assert numbers == sorted(set(numbers)) and numbers[-1] == job.n - 1


def test_a_log_it_cannot_seek_is_copied_as_read():
    class Stream(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:  # noqa: ANN001
            return 0

        def tell(self) -> int:
            raise OSError("not seekable")

    out = io.BytesIO()
    CutFollower(Stream(), "/nonexistent/attempt-1.log").copy(out)  # type: ignore[arg-type]
    assert out.getvalue() == b""


def test_the_keepers_cut_seen_between_its_truncate_and_its_append_is_not_a_foreign_truncation(tmp_path):
    """The keeper truncates to the head, then appends marker and tail: a look in between sees a
    short file with no marker. That is not a rotation by someone else (which is read again from
    the start, with a line): the follower looks again and finds the keeper's marker."""
    path = tmp_path / "attempt-1.log"
    path.write_bytes(b"")
    job, out = Job(path), io.BytesIO()
    with path.open("rb") as fh:
        follower = CutFollower(fh, str(path))
        job.write_until(60_000)
        follower.copy(out)
        job.write_until(70_000)
        cut = tmp_path / "cut.log"  # what the keeper's cut leaves, made aside
        cut.write_bytes(path.read_bytes())
        enforce_size_cap(cut, CAP * 3 // 4, stated_cap=CAP)
        after = cut.read_bytes()
        head = find_marker(after)[0]
        os.truncate(path, head)  # the keeper's truncate ...
        follower.copy(out)  # ... a look right then
        with path.open("ab") as f:
            f.write(after[head:])  # ... and its append
        job.write_until(path.stat().st_size + 5_000)
        follower.copy(out)
    assert follower.foreign_cuts == 0
    numbers = _numbers(out.getvalue().decode())
    assert numbers == sorted(set(numbers)) and numbers[-1] == job.n - 1


def test_a_file_truncated_by_someone_else_is_read_again_from_its_start(tmp_path):
    """`: > attempt-1.log` (a copy-truncate rotation): two looks agree, then the file is read
    from its start (the follower used to wait until the file grew past its old place)."""
    path = tmp_path / "attempt-1.log"
    path.write_bytes(b"")
    job, out = Job(path), io.BytesIO()
    with path.open("rb") as fh:
        follower = CutFollower(fh, str(path))
        told: list[int] = []
        follower.on_foreign = lambda: told.append(follower.foreign_cuts)
        job.write_until(10_000)
        follower.copy(out)
        os.truncate(path, 0)
        job.write_until(500)
        follower.copy(out)
        follower.copy(out)
        job.write_until(1_000)
        follower.copy(out)
    assert told == [1]
    assert _numbers(out.getvalue().decode()) == list(range(job.n))


@pytest.mark.parametrize("seed", [*range(8), 22, 64])
def test_the_keeper_cutting_inside_the_followers_reads_repeats_and_skips_nothing_readable(tmp_path, monkeypatch, seed):
    """The card's keeper (the real LogCopy, cap 64 kB) writes bursts and cuts at arbitrary
    points between the follower's own reads, as another process does on a loaded host (CI saw
    `rig log -f` show ~1,000 lines twice): a cut again while the follower found its place after
    the one before, and a cut made before the follower began, whose marker it must read as one.
    Every line it prints is printed once, in order, and the job's last line comes."""
    from rig.logkeeper import LogCopy

    rnd = random.Random(seed)
    log = tmp_path / "attempt-1.log"
    keeper = LogCopy(log, CAP)
    written = [0]
    inside = [0]  # the keeper is writing: no burst inside its own reads

    def write(lines: int) -> None:
        inside[0] += 1
        try:
            for _ in range(lines):
                keeper.feed(b"line-%06d %s\n" % (written[0], b"y" * 20))
                written[0] += 1
        finally:
            inside[0] -= 1

    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        if not inside[0] and rnd.random() < 0.3:
            write(rnd.choice([1, 10, 100, 1000, 3000]))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)
    write(50)
    out = io.BytesIO()
    with log.open("rb") as fh:
        follower = CutFollower(fh, str(log))
        for _ in range(rnd.randint(3, 30)):
            follower.copy(out)
            write(rnd.choice([0, 5, 50, 500, 2000, 5000]))
        write(3)
        keeper.close()
        inside[0] += 1  # ended: nothing more is written
        follower.copy(out)
    numbers = _numbers(out.getvalue().decode())
    assert numbers == sorted(set(numbers)), "a line repeated or out of order"
    assert numbers[-1] == written[0] - 1, "the job's last line is missing"
    assert keeper.cut > 0
