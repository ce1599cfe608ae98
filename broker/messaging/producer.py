"""Sends, batches and half prepares: every rule a message obeys before it is stored, whatever door it came in by.

Each door decodes its wire form into a ``SendRequest`` (or a ``BatchRequest``, messaging/batch.py), names the
caller as a ``Sender`` and calls one operation, ``ProducerService.send`` (``send_batch``), which checks, picks the
queue, stamps and stores the message (or prepares the half) and hands back the store's completion; the door only
turns its value into its answer.

The checks are synchronous, so the common send (a known topic) is a store Completion without a coroutine
(measured: a coroutine per send cost 5% of remoting send throughput); only what may create a topic is awaited, in
a task the caller answers from as it would from the completion (``send``).
"""
from __future__ import annotations

import asyncio
import random
import weakref
import zlib
from dataclasses import dataclass

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from halfmq.protocol.message import MessageRecord
from halfmq.store import message_request
from halfmq.store.completion import Completion
from halfmq.store.ops import PutMessage, PutMessages
from halfmq.store.timers import PutTimed

from ..errors import BrokerError, Failure
from ..names import check_message
from ..services.schedule import delay_level
from ..services.timers import TIMER_KEYS
from ..topics import (DEFAULT_TOPIC, DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC, SEND_FORBIDDEN, TopicConfig,
                      check_message_type, validate_topic_name)
from .batch import BatchRequest, BatchSent, prepare_batch

#: topic names already validated (a regex per send otherwise); cleared when full, so it stays bounded
_MAX_VALID_TOPICS = 10_000
#: deliveries of a message to a retry topic, when its sender names no limit (the reference's default)
DEFAULT_MAX_RECONSUME_TIMES = 16


def retry_limit(max_times: int | None) -> int:
    """The deliveries a consumer group's message may have: ``max_times`` when the consumer named one."""
    return DEFAULT_MAX_RECONSUME_TIMES if max_times is None or max_times < 0 else max_times


def fifo_queue(message_group: str, queues: int) -> int:
    """A message group's queue: a stable hash (Python's str hash changes per process)."""
    return zlib.crc32(message_group.encode()) % queues


@dataclass(slots=True)
class SendRequest:
    """One message to store, as a door decoded it.

    ``rec`` is the message (topic, body, properties, flags, born time and host, deliveries so far); the service
    stamps it and may move it (a retry past its limit goes to the group's DLQ topic, a delay level to the schedule
    topic). ``queue_id`` is the queue asked for (-1: any writable one; with ``message_group``, that group's queue),
    and once sent the queue chosen; ``half`` says whether it was stored as a half."""
    rec: MessageRecord
    queue_id: int = -1
    message_group: str | None = None
    #: a message to a retry topic that has had this many deliveries goes to the group's DLQ (None: the default)
    max_reconsume_times: int | None = None
    #: what a topic created by this send is modelled on (autoCreateTopicEnable)
    default_topic: str = DEFAULT_TOPIC
    default_queue_nums: int = 0
    half: bool = False


class Sender:
    """Who sends (the identity a send is made under): ``group``, the producer group the caller was authorised for
    (a half is filed under it; None when none was named), and ``channel``, where the checks of its halves go first.
    Each door's subclass says in ``half_sent`` how its producer is known as one (a remoting producer as its
    heartbeat registers it, a gRPC session by the topics it publishes)."""

    __slots__ = ("group", "channel")

    def __init__(self, group: str | None, channel):
        self.group, self.channel = group, channel

    def half_sent(self, producers, group: str, topic: str) -> None:
        """A half of ``topic`` filed under ``group`` is being stored: a sign of life of its producer, registered with
        ``producers`` (services/clients.py ProducerRegistry), so the group's halves waiting for a producer are
        checked with it at once (a producer reconnecting after a broker restart sends before its next heartbeat,
        30 s later for stock clients). Here: nothing."""


