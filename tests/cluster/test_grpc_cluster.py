"""RocketMQ 5 clients in a cluster: every broker's gRPC QueryRoute answers the whole cluster's queues, each with
its own broker's endpoint, so the official client sends to, receives from and checks transactions with every broker.
Real processes on loopback: 2 name servers, 3 brokers with gRPC on."""
from __future__ import annotations

import asyncio
import collections
import os
import queue
import time

import pytest
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer,
                      TransactionChecker, TransactionResolution)

from halfmq.broker.grpc.schema import Code, Encoding, MessageType, pb
from halfmq.client.admin import Admin

from tests.support.cluster import LocalCluster, until
from tests.support.grpc_raw import GrpcRaw, signed_metadata
from tests.support import rocketmq5

pytestmark = pytest.mark.grpc
BROKERS = ("broker-0", "broker-1", "broker-2")
#: fast registrations and checks; 2 queues per auto-created topic, so round-robin sends reach every broker soon
FLAGS = ("--registerNameServerPeriod=300", "--brokerNotActiveTimeoutMillis=2000", "--grpcListenPort=0",
         "--defaultTopicQueueNums=2", "--transactionTimeOut=300", "--transactionCheckInterval=300")


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=2, brokers=3, broker_flags=FLAGS,
                                 namesrv_flags=("--scanNotActiveBrokerInterval=200",)).start()
    yield cluster
    await cluster.stop()


def client_config(broker) -> ClientConfiguration:
    return ClientConfiguration(broker.grpc_addr, Credentials("", ""), request_timeout=5)


def message(topic: str, body: bytes) -> Message:
    msg = Message()
    msg.topic, msg.body = topic, body
    return msg


async def call(broker, method: str, request):
    """One RPC to ``broker``'s gRPC endpoint; a ReceiveMessage's answers as a list."""
    raw = GrpcRaw(broker.grpc_addr)
    try:
        answer = raw.stub(method)(request, metadata=signed_metadata("cluster-test@1"), timeout=10)
        return [item async for item in answer] if method == "ReceiveMessage" else await answer
    finally:
        await raw.close()


async def route_of(broker, topic: str) -> dict:
    """broker name → (queue ids, the endpoint advertised with them), as ``broker`` answers QueryRoute."""
    answer = await call(broker, "QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=topic)))
    assert answer.status.code == Code["OK"], answer.status
    served = collections.defaultdict(lambda: ([], set()))
    for mq in answer.message_queues:
        ids, ends = served[mq.broker.name]
        ids.append(mq.id)
        ends.update(f"{a.host}:{a.port}" for a in mq.broker.endpoints.addresses)
    return dict(served)


def receive_request(topic: str, group: str, broker_name: str, polling_s: int = 0) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=32, auto_renew=False)
    request.message_queue.topic.name = topic
    request.message_queue.broker.name = broker_name
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = polling_s
    request.filter_expression.expression = "*"
    return request


