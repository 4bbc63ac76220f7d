"""``python -m rig.call``: the process a ``@rig.task`` call runs in, on its card.

Reads the call (function, arguments) from the job record named by $RIG_JOB_ID, runs it, and
stores the pickled return value on the record. Exit codes (rig.failures classifies them; 2 and 3
are never retried, another attempt would fail the same way):

- 0: the call returned and its result is stored;
- 1: the function raised (its traceback is in the job's log), or called ``sys.exit`` with a
  non-zero code of its own (kept, except 2 and 3, which become 1);
- 2 (CALL_BAD_EXIT): the call cannot be loaded: no payload, not base64, not a pickle of the
  expected shape, the function cannot be imported, or its script submits jobs when imported;
- 3 (CALL_BAD_RESULT_EXIT): the function returned a value that cannot be pickled;
- 75 (REDIS_UNAVAILABLE_EXIT, EX_TEMPFAIL): Redis could not be reached to read the call or
  store its result (retried like any failure).

The interpreter runs with ``-P`` (rig.pytask.call_argv): the function's folder is added to
``sys.path`` here, after rig itself is imported, so a folder named ``rig`` there cannot shadow
rig; ``PYTHONPATH`` gets it too, for the processes the function starts.

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
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import redis

from rig import callpickle, pytask
from rig.callpickle import JOB_SCRIPT, ScriptNameMissing
from rig.failures import CALL_BAD_EXIT, CALL_BAD_RESULT_EXIT
from rig.keys import Keys
from rig.pytask import SubmittedWhileImported, loading_call
from rig.redis_conn import connect
from rig.replication import ReplicaWait, replica_wait, write_confirmed

if TYPE_CHECKING:
    from rig.config import Settings

#: Exit code for a call that could not be read or loaded (the function never ran).
BAD_CALL_EXIT = CALL_BAD_EXIT
#: Exit code for a call whose return value cannot be pickled (the function ran).
BAD_RESULT_EXIT = CALL_BAD_RESULT_EXIT
#: Exit code when Redis cannot be reached (transient: retried).
REDIS_UNAVAILABLE_EXIT = 75
#: Seconds to connect to Redis, and to wait for any one reply, before giving up.
REDIS_CONNECT_TIMEOUT_S = 10.0
REDIS_REPLY_TIMEOUT_S = 120.0


class BadCall(Exception):
    """The call's payload cannot be used; ``str()`` says why, in one line."""


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    """The call stored on the job record: base64 of a pickled dict with ``module`` and
    ``qualname`` (text), ``file`` (text or None), ``root`` (text), ``package`` (text, optional:
    the package of a script run with ``python -m``), and ``call`` (bytes: the
    pickled ``(args, kwargs)``, unpickled by :func:`decode_arguments` once the function's module
    is imported) or, as written by older versions, ``args`` (tuple or list) and ``kwargs``
    (dict with text keys). Raises BadCall naming the first thing wrong."""
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
    if not isinstance(payload.get("file"), str | type(None)) or not isinstance(payload.get("root", ""), str) \
            or not isinstance(payload.get("package", ""), str):
        raise BadCall("the call's payload has a bad 'file', 'root' or 'package'")
    if "call" in payload:
        if not isinstance(payload["call"], bytes):
            raise BadCall("the call's payload has a bad 'call' (the pickled arguments)")
    else:  # written before the arguments travelled as their own pickle: plain args and kwargs
        _check_arguments(payload.get("args"), payload.get("kwargs"))
    if payload["module"] == "__main__" and not payload.get("file"):
        raise BadCall("the call's function lives in a script whose file is unknown")
    return payload


def _check_arguments(args: Any, kwargs: Any) -> None:
    if not isinstance(args, tuple | list):
        raise BadCall("the call's payload has no argument list ('args')")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise BadCall("the call's payload has no keyword arguments dict ('kwargs')")


