"""Held pulls (reference §3.6 long polling): woken at once when their queue grows, or answered on timeout."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)


@dataclass(eq=False)
class HeldPull:
    topic: str
    queue_id: int
    offset: int
    resume: Callable[[], None]  # re-runs the pull once, without holding, and answers it
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class LongPollService:
    def __init__(self):
        self.held: dict[tuple[str, int], list[HeldPull]] = {}

    def hold(self, pull: HeldPull, timeout_s: float) -> None:
        self.held.setdefault((pull.topic, pull.queue_id), []).append(pull)
        pull.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, pull)

    def _expire(self, pull: HeldPull) -> None:
        waiting = self.held.get((pull.topic, pull.queue_id))
        if waiting is None or pull not in waiting:
            return
        waiting.remove(pull)
        if not waiting:
            del self.held[(pull.topic, pull.queue_id)]
        self._resume(pull)

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store hook: a queue grew to ``max_offset``."""
        waiting = self.held.get((topic, queue_id))
        if not waiting:
            return
        ready = [p for p in waiting if p.offset < max_offset]
        if not ready:
            return
        remaining = [p for p in waiting if p.offset >= max_offset]
        if remaining:
            self.held[(topic, queue_id)] = remaining
        else:
            del self.held[(topic, queue_id)]
        for pull in ready:
            if pull.timer is not None:
                pull.timer.cancel()
            self._resume(pull)

    @staticmethod
    def _resume(pull: HeldPull) -> None:
        try:
            pull.resume()
        except Exception:
            log.exception("resuming a held pull on %s/%d failed", pull.topic, pull.queue_id)

    def release_all(self) -> None:
        """Answer every held pull now (shutdown)."""
        held, self.held = self.held, {}
        for pulls in held.values():
            for pull in pulls:
                if pull.timer is not None:
                    pull.timer.cancel()
                self._resume(pull)

    def count(self) -> int:
        return sum(len(v) for v in self.held.values())
