"""A named background job run every ``interval`` seconds until stopped (maintenance, not polling for events)."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger(__name__)


class PeriodicTask:
    def __init__(self, name: str, interval: float, job: Callable[[], Awaitable[None] | None]):
        self.name = name
        self.interval = interval
        self.job = job
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                result = self.job()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("periodic job %s failed", self.name)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