def receive_all(consumer, count: int, timeout: float = 60.0) -> list:
    """What ``consumer`` receives until ``count`` messages came (each receive long-polls one broker)."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} messages within {timeout} s"
        got.extend(consumer.receive(32, 30))
    return got


async def test_every_broker_routes_the_whole_cluster_and_the_official_client_uses_it(cluster):
    b0, b1, b2 = cluster.brokers
    endpoints = {name: broker.grpc_addr for name, broker in zip(BROKERS, cluster.brokers)}
    assert all(endpoints.values()), endpoints

    def produce() -> list:
        producer = Producer(client_config(b0), ("Orders",))
        rocketmq5.started(producer)
        try:
            return [producer.send(message("Orders", b"order %d" % i)) for i in range(30)]
        finally:
            producer.shutdown()
    receipts = await asyncio.to_thread(produce)
    # A new topic's route lists every broker that creates topics; each created it on its first send.
    landed = collections.Counter(r.message_queue.message_queue0().broker.name for r in receipts)
    assert set(landed) == set(BROKERS), landed

    async def whole_route():
        route = await route_of(b1, "Orders")
        return set(route) == set(BROKERS) and route
    route = await until(whole_route, 15, "broker-1's route of Orders lists every broker")
    assert {name: (sorted(ids), ends) for name, (ids, ends) in route.items()} == \
        {name: ([0, 1], {addr}) for name, addr in endpoints.items()}
    assignment = await call(b2, "QueryAssignment", pb.QueryAssignmentRequest(
        topic=pb.Resource(name="Orders"), group=pb.Resource(name="OrderReaders")))
    assert sorted((a.message_queue.broker.name, a.message_queue.id, a.message_queue.broker.endpoints.addresses[0].port)
                  for a in assignment.assignments) == \
        sorted((name, q, int(addr.rsplit(":", 1)[1])) for name, addr in endpoints.items() for q in (0, 1))

    def consume() -> list:
        consumer = SimpleConsumer(client_config(b2), "OrderReaders", {"Orders": FilterExpression("*")},
                                  await_duration=1)
        rocketmq5.started(consumer)
        try:
            got = receive_all(consumer, len(receipts))
            for msg in got:
                consumer.ack(msg)  # at the broker that handed it out: a receipt is its broker's alone
            return got
        finally:
            consumer.shutdown()
    got = await asyncio.to_thread(consume)
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)  # each exactly once
    for broker, name in zip(cluster.brokers, BROKERS):  # acknowledged everywhere: nothing is left to hand out
        answers = await call(broker, "ReceiveMessage", receive_request("Orders", "OrderReaders", name))
        assert [a.status.code for a in answers if a.HasField("status")] == [Code["MESSAGE_NOT_FOUND"]], name


class Checker(TransactionChecker):
    def __init__(self):
        self.checked: queue.Queue = queue.Queue()

    def check(self, msg):
        self.checked.put(msg.message_id)
        return TransactionResolution.COMMIT


async def test_each_half_is_checked_back_by_the_broker_that_holds_it(cluster):
    b0, _b1, b2 = cluster.brokers
    checker = Checker()
    # The producer stays up until the messages are consumed: it sends its answer to a check after the checker has
    # returned, so shut down at the last check it could leave that half pending for good (CI saw it: the consumer
    # then waited, and its unacknowledged messages came again after their 30 s, one twice and one never).
    producer = Producer(client_config(b0), ("Pay",), checker)

    def produce() -> list:
        rocketmq5.started(producer)
        # left open: only each half's own broker can ask about it, and only its commit there makes it visible
        receipts = [producer.send(message("Pay", b"charge %d" % i), producer.begin_transaction()) for i in range(6)]
        checked, deadline = set(), time.monotonic() + 30
        while checked != {r.message_id for r in receipts}:
            checked.add(checker.checked.get(timeout=max(0.1, deadline - time.monotonic())))
        return receipts

    def consume(count: int) -> list:
        consumer = SimpleConsumer(client_config(b2), "Payers", {"Pay": FilterExpression("*")}, await_duration=1)
        rocketmq5.started(consumer)
        try:
            return receive_all(consumer, count)
        finally:
            consumer.shutdown()
    try:
        receipts = await asyncio.to_thread(produce)
        assert {r.message_queue.message_queue0().broker.name for r in receipts} == set(BROKERS)
        got = await asyncio.to_thread(consume, len(receipts))
    finally:
        await asyncio.to_thread(producer.shutdown)
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)


async def test_a_receive_for_another_brokers_queue_is_refused_not_served_from_this_store(cluster):
    b0 = cluster.brokers[0]
    send = pb.SendMessageRequest()
    msg = send.messages.add(topic=pb.Resource(name="Stale"), body=b"held by broker-0")
    msg.system_properties.message_id = "01STALE" + os.urandom(8).hex().upper()
    msg.system_properties.message_type = MessageType["NORMAL"]
    msg.system_properties.body_encoding = Encoding["IDENTITY"]
    assert (await call(b0, "SendMessage", send)).status.code == Code["OK"]
    refused = await call(b0, "ReceiveMessage", receive_request("Stale", "StaleReaders", "broker-1"))
    [status] = [a.status for a in refused if a.HasField("status")]
    assert status.code == Code["BAD_REQUEST"] and "broker-1" in status.message and "route" in status.message, status
    [_message, _timestamp, done] = await call(b0, "ReceiveMessage",
                                              receive_request("Stale", "StaleReaders", "broker-0"))
    assert done.status.code == Code["OK"]  # its own queue is served, and the message was still there


async def test_routes_follow_the_name_servers_and_fail_clearly_without_them(cluster):
    b0 = cluster.brokers[0]
    async with Admin(cluster.namesrvs[0].addr, broker=b0.broker_addr) as admin:
        for broker in cluster.brokers:
            admin.broker = broker.broker_addr
            await admin.update_topic("Kept", 2, 2)
    await until(lambda: _brokers_in_route(b0, "Kept", set(BROKERS)), 15, "every broker in the route of Kept")
    await cluster.namesrvs[0].kill()
    await cluster.brokers[2].stop()  # it leaves the routes of the name server still up
    await until(lambda: _brokers_in_route(b0, "Kept", {"broker-0", "broker-1"}), 15,
                "broker-2 leaves broker-0's gRPC route, learned from the second name server")
    await cluster.namesrvs[1].kill()

    async def refused():
        answer = await call(b0, "QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="Kept")))
        return answer.status.code == Code["INTERNAL_SERVER_ERROR"] and answer.status.message
    reason = await until(refused, 15, "a route asked with every name server down is refused")
    assert "no name server" in reason and all(n.addr in reason for n in cluster.namesrvs), reason


async def _brokers_in_route(broker, topic: str, names: set[str]) -> bool:
    return set(await route_of(broker, topic)) == names


async def test_route_lookups_are_signed_for_name_servers_with_acl(tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: ops\n    secretKey: ops-secret-1\n    admin: true\n")
    cluster = await LocalCluster(tmp_path, namesrvs=1, brokers=2, broker_flags=FLAGS + (
        "--namesrvAccessKey=ops", "--namesrvSecretKey=ops-secret-1"),
        namesrv_flags=("--aclEnable=true", f"--aclConfigFile={acl}")).start()
    try:
        # a new topic's route is TBW102's, from the name server: only a signed lookup gets it
        await until(lambda: _brokers_in_route(cluster.brokers[0], "Fresh", {"broker-0", "broker-1"}), 15,
                    "both brokers in the route, from signed lookups")
    finally:
        await cluster.stop()
