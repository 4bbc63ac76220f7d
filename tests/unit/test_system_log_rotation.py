"""rig's own logs (system_log_dir) are moved aside past a size: they grew without end (the
control worker's ~10 MB a day on an idle node), on the disk whose free space decides whether
the node takes jobs."""

from __future__ import annotations

import logging
from logging.handlers import WatchedFileHandler

from rig.logs import rotate_system_logs


def _writer(path) -> logging.Logger:
    """A log written as Celery's -f writes it (WatchedFileHandler)."""
    logger = logging.getLogger(f"rig-test-rotation-{path}")
    logger.propagate = False
    logger.addHandler(WatchedFileHandler(path))
    logger.setLevel(logging.INFO)
    return logger


def test_big_logs_are_renamed_aside_and_their_writer_goes_on_in_a_new_file(tmp_path):
    control = tmp_path / "control.log"
    log = _writer(control)
    log.info("x" * 2000)
    (tmp_path / "flower.log").write_text("y" * 2000)  # Tornado rotates it itself
    (tmp_path / "card1.log").symlink_to(tmp_path / "up.log")
    (tmp_path / "card2.log").write_text("small\n")

    assert rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == [control]
    log.info("after the first")
    assert control.read_text() == "after the first\n"
    assert (tmp_path / "control.log.1").read_text().startswith("x" * 2000)
    for name in ("flower.log", "card2.log"):
        assert not (tmp_path / f"{name}.1").exists()
    assert (tmp_path / "card1.log").is_symlink()

    for n in (2, 3):
        log.info(str(n) * 2000)
        assert rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == [control]
    log.info("newest")
    assert control.read_text() == "newest\n"
    assert (tmp_path / "control.log.1").read_text() == "3" * 2000 + "\n"
    assert (tmp_path / "control.log.2").read_text() == "after the first\n" + "2" * 2000 + "\n"
    assert not (tmp_path / "control.log.3").exists()  # at most `keep` older copies
    assert rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == []


def test_logs_written_through_an_inherited_descriptor_are_copied_aside_and_cut_in_place(tmp_path):
    """up.log (`rig up --daemon`'s output) and each process' *.out are written through the
    descriptor it inherited, opened "ab" (O_APPEND): renamed, the writer would go on in NAME.1
    and NAME stay empty, so they grew without end. Copied aside and cut to 0, the writer's next
    line lands at the start of NAME: no hole of the old size before it."""
    writers = {name: open(tmp_path / name, "ab", buffering=0) for name in ("up.log", "card0.out", "control.out")}
    try:
        for name, out in writers.items():
            out.write(f"{name} old\n".encode() + b"z" * 2000)
        (tmp_path / "control.out").chmod(0o600)
        (tmp_path / "beat.out").write_text("small\n")

        moved = rotate_system_logs(tmp_path, max_bytes=1000, keep=2)
        assert sorted(p.name for p in moved) == ["card0.out", "control.out", "up.log"]
        for name, out in writers.items():
            out.write(b"next\n")
            assert (tmp_path / name).read_bytes() == b"next\n"  # O_APPEND: at the new end, no hole
            assert (tmp_path / f"{name}.1").read_bytes() == f"{name} old\n".encode() + b"z" * 2000
        assert (tmp_path / "control.out.1").stat().st_mode & 0o777 == 0o600
        assert not (tmp_path / "beat.out.1").exists()

        for n in (2, 3):
            writers["up.log"].write(str(n).encode() * 2000)
            assert rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == [tmp_path / "up.log"]
        assert (tmp_path / "up.log").read_bytes() == b""
        assert (tmp_path / "up.log.1").read_bytes() == b"3" * 2000
        assert (tmp_path / "up.log.2").read_bytes() == b"next\n" + b"2" * 2000
        assert not (tmp_path / "up.log.3").exists()
    finally:
        for out in writers.values():
            out.close()


def test_a_log_swapped_for_a_symlink_after_its_check_is_left_alone_with_what_it_names(tmp_path):
    """up.log was checked with lstat, then opened and cut by its name (os.truncate follows
    symlinks): one swapped for a symlink in between had rig cut the file it named."""
    from rig.logs import _copy_and_cut

    victim = tmp_path / "elsewhere"
    victim.write_bytes(b"v" * 2000)
    (tmp_path / "up.log").symlink_to(victim)
    assert _copy_and_cut(tmp_path / "up.log", 2, 1000) is False
    assert victim.read_bytes() == b"v" * 2000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "up.log"]


def test_a_copy_that_fails_leaves_the_log_and_its_older_copies_as_they_were(tmp_path, monkeypatch):
    """On a full disk the copy of up.log failed half-way: the older copies had already been
    shifted (up.log.2, the oldest kept, deleted), a partial up.log.1 stayed, and each hourly pass
    did it again. Now the copy is made first; a failed one is removed and nothing else moves."""
    import errno
    import shutil

    import pytest

    import rig.logs

    up = tmp_path / "up.log"
    up.write_bytes(b"n" * 2000)
    (tmp_path / "up.log.1").write_text("one\n")
    (tmp_path / "up.log.2").write_text("two\n")

    def full(src, dst):
        dst.write(src.read(100))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full)
    with pytest.raises(OSError, match="No space left"):
        rig.logs.rotate_system_logs(tmp_path, max_bytes=1000, keep=2)
    assert up.read_bytes() == b"n" * 2000
    assert (tmp_path / "up.log.1").read_text() == "one\n" and (tmp_path / "up.log.2").read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["up.log", "up.log.1", "up.log.2"]
    monkeypatch.undo()
    assert rig.logs.rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == [up]
    assert up.read_bytes() == b"" and (tmp_path / "up.log.1").read_bytes() == b"n" * 2000
    assert (tmp_path / "up.log.2").read_text() == "one\n"
