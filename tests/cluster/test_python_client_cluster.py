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
