"""One store, both protocols: a message sent over gRPC is pulled by a remoting consumer and the other way round."""
from __future__ import annotations

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer

from halfmq.client import BlockingProducer, BlockingPullConsumer, Message as RemotingMessage

from .conftest import receive_all
from .test_produce_consume import message

pytestmark = pytest.mark.grpc


def test_grpc_producer_to_remoting_pull_consumer(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Mixed",)))
    receipt = producer.send(message("Mixed", b"from grpc", tag="T", keys="key-1", origin="v5"))
    with BlockingPullConsumer("RemotingReaders", grpc_broker.broker.namesrv_addr) as consumer:
        pulled = []
        for queue in consumer.fetch_subscribe_queues("Mixed"):
            pulled.extend(consumer.pull(queue, 0).messages)
    [msg] = pulled
    assert (msg.body, msg.tags, msg.keys, msg.properties["origin"], msg.msg_id) == (
        b"from grpc", "T", "key-1", "v5", receipt.message_id)


def test_remoting_producer_to_grpc_simple_consumer(grpc_broker, clients):
    with BlockingProducer("RemotingSenders", grpc_broker.broker.namesrv_addr) as producer:
        result = producer.send(RemotingMessage("Mixed4", b"from remoting", tags="R", keys="key-2",
                                               properties={"origin": "v4"}))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "V5Readers", {"Mixed4": FilterExpression("R")},
                                      await_duration=2))
    [msg] = receive_all(consumer, 1)
    assert (msg.body, msg.tag, msg.keys, msg.properties["origin"], msg.message_id) == (
        b"from remoting", "R", {"key-2"}, "v4", result.msg_id)
    consumer.ack(msg)


def test_grpc_sends_and_receives_count_in_the_broker_metrics(grpc_broker, clients):
    producer = clients(Producer(grpc_broker.config(), ("Counted",)))
    for i in range(3):
        producer.send(message("Counted", b"12345"))
    consumer = clients(SimpleConsumer(grpc_broker.config(), "Counters", {"Counted": FilterExpression("*")},
                                      await_duration=2))
    receive_all(consumer, 3)
    registry = grpc_broker.broker.ctx.metrics.registry
    labels = {"topic": "Counted", "consumer_group": "Counters"}
    assert grpc_broker.broker.ctx.metrics.messages_in["Counted"] == [3, 15]
    assert registry.get_sample_value("rocketmq_messages_out_total", labels) == 3
    assert registry.get_sample_value("rocketmq_throughput_out_total", labels) == 15
