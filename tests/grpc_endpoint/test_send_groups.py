"""Concurrent SendMessage calls share the store's write groups (issue 15: broker CPU per gRPC send)."""
from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.grpc_protocol import Code, Encoding, MessageType, SendMessageRequest
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.util.signature import Signature

from .conftest import raw_call, wait_until

pytestmark = pytest.mark.grpc
IN_FLIGHT = 48


def send_request(index: int, deliver_at: int | None = None) -> SendMessageRequest:
    request = SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name, msg.body = "Grouped", f"body-{index}".encode()
    msg.system_properties.message_id = f"01GROUPED{index:06d}"
    msg.system_properties.body_encoding = Encoding.IDENTITY
    if deliver_at is None:
        msg.system_properties.message_type = MessageType.NORMAL
    else:
        msg.system_properties.message_type = MessageType.DELAY
        msg.system_properties.delivery_timestamp.seconds = deliver_at
    return request


def test_sends_in_flight_together_are_written_in_shared_groups_each_with_its_own_answer(grpc_broker_factory):
    broker = grpc_broker_factory(timerMaxDelaySec=60)
    store = broker.broker.ctx.store
    assert raw_call(broker.endpoint, "SendMessage", send_request(-1)).status.code == Code.OK  # creates the topic
    too_late = int(time.time()) + 3600  # beyond timerMaxDelaySec: refused by the write path, alone
    requests = [send_request(i, too_late if i == IN_FLIGHT // 2 else None) for i in range(IN_FLIGHT)]
    metadata = Signature.metadata(ClientConfiguration(broker.endpoint, Credentials("", "")), "grouped@1")
    endpoint = broker.broker.grpc
    with grpc.insecure_channel(broker.endpoint) as channel:
        send = MessagingServiceStub(channel).SendMessage
        groups_before, ops_before = store.total_groups, store.total_ops
        # The store's writer stopped: every send of the burst has reached the write path before any is durable.
        writer = store.link.pid
        os.kill(writer, signal.SIGSTOP)
        try:
            calls = [send.future(request, metadata=metadata, timeout=20) for request in requests]
            wait_until(lambda: endpoint.requests == 1 + IN_FLIGHT)  # a call is served up to its write unsuspended
        finally:
            os.kill(writer, signal.SIGCONT)
        answers = [call.result() for call in calls]
        groups, ops = store.total_groups - groups_before, store.total_ops - ops_before
    codes = [answer.status.code for answer in answers]
    assert codes[IN_FLIGHT // 2] == Code.ILLEGAL_DELIVERY_TIME
    assert codes[:IN_FLIGHT // 2] + codes[IN_FLIGHT // 2 + 1:] == [Code.OK] * (IN_FLIGHT - 1)
    # one group for the first send, one for those that came while it was written (each its own group before)
    assert (ops, groups) == (IN_FLIGHT - 1, 2)
