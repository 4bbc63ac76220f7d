"""A card's start list: how a placed job reaches its card worker, without a Celery message.

The dispatcher's reservation (reserve.lua) pushes ``"<job id> <token>"`` onto the job's first
card's start list (``Keys.card_starts``) in the same script, so a reservation and its start are
one atomic step. That card's worker takes starts with a blocking ``BLMOVE`` into the card's
taking list (``Keys.card_taking``: a reliable queue, as kombu's unacked set was) and runs each
on a thread of its own, at most ``slots`` (max_task_per_gpu) at once; the entry is removed once
the claim is done or refused (``CardRunner.run_job``'s ``release``).

What keeps it exactly-once (docs/RELIABILITY.md):

- **Never lost.** An entry is in one of the two lists from its reservation until its claim was
  answered. A worker that dies between BLMOVE and the claim leaves it in the taking list; the
  next worker of the card moves every taking entry it does not handle itself back to the head of
  the start list before it takes any (``recover``), and again every ``recover_every`` s (an entry
  whose thread gave up on a Redis outage). A start missing from both lists (a claim a fail-over
  lost, Redis rolled back past the push) is pushed again by ``CardRunner.adopt`` once the job
  has been ASSIGNED for ``health.assigned_timeout`` s.
- **Never run twice.** Taking an entry twice is harmless: the claim (claim.lua) lets only the
  holder of the job's current assignment token move it from ASSIGNED to RUNNING, once; every
  other copy is refused and removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from redis.client import Pipeline

from rig import jobtrace
from rig.keys import Keys
from rig.lua import Scripts
from rig.redis_writes import is_outage

log = logging.getLogger(__name__)

#: How long one BLMOVE blocks (s): the loop checks shutdown and the node name this often.
TAKE_TIMEOUT_S = 1.0
#: How often taken entries no thread of this worker handles go back to the start list (s).
RECOVER_EVERY_S = 10.0

#: Runs one start: (job id, token, release) where release(pipe) removes the entry from the
#: taking list (queued on ``pipe`` when given, else at once). Blocks until the job ends.
RunStart = Callable[[int, str, Callable[[Pipeline | None], None]], object]


def entry(job_id: int | str, token: int | str) -> str:
    """A start as the lists hold it (reserve.lua writes the same)."""
    return f"{job_id} {token}"


@dataclass(frozen=True)
class Start:
    job_id: int
    token: str

    @classmethod
    def parse(cls, text: str) -> Start | None:
        """``"<job id> <token>"`` -> Start; None for anything else (never raised on)."""
        job_id, _, token = text.partition(" ")
        if not (job_id.isdigit() and token.isdigit()):
            return None
        return cls(int(job_id), token)


class StartList:
    """One card's start list and taking list."""

    def __init__(self, client: redis.Redis, keys: Keys, node: str, index: int,
                 scripts: Scripts | None = None) -> None:
        self.r = client
        self.starts = keys.card_starts(node, index)
        self.taking = keys.card_taking(node, index)
        self._scripts = scripts or Scripts(client)

    def take(self, timeout: float = TAKE_TIMEOUT_S) -> str | None:
        """The oldest start, moved to the taking list; None after ``timeout`` s without one."""
        return self.r.blmove(self.starts, self.taking, timeout, "LEFT", "RIGHT")

    def release(self, text: str, pipe: Pipeline | None = None) -> None:
        """Remove a taken start (its claim was answered): queued on ``pipe``, or at once."""
        (pipe if pipe is not None else self.r).lrem(self.taking, 1, text)

    def put_back(self, texts: Iterable[str]) -> int:
        """Taken starts back at the head of the start list, in order, each only if it is still
        in the taking list (start_back.lua). Returns how many went back."""
        texts = list(texts)
        if not texts:
            return 0
        return int(self._scripts.start_back(keys=[self.starts, self.taking], args=texts))

    def listed(self) -> tuple[list[str], list[str]]:
        """(start list, taking list), read in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.lrange(self.starts, 0, -1)
        pipe.lrange(self.taking, 0, -1)
        waiting, taken = pipe.execute()
        return waiting, taken

    def push(self, job_id: int, token: str) -> None:
        """A start again, at the tail (one that was lost: CardRunner.adopt)."""
        self.r.rpush(self.starts, entry(job_id, token))


class StartConsumer:
    """The card worker's loop over its start list: one thread takes, each start runs on a
    thread of its own, at most ``slots`` at once (a taken start always has a thread)."""

    def __init__(self, starts: StartList, run: RunStart, *, slots: int, shutdown: threading.Event,
                 may_take: Callable[[], bool] | None = None, recover_every: float = RECOVER_EVERY_S) -> None:
        self.starts = starts
        self.run = run
        self.slots = threading.BoundedSemaphore(slots)
        self.shutdown = shutdown
        #: False while another rig up owns the node name: its worker of this card takes the starts.
        self.may_take = may_take or (lambda: True)
        self.recover_every = recover_every
        self._lock = threading.Lock()
        self._handling: set[str] = set()  # entries a thread of this worker handles now
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rig-starts", daemon=True)
        self._thread.start()

    def handling(self) -> set[str]:
        with self._lock:
            return set(self._handling)

    def recover(self) -> int:
        """Move every taken start no thread of this worker handles back to the start list
        (run from the taking thread only, so none is mid-BLMOVE meanwhile). Returns how many."""
        _, taken = self.starts.listed()
        mine = self.handling()
        back = self.starts.put_back(t for t in taken if t not in mine)
        if back:
            log.info("%d start(s) taken by an earlier worker and not claimed went back to %s",
                     back, self.starts.starts)
        return back

    def _loop(self) -> None:
        delay = 0.2
        next_recover = 0.0  # at once: an earlier worker's taken starts go first
        while not self.shutdown.is_set():
            if not self.slots.acquire(timeout=0.5):
                continue
            handed = False
            try:
                if time.monotonic() >= next_recover:
                    self.recover()
                    next_recover = time.monotonic() + self.recover_every
                if not self.may_take():
                    self.shutdown.wait(TAKE_TIMEOUT_S)  # the owner's worker takes them
                    continue
                text = self.starts.take()
                if text is None:
                    continue
                if self.shutdown.is_set():
                    self.starts.put_back([text])  # for the next worker, at the head
                    continue
                self._hand(text)
                handed = True
                delay = 0.2
            except redis.RedisError as exc:
                if not is_outage(exc):
                    log.exception("start list %s: unexpected Redis error", self.starts.starts)
                log.debug("start list %s: Redis unavailable, retrying in %.1f s: %s", self.starts.starts, delay, exc)
                self.shutdown.wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                if not handed:
                    self.slots.release()

    def _hand(self, text: str) -> None:
        """Run one taken start on a thread of its own (which gives the slot back)."""
        start = Start.parse(text)
        if start is None:
            log.error("start list %s: dropped a malformed entry %r", self.starts.starts, text[:80])
            self.starts.release(text)
            self.slots.release()
            return
        jobtrace.mark(start.job_id, "taken")
        with self._lock:
            self._handling.add(text)
        threading.Thread(target=self._run, args=(start, text), name=f"rig-job-{start.job_id}",
                         daemon=True).start()

    def _run(self, start: Start, text: str) -> None:
        try:
            outcome = self.run(start.job_id, start.token, lambda pipe=None: self.starts.release(text, pipe))
            log.info("job %s: %s", start.job_id, outcome)
        except Exception:  # noqa: BLE001 - one start must never stop the others
            # Left in the taking list when its claim was not answered: recover() puts it back.
            log.exception("job %s: its start failed", start.job_id)
        finally:
            with self._lock:
                self._handling.discard(text)
            self.slots.release()
            jobtrace.mark(start.job_id, "ended")
