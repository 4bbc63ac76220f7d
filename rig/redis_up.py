"""Is rig's Redis answering now? Asked within about a second, for the node's HTTP endpoint.

A scrape of ``/metrics`` and the page's ``/api/overview`` read Redis with rig's ordinary client,
which rides out an outage: it retries a lost connection, under Sentinel for the whole fail-over
window (rig.redis_conn.FAILOVER_WINDOW_S), and waits REPLY_TIMEOUT_S for a reply. With Redis
gone for good that made a scrape hang past Prometheus' own timeout (no answer at all, so no
alert) and the page wait half a minute. Both first ask :meth:`RedisUp.down`, bounded by
PROBE_TIMEOUT_S per connection and per sentinel, without retry: an outage is then an answer
(``rig_redis_up 0``; the page's one line) within about a second.
"""

from __future__ import annotations

from redis.backoff import NoBackoff
from redis.retry import Retry

from rig.redis_conn import connect, strip_password

#: Bound on the connection, each sentinel's answer and the PING's reply (s).
PROBE_TIMEOUT_S = 1.0


class RedisUp:
    """A PING through a client of its own (short timeouts, no retry), reused across calls;
    thread-safe (redis-py's pool), as the endpoint serves each request in a thread."""

    def __init__(self, url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.url = url
        self.client = connect(url, timeout=timeout_s, reply_timeout=timeout_s, retry=Retry(NoBackoff(), 0))

    def down(self) -> str | None:
        """None when Redis answers PING; else one line saying why not (no diagnosis that
        would ask the sentinels again: this answer must stay within about a second)."""
        try:
            self.client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure is "down" here (a wrong-kind server too)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"Redis does not answer at {strip_password(self.url)} ({text[:160]})"
        return None
