"""Log lines that a repeating fault would repeat without end, written at most once per interval per kind.

Measured before (issue 23): one half the check-back could not turn into a check failed every pass, retried at
once, and wrote 13,000 tracebacks (13 MiB of log) in 5 s. A kind's first line is written; the next ones within
the interval are counted and the count is written with the next line that gets through.
"""
from __future__ import annotations

import logging
import time


class LimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0):
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args, exc_info=None) -> None:
        """Log ``message % args`` at ``level`` unless a line of ``kind`` was logged within the interval."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        if len(self._last) > 1000:  # kinds are few in practice; never let them grow without bound
            self._last.clear()
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self.interval_s:.0f} s not logged)"
        self.logger.log(level, message, *args, exc_info=exc_info)
