"""Our client against a real broker: produce, pull, push with rebalance, offsets, retries."""
from __future__ import annotations

import asyncio
import threading

import pytest
from halfmq.client import (
    BlockingProducer,
    BlockingPullConsumer,
    ConsumeFrom,
    ConsumeStatus,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
    TopicNotExistError,
)
from halfmq.client.push import allocate_average

from tests.support.broker_thread import BrokerThread


async def test_send_and_pull_round_trip(broker):
    async with Producer("PG", broker.namesrv_addr) as producer, PullConsumer("CG", broker.namesrv_addr) as consumer:
        result = await producer.send(Message("CT", b"hello", tags="A", keys="k1", properties={"p": "v"}))
        assert result.status is SendStatus.SEND_OK and len(result.msg_id) == 32
        queues = await consumer.fetch_subscribe_queues("CT")
        assert result.queue in queues
        pulled = await consumer.pull(result.queue, result.queue_offset)
        assert pulled.status is PullStatus.FOUND
        (msg,) = pulled.messages
        assert (msg.body, msg.tags, msg.keys, msg.properties["p"], msg.msg_id) == (b"hello", "A", "k1", "v",
                                                                                    result.msg_id)
        assert msg.offset_msg_id == result.offset_msg_id


async def test_round_robin_queues_and_batch(broker):
    async with Producer("PG", broker.namesrv_addr) as producer, PullConsumer("CG", broker.namesrv_addr) as consumer:
        results = [await producer.send(Message("RR", f"m{i}")) for i in range(8)]
        assert len({r.queue.queue_id for r in results}) == 4  # auto-created with the producer's 4 queues
        batch = await producer.send_batch([Message("RR", f"b{i}", tags="t") for i in range(10)])
        pulled = await consumer.pull(batch.queue, batch.queue_offset, max_nums=100)
        assert [m.body for m in pulled.messages] == [f"b{i}".encode() for i in range(10)]
        assert len({m.msg_id for m in pulled.messages}) == 10


async def test_fresh_producers_do_not_all_start_at_the_first_queue(broker):
    # Producers that each send one message (scripts, Spark tasks) would all fill queue 0 if every producer's round
    # robin started there; RocketMQ's producers start at a random queue.
    async with Producer("PG", broker.namesrv_addr) as producer:
        await producer.send(Message("Spread", b"create"))  # the topic, with 4 queues
    first_queues = set()
    for _ in range(20):
        async with Producer("PG", broker.namesrv_addr) as producer:
            first_queues.add((await producer.send(Message("Spread", b"one"))).queue.queue_id)
    assert len(first_queues) > 1, first_queues  # all 20 on one queue: a chance of 4 in 4**20 with random starts


async def test_tag_expression_filters_exactly(broker):
    async with Producer("PG", broker.namesrv_addr) as producer, PullConsumer("CG", broker.namesrv_addr) as consumer:
        q = MessageQueue("TagT", "broker-a", 0)
        for tag in ("a", "b", "c", "a"):
            await producer.send(Message("TagT", tag, tags=tag), queue=q)
        pulled = await consumer.pull(q, 0, expression="a || c")
        assert [m.body for m in pulled.messages] == [b"a", b"c", b"a"]


async def test_errors_are_raised_with_codes(broker_factory):
    broker = await broker_factory(autoCreateTopicEnable=False)
    async with Producer("PG", broker.namesrv_addr, auto_create=False) as producer:
        with pytest.raises(TopicNotExistError):
            await producer.send(Message("Missing", b"x"))
    with pytest.raises(ValueError):
        Message("T", b"x", properties={"TAGS": "reserved"})


async def test_offsets_round_trip(broker):
    async with PullConsumer("CG", broker.namesrv_addr) as consumer, Producer("PG", broker.namesrv_addr) as producer:
        r = await producer.send(Message("OT", b"x"))
        await consumer.update_offset(r.queue, 1)
        assert await consumer.query_offset(r.queue) == 1
        assert await consumer.max_offset(r.queue) == 1
        assert await consumer.search_offset(r.queue, 0) == 0


