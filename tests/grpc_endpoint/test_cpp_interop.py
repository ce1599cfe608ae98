"""Across protocols with a stock 4.x client: the RocketMQ C++ client (tests/interop) against 5.x clients."""
from __future__ import annotations

import asyncio

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer

from tests.interop.conftest import peer_python, run_peer  # noqa: F401  (fixtures)

from .conftest import receive_all
from .test_produce_consume import message

pytestmark = [pytest.mark.grpc, pytest.mark.interop]


async def test_v5_producer_to_cpp_push_consumer(grpc_broker, clients, run_peer):  # noqa: F811
    producer = clients(Producer(grpc_broker.config(), ("ToCpp",)))
    for i in range(20):
        await asyncio.to_thread(producer.send, message("ToCpp", f"body-{i}".encode(), tag=f"tag{i % 3}",
                                                       keys=f"key{i}", idx=str(i)))
    (out,) = await run_peer("consume", {"namesrv": grpc_broker.broker.namesrv_addr, "group": "CppReaders",
                                        "topic": "ToCpp", "expect": 20, "timeout": 40})
    got = sorted(out["received"], key=lambda m: int(m["idx"]))
    assert [(m["body"], m["tags"], m["keys"]) for m in got] == [
        (f"body-{i}", f"tag{i % 3}", f"key{i}") for i in range(20)]


async def test_cpp_producer_to_v5_simple_consumer(grpc_broker, clients, run_peer):  # noqa: F811
    sent = await run_peer("produce", {"namesrv": grpc_broker.broker.namesrv_addr, "group": "CppSenders",
                                      "topic": "FromCpp", "count": 20})
    ids = {line["msg_id"] for line in sent if "i" in line}
    consumer = clients(SimpleConsumer(grpc_broker.config(), "V5Readers", {"FromCpp": FilterExpression("*")},
                                      await_duration=2))
    got = await asyncio.to_thread(receive_all, consumer, 20)
    assert {m.message_id for m in got} == ids
    assert sorted((int(m.properties["idx"]), m.body, m.tag, tuple(m.keys)) for m in got) == [
        (i, f"body-{i}".encode(), f"tag{i % 3}", (f"key{i}",)) for i in range(20)]
    for m in got:
        await asyncio.to_thread(consumer.ack, m)
