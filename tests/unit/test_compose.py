"""docker-compose.yml cannot run here; keep it valid and its rig commands parseable by the CLI."""

from __future__ import annotations

import warnings
from pathlib import Path

import click
import yaml

from rig.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str]) -> click.Context:
    assert argv[0] == "rig"
    ctx = cli.make_context("rig", list(argv[1:]))
    with warnings.catch_warnings():  # click 8.2 deprecates protected_args; 9.0 folds it into args
        warnings.simplefilter("ignore", DeprecationWarning)
        tokens = [*ctx.protected_args, *ctx.args]
    name, command, rest = cli.resolve_command(ctx, tokens)
    return command.make_context(name, rest, parent=ctx)


def test_compose_services_run_valid_rig_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "gpu-worker", "beat", "flower"} <= set(services)
    commands = {name: svc["command"] for name, svc in services.items() if name != "redis"}
    for name, argv in commands.items():
        ctx = parse(argv)
        assert ctx.command.name == "up", name
    worker = parse(commands["gpu-worker"])
    assert worker.params["no_flower"] and worker.params["no_beat"]
    assert parse(commands["beat"]).params["only"] == ("beat",)
    assert parse(commands["flower"]).params["only"] == ("flower",)
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_redis_config_is_durable():
    conf = (ROOT / "config" / "redis.conf").read_text().splitlines()
    settings = {line.split()[0]: line.split()[1:] for line in conf if line.strip() and not line.startswith("#")}
    assert settings["appendonly"] == ["yes"]
    assert settings["appendfsync"] == ["everysec"]
    assert settings["maxmemory-policy"] == ["noeviction"]
