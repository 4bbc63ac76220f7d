"""``python -m rig.call``: the process a ``@rig.task`` call runs in, on its card.

Reads the call (function, arguments) from the job record named by $RIG_JOB_ID, runs it, and
stores the pickled return value on the record. An exception prints its traceback to the job's
log and exits 1.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import os
import pickle
import sys
import traceback
from typing import Any

import redis

from rig.keys import Keys


def _load_function(payload: dict[str, Any]) -> Any:
    module_name = payload["module"]
    if module_name == "__main__":
        # The submitter's script: import it under another name so its `if __name__ ==
        # "__main__":` block does not run again here.
        spec = importlib.util.spec_from_file_location("__rig_main__", payload["file"])
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["__rig_main__"] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        if payload.get("root") and payload["root"] not in sys.path:
            sys.path.insert(0, payload["root"])
        module = importlib.import_module(module_name)
    target: Any = module
    for part in payload["qualname"].split("."):
        target = getattr(target, part)
    return getattr(target, "fn", target)  # the RigTask wrapper -> the plain function


def main() -> int:
    job_id = os.environ.get("RIG_JOB_ID")
    if not job_id:
        print("rig.call: RIG_JOB_ID is not set; this runs only inside a rig job", file=sys.stderr)
        return 2
    keys = Keys(os.environ.get("RIG_KEY_PREFIX", "rig:"))
    client = redis.Redis.from_url(os.environ.get("RIG_REDIS_URL", "redis://127.0.0.1:6379/0"))
    raw = client.hget(keys.job(job_id), "payload")
    if raw is None:
        print(f"rig.call: job {job_id} has no payload", file=sys.stderr)
        return 2
    # The payload was written by the submitter of this very job into rig's own Redis.
    payload = pickle.loads(base64.b64decode(raw))
    try:
        fn = _load_function(payload)
        result = fn(*payload["args"], **payload["kwargs"])
    except Exception:  # noqa: BLE001 - the traceback is the job's evidence
        traceback.print_exc()
        return 1
    try:
        encoded = base64.b64encode(pickle.dumps(result)).decode()
    except Exception as exc:  # noqa: BLE001
        print(f"rig.call: the return value cannot be pickled: {exc}", file=sys.stderr)
        return 1
    client.hset(keys.job(job_id), "result", encoded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
