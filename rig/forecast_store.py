"""The estimated starts the leading dispatcher computes and every view reads: compute once, read
many.

The simulation (rig.forecast) costs hundreds of ms of CPU for 200 waiting jobs; every view
(`rig show`, `rig jobs`, the gateway, the web page's poll every 5 s) used to run it itself, on
its own machine's settings. Now the control worker whose dispatcher leads runs it at most every
FORECAST_EVERY_S while jobs wait (workers.forecaster) and :func:`publish`-es it in one hash
(Keys.forecast); a view :func:`read`-s only the ids it shows (one HMGET).

The hash: ``made_at`` (epoch s, Redis' clock), ``every`` (the interval it is remade at, s),
``complete`` ("1" when every waiting job was simulated), ``newest_id`` (the last job id handed out
when it ran), and job id -> compact JSON of that job's StartEstimate (``a`` start, ``w`` why none,
``l`` later, ``f`` after, ``r`` the run time assumed (s), ``s`` its source, ``o`` overrun:
rig.forecast.StartEstimate.overrun). It is replaced in
one MULTI (DEL, HSET, EXPIRE), so a reader sees a whole forecast or the one before, never half; it expires after TTL_INTERVALS intervals, so a dead
leader's forecast vanishes. The words ("~14:20", "in ~25 min") are made by the reader from these
fields, in the reader's time zone and at the reader's now.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rig.clock import shared_now
from rig.forecast import Forecast, StartEstimate
from rig.waiting import no_dispatcher_words

if TYPE_CHECKING:
    import redis

    from rig.keys import Keys

#: The leader remakes the forecast at most this often (s), while jobs wait.
FORECAST_EVERY_S = 10.0
#: A stored forecast expires after this many of its intervals: a dead leader's vanishes.
TTL_INTERVALS = 3
#: What a job newer than the stored forecast (or any job before the first one) says.
NOT_MADE_YET = f"the dispatcher makes one every {FORECAST_EVERY_S:.0f} s"
#: A job the stored forecast does not hold though it is newer (or was not waiting then); ``every``: s.
NEWER = "submitted after the last forecast; the dispatcher makes one every {every:.0f} s"
DAMAGED = "the stored forecast of it is unreadable; the dispatcher makes a new one every {every:.0f} s"

_META = ("made_at", "every", "complete", "newest_id")


def encode(estimate: StartEstimate) -> str:
    """``estimate`` as compact JSON (its job id is the hash field)."""
    fields = {"a": estimate.at, "w": estimate.why_none, "l": 1 if estimate.later else None, "f": estimate.after,
              "r": estimate.run, "s": estimate.run_source, "o": 1 if estimate.overrun else None}
    return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))


def decode(job_id: int, text: str) -> StartEstimate:
    """The inverse of :func:`encode`; ValueError (or TypeError) for text it did not write."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not an object")
    at, after, run = data.get("a"), data.get("f"), data.get("r")
    return StartEstimate(job_id, None if at is None else float(at), data.get("w"), bool(data.get("l")),
                         None if after is None else float(after), run=None if run is None else float(run),
                         run_source=data.get("s"), overrun=bool(data.get("o")))


def publish(r: redis.Redis, keys: Keys, forecast: Forecast, every: float = FORECAST_EVERY_S) -> None:
    """Replace the stored forecast with ``forecast`` (made every ``every`` s) in one MULTI; it
    expires after TTL_INTERVALS x ``every``."""
    mapping: dict[str, str] = {"made_at": repr(forecast.made_at if forecast.made_at is not None else forecast.now),
                               "every": repr(float(every)), "complete": "1" if forecast.complete else "0",
                               "newest_id": str(forecast.newest_id)}
    mapping.update({str(jid): encode(e) for jid, e in forecast.starts.items()})
    pipe = r.pipeline(transaction=True)
    pipe.delete(keys.forecast)
    pipe.hset(keys.forecast, mapping=mapping)
    pipe.expire(keys.forecast, math.ceil(every * TTL_INTERVALS))
    pipe.execute()


def read(r: redis.Redis, keys: Keys, job_ids: Iterable[int] | None = None) -> Forecast:
    """The stored forecast of ``job_ids`` (all it holds when None): one round trip (leader lock,
    HMGET). Every asked id gets an entry: its estimate; "not estimated yet" when it is newer
    than the forecast, or there is none yet; "later" when it was beyond the simulated head;
    with no dispatcher leading, rig.waiting.no_dispatcher_words (a dead leader's forecast is not shown)."""
    wanted = None if job_ids is None else list(dict.fromkeys(int(j) for j in job_ids))
    pipe = r.pipeline(transaction=False)
    pipe.exists(keys.sched_leader)
    if wanted is None:
        pipe.hgetall(keys.forecast)
    else:
        pipe.hmget(keys.forecast, *_META, *map(str, wanted))
    leader, stored = pipe.execute()
    if wanted is None:
        meta = [stored.get(k) for k in _META]
        wanted = sorted(int(k) for k in stored if k.isdigit())
        values = [stored[str(j)] for j in wanted]
    else:
        meta, values = stored[:len(_META)], stored[len(_META):]
    now = shared_now(r)
    if not leader:
        words = no_dispatcher_words(r, keys)
        return Forecast(now, {j: StartEstimate(j, None, words) for j in wanted})
    made_at, every, complete, newest = meta
    if made_at is None:
        return Forecast(now, {j: StartEstimate(j, None, NOT_MADE_YET, not_yet=True) for j in wanted})
    forecast = Forecast(now, {}, made_at=float(made_at), complete=complete == "1", newest_id=int(newest or 0))
    interval = float(every or FORECAST_EVERY_S)
    starts = {jid: _entry(forecast, interval, jid, value) for jid, value in zip(wanted, values, strict=True)}
    return Forecast(now, starts, forecast.made_at, forecast.complete, forecast.newest_id)


def _entry(forecast: Forecast, every: float, job_id: int, value: str | None) -> StartEstimate:
    """``job_id``'s estimate from its stored ``value`` (None: not in the forecast, which is remade
    every ``every`` s)."""
    if value is not None:
        try:
            return decode(job_id, value)
        except (ValueError, TypeError):
            return StartEstimate(job_id, None, DAMAGED.format(every=every), not_yet=True)
    if job_id > forecast.newest_id or forecast.complete:  # not waiting when it was made
        return StartEstimate(job_id, None, NEWER.format(every=every), not_yet=True)
    return StartEstimate(job_id, None, later=True)
