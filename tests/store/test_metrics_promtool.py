"""rig's /metrics text passes Prometheus' own checker (`promtool check metrics`, Debian's
`prometheus` package; .ci/run installs it): names, types, help texts, units (``_total``
counters, base units) and label sets, for a busy cluster with closed, gone and log-less cards and
a Redis that refuses writes or not."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from rig.client import Client
from rig.metrics import make_registry
from tests.store.test_metrics_alerts import busy, client  # noqa: F401 - fixtures

pytestmark = pytest.mark.redis

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) is not installed; .ci/run installs it")
def test_promtool_accepts_the_metrics(busy: Client):  # noqa: F811 - the fixture
    keys = busy.keys
    # A card taken out of the whitelist and one gone from the node, beside the busy ones.
    busy.ledger.r.hset(keys.card("n1", 0), mapping={"allowed": 0})
    busy.ledger.r.hset(keys.card("n1", 1), mapping={"gone": 1, "allowed": 0})
    text = generate_latest(make_registry(busy)).decode()
    assert "rig_card_free_bytes" in text and "rig_redis_refuses_writes" in text
    # The counters, the cumulative histogram, ratios and per-user gauges are in what is checked.
    for name in ("rig_jobs_submitted_total", 'rig_jobs_ended_total{failure="cuda_oom",state="FAILED"}',
                 'rig_job_start_wait_seconds_bucket{le="+Inf"}', "rig_job_start_wait_seconds_count",
                 "rig_card_utilization_ratio", "rig_card_total_bytes", 'rig_user_waiting_jobs{user="u"}'):
        assert name in text, name
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    # promtool exits non-zero on errors and prints lint problems (naming, units) one per line.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr
