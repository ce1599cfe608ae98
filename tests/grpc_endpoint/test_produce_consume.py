"""Producer (NORMAL, FIFO) and SimpleConsumer (receive, ack, invisibility, redelivery, DLQ) over gRPC."""
from __future__ import annotations

import asyncio
import time

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer
from rocketmq.v5.exception import BadRequestException

from halfmq.broker.services.long_poll import ANY_QUEUE
from halfmq.client.admin import Admin
from halfmq.protocol.message import decode_record

from .conftest import receive_all

pytestmark = pytest.mark.grpc


def message(topic: str, body: bytes, tag: str | None = None, keys: str | None = None, group: str | None = None,
            **props) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    if tag:
        msg.tag = tag
    if keys:
        msg.keys = keys
    if group:
        msg.message_group = group
    for key, value in props.items():
        msg.add_property(key, value)
    return msg


def test_normal_messages_are_received_with_their_attributes_and_acked_once(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Orders",)))
    receipts = [producer.send(message("Orders", f"order {i}".encode(), tag="new", keys=f"k{i}", shop="s1"))
                for i in range(5)]
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Billing", {"Orders": FilterExpression("new")},
                                      await_duration=2))
    got = receive_all(consumer, 5)
    assert sorted(m.body for m in got) == [f"order {i}".encode() for i in range(5)]
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    first = next(m for m in got if m.body == b"order 0")
    assert (first.tag, first.keys, first.properties.get("shop"), first.delivery_attempt) == ("new", {"k0"}, "s1", 1)
    for m in got:
        consumer.ack(m)
    assert consumer.receive(32, 30) == []  # acknowledged: never again for this group
    with pytest.raises(BadRequestException):
        consumer.ack(got[0])  # its receipt is gone


def test_tag_filter_skips_other_tags(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Tagged",)))
    producer.send(message("Tagged", b"a", tag="A"))
    producer.send(message("Tagged", b"b", tag="B"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "OnlyB", {"Tagged": FilterExpression("B")},
                                      await_duration=1))
    got = receive_all(consumer, 1)
    assert [m.body for m in got] == [b"b"]
    assert consumer.receive(32, 30) == []


def test_fifo_group_goes_to_one_queue_and_the_next_waits_for_the_ack(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Fifo",)))
    for i in range(3):
        producer.send(message("Fifo", f"a{i}".encode(), group="account-1"))
    store = grpc_broker.broker.store
    assert [store.max_offset("Fifo", q) for q in store.queue_ids("Fifo")].count(3) == 1  # one queue for the group
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Ledger", {"Fifo": FilterExpression("*")},
                                      await_duration=1))
    order = []
    for _ in range(3):
        [msg] = consumer.receive(1, 30)
        assert consumer.receive(1, 30) == []  # the next of the group waits until this one is acknowledged
        order.append(msg.body)
        consumer.ack(msg)
    assert order == [b"a0", b"a1", b"a2"]


def test_unacked_message_comes_back_after_its_invisible_duration_with_its_attempt_counted(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Jobs",)))
    producer.send(message("Jobs", b"job"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Workers", {"Jobs": FilterExpression("*")},
                                      await_duration=2))
    [first] = receive_all(consumer, 1, invisible_s=1)
    started = time.monotonic()
    [again] = receive_all(consumer, 1, invisible_s=30)  # long-polls until it is visible again
    assert time.monotonic() - started >= 0.5
    assert (again.message_id, again.delivery_attempt) == (first.message_id, 2)
    with pytest.raises(BadRequestException):
        consumer.ack(first)  # the older receipt handle expired with the redelivery
    consumer.ack(again)
    assert consumer.receive(32, 1) == []


def test_change_invisible_duration_extends_and_shortens(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Slow",)))
    producer.send(message("Slow", b"slow job"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "SlowWorkers", {"Slow": FilterExpression("*")},
                                      await_duration=1))
    [msg] = receive_all(consumer, 1, invisible_s=1)
    old_handle = msg.receipt_handle
    consumer.change_invisible_duration(msg, 30)  # extended: not delivered again after the first 1 s
    assert msg.receipt_handle != old_handle
    assert consumer.receive(32, 30) == [] and consumer.receive(32, 30) == []
    consumer.change_invisible_duration(msg, 0)   # visible again now
    [again] = receive_all(consumer, 1)
    assert (again.message_id, again.delivery_attempt) == (msg.message_id, 2)
    consumer.ack(again)


def test_message_goes_to_the_dlq_after_max_attempts(grpc_broker_factory, clients):
    grpc_broker = grpc_broker_factory(grpcMaxDeliveryAttempts=2)
    producer = clients(Producer(grpc_broker.config(), ("Poison",)))
    receipt = producer.send(message("Poison", b"poison", keys="p1"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Fragile", {"Poison": FilterExpression("*")},
                                      await_duration=3))
    assert [m.delivery_attempt for m in receive_all(consumer, 1, invisible_s=1)] == [1]
    assert [m.delivery_attempt for m in receive_all(consumer, 1, invisible_s=1)] == [2]
    assert consumer.receive(32, 1) == []  # the third time it is due, it goes to the DLQ instead
    store = grpc_broker.broker.store
    assert store.max_offset("%DLQ%Fragile", 0) == 1
    [raw] = store.read_queue("%DLQ%Fragile", 0, 0, 10, None, 1 << 20)[0]
    dead = decode_record(raw)
    assert (dead.body, dead.properties["UNIQ_KEY"], dead.reconsume_times) == (b"poison", receipt.message_id, 2)


def test_receipts_survive_a_restart(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Durable",)))
    for body in (b"one", b"two"):
        producer.send(message("Durable", body))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Keeper", {"Durable": FilterExpression("*")},
                                      await_duration=3))
    got = {m.body: m for m in receive_all(consumer, 2, invisible_s=2)}
    consumer.ack(got[b"one"])
    for client in (consumer, producer):
        client.shutdown()
    grpc_broker.restart()
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Keeper", {"Durable": FilterExpression("*")},
                                      await_duration=2))
    [again] = receive_all(consumer, 1)  # "two" once its invisible time is over; "one" never
    assert (again.body, again.delivery_attempt) == (b"two", 2)
    consumer.ack(again)
    assert consumer.receive(32, 30) == []


def test_forward_to_dead_letter_queue_moves_a_received_message(grpc_broker, clients):
    from rocketmq.grpc_protocol import Code, ForwardMessageToDeadLetterQueueRequest

    from .conftest import raw_call
    producer = clients(Producer(grpc_broker.config(), ("Doomed",)))
    producer.send(message("Doomed", b"doomed"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Giveup", {"Doomed": FilterExpression("*")},
                                      await_duration=2))
    [msg] = receive_all(consumer, 1)
    request = ForwardMessageToDeadLetterQueueRequest()
    request.group.name, request.topic.name = "Giveup", "Doomed"
    request.receipt_handle, request.message_id = msg.receipt_handle, msg.message_id
    request.delivery_attempt, request.max_delivery_attempts = 1, 1
    assert raw_call(grpc_broker.endpoint, "ForwardMessageToDeadLetterQueue", request).status.code == Code.OK
    assert raw_call(grpc_broker.endpoint, "ForwardMessageToDeadLetterQueue", request).status.code == \
        Code.INVALID_RECEIPT_HANDLE  # done once: the receipt is gone
    assert grpc_broker.broker.store.max_offset("%DLQ%Giveup", 0) == 1
    with pytest.raises(BadRequestException):
        consumer.ack(msg)


def test_auto_renewed_receipts_stay_invisible_and_keep_their_handle(grpc_broker, clients):
    from rocketmq.grpc_protocol import AckMessageRequest, Code, ReceiveMessageRequest

    from halfmq.store.receipts import read_receipts

    from .conftest import raw_call
    clients(Producer(grpc_broker.config(), ("Renewed",))).send(message("Renewed", b"long job"))
    request = ReceiveMessageRequest()
    request.group.name, request.message_queue.topic.name, request.batch_size = "Pushers", "Renewed", 1
    request.message_queue.id, request.auto_renew = -1, True  # a push consumer's receive: no invisible duration
    [answer] = [a for a in raw_call(grpc_broker.endpoint, "ReceiveMessage", request) if a.HasField("message")]
    handle = answer.message.system_properties.receipt_handle
    queue_id = answer.message.system_properties.queue_id
    endpoint = grpc_broker.broker.grpc
    [before] = read_receipts(grpc_broker.broker.store, "Pushers", "Renewed", queue_id)
    grpc_broker.call(endpoint.receive.renew())  # the periodic renewal, run now
    [after] = read_receipts(grpc_broker.broker.store, "Pushers", "Renewed", queue_id)
    assert after.visible_at > before.visible_at and after.version == before.version
    ack = AckMessageRequest()
    ack.group.name, ack.topic.name = "Pushers", "Renewed"
    ack.entries.add(message_id=answer.message.system_properties.message_id, receipt_handle=handle)
    assert raw_call(grpc_broker.endpoint, "AckMessage", ack).status.code == Code.OK  # the handle still holds
    assert endpoint.receive.receipts.renewing == {}


def test_acknowledging_a_fifo_message_wakes_a_waiting_receive_for_the_next(grpc_broker, clients):
    import threading
    producer = clients(Producer(grpc_broker.config(), ("FifoWake",)))
    for i in range(2):
        producer.send(message("FifoWake", f"w{i}".encode(), group="g"))
    config = grpc_broker.config()
    holder = clients(SimpleConsumer(config, "Waiters", {"FifoWake": FilterExpression("*")}, await_duration=1))
    waiter = clients(SimpleConsumer(config, "Waiters", {"FifoWake": FilterExpression("*")}, await_duration=10))
    [first] = holder.receive(1, 30)
    got = []
    thread = threading.Thread(target=lambda: got.extend(waiter.receive(1, 30)))
    thread.start()
    held = grpc_broker.broker.ctx.long_poll.held
    from .conftest import wait_until
    wait_until(lambda: ("FifoWake", ANY_QUEUE) in held)  # the waiter's receive is held: w1 waits for w0's ack
    started = time.monotonic()
    holder.ack(first)
    thread.join(15)
    assert [m.body for m in got] == [b"w1"] and time.monotonic() - started < 5  # not at the end of its long poll


def test_a_topic_deleted_and_created_again_is_received_from_its_start(grpc_broker, clients):
    """Before: deleteTopic left the group's cursors behind, so the new topic's first messages were skipped."""
    producer = clients(Producer(grpc_broker.config(), ("Recreated",)))
    for i in range(32):  # every queue of the topic gets some: every cursor moves past 0
        producer.send(message("Recreated", b"old %d" % i))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Readers", {"Recreated": FilterExpression("*")},
                                      await_duration=2))
    for m in receive_all(consumer, 32):
        consumer.ack(m)

    async def delete() -> None:
        async with Admin(grpc_broker.broker.namesrv_addr) as admin:
            await admin.delete_topic("Recreated")

    asyncio.run(delete())
    producer.send(message("Recreated", b"new"))
    assert [m.body for m in receive_all(consumer, 1, timeout=10)] == [b"new"]
