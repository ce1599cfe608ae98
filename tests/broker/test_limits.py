"""Connection limits against a real broker: most connections, idle timeout, requests in progress per connection."""
from __future__ import annotations

import asyncio
import os
import signal

from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.message import decode_offset_msg_id
from halfmq.store.ops import PutMeta

from tests.support.raw import RawClient


def closed_event(broker) -> asyncio.Event:
    """Set each time the broker notices a client connection is gone."""
    event = asyncio.Event()
    broker.dispatcher.on_channel_closed(lambda _channel: event.set())
    return event


async def max_offset(client: RawClient, topic: str = "Limits") -> int:
    r = await client.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    return int(r.ext_fields["offset"])


async def test_connections_beyond_the_limit_are_refused_until_one_closes(broker_factory):
    broker = await broker_factory(serverMaxConnections=2)
    gone = closed_event(broker)
    first, second = await RawClient.connect(broker.addr), await RawClient.connect(broker.addr)
    assert await max_offset(first) == 0 and await max_offset(second) == 0
    third = await RawClient.connect(broker.addr)
    await asyncio.wait_for(third.closed.wait(), 5)  # refused: the broker closes it at once
    gone.clear()
    first.close()
    await asyncio.wait_for(gone.wait(), 5)
    fourth = await RawClient.connect(broker.addr)
    assert await max_offset(fourth) == 0 and await max_offset(second) == 0
    second.close()
    fourth.close()


async def test_idle_connections_are_closed_and_active_ones_kept(broker_factory):
    broker = await broker_factory(serverChannelMaxIdleTimeSeconds=1)
    idle = await RawClient.connect(broker.addr)
    assert await max_offset(idle) == 0
    await asyncio.wait_for(idle.closed.wait(), 10)
    fresh = await RawClient.connect(broker.addr)
    assert await max_offset(fresh) == 0
    fresh.close()


async def test_requests_in_progress_per_connection_are_bounded_and_none_is_lost(broker_factory):
    limit, sent = 4, 12
    broker = await broker_factory(serverMaxInflightPerConnection=limit)
    producer = await RawClient.connect(broker.addr)
    assert (await producer.send("Limits", b"first")).code == ResponseCode.SUCCESS  # the topic exists
    dispatched = 0
    original = broker.dispatcher.dispatch

    def counting_dispatch(proto, cmd):
        nonlocal dispatched
        if cmd.code == RequestCode.SEND_MESSAGE_V2:
            dispatched += 1
        original(proto, cmd)

    broker.dispatcher.dispatch = counting_dispatch
    # Stop the store's writer process: every send stays in progress (unacknowledged) until it continues.
    helper = broker.store.link.pid
    os.kill(helper, signal.SIGSTOP)
    held = broker.store.submit(PutMeta("held", 1))
    try:
        sends = [asyncio.ensure_future(producer.send("Limits", f"m{i}".encode(), timeout=30))
                 for i in range(sent)]
        # All the sends are on the wire before this request on another connection is answered.
        observer = await RawClient.connect(broker.addr)
        assert await max_offset(observer) == 1
        assert dispatched == limit  # the rest waits, read but not taken on
    finally:
        os.kill(helper, signal.SIGCONT)
    await held
    responses = await asyncio.gather(*sends)
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * sent
    assert sorted(int(r.ext_fields["queueOffset"]) for r in responses) == list(range(1, sent + 1))
    assert len({decode_offset_msg_id(r.ext_fields["msgId"])[1] for r in responses}) == sent
    assert await max_offset(observer) == sent + 1
    producer.close()
    observer.close()


async def test_stopping_while_sends_wait_for_their_sync_answers_them(broker_factory):
    broker = await broker_factory(shutdownGraceSeconds=10)
    producer = await RawClient.connect(broker.addr)
    assert (await producer.send("Limits", b"first")).code == ResponseCode.SUCCESS
    helper = broker.store.link.pid
    os.kill(helper, signal.SIGSTOP)  # the sends stay in progress, waiting for the writer
    sends = [asyncio.ensure_future(producer.send("Limits", f"m{i}".encode(), timeout=30)) for i in range(5)]
    observer = await RawClient.connect(broker.addr)
    await max_offset(observer)  # the sends were read before this answer
    stopping = asyncio.ensure_future(broker.stop())
    done, _ = await asyncio.wait({stopping}, timeout=0.3)
    assert not done  # the stop drains the requests in progress
    os.kill(helper, signal.SIGCONT)
    await asyncio.wait_for(stopping, 20)
    responses = await asyncio.gather(*sends)
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 5