def test_allocate_average_matches_rocketmq():
    queues = [MessageQueue("T", "b", i) for i in range(8)]
    shares = [allocate_average(queues, ["c1", "c2", "c3"], c) for c in ("c1", "c2", "c3")]
    assert [[q.queue_id for q in s] for s in shares] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert allocate_average(queues[:2], ["a", "b", "c"], "c") == []
    assert allocate_average(queues, ["x"], "y") == []


async def test_push_consumers_share_the_queues_and_receive_everything_once(broker):
    received: dict[str, list[bytes]] = {"one": [], "two": []}
    total = asyncio.Event()

    def listener(name):
        async def on_messages(msgs):
            received[name].extend(m.body for m in msgs)
            if sum(len(v) for v in received.values()) >= 40:
                total.set()
            return ConsumeStatus.SUCCESS
        return on_messages

    async with Producer("PG", broker.namesrv_addr) as producer:
        await producer.send(Message("PushT", b"warm-up"))  # creates the topic with 4 queues
        one = PushConsumer("PCG", broker.namesrv_addr, listener("one"), ConsumeFrom.FIRST_OFFSET)
        two = PushConsumer("PCG", broker.namesrv_addr, listener("two"), ConsumeFrom.FIRST_OFFSET)
        for c in (one, two):
            c.subscribe("PushT")
            await c.start()
        await one.rebalance()  # both are members now: settle the split without waiting for the timer
        await two.rebalance()
        for i in range(39):
            await producer.send(Message("PushT", f"m{i}"))
        await asyncio.wait_for(total.wait(), 20)
        await one.close()
        await two.close()
    everything = received["one"] + received["two"]
    assert sorted(everything) == sorted([b"warm-up"] + [f"m{i}".encode() for i in range(39)])
    assert received["one"] and received["two"]


async def next_consumer_gets(broker, group: str, topic: str) -> list[bytes]:
    """What the group's next push consumer of ``topic`` is handed first (where its persisted offsets say)."""
    seen = asyncio.Event()
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)
        seen.set()

    consumer = PushConsumer(group, broker.namesrv_addr, listener, ConsumeFrom.FIRST_OFFSET)
    consumer.subscribe(topic)
    await consumer.start()
    await asyncio.wait_for(seen.wait(), 20)
    await consumer.close()
    return got


async def test_push_consumer_resumes_from_persisted_offsets_and_retries_failures(broker_factory):
    broker = await broker_factory(messageDelayLevel="10ms 10ms 10ms 10ms 10ms")
    attempts: dict[bytes, int] = {}
    done = asyncio.Event()

    def listener(msgs):  # a plain function: runs in an executor
        for m in msgs:
            attempts[m.body] = attempts.get(m.body, 0) + 1
            if m.body == b"flaky" and attempts[m.body] == 1:
                return ConsumeStatus.RECONSUME_LATER
        if attempts.get(b"flaky") == 2 and b"steady" in attempts:
            broker_loop.call_soon_threadsafe(done.set)
        return ConsumeStatus.SUCCESS

    broker_loop = asyncio.get_running_loop()
    async with Producer("PG", broker.namesrv_addr) as producer:
        await producer.send(Message("RetryT", b"flaky"))
        await producer.send(Message("RetryT", b"steady"))
        consumer = PushConsumer("RCG", broker.namesrv_addr, listener, ConsumeFrom.FIRST_OFFSET)
        consumer.subscribe("RetryT")
        await consumer.start()
        await asyncio.wait_for(done.wait(), 20)
        await consumer.close()
        assert attempts == {b"flaky": 2, b"steady": 1}
        await producer.send(Message("RetryT", b"later"))
        assert await next_consumer_gets(broker, "RCG", "RetryT") == [b"later"]


async def test_a_push_consumer_closed_while_its_listener_runs_counts_what_the_listener_consumed(broker_factory):
    """close() while the listener has a message: the listener finishes, and its SUCCESS is persisted. Before, the
    delivery was cancelled and the offset stayed behind: the group's next consumer got the message again."""
    broker = await broker_factory()
    handed, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    def listener(msgs):  # a plain function: runs in an executor thread
        loop.call_soon_threadsafe(handed.set)
        release.wait(20)
        return ConsumeStatus.SUCCESS

    async with Producer("PG", broker.namesrv_addr) as producer:
        await producer.send(Message("CloseT", b"first"))
        consumer = PushConsumer("CCG", broker.namesrv_addr, listener, ConsumeFrom.FIRST_OFFSET)
        consumer.subscribe("CloseT")
        await consumer.start()
        await asyncio.wait_for(handed.wait(), 20)
        closing = asyncio.ensure_future(consumer.close())
        async with asyncio.timeout(20):
            while consumer.tasks:  # close() has taken the queues' tasks to stop them
                await asyncio.sleep(0)
        release.set()
        await asyncio.wait_for(closing, 20)
        await producer.send(Message("CloseT", b"later"))
        assert await next_consumer_gets(broker, "CCG", "CloseT") == [b"later"]