def decode_arguments(payload: dict[str, Any]) -> tuple[tuple | list, dict[str, Any]]:
    """The call's ``(args, kwargs)``. Call after _load_function: the arguments may hold classes
    of the submitter's script, which unpickle from the script imported there (rig.callpickle).
    Raises BadCall; a name the script does not define says so (callpickle.ScriptNameMissing)."""
    if "call" not in payload:
        return payload["args"], payload["kwargs"]
    try:
        decoded = pickle.loads(payload["call"])  # noqa: S301 - trusted by design (module docstring)
    except ScriptNameMissing as exc:
        raise BadCall(f"the call's arguments cannot be unpickled: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad payload
        raise BadCall(f"the call's arguments cannot be unpickled here: {type(exc).__name__}: {exc}; "
                      f"pass plain data or file paths") from None
    if not isinstance(decoded, tuple) or len(decoded) != 2:
        raise BadCall("the call's arguments are not an (args, kwargs) pair")
    _check_arguments(*decoded)
    return decoded


def _add_root(root: str) -> None:
    """Put the function's folder first on sys.path (as Python does for a script) and on
    PYTHONPATH (for the processes the function starts). Called after rig is imported: later
    `import rig.x` resolve through rig's own package path, never through this folder."""
    if not root:
        return
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


class LoadFailed(Exception):
    """The call's module could not be imported, or does not define the function; ``str()``
    says why and what to do, in one line."""


def _load_function(payload: dict[str, Any]) -> Any:
    """Import the call's module (the submitter's script under the name ``__rig_main__``) and
    return its function. Raises LoadFailed, or SubmittedWhileImported (the module submits
    jobs when imported)."""
    module_name, qualname = payload["module"], payload["qualname"]
    _add_root(payload.get("root") or "")
    with loading_call(payload.get("file") or module_name):
        try:
            module = _import(payload)
        except SubmittedWhileImported:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a script's argparse exits (SystemExit)
            raise LoadFailed(_import_failure(payload, exc)) from exc
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            where = (f"the top level of {payload['file']}" if module_name == "__main__"
                     else f"module {module_name}")
            raise LoadFailed(f"{qualname} is not defined at {where} when the job imports it; define it "
                             f"at the module's top level (outside `if __name__ == \"__main__\":`), "
                             f"then submit the call again")
    return getattr(target, "fn", target)  # the RigTask wrapper -> the plain function


def _import(payload: dict[str, Any]) -> ModuleType:
    if payload["module"] != "__main__":
        return importlib.import_module(payload["module"])
    # The submitter's script: import it under another name so its `if __name__ ==
    # "__main__":` block does not run again here; its argv is the script alone, as if it were
    # run with no arguments (not rig.call's).
    spec = importlib.util.spec_from_file_location(JOB_SCRIPT, payload["file"])
    if spec is None or spec.loader is None:
        raise ImportError(f"{payload['file']} cannot be imported (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    if payload.get("package"):  # run with `python -m PACKAGE.NAME`: its relative imports need it
        importlib.import_module(payload["package"])
        module.__package__ = payload["package"]
    sys.modules[JOB_SCRIPT] = module
    argv, sys.argv = sys.argv, [payload["file"]]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


def _import_failure(payload: dict[str, Any], exc: BaseException) -> str:
    """One line: why importing the call's module failed, and what to do."""
    if isinstance(exc, SystemExit):
        what = f"exited (sys.exit({exc.code!r}))"
    else:
        what = f"raised {type(exc).__name__}: {exc}"
    if payload["module"] != "__main__" or isinstance(exc, ImportError):
        name = payload["module"] if payload["module"] != "__main__" else payload["file"]
        return f"importing {name} to find {payload['qualname']} {what}; fix it, then submit the call again"
    if len(what) > 100:  # the line is the job's evidence (rig.failures keeps 300 characters)
        what = what[:97] + "..."
    return (f"the job imports {Path(payload['file']).name} to find {payload['qualname']}, so its top-level "
            f"code runs in the job too (with no arguments in sys.argv), and that code {what}: move it under "
            f"`if __name__ == \"__main__\":`")


def _say(message: str) -> None:
    print(f"rig.call: {message}", file=sys.stderr, flush=True)


def run_call(job_id: str, raw: bytes | str) -> tuple[int, str | None]:
    """Decode the call ``raw`` (the job record's payload), load and run it: ``(exit code,
    the base64 of the pickled result when the code is 0)``. Says why on stderr otherwise."""
    try:
        payload = decode_payload(raw)
    except BadCall as exc:
        _say(f"job {job_id}: {exc}; resubmit the call")
        return BAD_CALL_EXIT, None
    try:
        fn = _load_function(payload)
    except SubmittedWhileImported as exc:
        _say(f"job {job_id}: {exc}")
        return BAD_CALL_EXIT, None
    except LoadFailed as exc:
        if not isinstance(exc.__cause__, SystemExit):  # an exit printed its own message
            traceback.print_exception(exc.__cause__ or exc)
        _say(f"job {job_id}: {exc}")
        return BAD_CALL_EXIT, None
    if pytask.refused_while_loading:  # caught by the script, or raised in one of its threads
        _say(f"job {job_id}: {pytask.refused_while_loading[0]}")
        return BAD_CALL_EXIT, None
    try:
        args, kwargs = decode_arguments(payload)
    except BadCall as exc:
        _say(f"job {job_id}: {exc}")
        return BAD_CALL_EXIT, None
    try:
        result = fn(*args, **kwargs)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code in (BAD_CALL_EXIT, BAD_RESULT_EXIT, REDIS_UNAVAILABLE_EXIT):
            _say(f"job {job_id}: the function called sys.exit({code}); reported as exit 1 "
                 f"({code} is rig.call's own code)")
            return 1, None
        raise
    except Exception:  # noqa: BLE001 - the traceback is the job's evidence
        traceback.print_exc()
        return 1, None
    try:
        # The script's classes in the result travel back to the submitter's __main__.
        pickled = callpickle.dumps(result)[0]
    except Exception as exc:  # noqa: BLE001
        _say(f"job {job_id}: the function returned a {type(result).__name__} that cannot be pickled "
             f"({type(exc).__name__}: {exc}); return plain data, or write it to a file and return the path")
        return BAD_RESULT_EXIT, None
    if len(pickled) > pytask.MAX_PAYLOAD_BYTES:
        # Kept in the job's record in Redis: one this large would fill it, or be refused by it
        # (512 MB at most) after the work was done, and each retry would do it all again.
        _say(f"job {job_id}: the function returned a {type(result).__name__} that pickles to {len(pickled)} "
             f"bytes, over {pytask.MAX_PAYLOAD_BYTES}; write it to a file and return the path")
        return BAD_RESULT_EXIT, None
    return 0, base64.b64encode(pickled).decode()


def main() -> int:
    job_id = os.environ.get("RIG_JOB_ID", "")
    if not job_id.isdigit():
        _say("RIG_JOB_ID is not set; this runs only inside a rig job")
        return BAD_CALL_EXIT
    from rig.config import load_settings

    settings = load_settings()
    gateway = _gateway(settings)
    if gateway is not None:
        # As its submitter, without Redis' password: the gateway hands the call and takes the
        # result only from this job's own running process (the kernel says which process asks).
        from rig.errors import RigError

        def fetch() -> str | None:
            return gateway.call("task_payload", job_id=int(job_id))

        def store(encoded: str) -> None:
            gateway.call("task_result", job_id=int(job_id), encoded=encoded)

        refused: type[Exception] = RigError
        where = "through rig's gateway"
    else:
        keys = Keys(os.environ.get("RIG_KEY_PREFIX", "rig:"))
        # A payload or result can be up to 256 MiB (rig.pytask): a longer reply timeout than rig's.
        url = os.environ.get("RIG_REDIS_URL", "redis://127.0.0.1:6379/0")
        client = connect(url, timeout=REDIS_CONNECT_TIMEOUT_S, reply_timeout=REDIS_REPLY_TIMEOUT_S)

        def fetch() -> str | None:
            return client.hget(keys.job(job_id), "payload")

        replicas = replica_wait(client, keys, url, settings.replica_wait_seconds)

        def store(encoded: str) -> None:
            note = store_result(client, keys, replicas, int(job_id), encoded)
            if note is not None:
                _say(f"job {job_id}: {note}")

        refused, where = redis.RedisError, "from Redis"
    try:
        raw = fetch()
    except refused as exc:
        _say(f"job {job_id}: cannot read the call {where}: {exc}")
        return REDIS_UNAVAILABLE_EXIT
    if raw is None:
        _say(f"job {job_id} has no payload; was it submitted with @rig.task? Resubmit the call")
        return BAD_CALL_EXIT
    code, encoded = run_call(job_id, raw)
    if encoded is None:
        return code
    try:
        store(encoded)
    except refused as exc:
        _say(f"job {job_id}: the call ran but its result could not be stored: {exc}")
        return REDIS_UNAVAILABLE_EXIT
    return 0


def store_result(client: redis.Redis, keys: Keys, replicas: ReplicaWait | None, job_id: int, encoded: str) -> str | None:
    """Store a call's result (base64 text) on its job record, so that a Redis fail-over does not
    lose it: under Sentinel it is written again on the new master when the one it went to was
    replaced (rig.replication.write_confirmed); a SUCCEEDED job without its result would tell
    its submitter the function never returned. Returns the warning line when no replica
    confirmed it, else None. The one writer of ``result``: rig.call and the gateway."""
    key = keys.job(job_id)
    return write_confirmed(replicas, lambda: client.hset(key, "result", encoded),
                           lambda: client.hstrlen(key, "result") == len(encoded), f"job {job_id}'s result")


def _gateway(settings: Settings):  # noqa: ANN202 - rig.gateway.client.GatewayClient | None
    """The gateway when this job holds no Redis password (it runs as its submitter on a root
    worker: rig.gateway.choice), else None."""
    from rig.gateway.choice import make_client

    client = make_client(settings)
    return client if getattr(client, "via_gateway", False) else None


if __name__ == "__main__":
    sys.exit(main())
