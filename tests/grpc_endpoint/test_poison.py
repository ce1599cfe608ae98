"""Poison isolation: a message that cannot be copied to the dead-letter queue affects only itself (issue 22)."""
from __future__ import annotations

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, Encoding, MessageType, SendMessageRequest

from halfmq.broker.context import now_ms
from halfmq.protocol.message import decode_record
from halfmq.store.receipts import read_receipts

from .conftest import raw_call, receive_all, wait_until
from .test_produce_consume import message

pytestmark = pytest.mark.grpc


def _send_raw(endpoint: str, topic: str, body: bytes, props: dict[str, str], message_id: str):
    request = SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name, msg.body = topic, body
    msg.system_properties.message_id = message_id
    msg.system_properties.body_encoding = Encoding.IDENTITY
    msg.system_properties.message_type = MessageType.NORMAL
    msg.user_properties.update(props)
    return raw_call(endpoint, "SendMessage", request)


def test_a_message_whose_dlq_copy_would_not_fit_is_dead_lettered_and_its_neighbours_delivered(grpc_broker_factory,
                                                                                             clients):
    """Its properties are a few bytes under the record's limit, so the copy's RETRY_TOPIC and ORIGIN_MESSAGE_ID
    would push it over: every receive of the group answered BAD_REQUEST once it was due for the DLQ, forever."""
    broker = grpc_broker_factory(grpcMaxDeliveryAttempts=1, defaultTopicQueueNums=1)  # both in one queue
    # The largest property the record takes: a few bytes under the properties limit once stored.
    size = 32_767
    while _send_raw(broker.endpoint, "Heavy", b"poison", {"big": "x" * size}, "01POISON").status.code != Code.OK:
        size -= 8
    consumer = clients(SimpleConsumer(broker.config(), "Careful", {"Heavy": FilterExpression("*")},
                                      await_duration=2))
    [first] = receive_all(consumer, 1, invisible_s=1)
    assert first.message_id == "01POISON"
    store = broker.broker.store
    [held] = read_receipts(store, "Careful", "Heavy", 0)
    wait_until(lambda: now_ms() > held.visible_at)  # due again: for the DLQ
    producer = clients(Producer(broker.config(), ("Heavy",)))
    good = producer.send(message("Heavy", b"good"))
    [next_one] = receive_all(consumer, 1)
    assert (next_one.message_id, next_one.body) == (good.message_id, b"good")
    consumer.ack(next_one)
    assert store.max_offset("%DLQ%Careful", 0) == 1
    [raw] = store.read_queue("%DLQ%Careful", 0, 0, 10, None, 1 << 20)[0]
    dead = decode_record(raw)
    assert (dead.body, dead.properties["big"], dead.properties["UNIQ_KEY"]) == (b"poison", "x" * size, "01POISON")
    assert "ORIGIN_MESSAGE_ID" not in dead.properties  # what did not fit
