"""The shipped monitoring configs: config/prometheus (scrape config, alert rules) passes
`promtool check config` / `check rules`, and every metric the rules and the Grafana dashboard
(config/grafana/dashboards/*.json) query is one rig exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from rig.client import Client
from rig.metrics import make_registry
from tests.store.test_metrics_alerts import busy, client  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "config" / "prometheus"
RULES = sorted((PROMETHEUS / "rules").glob("*.yml"))
DASHBOARDS = sorted((ROOT / "config" / "grafana" / "dashboards").glob("*.json"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus) is not installed; .ci/run installs it")

#: A metric name in PromQL: rig_..., not followed by "(" (a function) nor inside a label matcher.
_METRIC = re.compile(r"\b(rig_[a-z0-9_]+)\b")


def test_the_configs_are_shipped():
    assert (PROMETHEUS / "prometheus.yml").is_file()
    assert RULES and DASHBOARDS


@needs_promtool
def test_promtool_accepts_the_rules_and_the_scrape_config():
    done = subprocess.run([PROMTOOL, "check", "rules", *map(str, RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS / "prometheus.yml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout  # rule_files finds the rules beside it


@needs_promtool
def test_the_rules_fire_where_rigs_alerts_would():
    """`promtool test rules` (tests/store/prometheus/rig_alerts_test.yml): the failure rate from
    the counters, a long queue, a reserved but idle card after 10 min; two endpoints scraped make
    one alert."""
    done = subprocess.run([PROMTOOL, "test", "rules", "rig_alerts_test.yml"], capture_output=True, text=True,
                          cwd=Path(__file__).parent / "prometheus")
    assert done.returncode == 0, done.stdout + done.stderr


def _rule_exprs() -> list[str]:
    exprs = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [rule["expr"] for rule in group["rules"]]
    return exprs


def _dashboard_exprs() -> list[str]:
    exprs = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())  # it parses
        assert dashboard["panels"], path
        for panel in dashboard["panels"]:
            assert panel["targets"], panel["title"]
            exprs += [t["expr"] for t in panel["targets"]]
    return exprs


def _exported(text: str) -> set[str]:
    """Every sample name of a /metrics text (histogram and counter suffixes included)."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


@pytest.mark.redis
def test_every_queried_metric_is_exported(busy: Client):  # noqa: F811 - the fixture
    exported = _exported(generate_latest(make_registry(busy)).decode())
    assert "rig_jobs_ended_total" in exported and "rig_job_start_wait_seconds_bucket" in exported
    for expr in _rule_exprs() + _dashboard_exprs():
        names = set(_METRIC.findall(expr))
        assert names, expr  # each expression queries rig
        unknown = names - exported
        assert not unknown, f"{expr!r} names {sorted(unknown)}, which rig does not export"


def test_the_dashboard_uses_the_provisioned_datasource():
    datasources = yaml.safe_load(
        (ROOT / "config" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uids = {d["uid"] for d in datasources["datasources"]}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            assert panel["datasource"]["uid"] in uids, panel["title"]
