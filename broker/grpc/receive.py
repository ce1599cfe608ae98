"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue: RocketMQ 5's
consumption model over the receipts table (store/receipts.py).

A receive hands out, per queue, first the messages whose invisible time ran out (their attempt counted), then new
ones from the group's cursor; each gets a receipt, durable before the answer goes out. One not acknowledged in time
is handed out again; one that has used grpcMaxDeliveryAttempts goes to the group's %DLQ% topic instead (the copy
and the receipt's removal are one write). Messages with a message group (FIFO) keep their order: while a queue has
a grouped message out, no later grouped message of that queue is handed out (the reference's orderly pop locks the
queue the same way).

A group's first receive from a queue starts where its remoting consumers' committed offset is, else at the
queue's start when the queue still holds everything, else at its end (the reference's pop initial offset);
acknowledgements move that committed offset, so consumer progress and lag are shown for gRPC groups too.

Bounds, per gRPC connection (its peer), shared with the remoting door where it has one:
- a receive that finds nothing is held through the broker's LongPollService, so it counts against
  longPollingMaxHeldPerConnection and longPollingMaxHeld as a held pull does; beyond them it answers
  TOO_MANY_REQUESTS at once (measured before: one connection held 4,701 receives);
- the messages its receives took and have not yet written are at most serverMaxUnreadBytesPerConnection (their
  stored bytes, then their answers' bytes once built); beyond it a receive answers TOO_MANY_REQUESTS without
  taking anything, and an answer is built (a compressed body inflated) only while the connection's built and
  unwritten answers are under it. Answers are written one at a time, each awaiting grpc's flow control, so a
  stream not read stops being fed (measured before: 48 unread streams on one connection cost 210 MiB).
A message that cannot be turned into an answer (a remoting-compressed body that does not inflate within
maxMessageSize) is moved to the group's DLQ on its own, with a log line and halfmq_grpc_undeliverable_messages;
the rest of its receive is delivered.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time

from halfmq.protocol import properties as P
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import MessageRecord, decode_record
from halfmq.store import message_request
from halfmq.store.receipts import (AckReceipts, ChangeInvisibility, DeadLetter, Receipt, ReceiptError, RenewReceipts,
                                   TakeReceipts, read_cursor, read_receipts)

from ..context import now_ms
from ..errors import BrokerError
from ..messaging.dead_letter import consumer_copy
from ..services.clients import parse_subscription
from ..services.long_poll import ANY_QUEUE, HeldPull
from .auth import GROUP, SUB, TOPIC, Caller, require
from .convert import BodyError, to_message
from .route import checked_group, checked_topic
from .schema import Code, FilterType, pb
from .status import GrpcError, ok, status

log = logging.getLogger(__name__)
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3_600_000
AUTO_RENEW_INVISIBLE_MS = 30_000   #: a push consumer's receive (auto_renew, no duration of its own)
#: how long a queue that gave a receive nothing is passed by, at most, when no message arrived: what another
#: change (an admin's, retention's) waits for at worst
NOTHING_RECHECK_MS = 100
AUTO_RENEW_INTERVAL_S = 10.0       #: how often auto-renewed receipts are pushed AUTO_RENEW_INVISIBLE_MS ahead again
AUTO_RENEW_MAX_MS = 3_600_000      #: renewed for at most this long after the receive: a stuck listener lets go
MAX_BATCH = 1024
MAX_POLLING_MS = 60_000
MAX_RESPONSE_BYTES = 4 << 20
#: a take's room is at most 1/RECEIVE_SHARES of its connection's answer budget, so that many takes of one
#: connection run at once (and their receipts share write groups)
RECEIVE_SHARES = 16
_MAX_QUEUE_ID = (1 << 31) - 1  #: MessageQueue.id is an int32
_MAX_OFFSET = (1 << 63) - 1
_MAX_VERSION = (1 << 64) - 1


def not_found():
    """The answer of a receive that hands out nothing."""
    return pb.ReceiveMessageResponse(status=status(Code["MESSAGE_NOT_FOUND"], "no new message"))


def receipt_handle(broker: str, queue_id: int, queue_offset: int, version: int) -> str:
    """``<brokerName>:<queue>:<offset>:<version>`` (hex): another broker of a cluster refuses it rather than act on
    whatever receipt it holds at that queue and offset."""
    return f"{broker}:{queue_id:x}:{queue_offset:x}:{version:x}"


def parse_handle(text: str, broker: str) -> tuple[int, int, int]:
    """(queue id, queue offset, version) of a receipt handle ``broker`` gave.

    Raises:
        GrpcError: INVALID_RECEIPT_HANDLE.
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
    raise GrpcError(Code["INVALID_RECEIPT_HANDLE"], f"{text[:80]!r} is not a receipt handle this broker ({broker}) "
                                                    f"gave")


def _duration_ms(duration, what: str, low: int, high: int, code: str) -> int:
    ms = duration.ToMilliseconds()
    if not low <= ms <= high:
        raise GrpcError(Code[code], f"the {what} {ms} ms is outside {low}..{high} ms")
    return ms


class _Backlog:
    """One connection's receives' messages not yet written: ``taken`` stored bytes of messages taken and not yet
    built into answers, ``built`` bytes of answers built and not yet written; ``waiters`` wait for ``built`` to
    go down."""

    __slots__ = ("taken", "built", "reserved", "waiters")

    def __init__(self):
        self.taken = 0
        self.built = 0
        #: room held by takes under way, each at most a share of the budget: a good client's 32 receives in flight
        #: on one connection each reserved the whole room before, and all but one were refused
        self.reserved = 0
        self.waiters: list[asyncio.Future] = []

    async def reserve(self, limit: int) -> int:
        """Room for one take: at most RECEIVE_SHARE of ``limit``, once the takes under way leave it.

        Raises:
            GrpcError: TOO_MANY_REQUESTS, the connection's taken and built answers fill its budget (its reader is
                behind: waiting would not end).
        """
        while True:
            unwritten = self.taken + self.built
            if unwritten >= limit:
                raise GrpcError(Code["TOO_MANY_REQUESTS"], f"the connection's answers are not being read: "
                                                           f"{unwritten} bytes not yet written "
                                                           f"(serverMaxUnreadBytesPerConnection={limit})")
            free = limit - unwritten - self.reserved
            if free > 0:
                room = min(free, max(limit // RECEIVE_SHARES, 1), MAX_RESPONSE_BYTES)
                self.reserved += room
                return room
            await self._wait()

    async def _wait(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future
        finally:
            if future in self.waiters:
                self.waiters.remove(future)

    async def room_to_build(self, limit: int) -> None:
        """Until the connection's built and unwritten answers are under ``limit``. An answer waiting here has
        nothing built itself, so while every stream waits nothing is built and none waits: no deadlock."""
        while self.built >= limit:
            await self._wait()

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def idle(self) -> bool:
        return self.taken == 0 and self.built == 0 and self.reserved == 0 and not self.waiters


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


class Delivery:
    """What one receive took, to be written: (record, handle, attempts, stored bytes) in order; each item is
    dropped (None) once written or handled, so its record's memory goes with it."""

    __slots__ = ("group", "topic", "namespace", "invisible_ms", "items", "peer", "backlog")

    def __init__(self, group: str, topic: str, namespace: str, invisible_ms: int, items: list, peer: str,
                 backlog: _Backlog):
        self.group, self.topic, self.namespace, self.invisible_ms = group, topic, namespace, invisible_ms
        self.items, self.peer, self.backlog = items, peer, backlog