def test_blocking_facade(tmp_path):
    """Synchronous code: the broker runs in its own thread here, so nothing below needs an event loop."""
    bt = BrokerThread(tmp_path)
    try:
        with BlockingProducer("PG", bt.broker.namesrv_addr) as producer, \
                BlockingPullConsumer("CG", bt.broker.namesrv_addr) as consumer:
            result = producer.send(Message("Sync", b"blocking"))
            pulled = consumer.pull(result.queue, result.queue_offset)
            assert [m.body for m in pulled.messages] == [b"blocking"]
            consumer.update_offset(result.queue, 1)
            assert consumer.query_offset(result.queue) == 1
    finally:
        bt.stop()


@pytest.mark.parametrize("batch", [False, True])
def test_send_header_is_what_its_header_class_renders(batch):
    """Producer._header renders SendMessageRequestHeaderV2 by hand for speed: same keys, values and order."""
    from halfmq.protocol.headers import SendMessageRequestHeaderV2
    from halfmq.protocol.properties import encode_properties

    producer = Producer("PG", "127.0.0.1:9876")
    props = {"UNIQ_KEY": "u1", "WAIT": "true"}
    ext = producer._header(Message("T", b"x", flag=5), MessageQueue("T", "b", 3), props, sys_flag=4, batch=batch)
    expected = SendMessageRequestHeaderV2(
        producerGroup="PG", topic="T", defaultTopic="TBW102", defaultTopicQueueNums=4, queueId=3, sysFlag=4,
        bornTimestamp=int(ext["g"]), flag=5, properties=encode_properties(props), reconsumeTimes=0, unitMode=False,
        batch=True if batch else None)
    assert list(ext.items()) == list(expected.to_ext().items())
    assert SendMessageRequestHeaderV2.from_ext(ext) == expected


async def test_oversized_messages_get_a_clear_error(broker_factory):
    """Above the producer's max_message_size (4 MiB, the broker's default maxMessageSize) nothing is sent; a
    request above the broker's serverMaxFrameSize (the broker closes the connection) is named as such."""
    from halfmq.client import ConnectionClosedError, MessageIllegalError, MessageTooLargeError
    from halfmq.protocol.codes import ResponseCode

    broker = await broker_factory(serverMaxFrameSize=1 << 20, maxMessageSize=64 << 10)
    async with Producer("PG-big", broker.namesrv_addr) as producer:
        with pytest.raises(MessageTooLargeError, match=r"5,242,880 bytes, larger than max_message_size 4,194,304") \
                as refused:
            await producer.send(Message("Big", b"x" * (5 << 20)))
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        await producer.send(Message("Big", b"small"))  # the producer still works
    async with Producer("PG-big2", broker.namesrv_addr, max_message_size=16 << 20) as producer:
        with pytest.raises(MessageIllegalError, match="maxMessageSize"):  # the broker's own refusal, as before
            await producer.send(Message("Big", b"x" * (100 << 10)))
        with pytest.raises(ConnectionClosedError, match=r"2,09\d,\d{3}-byte request.*serverMaxFrameSize"):
            await producer.send(Message("Big", b"x" * (2 << 20)))


async def test_sends_to_a_topic_without_writable_queues_fail_clearly_oneway_too(broker):
    from halfmq.client import ClientError
    from halfmq.client.admin import Admin
    async with Admin(broker.namesrv_addr) as admin:
        await admin.update_topic("ReadOnlyT", perm=4)  # readable, not writable
    async with Producer("PG", broker.namesrv_addr) as producer:
        for send in (producer.send, producer.send_oneway):
            with pytest.raises(ClientError, match="topic ReadOnlyT has no writable queue"):
                await send(Message("ReadOnlyT", b"x"))
