"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue: the gRPC adapter of the
receipt model (broker/messaging/receipts.py, ``ReceiptService``), which takes, acknowledges, renews and dead-letters.
What is gRPC's own: reading the requests (a receive into a ``ReceiveRequest``, checked and planned by
``ReceiptService.plan_receive``; durations read as milliseconds), taking and holding a receive that found nothing
until its long polling time within the connection's budget, and writing the answers.

Bounds, per gRPC connection (its peer), shared with the remoting door where it has one:
- a receive that finds nothing is held through the broker's LongPollService (``ReceiptService.hold``), so it counts
  against longPollingMaxHeldPerConnection and longPollingMaxHeld as a held pull does; beyond them it answers
  TOO_MANY_REQUESTS at once (measured before: one connection held 4,701 receives);
- the messages its receives took and have not yet written are at most serverMaxUnreadBytesPerConnection (their
  stored bytes, then their answers' bytes once built); beyond it a receive answers TOO_MANY_REQUESTS without
  taking anything, and an answer is built (a compressed body inflated) only while the connection's built and
  unwritten answers are under it. Answers are written one at a time, each awaiting grpc's flow control, so a
  stream not read stops being fed (measured before: 48 unread streams on one connection cost 210 MiB).
A message that cannot be turned into an answer (a remoting-compressed body that does not inflate within
maxMessageSize) is moved to the group's DLQ on its own (``ReceiptService.undeliverable``), with a log line and
halfmq_grpc_undeliverable_messages; the rest of its receive is delivered.
"""
from __future__ import annotations

import asyncio
import logging
import time

from halfmq.protocol import properties as P
from halfmq.protocol.message import MessageRecord

from ..context import now_ms
from ..errors import Failure
from ..messaging.receipts import MAX_INVISIBLE_MS, ReceiptService, ReceiveRequest, check_duration
from .auth import GROUP, SUB, TOPIC, Caller, require
from .convert import BodyError, to_message
from .route import checked_group, checked_topic
from .schema import Code, FilterType, pb
from .status import OK, GrpcError, ok, status, status_for

log = logging.getLogger(__name__)
AUTO_RENEW_INTERVAL_S = 10.0       #: how often auto-renewed receipts are pushed AUTO_RENEW_INVISIBLE_MS ahead again
MAX_RESPONSE_BYTES = 4 << 20
#: a take's room is at most 1/RECEIVE_SHARES of its connection's answer budget, so that many takes of one
#: connection run at once (and their receipts share write groups)
RECEIVE_SHARES = 16


def not_found():
    """The answer of a receive that hands out nothing."""
    return pb.ReceiveMessageResponse(status=status(Code["MESSAGE_NOT_FOUND"], "no new message"))


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
        self.receipts = ReceiptService(endpoint.ctx, consumer)
        #: per gRPC connection (peer): its receives' messages taken or answers built, not yet written
        self._backlogs: dict[str, _Backlog] = {}
        self._stopping = False

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
            BrokerError: BUSY, the connection or the broker holds as many long polls as it may.
        """
        group, topic = checked_group(request.group), checked_topic(request.message_queue.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        queue = request.message_queue
        invisible_ms = (request.invisible_duration.ToMilliseconds() if request.HasField("invisible_duration")
                        else None)
        polling_ms = (request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout")
                      else 0)
        expression = request.filter_expression
        plan = await self.receipts.plan_receive(ReceiveRequest(
            group, topic, request.batch_size, invisible_ms, request.auto_renew, polling_ms,
            ("SQL" if expression.type == FilterType["SQL"] else "TAG", expression.expression), queue.id,
            queue.broker.name))
        renew_for = caller.client_id if plan.auto_renew else None
        deadline = time.monotonic() + polling_ms / 1000
        while True:
            taken, next_visible, backlog = await self._take_for(peer, group, topic, plan.queues, plan.tag_codes,
                                                                request.batch_size, plan.invisible_ms, renew_for)
            if taken:
                return Delivery(group, topic, queue.topic.resource_namespace, plan.invisible_ms, taken, peer,
                                backlog)
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping:
                return None
            if next_visible is not None:
                left = min(left, max(0.0, (next_visible - now_ms()) / 1000) + 0.01)
            await self.receipts.hold(topic, ("grpc", peer), left)

    async def _take_for(self, peer: str, group: str, topic: str, queues, tag_codes, batch: int, invisible_ms: int,
                        renew_for: str | None):
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
            taken, next_visible = await self.receipts.take(group, topic, queues, tag_codes, batch, room, invisible_ms,
                                                          renew_for)
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
        if self.ctx.metrics is not None:
            self.ctx.metrics.grpc_undeliverable(delivery.topic)
        log.warning("message %s of %s (offset %d) cannot be delivered to gRPC group %s: %s; it goes to the group's "
                    "DLQ", rec.properties.get(P.UNIQ_KEY, ""), delivery.topic, rec.queue_offset, delivery.group, exc)
        await self.receipts.undeliverable(delivery.group, delivery.topic, rec, handle, attempts)

    async def renew(self) -> None:
        """The periodic renewal of auto-renewed receipts, while their client's session is alive."""
        sessions = self.endpoint.sessions.by_client

        def alive(client_id: str, since: float) -> bool:
            session = sessions.get(client_id)
            return session is not None and session.heard_since(since)

        await self.receipts.renew(alive)

    # --- AckMessage ---
    async def ack_message(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        most = self.ctx.config.grpcMaxAckEntries
        if len(request.entries) > most:  # one write holds them all: a huge one stalled every other client's write
            raise GrpcError(Code["BAD_REQUEST"], f"the request holds {len(request.entries)} entries, more than "
                                                 f"grpcMaxAckEntries {most}")
        response = pb.AckMessageResponse()
        outcomes = await self.receipts.ack(group, topic, [entry.receipt_handle for entry in request.entries])
        for entry, error in zip(request.entries, outcomes, strict=True):
            result = response.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle)
            result.status.CopyFrom(OK if error is None else status_for(error))
        failed = [e for e in response.entries if e.status.code != Code["OK"]]
        if not failed:
            response.status.CopyFrom(OK)
        elif len(failed) == len(response.entries):
            response.status.CopyFrom(failed[0].status)
        else:
            response.status.CopyFrom(status(Code["MULTIPLE_RESULTS"], f"{len(failed)} entries failed"))
        return response

    # --- ChangeInvisibleDuration ---
    async def change_invisible_duration(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        invisible_ms = check_duration(request.invisible_duration.ToMilliseconds(), "invisible duration", 0,
                                      MAX_INVISIBLE_MS, Failure.ILLEGAL_INVISIBLE_TIME)
        handle = await self.receipts.change_invisibility(group, topic, request.receipt_handle, invisible_ms)
        return pb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    # --- ForwardMessageToDeadLetterQueue ---
    async def forward_to_dead_letter_queue(self, request, caller: Caller):
        group, topic = checked_group(request.group), checked_topic(request.topic)
        require(caller, (GROUP, group, SUB), (TOPIC, topic, SUB))
        await self.receipts.forward_to_dead_letter_queue(group, topic, request.receipt_handle)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=ok())


__all__ = ["Delivery", "ReceiveService", "not_found"]
