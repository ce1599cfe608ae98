"""Delayed delivery on the event loop the broker really runs on (uvloop, broker/cli.py).

Under uvloop a pass's timer could fire before that pass's done-callback ran: the kick saw the level still running
and was dropped, and the level's queue stalled until the next delayed message arrived (measured: 15 of 30 messages
delivered, a stale timer handle left behind)."""
from __future__ import annotations

import asyncio

import pytest

from halfmq.broker.server import Broker
from halfmq.client import Message, Producer, PullConsumer
from halfmq.protocol import properties as P

from tests.conftest import broker_config

uvloop = pytest.importorskip("uvloop")


def test_every_delayed_message_of_a_burst_is_delivered(tmp_path):
    uvloop.run(_burst(tmp_path))


async def _burst(tmp_path) -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    broker = Broker(broker_config(tmp_path / "store", messageDelayLevel=" ".join(["100ms"] * 18)))
    await broker.start()
    try:
        await _deliver_a_burst(broker)
    finally:
        await broker.stop()


async def _deliver_a_burst(broker) -> None:
    arrived = asyncio.Event()

    def on_arrival(topic, _queue_id, _max_offset):
        if topic == "Later" and sum(broker.store.max_offset("Later", q) for q in range(4)) == 30:
            arrived.set()

    broker.store.add_arrival_listener(on_arrival)
    async with Producer("PG_LATER", broker.namesrv_addr) as producer:
        for i in range(30):
            msg = Message("Later", b"%d" % i)
            msg.properties[P.DELAY] = "3"
            await producer.send(msg)
    await asyncio.wait_for(arrived.wait(), 10)
    async with PullConsumer("CG_LATER", broker.namesrv_addr) as consumer:
        bodies = set()
        for queue in await consumer.fetch_subscribe_queues("Later"):
            bodies.update(m.body for m in (await consumer.pull(queue, 0, 32)).messages)
    assert bodies == {b"%d" % i for i in range(30)}
