"""Submission templates (M3): presets fill what the submitter did not say."""

from __future__ import annotations

import pytest

from rig.client import Client
from rig.config import load_settings
from rig.errors import InvalidInput
from rig.memory import GIB
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


@pytest.fixture
def client(real_redis, key_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rig.toml").write_text(
        '[templates.nightly]\ngpu_memory = "16G"\npriority = "low"\ntime_limit = "6h"\n'
        '[templates.finetune]\nmargin = 1.5\npriority = "high"\n')
    settings = load_settings(key_prefix=key_prefix, redis_url=REDIS_URL, home=tmp_path / "home")
    return Client(settings, redis_client=real_redis)


def test_template_fills_unsaid_options_and_flags_win(client):
    job = client.submit("python ft.py", gpu_memory="10G", template="finetune").record
    assert job.gpu_memory == 15 * GIB  # 10 GiB x the config's margin 1.5
    assert job.priority.value == "high" and job.template == "finetune"
    # The config's finetune replaces the shipped one as a whole: unsaid values are the defaults.
    assert job.max_retries == 2 and job.time_limit is None and not job.oom_retry_grow
    explicit = client.submit("python ft.py", gpu_memory="10G", template="finetune", priority="low",
                             retries=0).record
    assert explicit.priority.value == "low" and explicit.max_retries == 0


def test_template_with_its_own_memory_and_shipped_ones_remain(client):
    job = client.submit("python eval.py", template="nightly").record
    assert job.gpu_memory == 16 * GIB and job.priority.value == "low" and job.time_limit == 6 * 3600
    assert {"finetune", "inference", "test", "nightly"} <= set(client.templates())
    smoke = client.submit("pytest -x", template="test").record
    assert smoke.gpu_memory == 2 * GIB and smoke.max_retries == 0


def test_unknown_template_and_missing_memory(client):
    with pytest.raises(InvalidInput, match="unknown template 'huge'; known: finetune"):
        client.submit("x", gpu_memory="1G", template="huge")
    with pytest.raises(InvalidInput, match="--gpu-memory is required"):
        client.submit("x", template="finetune")
