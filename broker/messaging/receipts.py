"""RocketMQ 5's consumption model over the receipts table (store/receipts.py), for any door: take (pop), ack,
change invisibility, dead-letter after grpcMaxDeliveryAttempts, auto-renewal. The gRPC door (grpc/receive.py) only
translates its requests and answers; a remoting pop could call the same operations.

A take hands out, per queue, first the messages whose invisible time ran out (their attempt counted), then new ones
from the group's cursor; each gets a receipt, durable before the answer goes out. One not acknowledged in time is
handed out again; one that has used grpcMaxDeliveryAttempts goes to the group's %DLQ% topic instead (the copy and
the receipt's removal are one write). Messages with a message group (FIFO) keep their order: while a queue has a
grouped message out, no later grouped message of that queue is handed out (the reference's orderly pop locks the
queue the same way).

A group's first take from a queue starts where its remoting consumers' committed offset is, else at the queue's
start when the queue still holds everything, else at its end (the reference's pop initial offset); acknowledgements
move that committed offset, so consumer progress and lag are shown for pop groups too.

A receipt is named by a handle, ``<brokerName>:<queue>:<offset>:<version>`` (hex, ``receipt_handle``): another
broker of a cluster refuses it rather than act on whatever receipt it holds at that queue and offset. A handle that
names no receipt held now is refused ``Failure.INVALID_RECEIPT``.

A door decodes a receive into a ``ReceiveRequest``; ``ReceiptService.plan_receive`` checks it (the queue's broker,
the topic's readability, the batch size, the durations, the filter) and answers the ``ReceivePlan`` the door takes
with (``take``), holding a receive that found nothing (``hold``) until its long polling time.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable

from halfmq.protocol import properties as P
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import MessageRecord, decode_record
from halfmq.store import message_request
from halfmq.store.receipts import (AckReceipts, ChangeInvisibility, DeadLetter, Receipt, ReceiptError, RenewReceipts,
                                   TakeReceipts, read_cursor, read_receipts)

from ..context import now_ms
from ..errors import BrokerError, Failure
from ..services.clients import parse_subscription
from ..services.long_poll import ANY_QUEUE, HeldPull
from .dead_letter import consumer_copy

log = logging.getLogger(__name__)
#: how long a queue that gave a take nothing is passed by, at most, when no message arrived: what another change
#: (an admin's, retention's) waits for at worst
NOTHING_RECHECK_MS = 100
AUTO_RENEW_INVISIBLE_MS = 30_000   #: an auto-renewed receipt's invisible time (a push consumer's receive)
AUTO_RENEW_MAX_MS = 3_600_000      #: renewed for at most this long after the take: a stuck listener lets go
_MAX_QUEUE_ID = (1 << 31) - 1  #: MessageQueue.id is an int32
_MAX_OFFSET = (1 << 63) - 1
_MAX_VERSION = (1 << 64) - 1
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3_600_000
MAX_BATCH = 1024
MAX_POLLING_MS = 60_000


@dataclass(slots=True)
class ReceiveRequest:
    """A receive of up to ``batch`` messages of ``topic`` for ``group`` (both checked and authorised by the door),
    as a door decoded it."""
    group: str
    topic: str
    batch: int
    #: how long the messages taken stay invisible; None: none given (then ``auto_renew`` must be asked)
    invisible_ms: int | None
    #: the receipts are renewed while the client is alive (``AUTO_RENEW_INVISIBLE_MS`` each time)
    auto_renew: bool = False
    #: how long a receive that finds nothing is held
    polling_ms: int = 0
    #: the filter: (type, expression); only "TAG" is served
    expression: tuple[str, str] = ("TAG", "*")
    #: the queue the client named, taken first (-1 or out of range: any), and its broker ("": none named)
    queue_id: int = -1
    broker: str = ""


@dataclass(slots=True)
class ReceivePlan:
    """What a checked receive takes from: its queues in the order tried, the tag codes passing its filter (None:
    every message), the invisible time of what it takes and whether its receipts are renewed."""
    queues: list[int]
    tag_codes: object
    invisible_ms: int
    auto_renew: bool


def check_duration(ms: int, what: str, low: int, high: int, failure: Failure) -> int:
    """``ms``, a duration a request gave, within ``low``..``high``.

    Raises:
        BrokerError: ``failure``.
    """
    if not low <= ms <= high:
        raise BrokerError(failure, f"the {what} {ms} ms is outside {low}..{high} ms")
    return ms


def receipt_handle(broker: str, queue_id: int, queue_offset: int, version: int) -> str:
    """``<brokerName>:<queue>:<offset>:<version>`` (hex)."""
    return f"{broker}:{queue_id:x}:{queue_offset:x}:{version:x}"


def parse_handle(text: str, broker: str) -> tuple[int, int, int]:
    """(queue id, queue offset, version) of a receipt handle ``broker`` gave.

    Raises:
        BrokerError: INVALID_RECEIPT.
    """
    parts = text.split(":")
    try:
        if len(parts) == 4 and parts[0] == broker:
            queue_id, queue_offset, version = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
            # the store's keys hold these ranges: a number beyond them failed the write group it was in
            if 0 <= queue_id <= _MAX_QUEUE_ID and 0 <= queue_offset <= _MAX_OFFSET and 0 <= version <= _MAX_VERSION:
                return queue_id, queue_offset, version
    except ValueError:
        pass
    raise BrokerError(Failure.INVALID_RECEIPT, f"{text[:80]!r} is not a receipt handle this broker ({broker}) gave")


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class _Take:
    """One queue's planned take: its TakeReceipts op and the records it hands out (by queue offset)."""

    __slots__ = ("queue_id", "op", "records", "sizes", "version", "visible_at", "size")

    def __init__(self, queue_id: int, op, records: dict, sizes: dict[int, int], version: int, visible_at: int):
        self.queue_id, self.op, self.records, self.sizes = queue_id, op, records, sizes
        self.version, self.visible_at = version, visible_at
        self.size = sum(sizes.values())

    def finish(self, results, broker: str) -> list:
        """(record, handle, attempts, stored bytes) of each message the written op handed out."""
        out = []
        for queue_offset, attempts, _physical in results:
            rec = self.records[queue_offset]
            rec.reconsume_times = attempts - 1
            out.append((rec, receipt_handle(broker, self.queue_id, queue_offset, self.version), attempts,
                        self.sizes[queue_offset]))
        return out