class ProducerService:
    def __init__(self, ctx):
        self.ctx = ctx
        self.max_body = ctx.config.maxMessageSize
        self.cluster = ctx.config.brokerClusterName
        self._valid_topics: set[str] = set()
        #: each sender channel's turn to prepare a batch (send_batch)
        self._batch_turns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # --- the operations ---
    def send(self, request: SendRequest, sender: Sender, writes=None):
        """Check, place, stamp and store one message, or prepare it as a half filed under ``sender.group``.

        Args:
            writes: what submits the store write (grpc/group_commit.py ``GroupCommit``: ``writes.store(write)``),
                None to submit it at once.
        Returns:
            A future of the write (a store Completion while the topic is known; a task when it may be created
            first, or when ``writes`` takes the write): a message's PutResult, a half's (PutResult, HalfState)
            (``request.half``). The queue chosen is ``request.queue_id``.
        Raises:
            BrokerError: what the checks refuse (check_topic, check_body, check_message, writable_queue, store_op);
                also through the future.
        """
        rec = request.rec
        topic = rec.topic
        self.check_topic(topic)
        size = len(rec.body)
        if not 0 < size <= self.max_body:  # (the check's call only when it refuses: one call less per send)
            self.check_body(size)
        config = self.ctx.topics.get(topic)
        if config is None or topic.startswith(RETRY_PREFIX):
            return asyncio.ensure_future(self._send_later(request, sender, writes))
        return self._store(request, sender, config, topic, writes)

    async def _send_later(self, request: SendRequest, sender: Sender, writes):
        """A send that may create its topic, or one to a retry topic (past its deliveries: to the DLQ topic)."""
        rec = request.rec
        named = rec.topic
        if named.startswith(RETRY_PREFIX) and rec.reconsume_times >= retry_limit(request.max_reconsume_times):
            rec.topic = DLQ_PREFIX + named[len(RETRY_PREFIX):]
            rec.properties.pop(P.DELAY, None)
        config = await self.topic_for_send(rec.topic, request.default_topic, request.default_queue_nums)
        # a retry turned into a DLQ copy is not held to the retry topic's type (the reference checks neither)
        return await self._store(request, sender, config, named, writes, typed=rec.topic == named)

    def _store(self, request: SendRequest, sender: Sender, config: TopicConfig, named: str, writes,
               typed: bool = True):
        rec = request.rec
        props = rec.properties
        group = sender.group
        self.check_message(config if typed else None, named, props, group)
        request.queue_id = rec.queue_id = self.writable_queue(config, request.queue_id, request.message_group)
        self.stamp(rec)
        if props.get(P.TRAN_MSG) == "true":
            request.half = True
            sender.half_sent(self.ctx.producers, group, rec.topic)
            if writes is None:
                return self.ctx.transactions.prepare(rec, group, sender.channel)
            return writes.store(lambda: self.ctx.transactions.prepare(rec, group, sender.channel))
        if writes is not None:
            return writes.store(lambda: self.submit_message(rec, True))
        return self.submit_message(rec, True)

    async def send_batch(self, request: BatchRequest, sender: Sender) -> BatchSent:
        """Check a batch whole and store its messages in one write to one queue (a batch half: prepare them as one
        half filed under ``sender.group``, halfmq's extension).

        A sender's batches are prepared one after the other, in the order they came: the first is stored while the
        next is prepared. Prepared side by side, a slice of each per loop turn, a connection pipelining n batches
        held n slices of every turn and each of its batches was done only when all were (the Spark sink's 4 batch
        halves per task: answered together after 180-270 ms, its worker idle meanwhile).

        Raises:
            BrokerError: what the checks refuse (batch.py ``prepare_batch``, check_topic, check_message,
                writable_queue).
        """
        self.check_topic(request.topic)
        turn = self._batch_turns.get(sender.channel)
        if turn is None:
            turn = self._batch_turns[sender.channel] = asyncio.Lock()
        async with turn:
            requests, outer, uniq, queue_id, size = await prepare_batch(self, request, sender.group)
        if outer.get(P.TRAN_MSG) == "true":
            if uniq is not None:
                outer[P.UNIQ_KEY] = uniq
            half = MessageRecord(topic=request.topic, body=b"", queue_id=queue_id, sys_flag=request.sys_flag,
                                 born_timestamp=request.born_timestamp, born_host=request.born_host,
                                 store_host=self.ctx.store_host, properties=outer)
            sender.half_sent(self.ctx.producers, sender.group, request.topic)
            result, state = await self.ctx.transactions.prepare(half, sender.group, sender.channel, requests)
            return BatchSent(queue_id, [result], state)
        results = await self.ctx.store.submit(PutMessages(requests))
        self.stored(request.topic, size, len(requests))
        return BatchSent(queue_id, results, None)

    # --- checks ---
    def check_topic(self, topic: str) -> None:
        """A topic a producer may name: a valid name, not a system topic.

        Raises:
            BrokerError: ILLEGAL_TOPIC, FORBIDDEN.
        """
        if topic not in self._valid_topics:
            try:
                validate_topic_name(topic)
            except BrokerError as exc:
                raise BrokerError(Failure.ILLEGAL_TOPIC, exc.remark) from None
            if len(self._valid_topics) >= _MAX_VALID_TOPICS:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic in SEND_FORBIDDEN:
            raise BrokerError(Failure.FORBIDDEN, f"Sending message to topic[{topic}] is forbidden.")

    def check_body(self, size: int, what: str = "message body") -> None:
        """A body is not empty and at most maxMessageSize (a batch's whole body, a message's decompressed one).

        Raises:
            BrokerError: BODY_EMPTY, BODY_TOO_LARGE.
        """
        if size > self.max_body:
            raise BrokerError(Failure.BODY_TOO_LARGE,
                              f"the {what} size {size} is larger than maxMessageSize {self.max_body}")
        if size == 0:
            raise BrokerError(Failure.BODY_EMPTY, f"the {what} is empty")

    def check_message(self, config: TopicConfig | None, topic: str, props: dict[str, str],
                      group: str | None = None) -> None:
        """A message's properties (``config``: its topic's, None for a copy to a DLQ topic, which takes any
        type): its keys and, for a half, the group it is filed under (names.check_message: the group the caller
        was authorised for, ``group``), its type against the topic's declared one, the transactional rules.

        Raises:
            BrokerError: BAD_MESSAGE, TYPE_CONFLICT; FORBIDDEN for a half while rejectTransactionMessage is set.
            MessageFormatError: a DELAY property that is not a number.
        """
        check_message(topic, props, group)
        check_message_type(config, props)
        if props.get(P.TRAN_MSG) == "true":
            if self.ctx.config.rejectTransactionMessage:
                raise BrokerError(Failure.FORBIDDEN,
                                  "the broker rejects transaction messages (rejectTransactionMessage=true)")
            if delay_level(props) > 0:
                raise BrokerError(Failure.BAD_MESSAGE, "a transaction message cannot have a delay level")

    @staticmethod
    def writable_queue(config: TopicConfig, requested: int, message_group: str | None = None) -> int:
        """The queue a message goes to: ``requested``, or when it is negative its message group's (a FIFO message:
        a group's messages keep their order in one queue), else any writable one.

        Raises:
            BrokerError: FORBIDDEN (the topic takes no messages), BAD_REQUEST (no such queue).
        """
        if not config.writable:
            raise BrokerError(Failure.FORBIDDEN, f"the topic[{config.name}] sending message is forbidden")
        if requested < 0:
            if message_group:
                return fifo_queue(message_group, config.write_queue_nums)
            return random.randrange(config.write_queue_nums)
        if requested >= config.queue_nums:
            raise BrokerError(Failure.BAD_REQUEST, f"request queueId[{requested}] is illegal, topic "
                                                     f"{config.name} has {config.queue_nums} queues")
        return requested

    async def topic_for_send(self, topic: str, default_topic: str = DEFAULT_TOPIC,
                             default_queue_nums: int = 0) -> TopicConfig:
        """The topic's config, created on first send when autoCreateTopicEnable allows it (and its quotas)."""
        config = self.ctx.topics.get(topic)
        if config is None:
            config = await self.ctx.topics.ensure_for_send(topic, default_topic, default_queue_nums)
        return config

    # --- the write path ---
    def stamp(self, rec: MessageRecord) -> None:
        """What the broker adds to every message it stores."""
        rec.properties.pop(P.WAIT, None)
        rec.properties[P.CLUSTER] = self.cluster

    def submit_message(self, rec: MessageRecord, counted: bool = False) -> Completion:
        """Store ``rec`` (see store_op); a timer message also tells the timer service when it is due.

        Args:
            counted: a message sent in (not a consumer's copy): counted once it is stored (metrics.py
                ``count_stored``: no callback per message), under the topic it was sent to (a delayed message is
                stored in the schedule topic).
        """
        topic = rec.topic
        op = self.store_op(rec)
        completion = self.ctx.store.submit(op)
        if isinstance(op, PutTimed):
            completion.add_done_callback(lambda c: self.ctx.timers.stored(op.due_ms) if c.exception() is None
                                         else None)
        if counted and (metrics := self.ctx.metrics) is not None:
            metrics.uncounted.append((completion, topic, len(rec.body)))
        return completion

    def store_op(self, rec: MessageRecord) -> PutMessage | PutTimed:
        """The write storing ``rec``: to the schedule topic when it has a delay level (reference §6.4), to the timer
        topic when it has a delivery time ahead (RocketMQ 5's timer properties; a delay level wins over them, as in
        the reference), else to its topic.

        Raises:
            BrokerError: ILLEGAL_DELIVERY_TIME for a malformed delivery time or one beyond timerMaxDelaySec.
        """
        props = rec.properties
        level = delay_level(props)
        tx_type = rec.sys_flag & SysFlag.TRANSACTION_MASK
        plain = tx_type in (SysFlag.TRANSACTION_NOT_TYPE, SysFlag.TRANSACTION_COMMIT_TYPE)
        if level > 0 and plain:
            level = min(level, self.ctx.schedule.max_level)
            for key in TIMER_KEYS:
                props.pop(key, None)
            props[P.DELAY] = str(level)
            props[P.REAL_TOPIC] = rec.topic
            props[P.REAL_QID] = str(rec.queue_id)
            rec.topic = SCHEDULE_TOPIC
            rec.queue_id = level - 1
        elif plain and (due := self.ctx.timers.deliver_at(props)) is not None:
            return PutTimed(self.ctx.timers.timed_request(rec, due), due)
        return PutMessage(message_request(rec, index=plain))

    def stored(self, topic: str, size: int, count: int = 1) -> None:
        if self.ctx.metrics is not None:
            self.ctx.metrics.message_in(topic, size, count)
