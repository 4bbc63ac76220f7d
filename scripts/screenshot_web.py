#!/usr/bin/env python3
"""A PNG of rig's web page under a mixed load of three users (running, waiting, failed jobs),
with six hours of history and a dispatcher's lock held (estimated starts): for the docs.

    .venv/bin/python scripts/screenshot_web.py [--out docs/web-page.png] [--redis-url URL]

Writes the load under a throwaway key prefix of the given Redis (never anyone else's keys; they
are deleted afterwards), serves the page on a free loopback port with a throwaway login, and has
Debian's chromium (headless) draw it. Exits 2 with one line when chromium or Redis is missing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rig.client import Client  # noqa: E402
from rig.config import load_settings  # noqa: E402
from rig.forecast import forecast  # noqa: E402
from rig.forecast_store import publish  # noqa: E402
from rig.testing.web_load import mixed_load  # noqa: E402
from rig.web.server import start_web_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "web-page.png")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--size", default="1400,1650", help="window width,height in pixels")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("screenshot_web: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    r = redis.Redis.from_url(args.redis_url, decode_responses=True, socket_connect_timeout=2)
    try:
        r.ping()
    except redis.RedisError as exc:
        print(f"screenshot_web: no Redis at {args.redis_url} ({exc}); give --redis-url", file=sys.stderr)
        return 2
    prefix = f"rigshot:{uuid.uuid4().hex[:10]}:"
    login = ("rig", uuid.uuid4().hex)
    with tempfile.TemporaryDirectory() as tmp:
        client = Client(load_settings(key_prefix=prefix, redis_url=args.redis_url, home=Path(tmp) / "home"),
                        redis_client=r)
        try:
            load = mixed_load(client, history_hours=6)
            # As a running node would have it: a dispatcher holds the lock (so the waiting jobs
            # get estimated starts, rig.forecast, stored by it) and the running jobs have earlier runs.
            for job_id, seconds in zip(load.running, (3600.0, 2400.0, 7200.0), strict=True):
                client.store.update(job_id, expected_seconds=seconds)
            r.set(client.keys.sched_leader, "screenshot", px=600_000)
            publish(r, client.keys, forecast(client), every=200.0)  # as the leader stores it (workers.forecaster)
            server = start_web_server(client, "127.0.0.1", 0, login)
            try:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                done = subprocess.run(
                    [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     f"--user-data-dir={tmp}/profile", "--virtual-time-budget=5000", f"--window-size={args.size}",
                     f"--screenshot={args.out.resolve()}", f"http://{login[0]}:{login[1]}@127.0.0.1:{server.server_port}/"],
                    capture_output=True, text=True, timeout=120)
            finally:
                server.shutdown()
                server.server_close()
        finally:
            for key in r.scan_iter(f"{prefix}*", count=500):
                r.delete(key)
    if done.returncode != 0 or not args.out.exists():
        print(f"screenshot_web: chromium failed ({done.returncode}): {done.stderr.strip()[-300:]}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
