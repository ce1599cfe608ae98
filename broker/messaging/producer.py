"""Sends, batches and half prepares: every rule a message obeys before it is stored, whatever door it came in by.

The checks are synchronous, so the remoting door's common send (a known topic) is answered from the store's
completion without a coroutine (measured: a coroutine per send cost 5% of send throughput); only what may create
a topic is awaited (``topic_for_send``).
"""
from __future__ import annotations

import random

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import MessageRecord
from halfmq.store import message_request
from halfmq.store.completion import Completion
from halfmq.store.ops import PutMessage
from halfmq.store.requests import PutRequest
from halfmq.store.timers import PutTimed

from ..errors import BrokerError, Failure
from ..names import check_message
from ..services.clients import ClientInfo
from ..services.timers import TIMER_KEYS
from ..topics import DEFAULT_TOPIC, SCHEDULE_TOPIC, SEND_FORBIDDEN, TopicConfig, check_message_type, validate_topic_name

#: topic names already validated (a regex per send otherwise); cleared when full, so it stays bounded
_MAX_VALID_TOPICS = 10_000


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


class ProducerService:
    def __init__(self, ctx):
        self.ctx = ctx
        self.max_body = ctx.config.maxMessageSize
        self.cluster = ctx.config.brokerClusterName
        self._valid_topics: set[str] = set()

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
    def writable_queue(config: TopicConfig, requested: int) -> int:
        """The queue a message goes to: ``requested``, or any writable one when it is negative.

        Raises:
            BrokerError: FORBIDDEN (the topic takes no messages), BAD_REQUEST (no such queue).
        """
        if not config.writable:
            raise BrokerError(Failure.FORBIDDEN, f"the topic[{config.name}] sending message is forbidden")
        if requested < 0:
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

    def submit_message(self, rec: MessageRecord) -> Completion:
        """Store ``rec`` (see store_op); a timer message also tells the timer service when it is due."""
        op = self.store_op(rec)
        completion = self.ctx.store.submit(op)
        if isinstance(op, PutTimed):
            completion.add_done_callback(lambda c: self.ctx.timers.stored(op.due_ms) if c.exception() is None
                                         else None)
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

    def prepare_half(self, rec: MessageRecord, group: str, channel, batch: list[PutRequest] | None = None,
                     sender: ClientInfo | None = None) -> Completion:
        """Store ``rec`` as a half filed under ``group`` (checked by check_message); value (PutResult, HalfState).

        ``sender`` (a remoting producer; a gRPC session registers through its telemetry stream) is registered as a
        live producer of ``group``: a half sent is a sign of life, so the group's halves waiting for a producer are
        checked with it at once (a producer reconnecting after a broker restart sends before its next heartbeat,
        30 s later for stock clients)."""
        if sender is not None:
            self.ctx.producers.register(group, sender)
        return self.ctx.transactions.prepare(rec, group, channel, batch)

    def stored(self, topic: str, size: int, count: int = 1) -> None:
        if self.ctx.metrics is not None:
            self.ctx.metrics.message_in(topic, size, count)
