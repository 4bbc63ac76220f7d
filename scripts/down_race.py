#!/usr/bin/env python3
"""Does a node read "stopped" the instant `rig down` returns? Loops `rig up --daemon` /
`rig down` of one node (fake card, real CLI, real workers) and, right after each `rig down`,
reads the node's record, heartbeat and name claim in one transaction.

    RIG_TEST_REDIS_URL=redis://127.0.0.1:6413/0 .venv/bin/python scripts/down_race.py --rounds 20 --load 2

``--load N`` runs N busy-loop processes beside it (the race needs a slow machine to show).
Prints one line per round and a summary; exit 1 when any round read anything but stopped.
Uses a key prefix of its own and removes its keys afterwards.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.keys import Keys  # noqa: E402
from rig.nodes import NodeRegistry  # noqa: E402
from rig.stack import settings_env  # noqa: E402
from rig.testing.faults import _free_port  # noqa: E402
from rig.testing.harness import RigHarness, delete_prefix, new_prefix  # noqa: E402


def _spin() -> None:
    while True:
        pass


def _watch(r, keys: Keys, done: threading.Event, seen: list[str]) -> None:  # noqa: ANN001 - redis.Redis
    """While `rig down` runs: after the stop mark appears, note every heartbeat or name claim
    that is (re)written (its writer and when, relative to the mark)."""
    last: tuple = (None, None)
    while not done.is_set():
        pipe = r.pipeline(transaction=True)
        pipe.hget(keys.node("a"), "stopped_at")
        pipe.get(keys.node_alive("a"))
        pipe.get(keys.node_owner("a"))
        stopped_at, alive, owner = pipe.execute()
        if stopped_at is not None and (alive, owner) != last and (alive or owner):
            beat = json.loads(alive) if alive else None
            claim = json.loads(owner.rpartition("|")[0]).get("pid") if owner else None
            said = (f"heartbeat by {beat.get('by')} (pid {beat.get('pid')}, seen_at "
                    f"{float(beat.get('seen_at', 0)) - float(stopped_at):+.3f} s from the mark)" if beat
                    else "no heartbeat")
            seen.append(f"after the stop mark: {said}, name claim of pid {claim}")
        last = (alive, owner) if stopped_at is not None else (None, None)
        time.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside it")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="telemetry_interval, s (smaller: the control worker beats more often)")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    prefix = new_prefix()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="rig-down-race-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        h = RigHarness(home, fake_gpus="1x80G", prefix=prefix, node_name="a", flower_port=_free_port(),
                       telemetry_interval=args.interval, health={"check_interval": 1.0, "timeout": 4.0})
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RIG_")}, **settings_env(h.settings)}
        rig = str(Path(sys.executable).parent / "rig")
        keys: Keys = h.keys

        def cli(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([rig, *argv], env=env, capture_output=True, text=True, timeout=180, cwd=home)

        try:
            for i in range(args.rounds):
                up = cli("up", "--daemon", "--no-flower", "--no-metrics", "--no-beat")
                if up.returncode != 0:
                    print(f"round {i}: rig up failed: {up.stderr.strip()[-300:]}")
                    bad += 1
                    continue
                time.sleep(1.0)  # a few heartbeats of the control worker
                seen: list[str] = []
                done = threading.Event()
                watcher = threading.Thread(target=_watch, args=(h.redis, keys, done, seen))
                watcher.start()
                down = cli("down", "--node", "a")
                done.set()
                watcher.join()
                pipe = h.redis.pipeline(transaction=True)
                pipe.get(keys.node_alive("a"))
                pipe.get(keys.node_owner("a"))
                pipe.hmget(keys.node("a"), "stopped_at", "last_seen")
                alive, owner, (stopped_at, last_seen) = pipe.execute()
                state = {n.name: n for n in NodeRegistry(h.redis, keys).read()}["a"].state
                ok = down.returncode == 0 and state == "stopped" and alive is None and owner is None
                bad += not ok
                by = json.loads(alive).get("by") if alive else None
                claim = json.loads(owner.rpartition("|")[0]).get("pid") if owner else None
                print(f"round {i}: {'ok ' if ok else 'BAD'} state={state} heartbeat_by={by} "
                      f"claim_pid={claim} last_seen-stopped_at="
                      f"{float(last_seen or 0) - float(stopped_at or 0):+.3f} s", flush=True)
                for line in seen:
                    print(f"    during rig down: {line}", flush=True)
        finally:
            cli("down", "--node", "a")
            delete_prefix(h.redis, prefix)
    for p in spinners:
        p.terminate()
    print(f"{bad} of {args.rounds} round(s) read anything but stopped right after rig down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
