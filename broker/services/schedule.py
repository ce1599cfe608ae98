"""Delayed delivery (reference §6.4): records wait in SCHEDULE_TOPIC_XXXX queue level-1 and are re-stored to
their REAL_TOPIC/REAL_QID once their delay has passed.

Every record of one level has the same delay, so each level's queue is due in store order: the service only
ever looks at the head of each level. Progress per level is kept in the store's meta table and advanced in the
same write transaction that re-stores the records, so a crash neither loses nor duplicates a delivery.
"""
from __future__ import annotations

import asyncio
import logging

from halfmq.protocol import properties as P
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import decode_record
from halfmq.store import message_request
from halfmq.store.ops import DeliverDelayed

from ..context import now_ms
from ..topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)
BATCH = 256


def delay_level(props: dict[str, str]) -> int:
    """The DELAY property as a level; 0 without one.

    Raises:
        MessageFormatError: the property is not an integer.
    """
    text = props.get(P.DELAY)
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        raise MessageFormatError(f"the DELAY property {text!r} is not an integer") from None


class ScheduleService:
    def __init__(self, ctx):
        self.ctx = ctx
        self.store = ctx.store
        self.delays_ms = ctx.config.delay_levels_ms
        self.progress: dict[int, int] = {}
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.running: dict[int, asyncio.Task] = {}
        self.kick_again: set[int] = set()  #: levels kicked while their pass ran
        self.stopped = False

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def start(self) -> None:
        for level in range(1, self.max_level + 1):
            self.progress[level] = self.store.get_meta(self._key(level)) or 0
            self.kick(level)

    async def stop(self) -> None:
        self.stopped = True
        for timer in self.timers.values():
            timer.cancel()
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    @staticmethod
    def _key(level: int) -> str:
        return f"schedule.offset.{level}"

    def on_arrival(self, topic: str, queue_id: int, _max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self.kick(queue_id + 1)

    def kick(self, level: int) -> None:
        if self.stopped or not 1 <= level <= self.max_level:
            return
        if level in self.running:
            # The running pass may already be past its last look at the queue (its timer can even fire before
            # its done-callback runs, as under uvloop): it looks again once it ends, or this kick is lost.
            self.kick_again.add(level)
            return
        timer = self.timers.pop(level, None)
        if timer is not None:
            timer.cancel()
        task = asyncio.get_running_loop().create_task(self._deliver(level))
        self.running[level] = task
        task.add_done_callback(lambda _t, lv=level: self._done(lv, _t))

    def _done(self, level: int, task: asyncio.Task) -> None:
        self.running.pop(level, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("delayed delivery of level %d failed: %s", level, task.exception())
            if not self.stopped:
                self.timers[level] = asyncio.get_running_loop().call_later(1.0, self.kick, level)
        elif level in self.kick_again:
            self.kick_again.discard(level)
            self.kick(level)

    async def _deliver(self, level: int) -> None:
        delay = self.delays_ms[level - 1]
        queue_id = level - 1
        while not self.stopped:
            start = self.progress[level]
            entries = self.store.get_queue_entries(SCHEDULE_TOPIC, queue_id, start, BATCH)
            if not entries:
                return
            now = now_ms()
            due = [e for e in entries if e.store_timestamp + delay <= now]
            if due:
                await self._redeliver(level, due)
            if len(due) < len(entries):
                wait_s = max(0.0, (entries[len(due)].store_timestamp + delay - now_ms()) / 1000)
                self.timers[level] = asyncio.get_running_loop().call_later(wait_s, self.kick, level)
                return

    async def _redeliver(self, level: int, entries) -> None:
        raw = self.store.read_records([e.physical_offset for e in entries])
        records = [decode_record(r) for r in raw]
        items = [(rec.physical_offset, redelivery_request(rec)) for rec in records]
        next_offset = entries[-1].queue_offset + 1
        await self.store.submit(DeliverDelayed(items, self._key(level), next_offset))
        self.progress[level] = next_offset


def redelivery_request(rec):
    """The PutRequest that re-stores a delayed record to its real topic and queue, DELAY removed."""
    props = dict(rec.properties)
    props.pop(P.DELAY, None)
    rec.topic = props.get(P.REAL_TOPIC, rec.topic)
    rec.queue_id = int(props.get(P.REAL_QID, rec.queue_id))
    rec.properties = props
    return message_request(rec)
