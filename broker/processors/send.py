"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and CONSUMER_SEND_MSG_BACK (36).

Reference §3.1 and §3.10. A send is answered only after the store made it durable.
"""
from __future__ import annotations

import asyncio
import random
import weakref

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader,
                                     SendMessageRequestHeaderV2)
from halfmq.protocol.message import (MessageRecord, create_offset_msg_id, decode_batch, decode_record,
                                     encode_record)
from halfmq.protocol.properties import decode_properties, encode_properties, encoding_without
from halfmq.store import record_request
from halfmq.store.ops import PutMessages

from ..context import BrokerContext
from ..dispatch import Deferred
from ..errors import BrokerError, Failure
from ..messaging.dead_letter import consumer_copy
from ..messaging.producer import ProducerService, delay_level
from ..names import check_group
from ..services.clients import ClientInfo
from ..services.timers import TIMER_KEYS
from ..topics import DLQ_PREFIX, RETRY_PREFIX, SYSTEM_TOPICS

DEFAULT_MAX_RECONSUME_TIMES = 16
# Plain ints, compared on every send (an enum member's lookup costs a tenth of a microsecond).
_SEND_MESSAGE, _SEND_BATCH_MESSAGE = int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_BATCH_MESSAGE)
_EXTRA = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


class SendProcessor:
    """The remoting adapter of ProducerService: decodes the send headers, calls the service, encodes answers."""

    def __init__(self, ctx: BrokerContext, producer: ProducerService):
        self.ctx = ctx
        self.producer = producer
        #: each connection's turn to prepare a batch (_send_batch)
        self._batch_turns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def register(self, dispatcher) -> None:
        check_body = self.producer.check_body
        dispatcher.register(RequestCode.SEND_MESSAGE, self.send, check_body)
        dispatcher.register(RequestCode.SEND_MESSAGE_V2, self.send, check_body)
        dispatcher.register(RequestCode.SEND_BATCH_MESSAGE, self.send,
                            lambda size: check_body(size, "batch body"))
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.send_back)

    # --- SEND_MESSAGE / V2 / BATCH ---
    def send(self, channel, cmd: RemotingCommand):
        if cmd.code == _SEND_MESSAGE:
            header = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        else:
            header = SendMessageRequestHeaderV2.from_ext(cmd.ext_fields)
        self.producer.check_topic(header.topic)
        if cmd.code == _SEND_BATCH_MESSAGE:
            return self._send_batch(channel, cmd, header)
        self.producer.check_body(len(cmd.body))
        return self._send_one(channel, cmd, header)

    async def _topic_config(self, header, topic: str):
        return await self.producer.topic_for_send(topic, header.defaultTopic, header.defaultTopicQueueNums)

    def _send_one(self, channel, cmd: RemotingCommand, header):
        """The common case (known topic, not a retry) is answered by a Deferred on the store's future."""
        config = self.ctx.topics.get(header.topic)
        if config is None or header.topic.startswith(RETRY_PREFIX):
            return self._send_one_slow(channel, cmd, header)
        props = decode_properties(header.properties or "")
        self.producer.check_message(config, header.topic, props, header.producerGroup)
        return self._store_one(channel, cmd, header, header.topic, self.producer.writable_queue(config, header.queueId),
                               props)

    async def _send_one_slow(self, channel, cmd: RemotingCommand, header) -> RemotingCommand:
        topic = header.topic
        props = decode_properties(header.properties or "")
        if topic.startswith(RETRY_PREFIX):
            max_times = header.maxReconsumeTimes
            if max_times is None or max_times < 0 or cmd.version < 121:
                max_times = DEFAULT_MAX_RECONSUME_TIMES
            if (header.reconsumeTimes or 0) >= max_times:
                topic = DLQ_PREFIX + topic[len(RETRY_PREFIX):]
                props.pop(P.DELAY, None)
        config = await self._topic_config(header, topic)
        # a retry turned into a DLQ copy is not held to the retry topic's type (the reference checks neither)
        self.producer.check_message(config if topic == header.topic else None, header.topic, props,
                                    header.producerGroup)
        queue_id = self.producer.writable_queue(config, header.queueId)
        result = self._store_one(channel, cmd, header, topic, queue_id, props)
        if isinstance(result, Deferred):
            return result.finish(await result.future)
        return await result

    def _store_one(self, channel, cmd: RemotingCommand, header, topic: str, queue_id: int, props: dict):
        ctx = self.ctx
        rec = MessageRecord(topic=topic, body=cmd.body, queue_id=queue_id, flag=header.flag,
                            sys_flag=header.sysFlag, born_timestamp=header.bornTimestamp,
                            born_host=channel.remote, store_host=ctx.store_host,
                            reconsume_times=header.reconsumeTimes or 0, properties=props)
        self.producer.stamp(rec)
        if props.get(P.TRAN_MSG) == "true":
            completion = self.producer.prepare_half(rec, header.producerGroup, channel,
                                                    sender=_sender(channel, cmd))
            return Deferred(completion, lambda value: self._half_response(cmd, queue_id, value[0], value[1].uniq))
        completion = self.producer.submit_message(rec)
        size = len(cmd.body)

        def finish(result) -> RemotingCommand:
            self.producer.stored(topic, size)
            return cmd.response(ResponseCode.SUCCESS, ext_fields={
                "msgId": create_offset_msg_id(ctx.store_host, result.physical_offset),
                "queueId": str(queue_id), "queueOffset": str(result.queue_offset), **_EXTRA})

        return Deferred(completion, finish)

    def _half_response(self, cmd: RemotingCommand, queue_id: int, result, transaction_id: str) -> RemotingCommand:
        ctx = self.ctx
        return cmd.response(ResponseCode.SUCCESS, ext_fields={
            "msgId": create_offset_msg_id(ctx.store_host, result.physical_offset),
            "queueId": str(queue_id), "queueOffset": str(result.queue_offset),
            "transactionId": transaction_id, **_EXTRA})

    async def _send_batch(self, channel, cmd: RemotingCommand, header) -> RemotingCommand:
        """A batch is bounded whole: its body by maxMessageSize (as the reference does), its messages by
        maxBatchMessageCount (which also keeps the answer's message-id list inside a frame header), and it is
        prepared in slices that let other clients' requests run between them (measured before: a 15 MiB batch of
        683,853 tiny messages stalled every other client for 11 s, and its answer header overflowed the frame).

        A connection's batches are prepared one after the other, in the order they came: the first is stored while
        the next is prepared. Prepared side by side, a slice of each per loop turn, a connection pipelining n
        batches held n slices of every turn and each of its batches was done only when all were (the Spark sink's
        4 batch halves per task: answered together after 180-270 ms, its worker idle meanwhile)."""
        turn = self._batch_turns.get(channel)
        if turn is None:
            turn = self._batch_turns[channel] = asyncio.Lock()
        async with turn:
            prepared = await self._prepare_batch(channel, cmd, header)
        items, requests, outer, uniq, queue_id = prepared
        ctx = self.ctx
        if outer.get(P.TRAN_MSG) == "true":
            if uniq is not None:
                outer[P.UNIQ_KEY] = uniq
            half = MessageRecord(topic=header.topic, body=b"", queue_id=queue_id, sys_flag=header.sysFlag,
                                 born_timestamp=header.bornTimestamp, born_host=channel.remote,
                                 store_host=ctx.store_host, properties=outer)
            result, state = await self.producer.prepare_half(half, header.producerGroup, channel, requests,
                                                             _sender(channel, cmd))
            return self._half_response(cmd, queue_id, result, state.uniq)
        results = await ctx.store.submit(PutMessages(requests))
        self.producer.stored(header.topic, sum(len(i.body) for i in items), len(items))
        return cmd.response(ResponseCode.SUCCESS, ext_fields={
            "msgId": ",".join(create_offset_msg_id(ctx.store_host, r.physical_offset) for r in results),
            "queueId": str(queue_id), "queueOffset": str(results[0].queue_offset), **_EXTRA})

    async def _prepare_batch(self, channel, cmd: RemotingCommand, header) -> tuple:
        """A batch checked whole and encoded: (its items, the requests storing them, the batch's own properties,
        its UNIQ_KEY, the queue)."""
        ctx = self.ctx
        max_count = ctx.config.maxBatchMessageCount
        step = 256  # messages prepared between two yields to the loop (~2 ms)
        topic = header.topic
        if topic.startswith(RETRY_PREFIX):
            raise BrokerError(Failure.BAD_MESSAGE, "batch messages cannot be sent to a retry topic")
        producer = self.producer
        producer.check_body(len(cmd.body), "batch body")
        items = decode_batch(cmd.body)
        if not items:
            raise BrokerError(Failure.BAD_MESSAGE, "the batch is empty")
        if len(items) > max_count:
            raise BrokerError(Failure.BAD_MESSAGE,
                              f"the batch holds {len(items)} messages, more than maxBatchMessageCount {max_count}")
        outer = decode_properties(header.properties or "")
        outer.pop(P.WAIT, None)
        transactional = outer.get(P.TRAN_MSG) == "true"
        if transactional:  # a batch half (halfmq's extension): one transaction for all of its messages
            producer.check_message(None, topic, outer, header.producerGroup)
        uniq = outer.pop(P.UNIQ_KEY, None)  # the batch's own: a batch half's transaction id, not its messages'
        outer[P.CLUSTER] = producer.cluster
        # Every message stores the batch's properties it inherits: bounded, so a small batch with one large batch
        # property cannot make the broker build and store thousands of copies of it (twice maxMessageSize leaves
        # any batch a client may send, with the usual few batch properties, far inside).
        inherited = len(encode_properties(outer).encode())
        stored = len(cmd.body) + len(items) * inherited
        if stored > 2 * producer.max_body:
            raise BrokerError(Failure.BAD_MESSAGE,
                              f"the batch's {len(items)} messages would each inherit {inherited} bytes of batch "
                              f"properties: {stored} bytes to store, more than twice maxMessageSize "
                              f"{producer.max_body}")
        # Every message is checked whole (with the batch-level properties it inherits) before the topic is
        # resolved, so a refused batch creates nothing.
        config = ctx.topics.get(topic)
        outer_text = encode_properties(outer)
        max_body = producer.max_body
        item_props = []  # each message's properties, and their text when it was cheaper to build here
        for index, item in enumerate(items):
            if index and not index % step:
                await asyncio.sleep(0)  # let other connections' requests run between slices
            props = decode_properties(item.properties)
            if (props.get(P.TRAN_MSG) == "true" or (P.DELAY in props and delay_level(props) > 0)
                    or not props.keys().isdisjoint(TIMER_KEYS)):
                raise BrokerError(Failure.BAD_MESSAGE,
                                  "transactional, delayed or timer messages cannot be sent in a batch")
            if not 0 < len(item.body) <= max_body:
                producer.check_body(len(item.body), f"body of batch message {index}")
            own_text = encoding_without(item.properties, props, P.WAIT)
            if props.keys().isdisjoint(outer):
                # The usual message: its own properties, then the batch's, which it inherits whole (the text is the
                # merged map's, in the same order, without encoding the batch's properties again for each message,
                # nor its own when the text it came with is their encoding).
                text = own_text + outer_text
                props.update(outer)
            else:
                for key, value in outer.items():  # batch-level properties never override a message's own
                    props.setdefault(key, value)
                text = None
            producer.check_message(config, topic, props, header.producerGroup)
            item_props.append((props, text))
        queue_id = producer.writable_queue(await self._topic_config(header, topic), header.queueId)
        host = channel.remote
        sys_flag = header.sysFlag & ~SysFlag.TRANSACTION_MASK
        requests = []
        # One record of the batch's shared fields, its message's own set in turn: encode_record keeps none of it.
        rec = MessageRecord(topic=topic, queue_id=queue_id, sys_flag=sys_flag, born_timestamp=header.bornTimestamp,
                            born_host=host, store_host=ctx.store_host)
        for index, (item, (props, text)) in enumerate(zip(items, item_props)):
            if index and not index % step:
                await asyncio.sleep(0)
            rec.body, rec.flag, rec.properties = item.body, item.flag, props
            requests.append(record_request(encode_record(rec, text), topic, queue_id, props))
        return items, requests, outer, uniq, queue_id

    # --- CONSUMER_SEND_MSG_BACK ---
    async def send_back(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        header = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
        check_group(header.group, "group")  # it names the retry and DLQ topics the copy goes to
        ctx = self.ctx
        raw = ctx.store.read_record(header.offset) if header.offset >= 0 else None
        if raw is None:
            raise BrokerError(Failure.MESSAGE_MISSING, f"look message by offset failed, {header.offset}")
        rec = decode_record(raw)
        ctx.acl.check_record(channel, cmd, rec.topic)
        _check_consumable(rec, header.offset)
        max_times = header.maxReconsumeTimes
        if max_times is None or max_times < 0 or cmd.version < 121:
            max_times = DEFAULT_MAX_RECONSUME_TIMES
        # The copy goes to the group's own topics: the group must exist or be allowed to (topics.py quotas).
        retry = await ctx.topics.ensure_group(header.group)
        level = 0
        if rec.reconsume_times >= max_times or header.delayLevel < 0:
            target = await ctx.topics.ensure_dlq(header.group)
        else:
            target = retry
            level = header.delayLevel or 3 + rec.reconsume_times
        new = consumer_copy(rec, target.name, random.randrange(target.write_queue_nums), rec.topic,
                            header.originMsgId or rec.msg_id, rec.reconsume_times + 1, ctx.store_host, level)
        await self.producer.submit_message(new)
        return cmd.response(ResponseCode.SUCCESS)


def _check_consumable(rec: MessageRecord, offset: int) -> None:
    """Only what a consumer could have been served is sent back: a committed or plain message of a user topic.

    A half (pending, rolled back or discarded: it stays in the half topic or TRANS_CHECK_MAX_TIME_TOPIC), an
    op record or a delayed message's schedule copy would otherwise become readable in a retry or DLQ topic.

    Raises:
        BrokerError: MESSAGE_ILLEGAL.
    """
    tx_type = rec.sys_flag & SysFlag.TRANSACTION_MASK
    if rec.topic in SYSTEM_TOPICS or tx_type not in (SysFlag.TRANSACTION_NOT_TYPE, SysFlag.TRANSACTION_COMMIT_TYPE):
        raise BrokerError(Failure.BAD_MESSAGE,
                          f"the record at offset {offset} is not a consumable message: only committed messages of a "
                          f"user topic can be sent back")


def _sender(channel, cmd: RemotingCommand) -> ClientInfo:
    """The producer a half came from, as its heartbeat would register it (its client id once it sent one)."""
    return ClientInfo(channel.client_id or channel.remote, channel, cmd.language, cmd.version)

