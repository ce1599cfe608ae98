"""A batch of messages checked whole before any of it is stored: the rules of SEND_BATCH_MESSAGE (a batch half is
halfmq's extension), behind ``ProducerService.send_batch``.

A batch is bounded whole: its body by maxMessageSize (as the reference does), its messages by maxBatchMessageCount
(which also keeps a remoting answer's message-id list inside a frame header), and it is prepared in slices that let
other clients' requests run between them (measured before: a 15 MiB batch of 683,853 tiny messages stalled every
other client for 11 s, and its answer header overflowed the frame).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag
from halfmq.protocol.message import MessageRecord, decode_batch, encode_record
from halfmq.protocol.properties import decode_properties, encode_properties, encoding_without
from halfmq.store import record_request
from halfmq.store.halfs import HalfState
from halfmq.store.requests import PutRequest, PutResult

from ..errors import BrokerError, Failure
from ..services.schedule import delay_level
from ..services.timers import TIMER_KEYS
from ..topics import DEFAULT_TOPIC, RETRY_PREFIX

#: messages prepared between two yields to the loop (~2 ms)
STEP = 256


@dataclass(slots=True)
class BatchRequest:
    """A batch as a door decoded it: its encoded messages (``body``, protocol/message.py's batch layout) and what
    they share (the batch's own properties, text as sent, flags, born time and host, the queue asked for)."""
    topic: str
    body: bytes
    properties: str = ""
    queue_id: int = -1
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    default_topic: str = DEFAULT_TOPIC
    default_queue_nums: int = 0


@dataclass(slots=True)
class BatchSent:
    """A stored batch: its queue, each message's PutResult in order (a batch half: the half's alone) and, for a
    batch half, its HalfState."""
    queue_id: int
    results: list[PutResult]
    half: HalfState | None


async def prepare_batch(producer, request: BatchRequest, group: str | None) -> tuple:
    """A batch checked whole and encoded: (the requests storing its messages, the batch's own properties, its
    UNIQ_KEY, the queue, the bodies' total size).

    Raises:
        BrokerError: BAD_MESSAGE (a retry topic, an empty batch, too many messages, too much inherited, a
            transactional, delayed or timer message inside), and what check_body, check_message and
            writable_queue refuse.
    """
    ctx = producer.ctx
    max_count = ctx.config.maxBatchMessageCount
    topic = request.topic
    if topic.startswith(RETRY_PREFIX):
        raise BrokerError(Failure.BAD_MESSAGE, "batch messages cannot be sent to a retry topic")
    producer.check_body(len(request.body), "batch body")
    items = decode_batch(request.body)
    if not items:
        raise BrokerError(Failure.BAD_MESSAGE, "the batch is empty")
    if len(items) > max_count:
        raise BrokerError(Failure.BAD_MESSAGE,
                          f"the batch holds {len(items)} messages, more than maxBatchMessageCount {max_count}")
    outer = decode_properties(request.properties)
    outer.pop(P.WAIT, None)
    if outer.get(P.TRAN_MSG) == "true":  # a batch half: one transaction for all of its messages
        producer.check_message(None, topic, outer, group)
    uniq = outer.pop(P.UNIQ_KEY, None)  # the batch's own: a batch half's transaction id, not its messages'
    outer[P.CLUSTER] = producer.cluster
    # Every message stores the batch's properties it inherits: bounded, so a small batch with one large batch
    # property cannot make the broker build and store thousands of copies of it (twice maxMessageSize leaves any
    # batch a client may send, with the usual few batch properties, far inside).
    inherited = len(encode_properties(outer).encode())
    stored = len(request.body) + len(items) * inherited
    if stored > 2 * producer.max_body:
        raise BrokerError(Failure.BAD_MESSAGE,
                          f"the batch's {len(items)} messages would each inherit {inherited} bytes of batch "
                          f"properties: {stored} bytes to store, more than twice maxMessageSize {producer.max_body}")
    # Every message is checked whole (with the batch-level properties it inherits) before the topic is resolved,
    # so a refused batch creates nothing.
    config = ctx.topics.get(topic)
    outer_text = encode_properties(outer)
    max_body = producer.max_body
    item_props = []  # each message's properties, and their text when it was cheaper to build here
    for index, item in enumerate(items):
        if index and not index % STEP:
            await asyncio.sleep(0)  # let other connections' requests run between slices
        props = decode_properties(item.properties)
        if (props.get(P.TRAN_MSG) == "true" or (P.DELAY in props and delay_level(props) > 0)
                or not props.keys().isdisjoint(TIMER_KEYS)):
            raise BrokerError(Failure.BAD_MESSAGE, "transactional, delayed or timer messages cannot be sent in a batch")
        if not 0 < len(item.body) <= max_body:
            producer.check_body(len(item.body), f"body of batch message {index}")
        own_text = encoding_without(item.properties, props, P.WAIT)
        if props.keys().isdisjoint(outer):
            # The usual message: its own properties, then the batch's, which it inherits whole (the text is the
            # merged map's, in the same order, without encoding the batch's properties again for each message, nor
            # its own when the text it came with is their encoding).
            text = own_text + outer_text
            props.update(outer)
        else:
            for key, value in outer.items():  # batch-level properties never override a message's own
                props.setdefault(key, value)
            text = None
        producer.check_message(config, topic, props, group)
        item_props.append((props, text))
    config = await producer.topic_for_send(topic, request.default_topic, request.default_queue_nums)
    queue_id = producer.writable_queue(config, request.queue_id)
    sys_flag = request.sys_flag & ~SysFlag.TRANSACTION_MASK
    requests: list[PutRequest] = []
    size = 0
    # One record of the batch's shared fields, its message's own set in turn: encode_record keeps none of it.
    rec = MessageRecord(topic=topic, queue_id=queue_id, sys_flag=sys_flag, born_timestamp=request.born_timestamp,
                        born_host=request.born_host, store_host=ctx.store_host)
    for index, (item, (props, text)) in enumerate(zip(items, item_props)):
        if index and not index % STEP:
            await asyncio.sleep(0)
        rec.body, rec.flag, rec.properties = item.body, item.flag, props
        size += len(item.body)
        requests.append(record_request(encode_record(rec, text), topic, queue_id, props))
    return requests, outer, uniq, queue_id, size
