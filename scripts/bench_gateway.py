#!/usr/bin/env python3
"""What the gateway costs: the same calls straight to Redis and through the gateway, side by
side in one run.

Starts a real gateway process (`python -m rig.gateway.server`) on a throwaway socket against
real Redis ($RIG_BENCH_REDIS_URL or 127.0.0.1:6379) under a private key prefix (no node: the
jobs are only queued), then prints, for the direct client and the gateway client (the best
of --rounds interleaved rounds):

  * submit(): jobs/s of one call per job, and the median latency of one call;
  * submit_many(): jobs/s of one call for a batch;
  * status(): the median latency of `rig status`'s read.

The machine is noisy (2 cores): compare the two columns of one run, not runs.

    .venv/bin/python scripts/bench_gateway.py [--submits 300] [--batch 2000] [--status 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from rig.client import Client  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.gateway.client import GatewayClient  # noqa: E402
from rig.testing.harness import delete_prefix  # noqa: E402


def measure(client, args: argparse.Namespace) -> dict[str, float]:  # noqa: ANN001
    one = []
    began = time.perf_counter()
    for _ in range(args.submits):
        t = time.perf_counter()
        client.submit(["true"], gpu_memory="1G", workdir="/tmp")
        one.append(time.perf_counter() - t)
    single = args.submits / (time.perf_counter() - began)
    began = time.perf_counter()
    client.submit_many([{"command": ["true"], "gpu_memory": "1G", "workdir": "/tmp"} for _ in range(args.batch)])
    many = args.batch / (time.perf_counter() - began)
    status = []
    for _ in range(args.status):
        t = time.perf_counter()
        client.status()
        status.append(time.perf_counter() - t)
    return {"submit/s": single, "submit ms": 1000 * statistics.median(one), "submit_many/s": many,
            "status ms": 1000 * statistics.median(status)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=300)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--status", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("RIG_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"rigbench:{uuid.uuid4().hex[:10]}:"
    home = Path(tempfile.mkdtemp(prefix="rig-bench-gw-"))
    sock = Path(f"/tmp/rig-bench-gw-{uuid.uuid4().hex[:8]}.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(RIG_REDIS_URL=url, RIG_KEY_PREFIX=prefix, RIG_HOME=str(home), RIG_GATEWAY_SOCKET=str(sock))
    gateway = subprocess.Popen([sys.executable, "-P", "-m", "rig.gateway.server"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    settings = load_settings(redis_url=url, key_prefix=prefix, home=home, gateway_socket=sock)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if gateway.poll() is not None or time.monotonic() > deadline:
                sys.exit("the gateway did not start")
            time.sleep(0.05)
        direct, through = Client(settings), GatewayClient(settings, sock)
        through.ping()
        # Interleaved rounds, the best of each (the order and the machine's noise matter less).
        rounds: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
        for _ in range(args.rounds):
            rounds["direct"].append(measure(direct, args))
            rounds["gateway"].append(measure(through, args))
        best = {"submit/s": max, "submit ms": min, "submit_many/s": max, "status ms": min}
        results = {side: {k: pick(r[k] for r in runs) for k, pick in best.items()} for side, runs in rounds.items()}
    finally:
        gateway.terminate()
        gateway.wait(10)
        client = redis.Redis.from_url(url)
        delete_prefix(client, prefix)
        client.close()
    print(f"{'':16}{'direct':>12}{'gateway':>12}{'ratio':>8}")
    for key in results["direct"]:
        d, g = results["direct"][key], results["gateway"][key]
        print(f"{key:16}{d:12.1f}{g:12.1f}{g / d:8.2f}")
    added = results["gateway"]["submit ms"] - results["direct"]["submit ms"]
    print(f"gateway adds {added:.2f} ms per submit() (median), "
          f"{results['gateway']['status ms'] - results['direct']['status ms']:.2f} ms per status()")


if __name__ == "__main__":
    main()
