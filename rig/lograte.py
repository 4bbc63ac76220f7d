"""Say a repeated trouble once, not once per retry: a node that cannot reach or log in to Redis
retries every few seconds for as long as it lasts, and a full traceback each time grew
control.log by 1 KB/s while telling nothing new."""

from __future__ import annotations

import time

#: How long the same line stays unsaid after it was said (s).
REPEAT_AFTER_S = 300.0


class Throttle:
    """``due(line)`` is True the first time ``line`` comes, then again only once ``every`` s
    have passed (monotonic) or after another line came in between."""

    def __init__(self, every: float = REPEAT_AFTER_S) -> None:
        self.every = every
        self._last: str | None = None
        self._at = 0.0
        self.skipped = 0  # repeats not said since the line was last said

    def due(self, line: str) -> bool:
        now = time.monotonic()
        if line != self._last or now - self._at >= self.every:
            self._last, self._at = line, now
            return True
        self.skipped += 1
        return False

    def said(self) -> int:
        """How many repeats were kept quiet since the last time it said (and reset it)."""
        count, self.skipped = self.skipped, 0
        return count
