"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and CONSUMER_SEND_MSG_BACK (36): the remoting
adapter of ProducerService (broker/messaging/producer.py): decode the send headers into a ``SendRequest`` or a
``BatchRequest`` and the caller into a ``Sender``, call the service, encode its result.

Reference §3.1 and §3.10. A send is answered only after the store made it durable.
"""
from __future__ import annotations

import random

from halfmq.protocol.codes import RequestCode, ResponseCode, SysFlag
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import (ConsumerSendMsgBackRequestHeader, SendMessageRequestHeader,
                                     SendMessageRequestHeaderV2)
from halfmq.protocol.message import MessageRecord, create_offset_msg_id, decode_record
from halfmq.protocol.properties import decode_properties

from ..context import BrokerContext
from ..dispatch import Deferred
from ..errors import BrokerError, Failure
from ..messaging.batch import BatchRequest
from ..messaging.dead_letter import consumer_copy
from ..messaging.producer import ProducerService, Sender, SendRequest, retry_limit
from ..names import check_group
from ..services.clients import ClientInfo
from ..topics import SYSTEM_TOPICS

# Plain ints, compared on every send (an enum member's lookup costs a tenth of a microsecond).
_SEND_MESSAGE, _SEND_BATCH_MESSAGE = int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_BATCH_MESSAGE)
_EXTRA = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
#: a client older than this version sends no maxReconsumeTimes to read (the reference's rule)
_MAX_RECONSUME_VERSION = 121


class RemotingSender(Sender):
    """A remoting producer: its half registers it as its heartbeat would (its client id once it sent one).

    A connection's sends are made as one RemotingSender (``Channel.sender``, built again when a send names another
    group or client version: ``SendProcessor.send``), not one each."""

    __slots__ = ("language", "version")

    def __init__(self, group: str | None, channel, cmd: RemotingCommand):
        # (Sender's fields set here: one call less)
        self.group, self.channel, self.language, self.version = group, channel, cmd.language, cmd.version

    def half_sent(self, producers, group: str, topic: str) -> None:
        channel = self.channel
        producers.register(group, ClientInfo(channel.client_id or channel.remote, channel, self.language,
                                             self.version))


class SendProcessor:
    """The remoting adapter of ProducerService: decodes the send headers, calls the service, encodes answers."""

    def __init__(self, ctx: BrokerContext, producer: ProducerService):
        self.ctx = ctx
        self.producer = producer

    def register(self, dispatcher) -> None:
        check_body = self.producer.check_body
        dispatcher.register(RequestCode.SEND_MESSAGE, self.send, check_body)
        dispatcher.register(RequestCode.SEND_MESSAGE_V2, self.send, check_body)
        dispatcher.register(RequestCode.SEND_BATCH_MESSAGE, self.send,
                            lambda size: check_body(size, "batch body"))
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.send_back)
        dispatcher.on_channel_closed(_forget_sender)

    # --- SEND_MESSAGE / V2 / BATCH ---
    def send(self, channel, cmd: RemotingCommand):
        if cmd.code == _SEND_MESSAGE:
            header = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        else:
            header = SendMessageRequestHeaderV2.from_ext(cmd.ext_fields)
        if cmd.code == _SEND_BATCH_MESSAGE:
            return self._send_batch(channel, cmd, header)
        store_host = self.ctx.store_host
        rec = MessageRecord(topic=header.topic, body=cmd.body, flag=header.flag, sys_flag=header.sysFlag,
                            born_timestamp=header.bornTimestamp, born_host=channel.remote,
                            store_host=store_host, reconsume_times=header.reconsumeTimes or 0,
                            properties=decode_properties(header.properties or ""))
        request = SendRequest(rec, header.queueId, None,
                              header.maxReconsumeTimes if cmd.version >= _MAX_RECONSUME_VERSION else None,
                              header.defaultTopic, header.defaultTopicQueueNums)
        sender = channel.sender  # the connection's, while its sends are alike (a call and an object less each)
        if (sender is None or sender.group != header.producerGroup or sender.version != cmd.version
                or sender.language != cmd.language):
            sender = channel.sender = RemotingSender(header.producerGroup, channel, cmd)
        sent = self.producer.send(request, sender)

        def answer(value) -> RemotingCommand:
            if request.half:
                result, state = value
                return cmd.response(ResponseCode.SUCCESS, ext_fields={
                    "msgId": create_offset_msg_id(store_host, result.physical_offset),
                    "queueId": str(request.queue_id), "queueOffset": str(result.queue_offset),
                    "transactionId": state.uniq, **_EXTRA})
            return cmd.response(ResponseCode.SUCCESS, ext_fields={
                "msgId": create_offset_msg_id(store_host, value.physical_offset),
                "queueId": str(request.queue_id), "queueOffset": str(value.queue_offset), **_EXTRA})

        return Deferred(sent, answer)

    async def _send_batch(self, channel, cmd: RemotingCommand, header) -> RemotingCommand:
        request = BatchRequest(header.topic, cmd.body, header.properties or "", header.queueId, header.sysFlag,
                               header.bornTimestamp, channel.remote, header.defaultTopic,
                               header.defaultTopicQueueNums)
        sent = await self.producer.send_batch(request, RemotingSender(header.producerGroup, channel, cmd))
        store_host = self.ctx.store_host
        ext = {"msgId": ",".join(create_offset_msg_id(store_host, r.physical_offset) for r in sent.results),
               "queueId": str(sent.queue_id), "queueOffset": str(sent.results[0].queue_offset), **_EXTRA}
        if sent.half is not None:
            ext["transactionId"] = sent.half.uniq
        return cmd.response(ResponseCode.SUCCESS, ext_fields=ext)

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
        max_times = retry_limit(header.maxReconsumeTimes if cmd.version >= _MAX_RECONSUME_VERSION else None)
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


def _forget_sender(channel) -> None:
    channel.sender = None  # it refers to the channel: no cycle left for the collector


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
