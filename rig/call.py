"""``python -m rig.call``: the process a ``@rig.task`` call runs in, on its card.

Reads the call (function, arguments) from the job record named by $RIG_JOB_ID, runs it, and
stores the pickled return value on the record. An exception prints its traceback to the job's
log and exits 1; a call that cannot be read (no payload, not base64, not a pickle of the
expected shape, Redis unreachable) prints one line saying so and exits 2, at once.

Trust: the payload is a pickle, and unpickling runs code. It was written into rig's Redis by
the job's submitter, and it is unpickled here, in the job's own process (as the submitter's user
when workers run as root). Whoever can write to rig's Redis can therefore run code as any
user whose jobs a root worker runs — as they could by writing a job record with any command.
Redis must be reachable only by the people allowed to submit (README, "Sharing a server").
"""

from __future__ import annotations

import base64
import binascii
import importlib
import importlib.util
import os
import pickle
import sys
import traceback
from typing import Any

import redis

from rig.keys import Keys

#: Exit code for a call that could not be read (the function never ran).
BAD_CALL_EXIT = 2
#: Seconds to connect to Redis, and to wait for any one reply, before giving up.
REDIS_CONNECT_TIMEOUT_S = 10.0
REDIS_REPLY_TIMEOUT_S = 120.0


class BadCall(Exception):
    """The call's payload cannot be used; ``str()`` says why, in one line."""


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    """The call stored on the job record: base64 of a pickled dict with ``module`` and
    ``qualname`` (text), ``file`` (text or None), ``root`` (text), ``args`` (tuple or list)
    and ``kwargs`` (dict with text keys). Raises BadCall naming the first thing wrong."""
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadCall(f"the call's payload is not base64 ({exc})") from None
    try:
        payload = pickle.loads(data)  # noqa: S301 - see the module docstring: trusted by design
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad payload
        raise BadCall(f"the call's payload cannot be unpickled here: {type(exc).__name__}: {exc}") from None
    if not isinstance(payload, dict):
        raise BadCall(f"the call's payload is a {type(payload).__name__}, not a dict")
    for key in ("module", "qualname"):
        if not isinstance(payload.get(key), str) or not payload[key]:
            raise BadCall(f"the call's payload has no valid {key!r}")
    if not isinstance(payload.get("file"), str | type(None)) or not isinstance(payload.get("root", ""), str):
        raise BadCall("the call's payload has a bad 'file' or 'root'")
    if not isinstance(payload.get("args"), tuple | list):
        raise BadCall("the call's payload has no argument list ('args')")
    kwargs = payload.get("kwargs")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise BadCall("the call's payload has no keyword arguments dict ('kwargs')")
    if payload["module"] == "__main__" and not payload.get("file"):
        raise BadCall("the call's function lives in a script whose file is unknown")
    return payload


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


def _say(message: str) -> None:
    print(f"rig.call: {message}", file=sys.stderr, flush=True)


def main() -> int:
    job_id = os.environ.get("RIG_JOB_ID", "")
    if not job_id.isdigit():
        _say("RIG_JOB_ID is not set; this runs only inside a rig job")
        return BAD_CALL_EXIT
    keys = Keys(os.environ.get("RIG_KEY_PREFIX", "rig:"))
    client = redis.Redis.from_url(os.environ.get("RIG_REDIS_URL", "redis://127.0.0.1:6379/0"),
                                  socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
                                  socket_timeout=REDIS_REPLY_TIMEOUT_S)
    try:
        raw = client.hget(keys.job(job_id), "payload")
    except redis.RedisError as exc:
        _say(f"job {job_id}: cannot read the call from Redis: {exc}")
        return BAD_CALL_EXIT
    if raw is None:
        _say(f"job {job_id} has no payload; was it submitted with @rig.task? Resubmit the call")
        return BAD_CALL_EXIT
    try:
        payload = decode_payload(raw)
    except BadCall as exc:
        _say(f"job {job_id}: {exc}; resubmit the call")
        return BAD_CALL_EXIT
    try:
        fn = _load_function(payload)
        result = fn(*payload["args"], **payload["kwargs"])
    except Exception:  # noqa: BLE001 - the traceback is the job's evidence
        traceback.print_exc()
        return 1
    try:
        encoded = base64.b64encode(pickle.dumps(result)).decode()
    except Exception as exc:  # noqa: BLE001
        _say(f"the return value cannot be pickled: {exc}")
        return 1
    try:
        client.hset(keys.job(job_id), "result", encoded)
    except redis.RedisError as exc:
        _say(f"job {job_id}: the call ran but its result could not be stored: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
