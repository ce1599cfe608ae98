"""halfmq's own Python client over a cluster: a push consumer's failed messages come back from the broker that
stored them (a send-back names the message by that broker's commit-log offset)."""
from __future__ import annotations

import asyncio
import collections

import pytest

from halfmq.client import ConsumeFrom, Message, Producer, PushConsumer

from tests.support.cluster import LocalCluster

FAST_RETRIES = "--messageDelayLevel=" + " ".join(["100ms"] * 18)


@pytest.fixture
async def cluster(tmp_path):
    cluster = await LocalCluster(tmp_path, namesrvs=1, brokers=3, broker_flags=(FAST_RETRIES,)).start()
    yield cluster
    await cluster.stop()


async def test_a_failed_message_is_redelivered_from_the_broker_that_stored_it(cluster):
    bodies = {f"m{i}" for i in range(30)}
    async with Producer("PG_RETRY_CLUSTER", cluster.namesrv_addr) as producer:
        brokers = {(await producer.send(Message("RetryCluster", b.encode()))).queue.broker_name for b in bodies}
    assert brokers == {"broker-0", "broker-1", "broker-2"}
    seen = collections.Counter()
    done = asyncio.Event()

    def listener(messages):
        body = messages[0].body.decode()
        seen[body] += 1
        if seen[body] == 1:
            raise RuntimeError("fail the first delivery: the message must come back")
        if all(seen[b] >= 2 for b in bodies):
            loop.call_soon_threadsafe(done.set)

    loop = asyncio.get_running_loop()
    consumer = PushConsumer("CG_RETRY_CLUSTER", cluster.namesrv_addr, listener, consume_from=ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe("RetryCluster")
    async with consumer:
        await asyncio.wait_for(done.wait(), 60)
    assert set(seen) == bodies, f"delivered bodies that were never sent: {set(seen) - bodies}"


async def test_a_push_consumer_joins_a_broker_that_joined_the_cluster_after_it_started(tmp_path):
    import json

    from halfmq.client.admin import Admin
    from halfmq.protocol.codes import RequestCode

    from tests.support.cluster import until
    from tests.support.raw import RawClient

    cluster = await LocalCluster(tmp_path, namesrvs=1, brokers=1).start()
    try:
        got = asyncio.Queue()
        consumer = PushConsumer("CG_LATE_BROKER", cluster.namesrv_addr, lambda msgs: got.put_nowait(msgs[0].body))
        consumer.subscribe("LateBroker")
        async def routed(brokers: int):
            async with Admin(cluster.namesrvs[0].addr) as admin:
                return len((await admin.topic_route("LateBroker"))["queueDatas"]) == brokers

        async with Admin(cluster.namesrvs[0].addr, broker=cluster.brokers[0].broker_addr) as admin:
            await admin.update_topic("LateBroker", 2, 2)
        # the broker registers its new topic with the name server on its own, a moment later (a CI run started the
        # consumer before: TOPIC_NOT_EXIST)
        await until(lambda: routed(1), 10, "the first broker's queues are routed")
        async with consumer:
            late = cluster.broker_process(1)
            await late.start()
            cluster.brokers.append(late)
            async with Admin(cluster.namesrvs[0].addr, broker=late.broker_addr) as admin:
                await admin.update_topic("LateBroker", 2, 2)
            await until(lambda: routed(2), 10, "the late broker's queues are routed")
            await consumer.rebalance()  # what its periodic rebalance does
            raw = await RawClient.connect(late.broker_addr)
            answer = await raw.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CG_LATE_BROKER"})
            raw.transport.close()
            assert json.loads(answer.body or b"{}").get("consumerIdList") == [consumer.instance.client_id]
            async with Producer("PG_LATE_BROKER", cluster.namesrv_addr) as producer:
                for queue in [q for q in (await producer.instance.routes.fetch("LateBroker")).write_queues
                              if q.broker_name == "broker-1"]:
                    await producer.send(Message("LateBroker", b"on the late broker"), queue)
            assert await asyncio.wait_for(got.get(), 30) == b"on the late broker"
    finally:
        await cluster.stop()


async def test_sends_go_on_at_the_other_brokers_while_one_refuses_them(tmp_path):
    """A broker answering code 14 to a topic's sends (here a group's leader short of in-sync members, as after its
    follower died: restarted with minInSyncReplicas 2 and no follower) fails none: the producer retries them on
    another broker and avoids it a while, though the route still lists its queues."""
    cluster = await LocalCluster(tmp_path, namesrvs=1, brokers=2).start()
    try:
        async with Producer("PG_SHORT_GROUP", cluster.namesrv_addr) as producer:
            assert {(await producer.send(Message("ShortGroup", b"%d" % i))).queue.broker_name
                    for i in range(20)} == {"broker-0", "broker-1"}
        await cluster.brokers[1].stop()
        cluster.brokers[1] = cluster.broker_process(1, "--minInSyncReplicas=2")
        await cluster.brokers[1].start()
        async with Producer("PG_SHORT_GROUP", cluster.namesrv_addr) as producer:
            landed = collections.Counter([(await producer.send(Message("ShortGroup", b"%d" % i))).queue.broker_name
                                          for i in range(20)])
        assert landed == {"broker-0": 20}
    finally:
        await cluster.stop()
