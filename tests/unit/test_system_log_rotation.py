"""rig's own logs (system_log_dir) are renamed aside past a size: they grew without end (the
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
    for name in ("up.log", "card0.out", "flower.log"):  # inherited descriptors / Tornado's own
        (tmp_path / name).write_text("y" * 2000)
    (tmp_path / "card1.log").symlink_to(tmp_path / "up.log")
    (tmp_path / "card2.log").write_text("small\n")

    assert rotate_system_logs(tmp_path, max_bytes=1000, keep=2) == [control]
    log.info("after the first")
    assert control.read_text() == "after the first\n"
    assert (tmp_path / "control.log.1").read_text().startswith("x" * 2000)
    for name in ("up.log", "card0.out", "flower.log", "card2.log"):
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
