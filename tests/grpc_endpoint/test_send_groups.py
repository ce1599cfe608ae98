"""Concurrent SendMessage calls share the store's write groups (issue 15: broker CPU per gRPC send); the store's
writer is SIGSTOPped to hold a group in flight while the next sends arrive."""
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


def send_request(index: int, deliver_at: int | None = None, transactional: bool = False) -> SendMessageRequest:
    request = SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name, msg.body = "Grouped", f"body-{index}".encode()
    msg.system_properties.message_id = f"01GROUPED{index:06d}"
    msg.system_properties.body_encoding = Encoding.IDENTITY
    if transactional:
        msg.system_properties.message_type = MessageType.TRANSACTION
    elif deliver_at is None:
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
    # Every third one a half: halves share the groups too.
    requests = [send_request(i, too_late if i == IN_FLIGHT // 2 else None, transactional=i % 3 == 1)
                for i in range(IN_FLIGHT)]
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


def test_a_send_whose_deadline_passes_while_it_waits_for_the_group_ahead_is_not_stored(grpc_broker):
    store = grpc_broker.broker.ctx.store
    assert raw_call(grpc_broker.endpoint, "SendMessage", send_request(-1)).status.code == Code.OK  # the topic
    writes = grpc_broker.broker.grpc.send.writes
    metadata = Signature.metadata(ClientConfiguration(grpc_broker.endpoint, Credentials("", "")), "late@1")
    with grpc.insecure_channel(grpc_broker.endpoint) as channel:
        send = MessagingServiceStub(channel).SendMessage
        writer = store.link.pid
        os.kill(writer, signal.SIGSTOP)  # the first send's group is not durable until the writer continues
        try:
            first = send.future(send_request(0), metadata=metadata, timeout=20)
            wait_until(lambda: writes._unfinished == 1)
            late = [send.future(send_request(i), metadata=metadata, timeout=1) for i in range(1, 5)]
            for call in late:
                with pytest.raises(grpc.RpcError) as refused:
                    call.result()
                assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            wait_until(lambda: len(writes._queued) == 4 and all(future.done() for _record, future in writes._queued))
        finally:
            os.kill(writer, signal.SIGCONT)
        assert first.result().status.code == Code.OK
        assert send(send_request(5), metadata=metadata, timeout=20).status.code == Code.OK  # written after them
    queues = grpc_broker.broker.ctx.topics.get("Grouped").write_queue_nums
    stored = sum(store.max_offset("Grouped", queue_id) for queue_id in range(queues))
    assert stored == 3  # the topic's first message, the first send and the last: the late ones were not written
