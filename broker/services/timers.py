"""Timer messages: delivered at any time, not only after one of the 18 delay levels (RocketMQ 5's TIMER_DELIVER_MS,
TIMER_DELAY_SEC, TIMER_DELAY_MS and Alibaba's __STARTDELIVERTIME), for remoting and gRPC senders alike.

A timer message waits in the timer topic, indexed by its delivery time (store/timers.py). One timer wakes the service
at the next delivery time; it re-stores what is due to its real topic in batches, each in one write with the removal
of its index entries (so a crash neither loses nor repeats a delivery), and a start delivers at once what came due
while the broker was down.
"""
from __future__ import annotations

import asyncio
import logging
import time

from halfmq.protocol import properties as P
from halfmq.protocol.message import MessageRecord, decode_record
from halfmq.store import PutRequest, message_request
from halfmq.store.errors import CorruptRecordError
from halfmq.store.timers import DeliverTimed

from ..errors import BrokerError, Failure
from ..topics import TIMER_TOPIC

log = logging.getLogger(__name__)
#: the properties that ask for a delivery time (absolute: TIMER_DELIVER_MS, __STARTDELIVERTIME; relative: the others)
TIMER_KEYS = (P.TIMER_DELIVER_MS, P.START_DELIVER_TIME, P.TIMER_DELAY_SEC, P.TIMER_DELAY_MS)
BATCH = 256


def now_ms() -> int:
    return int(time.time() * 1000)


class TimerService:
    def __init__(self, ctx):
        self.ctx = ctx
        self.store = ctx.store
        self.max_delay_ms = ctx.config.timerMaxDelaySec * 1000
        self._wake_at: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self._again = False
        self._stopped = False
        self.delivered = 0

    # --- sending ---
    def deliver_at(self, props: dict[str, str]) -> int | None:
        """When a message with ``props`` is to be delivered (ms), or None for now (no timer property, or a time
        already past).

        Raises:
            BrokerError: ILLEGAL_DELIVERY_TIME for a value that is not an integer, or a time beyond timerMaxDelaySec.
        """
        if props.keys().isdisjoint(TIMER_KEYS):  # the usual message: one set operation, no clock read
            return None
        now = now_ms()
        due = None
        for key in TIMER_KEYS:
            text = props.get(key)
            if text is None:
                continue
            try:
                value = int(text)
            except ValueError:
                raise BrokerError(Failure.ILLEGAL_DELIVERY_TIME, f"the {key} property {text[:40]!r} is not an integer")
            due = value if key in (P.TIMER_DELIVER_MS, P.START_DELIVER_TIME) else \
                now + value * (1000 if key == P.TIMER_DELAY_SEC else 1)
            break
        if due is None or due <= now:
            return None
        if due - now > self.max_delay_ms:
            raise BrokerError(Failure.ILLEGAL_DELIVERY_TIME,
                              f"the timer message is due in {(due - now) // 1000} s, beyond timerMaxDelaySec "
                              f"{self.max_delay_ms // 1000}")
        return due

    def timed_request(self, rec: MessageRecord, due: int) -> PutRequest:
        """``rec`` as it waits in the timer topic: its real topic and queue, and its time, in its properties."""
        props = rec.properties
        props[P.REAL_TOPIC] = rec.topic
        props[P.REAL_QID] = str(rec.queue_id)
        props[P.TIMER_OUT_MS] = str(due)
        rec.topic, rec.queue_id = TIMER_TOPIC, 0
        return message_request(rec, index=False)  # found through the timers table, never through a queue

    def stored(self, due: int) -> None:
        """A timer message was stored: wake earlier if it is due before the next wake-up."""
        if self._wake_at is None or due < self._wake_at:
            self._arm(due)

    # --- delivering ---
    def start(self) -> None:
        self._deliver_soon()

    async def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _arm(self, due: int) -> None:
        if self._stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._wake_at = due
        self._timer = asyncio.get_running_loop().call_later(max(0.0, (due - now_ms()) / 1000), self._deliver_soon)

    def _deliver_soon(self) -> None:
        self._timer = self._wake_at = None
        if self._stopped:
            return
        if self._task is not None and not self._task.done():
            self._again = True  # a delivery is running: it looks again when it ends
            return
        self._task = asyncio.get_running_loop().create_task(self._deliver())
        self._task.add_done_callback(self._delivered)

    def _delivered(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._stopped:
            return
        if task.exception() is not None:
            log.error("timer message delivery failed (retried in 1 s): %s", task.exception())
            self._arm(now_ms() + 1000)
        elif self._again:
            self._again = False
            self._deliver_soon()

    async def _deliver(self) -> None:
        while not self._stopped:
            due = self.store.due_timers(now_ms(), BATCH)
            if not due:
                upcoming = self.store.next_timer()
                if upcoming is not None:
                    self._arm(upcoming[0])
                return
            items = []
            for when, offset in due:
                try:
                    raw = self.store.read_record(offset)
                except CorruptRecordError:
                    raw = None  # reported by the store; its entry goes, there is nothing to deliver
                items.append((when, offset, delivery_request(raw) if raw is not None else None))
            delivered = await self.store.submit(DeliverTimed(items))
            self.delivered += delivered


def delivery_request(raw: bytes) -> PutRequest:
    """The request storing a waiting timer message in its real topic and queue, as its sender meant it."""
    rec = decode_record(raw)
    props = dict(rec.properties)
    rec.topic = props.pop(P.REAL_TOPIC, rec.topic)
    rec.queue_id = int(props.pop(P.REAL_QID, rec.queue_id))
    props.pop(P.TIMER_OUT_MS, None)
    for key in (P.TIMER_DELAY_SEC, P.TIMER_DELAY_MS):  # done: a retry of the delivered message must not wait again
        props.pop(key, None)
    rec.properties = props
    return message_request(rec)
