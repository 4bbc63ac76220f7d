"""docker-compose.yml cannot run here (no Docker engine): keep it valid, its rig commands
parseable by the CLI, its settings names real, its secrets out of argv and the repository, and
every published port on the host's loopback."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import time
import warnings
from pathlib import Path

import click
import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.cli.main import cli
from rig.config import Settings

ROOT = Path(__file__).resolve().parents[2]
#: RIG_* variables rig reads straight from the environment rather than through Settings.
DIRECT_ENV = {"RIG_FLOWER_AUTH", "RIG_CONFIG", "RIG_ROLE", "RIG_CARD_INDEX"}
#: Services that run another image than rig's (no rig command).
THIRD_PARTY = {"redis", "prometheus", "grafana"}
REQUIRED = re.compile(r"\$\{(\w+):\?[^}]*\}")


def parse(argv: list[str]) -> click.Context:
    assert argv[0] == "rig"
    ctx = cli.make_context("rig", list(argv[1:]))
    with warnings.catch_warnings():  # click 8.2 deprecates protected_args; 9.0 folds it into args
        warnings.simplefilter("ignore", DeprecationWarning)
        tokens = [*ctx.protected_args, *ctx.args]
    name, command, rest = cli.resolve_command(ctx, tokens)
    return command.make_context(name, rest, parent=ctx)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services_run_valid_rig_commands(compose):
    services = compose["services"]
    assert {"redis", "gpu-worker", "beat", "flower", "metrics"} <= set(services)
    commands = {name: svc["command"] for name, svc in services.items() if name not in THIRD_PARTY}
    for name, argv in commands.items():
        ctx = parse(argv)
        assert ctx.command.name == "up", name
    worker = parse(commands["gpu-worker"])
    assert worker.params["no_flower"] and worker.params["no_beat"] and worker.params["no_metrics"]
    assert parse(commands["beat"]).params["only"] == ("beat",)
    assert parse(commands["flower"]).params["only"] == ("flower",)
    assert parse(commands["metrics"]).params["only"] == ("metrics",)
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_compose_settings_names_are_real(compose):
    """Every RIG_* variable a service sets is a setting rig reads (a typo would be ignored)."""
    nested = {name for name, field in Settings.model_fields.items()
              if field.annotation is not None and hasattr(field.annotation, "model_fields")}
    for name, service in compose["services"].items():
        for var in service.get("environment", {}):
            if not var.startswith("RIG_") or var in DIRECT_ENV:
                continue
            field, _, sub = var[4:].lower().partition("__")
            assert field in Settings.model_fields, f"{name}: {var} is not a rig setting"
            if sub:
                assert field in nested, f"{name}: {var}"


def test_compose_redis_requires_the_password_from_env(compose):
    services = compose["services"]
    redis_svc = services["redis"]
    script = "\n".join(redis_svc["command"])
    # The password reaches Redis through a generated 0600 file, never argv (ps shows argv).
    assert "--requirepass" not in script and "requirepass" in script and "umask 077" in script
    assert "$$REDISCLI_AUTH" in script  # "$$": expanded by the container's shell, not compose
    assert REQUIRED.fullmatch(redis_svc["environment"]["REDISCLI_AUTH"])
    # An unauthenticated or refused PING prints an error but exits 0: look for PONG.
    assert "PONG" in " ".join(redis_svc["healthcheck"]["test"])
    assert "-a" not in " ".join(redis_svc["healthcheck"]["test"]).split()
    for name in ("gpu-worker", "beat", "flower", "metrics"):
        env = services[name]["environment"]
        assert "@" not in env["RIG_REDIS_URL"], f"{name}: the password belongs in RIG_REDIS_PASSWORD"
        assert REQUIRED.fullmatch(env["RIG_REDIS_PASSWORD"]), name
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert REQUIRED.fullmatch(services["flower"]["environment"]["RIG_FLOWER_AUTH"])


def test_compose_publishes_only_on_loopback(compose):
    services = compose["services"]
    published = {}
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip, host_port, container_port = str(port).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published[name] = (int(host_port), int(container_port))
    assert "redis" not in published
    assert published["flower"][1] == int(services["flower"]["environment"]["RIG_FLOWER_PORT"])
    assert published["metrics"][1] == int(services["metrics"]["environment"]["RIG_METRICS_PORT"])
    assert published["metrics"][1] == Settings.model_fields["metrics_port"].default


def test_compose_secrets_stay_out_of_git_and_the_image(compose):
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(REQUIRED.findall(text))
    assert {"RIG_REDIS_PASSWORD", "RIG_FLOWER_AUTH"} <= required
    example = (ROOT / ".env.example").read_text()
    listed = {line.split("=", 1)[0].lstrip("# ").strip() for line in example.splitlines() if "=" in line}
    assert required <= listed, f".env.example lacks {required - listed}"
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    assert ".env" in (ROOT / ".dockerignore").read_text().split()
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, capture_output=True)
    assert ignored.returncode in (0, 128), "git must ignore .env"  # 128: not a git checkout


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) where it works, else Debian's `docker-compose` (v1.29),
    else None."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_accepts_it(tmp_path):
    compose_cli = _compose_cli()
    if compose_cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed here (.ci/run installs "
                    "Debian's docker-compose); the schema checks above stand in for `config`")
    env = {**os.environ, "RIG_REDIS_PASSWORD": "x" * 32, "RIG_FLOWER_AUTH": "rig:" + "y" * 24}
    checked = subprocess.run([*compose_cli, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    unset = {k: v for k, v in env.items() if k != "RIG_REDIS_PASSWORD"}
    refused = subprocess.run([*compose_cli, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                             capture_output=True, text=True, env=unset, cwd=tmp_path)
    assert refused.returncode != 0 and "RIG_REDIS_PASSWORD" in refused.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compose_redis_script_runs_with_a_password(compose, tmp_path):
    """The redis service's own shell script, outside Docker: Docker-only paths point into
    tmp_path, the image's entrypoint becomes a plain redis-server on a free loopback port. The
    Redis it starts must refuse clients without the password, accept it, and not show it in
    its argv; the generated file must be mode 0600."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("no redis-server on PATH")
    port, password = _free_port(), "c0mpose-Test-" + os.urandom(8).hex()
    conf = tmp_path / "redis.conf"
    conf.write_text((ROOT / "config/redis.conf").read_text())
    script = "\n".join(compose["services"]["redis"]["command"][2:])
    generated = tmp_path / "auth/redis.conf"
    script = (script.replace("$$", "$")  # what compose does to "$$"
              .replace("/run/redis-auth", str(tmp_path / "auth"))
              .replace("/usr/local/etc/redis/redis.conf", str(conf))
              .replace("chown redis:redis", "true"))
    entry = f"docker-entrypoint.sh redis-server {generated}"
    assert entry in script
    # Options after the file override it: a free port, loopback, this test's folder.
    script = script.replace(entry, f"{server} {generated} --port {port} --bind 127.0.0.1 "
                                   f"--dir {tmp_path} --logfile {tmp_path / 'redis.log'}")
    (tmp_path / "auth").mkdir()
    proc = subprocess.Popen(["sh", "-ec", script], env={**os.environ, "REDISCLI_AUTH": password},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        authed = redis.Redis(port=port, password=password, retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                assert authed.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, retry=Retry(NoBackoff(), 0)).ping()
        assert authed.config_get("appendonly")["appendonly"] == "yes"  # config/redis.conf applies
        assert password not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert stat.S_IMODE(generated.stat().st_mode) == 0o600
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_config_is_durable():
    conf = (ROOT / "config" / "redis.conf").read_text().splitlines()
    settings = {line.split()[0]: line.split()[1:] for line in conf if line.strip() and not line.startswith("#")}
    assert settings["appendonly"] == ["yes"]
    assert settings["appendfsync"] == ["everysec"]
    assert settings["maxmemory-policy"] == ["noeviction"]
    assert settings["protected-mode"] == ["yes"]
    assert all(not addr.lstrip("-").startswith(("0.0.0.0", "*", "::")) or addr.lstrip("-") == "::1"
               for addr in settings["bind"])


def test_compose_monitoring_is_provisioned_from_config(compose):
    """Prometheus and Grafana (profile "monitoring", off by default) read the shipped configs."""
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
    mounts = {name: {v.split(":")[0]: v.split(":")[1] for v in services[name]["volumes"] if v.startswith("./")}
              for name in ("prometheus", "grafana")}
    assert mounts["prometheus"] == {"./config/prometheus": "/etc/prometheus"}
    assert (ROOT / "config/prometheus/prometheus.yml").is_file()
    scrape = yaml.safe_load((ROOT / "config/prometheus/prometheus.yml").read_text())
    targets = [t for job in scrape["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert f"metrics:{services['metrics']['environment']['RIG_METRICS_PORT']}" in targets
    assert mounts["grafana"]["./config/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards = mounts["grafana"]["./config/grafana/dashboards"]
    provider = yaml.safe_load((ROOT / "config/grafana/provisioning/dashboards/rig.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == dashboards
    source = yaml.safe_load((ROOT / "config/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
