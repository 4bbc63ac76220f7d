#!/usr/bin/env python3
"""Run rig's fault-injection scenarios against real Redis, real workers and real jobs, and print
the table (scenario, jobs, faults, lost, duplicated, leaked, orphans).

    .venv/bin/python scripts/fault_scenarios.py              # all scenarios (several minutes)
    .venv/bin/python scripts/fault_scenarios.py redis-restart beats
    .venv/bin/python scripts/fault_scenarios.py --help             # this text and the scenarios' names

Needs a Redis at $RIG_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) for the scenarios that
don't start their own; each uses a private key prefix and removes its keys afterwards.
Exit status 0 when every scenario counted zeros.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rig.testing.fault_suite import ALL, run  # noqa: E402
from rig.testing.faults import table  # noqa: E402


def main() -> int:
    names = sys.argv[1:]
    if {"-h", "--help"} & set(names):
        print(f"{(__doc__ or '').strip()}\n\nscenarios: {' '.join(n for n, _ in ALL)}")
        return 0  # was: "unknown scenario(s) ['--help']", exit 2
    unknown = [n for n in names if n not in dict(ALL)]
    if unknown:
        print(f"unknown scenario(s) {unknown}; choose from {[n for n, _ in ALL]}", file=sys.stderr)
        return 2
    results = run(names or None)
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
