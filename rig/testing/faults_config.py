"""Fault-suite scenario for configuration slips (issue 11, item 6).

``config-slips``: while a node runs jobs, an operator tries a second node (`rig up`), a
submission (`rig-submit`) and `rig status` with the configuration slips seen from outside: a
misspelt key in the file and in a variable, a health.timeout below the heartbeat interval, a
Redis URL with a bad scheme or port, a Flower port beyond 65535, a template whose memory is no
size, a table variable that is no JSON; an unknown RIG_* variable far from any setting, a
top-level key appended under [health], listen addresses that are none, a log_dir that is a
file, a health.check_interval above health.timeout. Each must be refused by the command with one line
naming the file and key or the variable, and exit code 6 (ConfigError), before touching Redis:
no node registered, no job submitted, and the running node's jobs end once each, nothing
leaked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from rig.errors import ConfigError
from rig.nodes import NodeRegistry
from rig.testing.faults import Scenario, ScenarioResult

UP = ["up", "--no-flower", "--no-beat", "--no-metrics"]
SUBMIT = ["submit", "--gpu-memory", "1G", "--", "true"]
STATUS = ["status"]

#: (what slipped, variables, config file text, the command, what its one line must say)
SLIPS: list[tuple[str, dict[str, str], str, list[str], str]] = [
    ("misspelt top-level key", {}, "max_tasks_per_gpu = 1\n", UP, "did you mean 'max_task_per_gpu'?"),
    ("misspelt [health] key", {}, "[health]\ntimout = 60\n", UP, "[health] 'timout'; did you mean 'timeout'?"),
    ("misspelt variable", {"RIG_HEALTH__TIMOUT": "60"}, "", UP, "did you mean RIG_HEALTH__TIMEOUT?"),
    ("health.timeout below the heartbeat", {}, "[health]\ntimeout = 1\n", UP,
     "health.timeout = 1 (RIG_CONFIG_FILE: [health] timeout) is less than 2 x telemetry_interval"),
    ("Redis URL scheme", {"RIG_REDIS_URL": "htp://127.0.0.1:6379/0"}, "", UP, "RIG_REDIS_URL: the scheme 'htp'"),
    ("Redis URL port", {"RIG_REDIS_URL": "redis://127.0.0.1:99999/0"}, "", UP, "RIG_REDIS_URL: its port"),
    ("Flower port", {"RIG_FLOWER_PORT": "99999"}, "", UP, "RIG_FLOWER_PORT: "),
    ("template memory", {}, '[templates.big]\ngpu_memory = "lots"\n', ["submit", "-t", "big", "--", "true"],
     "RIG_CONFIG_FILE: [templates.big] gpu_memory: cannot read 'lots' as a size"),
    ("table variable not JSON", {"RIG_HEALTH": "garbage"}, "", SUBMIT, "RIG_HEALTH: expected a JSON object"),
    ("misspelt variable (status)", {"RIG_MAX_TASKS_PER_GPU": "2"}, "", STATUS, "did you mean RIG_MAX_TASK_PER_GPU?"),
    ("variable far from its setting", {"RIG_NODE": "a"}, "", UP, "RIG_NODE: unknown rig setting; did you mean RIG_NODE_NAME?"),
    ("top-level key under [health]", {}, "[health]\ntimeout = 30\nmax_task_per_gpu = 3\n", UP,
     "max_task_per_gpu is a top-level setting; put it above the first [section]"),
    ("Flower address", {}, 'flower_address = "not an ip!"\n', UP,
     "RIG_CONFIG_FILE: flower_address: 'not an ip!' is neither an IP address nor a host name"),
    ("metrics address", {"RIG_METRICS_ADDRESS": "999.1.1.1"}, "", UP, "RIG_METRICS_ADDRESS: '999.1.1.1' is not an IP"),
    ("log_dir is a file", {"RIG_LOG_DIR": "/etc/passwd"}, "", UP, "log_dir = '/etc/passwd' (RIG_LOG_DIR) is not a folder"),
    ("check_interval above timeout", {}, "[health]\ncheck_interval = 100\ntimeout = 30\n", UP,
     "set health.check_interval below 30"),
]


def _try(sc: Scenario, index: int, env: dict[str, str], toml: str, command: list[str]) -> tuple[int, str, Path]:
    """Run ``rig COMMAND`` from a fresh folder (its rig.toml: ``toml``) and home, against the
    running node's Redis and key prefix. A command that does not end by itself within 30 s
    (a slip let through: `rig up` running) is stopped and reported."""
    folder = sc.workdir / f"slip{index}"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "rig.toml"
    if toml:
        config.write_text(toml)
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("RIG_")}
    s = sc.node.settings
    child_env = {**base, "RIG_REDIS_URL": s.redis_url, "RIG_KEY_PREFIX": s.key_prefix,
                 "RIG_HOME": str(folder / "home"), "RIG_FAKE_GPUS": "1x8G", "RIG_NODE_NAME": "slipnode", **env}
    proc = subprocess.Popen([sys.executable, "-m", "rig.cli.main", *command], env=child_env, cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # rig up stops what it started on Ctrl-C
        _, err = proc.communicate(timeout=60)
        return -1, err, config
    return proc.returncode, err, config


def config_slips(workdir: Path) -> ScenarioResult:
    sc = Scenario(workdir, "configuration slips", f"{len(SLIPS)} slips of file, variables and templates "
                  "beside a running node", fake_gpus="2x24G")
    try:
        sc.node.up()
        ids = [sc.submit(gpu_memory="4G") for _ in range(2)]
        sc.wait_running(ids)
        before = {job.id for job in sc.node.client.jobs(limit=1000)}
        for index, (what, env, toml, command, said) in enumerate(SLIPS):
            code, err, config = _try(sc, index, env, toml, command)
            lines = err.strip().splitlines()
            expected = said.replace("RIG_CONFIG_FILE", str(config))
            if code != ConfigError.exit_code or len(lines) != 1 or expected not in lines[0]:
                sc.result.problems.append(f"{what}: exit {code}, said {err.strip()[-300:]!r}")
            elif index in (0, 3, 4, 7):
                sc.result.notes.append(f"told ({what}): {lines[0]}")
        nodes = sorted(node.name for node in NodeRegistry(sc.node.redis, sc.node.keys).read())
        if nodes != [sc.node.settings.node_name]:
            sc.result.problems.append(f"nodes registered after the slips: {nodes}")
        after = {job.id for job in sc.node.client.jobs(limit=1000)}
        if after != before:
            sc.result.problems.append(f"jobs submitted by refused commands: {sorted(after - before)}")
        sc.finish()
        return sc.result
    finally:
        sc.close()


SCENARIOS = [
    ("config-slips", config_slips),
]