class ReceiptService:
    """The receipts of every consumer group that pops: its operations take a group and topic (authorised by the
    door), handles and durations already read from the wire, and answer with records and handles or a
    ``BrokerError``."""

    def __init__(self, ctx, consumer):
        self.ctx = ctx
        self.consumer = consumer
        self.store = ctx.store
        self.broker = ctx.config.brokerName  #: named by every receipt handle given
        #: one plan at a time per (group, topic, queue): plans then never race each other (the ops check anyway)
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        #: per (group, topic, queue), the takes submitted and not yet durable, in order: the next take of the queue
        #: is planned on top of them instead of waiting for their sync (``_queue_state``)
        self._writing: dict[tuple[str, str, int], list[_Take]] = {}
        #: queues that just gave a take nothing: (their max offset then, the tag filter, until when (ms) that is
        #: trusted, their next visibility); a take passes them by unless a message arrived since (measured before:
        #: receives finding little planned ~8 queues each, reading every queue's receipts, 40% of their CPU)
        self._nothing: dict[tuple[str, str, int], tuple[int, object, int, int | None]] = {}
        # versions grow across restarts too: a handle from before a restart never names a newer receipt
        self._versions = itertools.count(time.time_ns() // 1000)
        self.dead_lettered = 0
        self.dead_letter_failures = 0  #: messages dropped at their last delivery because no DLQ copy could be made
        #: receipts a consumer asked to have renewed: item (as AckReceipts takes it) → (client id, until ms)
        self.renewing: dict[tuple[str, str, int, int, int], tuple[str, int]] = {}

    # --- receive ---
    async def plan_receive(self, request: ReceiveRequest) -> ReceivePlan:
        """Check a receive and plan it.

        Raises:
            BrokerError: BAD_REQUEST (another broker's queue: the client's route is stale; a batch size outside
                1..MAX_BATCH), TOPIC_NOT_FOUND, FORBIDDEN (readable_topic), ILLEGAL_INVISIBLE_TIME,
                ILLEGAL_POLLING_TIME, UNSUPPORTED_FILTER.
        """
        topic = request.topic
        if request.broker and request.broker != self.broker:  # never served from this store
            raise BrokerError(Failure.BAD_REQUEST, f"queue {request.queue_id} of {topic} belongs to broker "
                                                   f"{request.broker[:100]}, not to this broker ({self.broker}): "
                                                   f"query the route again")
        config = self.consumer.readable_topic(topic)
        await self.ctx.topics.ensure_group(request.group)
        if not 1 <= request.batch <= MAX_BATCH:
            raise BrokerError(Failure.BAD_REQUEST, f"batch_size {request.batch} is outside 1..{MAX_BATCH}")
        if request.invisible_ms is not None:
            invisible_ms = check_duration(request.invisible_ms, "invisible duration", MIN_INVISIBLE_MS,
                                          MAX_INVISIBLE_MS, Failure.ILLEGAL_INVISIBLE_TIME)
            renew = False
        elif request.auto_renew:
            invisible_ms, renew = AUTO_RENEW_INVISIBLE_MS, True
        else:
            raise BrokerError(Failure.ILLEGAL_INVISIBLE_TIME, "the invisible duration is required")
        check_duration(request.polling_ms, "long polling timeout", 0, MAX_POLLING_MS, Failure.ILLEGAL_POLLING_TIME)
        expression_type, expression = request.expression
        if expression_type != "TAG":
            raise BrokerError(Failure.UNSUPPORTED_FILTER, f"{expression_type} filter expressions are not supported")
        tag_codes = parse_subscription(topic, expression or "*").tag_codes
        queues = list(range(config.read_queue_nums))
        start = request.queue_id
        if start < 0 or start >= len(queues):
            start = random.randrange(len(queues)) if queues else 0
        return ReceivePlan(queues[start:] + queues[:start], tag_codes, invisible_ms, renew)

    # --- take (pop) ---
    async def take(self, group: str, topic: str, queues, tag_codes, batch: int, max_bytes: int, invisible_ms: int,
                   renew_for: str | None = None):
        """Up to ``batch`` messages of ``queues`` in turn, and about ``max_bytes`` of them (at least one), each now
        invisible for ``invisible_ms``, as (record, handle, attempts, stored bytes); and the earliest time a held
        one becomes visible. With ``renew_for`` (a client id), the receipts taken are renewed while that client is
        alive (``renew``), for at most AUTO_RENEW_MAX_MS."""
        if self.ctx.store.reads_held is not None:
            return [], None  # as a queue with nothing new: the receive waits out its long poll
        taken, next_visible = await self._take_from(group, topic, queues, tag_codes, batch, max_bytes, invisible_ms)
        if taken and renew_for is not None:
            until = now_ms() + AUTO_RENEW_MAX_MS
            for _rec, handle, _attempts, _size in taken:
                queue_id, queue_offset, version = parse_handle(handle, self.broker)
                self.renewing[(group, topic, queue_id, queue_offset, version)] = (renew_for, until)
        return taken, next_visible

    async def hold(self, topic: str, waiter, timeout_s: float) -> None:
        """Wait for the topic to grow (or a message of it to become visible again) as a held long poll of
        ``waiter`` (bounded per waiter by LongPollService, as a remoting pull); a cancelled wait leaves at once.

        Raises:
            BrokerError: BUSY, the waiter or the broker holds as many long polls as it may.
        """
        pull = HeldPull(topic, ANY_QUEUE, -1, waiter)
        woken = self.ctx.long_poll.hold(pull, max(0.0, timeout_s))
        try:
            await woken
        finally:
            self.ctx.long_poll.drop(pull)

    async def _take_from(self, group, topic, queues, tag_codes, batch, max_bytes, invisible_ms):
        """Up to ``batch`` messages, and about ``max_bytes`` of them (at least one), from ``queues`` in turn, as
        (record, handle, attempts, stored bytes); and the earliest time a held one becomes visible.

        One plan at a time per queue of a group (its cursor and receipts). The queues no other receive is planning
        are planned in turn and their takes written together, one write group for the whole receive (taken queue by
        queue, a receive of 32 from 8 queues waited for 8 syncs one after the other); a queue with nothing to give
        is let go at once. Once its takes are submitted the receive lets its queues go: the next take of a queue is
        planned on top of the takes being written (``_queue_state``) instead of waiting for their sync (measured
        before: 32 receives in flight on 8 queues waited ~20 ms each for a queue and ~80 ms in all under load). Only
        when every queue with something to give is being planned does it wait, for one queue, holding no other lock
        (so two receives never wait on each other), and when that one gives nothing it looks again at those not
        tried yet."""
        plans: list[_Take] = []
        next_visible = None
        count, room = 0, max_bytes
        held: list[asyncio.Lock] = []
        taken: list = []
        tried: set[int] = set()

        async def plan_locked(queue_id: int, lock: asyncio.Lock) -> None:
            """Plan ``queue_id``, whose lock was just acquired: kept while its take is written, released at once
            when the queue has nothing to give."""
            nonlocal next_visible, count, room
            held.append(lock)
            tried.add(queue_id)
            top = self.store.max_offset(topic, queue_id)
            plan, visible = await self._plan(group, topic, queue_id, tag_codes, batch - count, room, invisible_ms)
            next_visible = _earliest(next_visible, visible)
            if plan is None:
                held.remove(lock)
                lock.release()
                until = now_ms() + NOTHING_RECHECK_MS
                self._nothing[(group, topic, queue_id)] = (top, tag_codes, until if visible is None else
                                                           min(until, visible), visible)
            else:
                plans.append(plan)
                count, room = count + len(plan.records), room - plan.size

        try:
            while True:
                busy = []
                for queue_id in queues:
                    if count >= batch or room <= 0:
                        break
                    if queue_id in tried:
                        continue
                    nothing = self._nothing.get((group, topic, queue_id))
                    if nothing is not None:
                        if (nothing[0] == self.store.max_offset(topic, queue_id) and nothing[1] == tag_codes
                                and now_ms() < nothing[2]):
                            tried.add(queue_id)
                            next_visible = _earliest(next_visible, nothing[3])
                            continue
                        del self._nothing[(group, topic, queue_id)]
                    lock = self._queue_lock(group, topic, queue_id)
                    if lock.locked():
                        busy.append(queue_id)
                        continue
                    await lock.acquire()  # free: taken without yielding
                    await plan_locked(queue_id, lock)
                if plans or not busy:
                    break
                # Every queue with something to give was being taken from: wait for one, holding no lock (two
                # receives never wait on each other); when it gave nothing, look again at those not tried yet
                # (before: the receive answered MESSAGE_NOT_FOUND though other queues held messages).
                lock = self._queue_lock(group, topic, busy[0])
                await lock.acquire()
                await plan_locked(busy[0], lock)
                if plans:
                    break
            completions = [self.store.submit(plan.op) for plan in plans]  # one write group
            for plan in plans:
                self._writing.setdefault((group, topic, plan.queue_id), []).append(plan)
            for lock in held:  # the next take of these queues plans on top of these: it need not wait for the sync
                lock.release()
            held.clear()
            durable: set[int] = set()
            try:
                for plan, completion in zip(plans, completions):
                    try:
                        results = await completion
                    except ReceiptError:  # an ack or change raced the plan: this queue gives nothing this time
                        continue
                    durable.add(id(plan))
                    taken.extend(plan.finish(results, self.broker))
                    self._commit_progress(group, topic, plan.queue_id)
                    if plan.records:
                        next_visible = _earliest(next_visible, plan.visible_at)
            finally:
                for plan in plans:
                    self._written(group, topic, plan, id(plan) in durable)
        finally:
            for lock in held:
                lock.release()
        taken.sort(key=lambda item: (item[0].queue_id, item[0].queue_offset))
        return taken, next_visible

    def _queue_lock(self, group: str, topic: str, queue_id: int) -> asyncio.Lock:
        key = (group, topic, queue_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _plan(self, group, topic, queue_id, tag_codes, room, max_bytes, invisible_ms):
        """The take of one queue: its due receipts to hand out again and its fresh messages, as a ``_Take`` (None
        when there is nothing to write); and the earliest time a held receipt of it becomes visible."""
        store, cfg = self.store, self.ctx.config
        now = now_ms()
        receipts, cursor = self._queue_state(group, topic, queue_id)
        due = [r for r in receipts if r.visible_at <= now]
        for receipt in [r for r in due if r.attempts >= cfg.grpcMaxDeliveryAttempts]:
            await self._dead_letter(group, topic, queue_id, receipt)
            receipts.remove(receipt)
            due.remove(receipt)
        held = [r for r in receipts if r.visible_at > now]
        next_visible = min((r.visible_at for r in held), default=None)
        redelivered, dropped = [], []
        sizes: dict[int, int] = {}  # queue offset → stored bytes
        read_bytes = 0
        for receipt in due[:room]:  # read one by one: the bytes bound the redeliveries as they bound new ones
            if redelivered and read_bytes >= max_bytes:
                break
            raw = store.read_record(receipt.physical_offset)
            if raw is None:
                dropped.append((receipt.queue_offset, receipt.version))
                continue
            redelivered.append((receipt, decode_record(raw)))
            sizes[receipt.queue_offset] = len(raw)
            read_bytes += len(raw)
        grouped_out = any(r.grouped for r in receipts)
        if cursor is not None:
            start = cursor
        else:  # a group's first receive from the queue
            start = self.consumer.start_offset(group, topic, queue_id)
            if start is None:
                start = store.max_offset(topic, queue_id)
        start = max(start, store.min_offset(topic, queue_id))
        fresh: list[MessageRecord] = []
        new_cursor = start
        space = min(room - len(redelivered), cfg.grpcMaxReceiptsPerQueue - len(receipts))
        if redelivered and read_bytes >= max_bytes:
            space = 0
        if space > 0 and start < store.max_offset(topic, queue_id):
            records, scanned_to = store.read_queue(topic, queue_id, start, space, tag_codes, max_bytes - read_bytes)
            new_cursor = scanned_to
            for raw in records:
                rec = decode_record(raw)
                if grouped_out and P.SHARDING_KEY in rec.properties:
                    new_cursor = rec.queue_offset  # it waits until the grouped messages out now are acknowledged
                    break
                fresh.append(rec)
                sizes[rec.queue_offset] = len(raw)
        if not fresh and not redelivered and not dropped and new_cursor == start and cursor is not None:
            return None, next_visible
        version = next(self._versions)
        visible_at = now + invisible_ms
        op = TakeReceipts(group, topic, queue_id, cursor, new_cursor,
                          [(rec.queue_offset, rec.physical_offset, P.SHARDING_KEY in rec.properties)
                           for rec in fresh],
                          [(r.queue_offset, r.version) for r, _rec in redelivered], dropped, visible_at, version)
        records = {rec.queue_offset: rec for rec in fresh}
        records.update({r.queue_offset: rec for r, rec in redelivered})
        return _Take(queue_id, op, records, sizes, version, visible_at), next_visible

    def _queue_state(self, group: str, topic: str, queue_id: int) -> tuple[list[Receipt], int | None]:
        """The queue's receipts (by queue offset) and cursor: the store's, with the takes being written applied on
        top. A take applied already but not yet seen complete changes nothing applied again. A take planned on one
        that then fails fails too (its op checks the cursor and versions it read): nothing is handed out twice."""
        receipts = read_receipts(self.store, group, topic, queue_id)
        cursor = read_cursor(self.store, group, topic, queue_id)
        writing = self._writing.get((group, topic, queue_id))
        if not writing:
            return receipts, cursor
        by_offset = {r.queue_offset: r for r in receipts}
        for take in writing:
            op = take.op
            cursor = op.new_cursor
            for offset, _version in op.dropped:
                by_offset.pop(offset, None)
            for offset, _version in op.again:
                held = by_offset.get(offset)
                if held is not None:  # else acknowledged meanwhile: the take will fail on it
                    by_offset[offset] = held._replace(visible_at=op.visible_at, version=op.version)
            for offset, physical, grouped in op.fresh:
                by_offset[offset] = Receipt(offset, op.visible_at, 1, physical, op.version, grouped)
        return [by_offset[offset] for offset in sorted(by_offset)], cursor

    def _written(self, group: str, topic: str, take: "_Take", durable: bool) -> None:
        """A take is durable, or failed (or its outcome is unknown): after a failure the queue's next take is
        planned from the store alone, not on top of takes that may fail in turn."""
        key = (group, topic, take.queue_id)
        writing = self._writing.get(key)
        if writing is None:
            return
        if durable and take in writing:
            writing.remove(take)
        elif not durable:
            writing.clear()
            self._nothing.pop(key, None)  # it was planned on top of this take: the queue may have something
        if not writing:
            del self._writing[key]

    def _commit_progress(self, group: str, topic: str, queue_id: int) -> None:
        """The group's committed offset: the first message not yet acknowledged (for progress and lag)."""
        receipts = read_receipts(self.store, group, topic, queue_id)
        cursor = read_cursor(self.store, group, topic, queue_id)
        if cursor is None:
            return
        first = min((r.queue_offset for r in receipts), default=cursor)
        if self.ctx.offsets.get(group, topic, queue_id) != first:
            self.ctx.offsets.commit(group, topic, queue_id, first)

    async def _dead_letter(self, group: str, topic: str, queue_id: int, receipt: Receipt,
                           version: int | None = None) -> None:
        """Move a message to the group's DLQ (its copy, and its receipt dropped, in one write). A message with no
        copy to store (gone with retention, or one that cannot be copied: dead_letter.py) loses only its receipt,
        so it never blocks its queue.

        Raises:
            ReceiptError: ``version`` is not the receipt's (acknowledged or handed out again meanwhile).
        """
        try:
            dlq = await self.ctx.topics.ensure_dlq(group)
            raw = self.store.read_record(receipt.physical_offset)
            rec = decode_record(raw) if raw is not None else None
            request = None
            if rec is not None:
                try:
                    copy = consumer_copy(rec, dlq.name, 0, topic, rec.properties.get(P.UNIQ_KEY, ""),
                                         receipt.attempts, self.ctx.store_host)
                    request = message_request(copy)
                except (BrokerError, MessageFormatError) as exc:
                    self.dead_letter_failures += 1
                    log.warning("message %s of %s/%d is dropped after %d deliveries to group %s: no copy of it "
                                "can go to %s (%s)", rec.properties.get(P.UNIQ_KEY, ""), topic, queue_id,
                                receipt.attempts, group, dlq.name, exc)
            if request is None:
                await self.store.submit(AckReceipts([(group, topic, queue_id, receipt.queue_offset,
                                                      receipt.version)]))
                return
            await self.store.submit(DeadLetter(group, topic, queue_id, receipt.queue_offset, version, request))
            self.dead_lettered += 1
            log.info("message %s of %s/%d moved to %s after %d deliveries to group %s",
                     rec.properties.get(P.UNIQ_KEY, ""), topic, queue_id, dlq.name, receipt.attempts, group)
        finally:  # a receipt less: room under grpcMaxReceiptsPerQueue, or a FIFO queue's next
            self._nothing.pop((group, topic, queue_id), None)

    async def renew(self, alive: Callable[[str, float], bool]) -> None:
        """Push auto-renewed receipts ahead again while their consumer is alive (``alive(client id, since)``: it
        sent anything since that monotonic time, the renewal's invisible time ago) and for at most
        AUTO_RENEW_MAX_MS; acknowledged or redelivered ones drop out."""
        if not self.renewing:
            return
        now = now_ms()
        alive_since = time.monotonic() - AUTO_RENEW_INVISIBLE_MS / 1000
        items = []
        for item, (client_id, until) in list(self.renewing.items()):
            if until <= now or not alive(client_id, alive_since):
                del self.renewing[item]
            else:
                items.append(item)
        if not items:
            return
        renewed = set(await self.store.submit(RenewReceipts(items, now + AUTO_RENEW_INVISIBLE_MS)))
        for item in items:
            if item not in renewed:
                self.renewing.pop(item, None)


    # --- ack, change invisibility, dead-letter ---
    async def ack(self, group: str, topic: str, handles: list[str]) -> list[BrokerError | None]:
        """Acknowledge each receipt ``handles`` name (one write for all); each one's refusal or None, in order."""
        outcomes: list[BrokerError | None] = []
        items, slots = [], []
        for handle in handles:
            try:
                queue_id, queue_offset, version = parse_handle(handle, self.broker)
            except BrokerError as exc:
                outcomes.append(exc)
                continue
            slots.append(len(outcomes))
            outcomes.append(None)
            items.append((group, topic, queue_id, queue_offset, version))
        errors = await self.store.submit(AckReceipts(items)) if items else []
        for item in items:
            self.renewing.pop(item, None)
            self._nothing.pop(item[:3], None)  # room under grpcMaxReceiptsPerQueue, or a FIFO queue's next
        if any(error is None for error in errors):
            self.ctx.long_poll.wake_topic(topic)  # an acknowledged FIFO message lets the next of its queue go
        for slot, error in zip(slots, errors, strict=True):
            if error is not None:
                outcomes[slot] = BrokerError(Failure.INVALID_RECEIPT, str(error))
        for queue_id in sorted({item[2] for item in items}):
            self._commit_progress(group, topic, queue_id)
        return outcomes

    async def change_invisibility(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Make the receipt ``handle`` names visible again in ``invisible_ms``; its new handle.

        Raises:
            BrokerError: INVALID_RECEIPT (not held: acknowledged, or handed out again).
        """
        queue_id, queue_offset, version = parse_handle(handle, self.broker)
        new_version = next(self._versions)
        await self.store.submit(ChangeInvisibility(group, topic, queue_id, queue_offset, version,
                                                   now_ms() + invisible_ms, new_version))
        self._nothing.pop((group, topic, queue_id), None)
        if invisible_ms == 0:
            self.ctx.long_poll.wake_topic(topic)  # visible now: wake the receives waiting on the topic
        return receipt_handle(self.broker, queue_id, queue_offset, new_version)

    async def forward_to_dead_letter_queue(self, group: str, topic: str, handle: str) -> None:
        """Move the message of the receipt ``handle`` names to the group's DLQ now.

        Raises:
            BrokerError: INVALID_RECEIPT (not held: acknowledged, or handed out again).
        """
        queue_id, queue_offset, version = parse_handle(handle, self.broker)
        held = {r.queue_offset: r for r in read_receipts(self.store, group, topic, queue_id)}
        receipt = held.get(queue_offset)
        if receipt is None or receipt.version != version:
            raise BrokerError(Failure.INVALID_RECEIPT, "the receipt handle is not held (acknowledged, or delivered "
                                                       "again with a newer handle)")
        await self._dead_letter(group, topic, queue_id, receipt, version)
        self._commit_progress(group, topic, queue_id)

    async def undeliverable(self, group: str, topic: str, rec: MessageRecord, handle: str, attempts: int) -> None:
        """A message taken that no consumer of the door can be given goes to the group's DLQ now, alone: retrying
        cannot help."""
        queue_id, queue_offset, version = parse_handle(handle, self.broker)
        self.renewing.pop((group, topic, queue_id, queue_offset, version), None)
        receipt = Receipt(queue_offset, 0, attempts, rec.physical_offset, version, P.SHARDING_KEY in rec.properties)
        try:
            await self._dead_letter(group, topic, queue_id, receipt, version)
        except ReceiptError as exc:  # acknowledged or taken again meanwhile: that receiver has it now
            log.info("message %s of %s/%d was not moved to the DLQ: %s", rec.properties.get(P.UNIQ_KEY, ""),
                     topic, queue_id, exc)
            return
        self._commit_progress(group, topic, queue_id)
