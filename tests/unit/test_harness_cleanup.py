"""A throwaway node's clean-up (rig.testing.harness) leaves nothing of it on the host: on a root
host its jobs' fake-card usage folders live outside its home, under /run/rig, and every
benchmark stopped mid-run (bench_mixed under `timeout`) left one folder with a job-N folder per
job that was running."""

from __future__ import annotations

from rig.gpus.fake import jobs_dir_for
from rig.testing.harness import RigHarness


def test_cleanup_removes_the_jobs_fake_usage_folder(tmp_path):
    harness = RigHarness(tmp_path / "home", fake_gpus="1x24G", redis_url="redis://127.0.0.1:1/0")
    jobs_dir = jobs_dir_for(harness.settings.fake_usage_dir)
    card = jobs_dir / "job-7" / "0"
    card.mkdir(parents=True)
    (card / "4242").write_text(str(10 << 30))  # a job killed with its node wrote it and never ended
    harness.cleanup()  # no stack, no Redis: only what is on the host goes
    assert not jobs_dir.exists()