class ReceiveService:
    def __init__(self, endpoint, consumer):
        self.endpoint = endpoint
        self.ctx = endpoint.ctx
        self.consumer = consumer
        self.store = endpoint.ctx.store
        self.broker = endpoint.ctx.config.brokerName  #: named by every receipt handle given
        #: one plan at a time per (group, topic, queue): plans then never race each other (the ops check anyway)
        self._locks: dict[tuple[str, str, int], asyncio.Lock] = {}
        #: per (group, topic, queue), the takes submitted and not yet durable, in order: the next take of the queue
        #: is planned on top of them instead of waiting for their sync (``_queue_state``)
        self._writing: dict[tuple[str, str, int], list[_Take]] = {}
        #: queues that just gave a receive nothing: (their max offset then, the tag filter, until when (ms) that is
        #: trusted, their next visibility); a receive passes them by unless a message arrived since (measured
        #: before: receives finding little planned ~8 queues each, reading every queue's receipts, 40% of their CPU)
        self._nothing: dict[tuple[str, str, int], tuple[int, object, int, int | None]] = {}
        #: per gRPC connection (peer): its receives' messages taken or answers built, not yet written
        self._backlogs: dict[str, _Backlog] = {}
        # versions grow across restarts too: a handle from before a restart never names a newer receipt
        self._versions = itertools.count(time.time_ns() // 1000)
        self.dead_lettered = 0
        self.dead_letter_failures = 0  #: messages dropped at their last delivery because no DLQ copy could be made
        self._stopping = False
        #: receipts a push consumer asked to have renewed: item (as AckReceipts takes it) → (client id, until ms)
        self.renewing: dict[tuple[str, str, int, int, int], tuple[str, int]] = {}

    def release_all(self) -> None:
        """Shutdown: held receives answer now (with what they have: nothing). The held remoting pulls are answered
        too: the broker is stopping, and LongPollService holds both."""
        self._stopping = True
        self.ctx.long_poll.release_all()

    def _backlog(self, peer: str) -> "_Backlog":
        backlog = self._backlogs.get(peer)
        if backlog is None:
            backlog = self._backlogs[peer] = _Backlog()
        return backlog

    def _settle(self, peer: str, backlog: "_Backlog") -> None:
        backlog.wake()
        if backlog.idle() and self._backlogs.get(peer) is backlog:
            del self._backlogs[peer]

    # --- ReceiveMessage ---
    async def receive_message(self, request, caller: Caller, peer: str) -> Delivery | None:
        """Take the messages one receive answers (None: none came within its long polling time).

        Raises:
            GrpcError: a request refused (TOO_MANY_REQUESTS: the connection's answers are not being read).
            BrokerError: SYSTEM_BUSY, the connection or the broker holds as many long polls as it may.
        """
        group, topic = checked_group(request.group), checked_topic(request.message_queue.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        owner, here = request.message_queue.broker.name, self.ctx.config.brokerName
        if owner and owner != here:  # never served from this store: the client's route is stale
            raise GrpcError(Code["BAD_REQUEST"], f"queue {request.message_queue.id} of {topic} belongs to broker "
                                                 f"{owner[:100]}, not to this broker ({here}): query the route again")
        config = self.consumer.readable_topic(topic)
        await self.ctx.topics.ensure_group(group)
        batch = request.batch_size
        if not 1 <= batch <= MAX_BATCH:
            raise GrpcError(Code["BAD_REQUEST"], f"batch_size {batch} is outside 1..{MAX_BATCH}")
        renew = False
        if request.HasField("invisible_duration"):
            invisible_ms = _duration_ms(request.invisible_duration, "invisible duration", MIN_INVISIBLE_MS,
                                        MAX_INVISIBLE_MS, "ILLEGAL_INVISIBLE_TIME")
        elif request.auto_renew:
            invisible_ms = AUTO_RENEW_INVISIBLE_MS
            renew = True
        else:
            raise GrpcError(Code["ILLEGAL_INVISIBLE_TIME"], "the invisible duration is required")
        polling_ms = 0
        if request.HasField("long_polling_timeout"):
            polling_ms = _duration_ms(request.long_polling_timeout, "long polling timeout", 0, MAX_POLLING_MS,
                                      "ILLEGAL_POLLING_TIME")
        tag_codes = self._tag_codes(topic, request.filter_expression)
        queues = list(range(config.read_queue_nums))
        start = request.message_queue.id
        if start < 0 or start >= len(queues):
            start = random.randrange(len(queues)) if queues else 0
        queues = queues[start:] + queues[:start]
        deadline = time.monotonic() + polling_ms / 1000
        while True:
            taken, next_visible, backlog = await self._take_for(peer, group, topic, queues, tag_codes, batch,
                                                                invisible_ms)
            if taken:
                if renew:
                    until = now_ms() + AUTO_RENEW_MAX_MS
                    for _rec, handle, _attempts, _size in taken:
                        queue_id, queue_offset, version = parse_handle(handle, self.broker)
                        self.renewing[(group, topic, queue_id, queue_offset, version)] = (caller.client_id, until)
                return Delivery(group, topic, request.message_queue.topic.resource_namespace, invisible_ms, taken,
                                peer, backlog)
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping:
                return None
            if next_visible is not None:
                left = min(left, max(0.0, (next_visible - now_ms()) / 1000) + 0.01)
            await self._hold(topic, peer, left)

    async def _hold(self, topic: str, peer: str, timeout_s: float) -> None:
        """Wait for the topic to grow (or a message of it to become visible again) as a held long poll of the
        connection ``peer``; a receive whose stream is cancelled leaves LongPollService at once."""
        pull = HeldPull(topic, ANY_QUEUE, -1, ("grpc", peer))
        woken = self.ctx.long_poll.hold(pull, max(0.0, timeout_s))
        try:
            await woken
        finally:
            self.ctx.long_poll.drop(pull)

    async def _take_for(self, peer: str, group: str, topic: str, queues, tag_codes, batch: int, invisible_ms: int):
        """Take for a receive of connection ``peer`` at most the room its backlog has (at least one message).

        Raises:
            GrpcError: TOO_MANY_REQUESTS, the connection's taken and built answers fill its backlog.
        """
        limit = self.ctx.config.serverMaxUnreadBytesPerConnection
        backlog = self._backlog(peer)
        taken: list = []
        try:
            room = await backlog.reserve(limit)
        except GrpcError:
            self._settle(peer, backlog)
            if self.ctx.metrics is not None:
                self.ctx.metrics.grpc_receive_refused()
            raise
        try:
            taken, next_visible = await self._take_from(group, topic, queues, tag_codes, batch, room, invisible_ms)
            backlog.taken += sum(size for _rec, _handle, _attempts, size in taken)
        finally:
            backlog.reserved -= room
            backlog.wake()
            if not taken:
                self._settle(peer, backlog)
        return taken, next_visible, backlog

    async def deliver(self, delivery: Delivery, write) -> None:
        """Write each message of ``delivery`` with ``write`` (grpc's ``context.write``: it returns once flow
        control took the answer), then the delivery time and the status."""
        cfg, backlog = self.ctx.config, delivery.backlog
        items = delivery.items
        delivered = delivered_bytes = 0
        try:
            for index, (rec, handle, attempts, size) in enumerate(items):
                await backlog.room_to_build(cfg.serverMaxUnreadBytesPerConnection)
                items[index] = None
                backlog.taken -= size
                try:
                    message = to_message(rec, delivery.namespace, handle, attempts, delivery.invisible_ms,
                                         max_body=cfg.maxMessageSize)
                except BodyError as exc:
                    await self._undeliverable(delivery, rec, handle, attempts, exc)
                    continue
                answer = pb.ReceiveMessageResponse(message=message)
                built = answer.ByteSize()
                backlog.built += built
                try:
                    await write(answer)
                finally:
                    backlog.built -= built
                    backlog.wake()
                delivered += 1
                delivered_bytes += len(rec.body)
        finally:
            backlog.taken -= sum(item[3] for item in items if item is not None)
            self._settle(delivery.peer, backlog)
            if delivered and self.ctx.metrics is not None:  # the same series as remoting pulls
                self.ctx.metrics.message_out(delivery.topic, delivery.group, delivered, delivered_bytes)
        if delivered:
            done = pb.ReceiveMessageResponse()
            done.delivery_timestamp.GetCurrentTime()  # when the broker handed them out (client latency metric)
            await write(done)
            await write(pb.ReceiveMessageResponse(status=ok()))
        else:
            await write(not_found())

    async def _undeliverable(self, delivery: Delivery, rec: MessageRecord, handle: str, attempts: int,
                             exc: BodyError) -> None:
        """A message no gRPC consumer can be given goes to the group's DLQ now, alone: retrying cannot help."""
        group, topic = delivery.group, delivery.topic
        queue_id, queue_offset, version = parse_handle(handle, self.broker)
        if self.ctx.metrics is not None:
            self.ctx.metrics.grpc_undeliverable(topic)
        log.warning("message %s of %s/%d (offset %d) cannot be delivered to gRPC group %s: %s; it goes to the "
                    "group's DLQ", rec.properties.get(P.UNIQ_KEY, ""), topic, queue_id, queue_offset, group, exc)
        self.renewing.pop((group, topic, queue_id, queue_offset, version), None)
        receipt = Receipt(queue_offset, 0, attempts, rec.physical_offset, version, P.SHARDING_KEY in rec.properties)
        try:
            await self._dead_letter(group, topic, queue_id, receipt, version)
        except ReceiptError as exc2:  # acknowledged or taken again meanwhile: that receiver has it now
            log.info("message %s of %s/%d was not moved to the DLQ: %s", rec.properties.get(P.UNIQ_KEY, ""),
                     topic, queue_id, exc2)
            return
        self._commit_progress(group, topic, queue_id)

    @staticmethod
    def _tag_codes(topic: str, expression):
        if expression.type == FilterType["SQL"]:
            raise GrpcError(Code["ILLEGAL_FILTER_EXPRESSION"], "SQL filter expressions are not supported")
        return parse_subscription(topic, expression.expression or "*").tag_codes

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

    async def renew(self) -> None:
        """Push auto-renewed receipts ahead again while their consumer is alive (it sent anything within the
        renewal's invisible time) and for at most AUTO_RENEW_MAX_MS; acknowledged or redelivered ones drop out."""
        if not self.renewing:
            return
        now = now_ms()
        alive_since = time.monotonic() - AUTO_RENEW_INVISIBLE_MS / 1000
        sessions = self.endpoint.sessions.by_client
        items = []
        for item, (client_id, until) in list(self.renewing.items()):
            session = sessions.get(client_id)
            if until <= now or session is None or not session.heard_since(alive_since):
                del self.renewing[item]
            else:
                items.append(item)
        if not items:
            return
        renewed = set(await self.store.submit(RenewReceipts(items, now + AUTO_RENEW_INVISIBLE_MS)))
        for item in items:
            if item not in renewed:
                self.renewing.pop(item, None)

    # --- AckMessage ---
    async def ack_message(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        most = self.ctx.config.grpcMaxAckEntries
        if len(request.entries) > most:  # one write holds them all: a huge one stalled every other client's write
            raise GrpcError(Code["BAD_REQUEST"], f"the request holds {len(request.entries)} entries, more than "
                                                 f"grpcMaxAckEntries {most}")
        response = pb.AckMessageResponse()
        items, slots = [], []
        for entry in request.entries:
            result = response.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle)
            try:
                queue_id, queue_offset, version = parse_handle(entry.receipt_handle, self.broker)
            except GrpcError as exc:
                result.status.CopyFrom(status(exc.code, exc.message))
                continue
            items.append((group, topic, queue_id, queue_offset, version))
            slots.append(result)
        errors = await self.store.submit(AckReceipts(items)) if items else []
        for item in items:
            self.renewing.pop(item, None)
            self._nothing.pop(item[:3], None)  # room under grpcMaxReceiptsPerQueue, or a FIFO queue's next
        if any(error is None for error in errors):
            self.ctx.long_poll.wake_topic(topic)  # an acknowledged FIFO message lets the next of its queue go
        for result, error in zip(slots, errors, strict=True):
            result.status.CopyFrom(ok() if error is None else status(Code["INVALID_RECEIPT_HANDLE"], str(error)))
        for queue_id in sorted({item[2] for item in items}):
            self._commit_progress(group, topic, queue_id)
        failed = [e for e in response.entries if e.status.code != Code["OK"]]
        if not failed:
            response.status.CopyFrom(ok())
        elif len(failed) == len(response.entries):
            response.status.CopyFrom(failed[0].status)
        else:
            response.status.CopyFrom(status(Code["MULTIPLE_RESULTS"], f"{len(failed)} entries failed"))
        return response

    # --- ChangeInvisibleDuration ---
    async def change_invisible_duration(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        invisible_ms = _duration_ms(request.invisible_duration, "invisible duration", 0, MAX_INVISIBLE_MS,
                                    "ILLEGAL_INVISIBLE_TIME")
        queue_id, queue_offset, version = parse_handle(request.receipt_handle, self.broker)
        new_version = next(self._versions)
        try:
            await self.store.submit(ChangeInvisibility(group, topic, queue_id, queue_offset, version,
                                                       now_ms() + invisible_ms, new_version))
        except ReceiptError as exc:
            raise GrpcError(Code["INVALID_RECEIPT_HANDLE"], str(exc)) from None
        self._nothing.pop((group, topic, queue_id), None)
        if invisible_ms == 0:
            self.ctx.long_poll.wake_topic(topic)  # visible now: wake the receives waiting on the topic
        return pb.ChangeInvisibleDurationResponse(status=ok(),
                                                  receipt_handle=receipt_handle(self.broker, queue_id, queue_offset,
                                                                                new_version))

    # --- ForwardMessageToDeadLetterQueue ---
    async def forward_to_dead_letter_queue(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        queue_id, queue_offset, version = parse_handle(request.receipt_handle, self.broker)
        held = {r.queue_offset: r for r in read_receipts(self.store, group, topic, queue_id)}
        receipt = held.get(queue_offset)
        if receipt is None or receipt.version != version:
            raise GrpcError(Code["INVALID_RECEIPT_HANDLE"], "the receipt handle is not held (acknowledged, or "
                                                            "delivered again with a newer handle)")
        try:
            await self._dead_letter(group, topic, queue_id, receipt, version)
        except ReceiptError as exc:
            raise GrpcError(Code["INVALID_RECEIPT_HANDLE"], str(exc)) from None
        self._commit_progress(group, topic, queue_id)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=ok())


__all__ = ["Delivery", "ReceiveService", "not_found", "receipt_handle", "parse_handle"]
