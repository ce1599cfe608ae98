"""Retention: the store stays bounded (RocketMQ's fileReservedTime and diskMaxUsedSpaceRatio).

Every ``cleanResourceInterval`` a pass runs, in slices submitted one after another through the store's write path
(store/lifecycle.py), so sends keep flowing between them:
1. deleted topics are purged (their records, queue entries and KEYS entries);
2. messages stored more than ``fileReservedTime`` hours ago are deleted, oldest first;
3. while the store is above ``diskMaxUsedSpaceRatio`` percent of its limit, the oldest go whatever their age;
4. above ``diskSpaceWarningLevelRatio`` percent, new messages are refused (code 14) until a pass brings it below;
   reads, decisions and offsets go on.
What transactions and delayed delivery still need is never deleted (lifecycle.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from halfmq.store.lifecycle import Expire, Protected, PurgeTopics

from ..topics import HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC

log = logging.getLogger(__name__)
#: records one slice deletes at most: a slice shares its write transaction with the sends grouped with it, so it
#: is kept to about a millisecond of the writer's time
SLICE_RECORDS = 256
#: when over diskMaxUsedSpaceRatio, a pass frees down to this many percent below it (not one page at a time)
SPACE_MARGIN = 5
#: a pass that found nothing to delete ends here; above the warning level it is repeated this often
RETRY_FULL_S = 1.0


@dataclass
class PassResult:
    deleted: int = 0        #: records deleted by age or for space
    purged: int = 0         #: records of deleted topics removed
    freed_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class RetentionStatus:
    used_bytes: int
    file_bytes: int
    limit_bytes: int
    use_ratio: float
    oldest_age_seconds: float   #: of the oldest message held (0 for an empty store)
    deleted_total: int          #: messages deleted by retention since start
    purged_total: int           #: messages of deleted topics removed since start
    refusing: bool              #: new messages refused (above diskSpaceWarningLevelRatio)


class RetentionService:
    def __init__(self, ctx):
        cfg = ctx.config
        self.store = ctx.store
        self.reserved_ms = int(cfg.fileReservedTime * 3_600_000)
        self.interval_s = cfg.cleanResourceInterval / 1000
        self.max_used = cfg.diskMaxUsedSpaceRatio
        self.warning = cfg.diskSpaceWarningLevelRatio
        # A discarded half stays resumable for as long as a message is kept.
        self.protected = Protected(HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC, self.reserved_ms)
        self.deleted_total = 0
        self.purged_total = 0
        self.last_pass: PassResult | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopped = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._check_usage()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def kick(self) -> None:
        """Run a pass now (a topic was deleted)."""
        self._wake.set()

    async def _run(self) -> None:
        while not self._stopped:
            wait = RETRY_FULL_S if self.store.refusing else self.interval_s
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if self._stopped:
                return
            try:
                await self.run_pass()
            except Exception:
                log.exception("retention pass failed")

    async def run_pass(self) -> PassResult:
        """One whole pass (the admin command's "now"); passes never overlap."""
        async with self._lock:
            started = time.monotonic()
            result = PassResult()
            await self._purge(result)
            await self._expire(int(time.time() * 1000) - self.reserved_ms, 0, result)
            usage = self.store.usage()
            if usage.ratio * 100 > self.max_used:
                goal = usage.used_bytes - usage.limit_bytes * (self.max_used - SPACE_MARGIN) / 100
                log.warning("the store uses %.0f%% of its limit (%d of %d bytes), above diskMaxUsedSpaceRatio=%d%%: "
                            "deleting the oldest messages whatever their age", usage.ratio * 100, usage.used_bytes,
                            usage.limit_bytes, self.max_used)
                await self._expire(1 << 62, int(goal), result)
            self._check_usage()
            result.seconds = time.monotonic() - started
            self.last_pass = result
            if result.deleted or result.purged:
                log.info("retention: %d messages deleted, %d of deleted topics purged, %d bytes, in %.2f s",
                         result.deleted, result.purged, result.freed_bytes, result.seconds)
            return result

    async def _purge(self, result: PassResult) -> None:
        while not self._stopped:
            done = await self.store.submit(PurgeTopics(SLICE_RECORDS))
            result.purged += done.deleted
            self.purged_total += done.deleted
            if done.done or not done.deleted:
                return

    async def _expire(self, before_ms: int, goal_bytes: int, result: PassResult) -> None:
        """Slices from the start of the commit log until nothing older than ``before_ms`` is left (or, with a
        byte goal, until that much was freed)."""
        start, blocked, freed = 0, frozenset(), 0
        while not self._stopped:
            slice_goal = goal_bytes - freed if goal_bytes else 0
            done = await self.store.submit(Expire(before_ms, start, SLICE_RECORDS, slice_goal, self.protected,
                                                  blocked))
            self.store.advance_minimums(done.mins)
            result.deleted += done.deleted
            result.freed_bytes += done.freed_bytes
            self.deleted_total += done.deleted
            freed += done.freed_bytes
            if done.done or (goal_bytes and freed >= goal_bytes) or done.next_start == start:
                return
            start, blocked = done.next_start, done.blocked

    def status(self) -> RetentionStatus:
        """What brokerStatus and the metrics show of the store's size and retention."""
        usage = self.store.usage()
        oldest = self.store.oldest_store_timestamp()
        return RetentionStatus(usage.used_bytes, usage.file_bytes, usage.limit_bytes, usage.ratio,
                               max(0.0, time.time() - oldest / 1000) if oldest is not None else 0.0,
                               self.deleted_total, self.purged_total, self.store.refusing is not None)

    def _check_usage(self) -> None:
        usage = self.store.usage()
        percent = usage.ratio * 100
        if percent >= self.warning:
            if self.store.refusing is None:
                log.error("the store uses %.0f%% of its limit, above diskSpaceWarningLevelRatio=%d%%: new messages "
                          "are refused until retention frees space", percent, self.warning)
            self.store.refusing = (f"the store is full: it uses {percent:.0f}% of its limit, above "
                                   f"diskSpaceWarningLevelRatio={self.warning}%; messages are refused until "
                                   f"retention frees space (reads go on)")
        elif self.store.refusing is not None:
            log.info("the store uses %.0f%% of its limit: new messages are accepted again", percent)
            self.store.refusing = None
