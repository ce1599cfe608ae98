"""Timer messages for remoting clients (issue 15, item 4): delivered at any time, within bounds, across restarts."""
from __future__ import annotations

import asyncio
import random
import time

import pytest

from halfmq.client import Message, MessageQueue, Producer, PullConsumer
from halfmq.client.errors import BrokerError
from halfmq.protocol.codes import ResponseCode


def now_ms() -> int:
    return int(time.time() * 1000)


def arrivals(broker, topic: str) -> asyncio.Queue:
    """Broker time (ms) of each time ``topic`` grew: when a delivery was stored."""
    seen: asyncio.Queue = asyncio.Queue()
    broker.store.add_arrival_listener(lambda t, _q, _m: seen.put_nowait(now_ms()) if t == topic else None)
    return seen


async def pulled(namesrv: str, topic: str) -> list:
    async with PullConsumer("C", namesrv) as consumer:
        return [m for q in await consumer.fetch_subscribe_queues(topic) for m in (await consumer.pull(q, 0)).messages]


def timed(topic: str, body: bytes, **props: str) -> Message:
    """A message carrying timer properties as other clients send them (halfmq's client offers deliver_time_ms and
    refuses reserved names in ``properties``)."""
    msg = Message(topic, body)
    msg.properties.update(props)
    return msg


@pytest.mark.parametrize("key, value", [(None, lambda t: t), ("__STARTDELIVERTIME", lambda t: t),
                                        ("TIMER_DELAY_MS", lambda t: t - now_ms()),
                                        ("TIMER_DELAY_SEC", lambda t: 1)])
async def test_a_timer_message_is_delivered_at_its_time_not_before(broker, key, value):
    seen = arrivals(broker, "Timed")
    async with Producer("P", broker.namesrv_addr) as producer:
        await producer.send(Message("Timed", b"warm-up"))  # the topic exists before the clock starts
        await seen.get()
        due = now_ms() + 1000
        await producer.send(Message("Timed", b"later", deliver_time_ms=due) if key is None
                            else timed("Timed", b"later", **{key: str(value(due))}))
        assert [m.body for m in await pulled(broker.namesrv_addr, "Timed")] == [b"warm-up"]
        arrived = await asyncio.wait_for(seen.get(), 10)
    assert due - 5 <= arrived <= due + 1000  # (TIMER_DELAY_SEC counts from the send, a few ms after `due` was set)
    (msg,) = [m for m in await pulled(broker.namesrv_addr, "Timed") if m.body == b"later"]
    assert "REAL_TOPIC" not in msg.properties and msg.store_timestamp >= due - 5


def stored_count(broker, topic: str, count: int) -> asyncio.Event:
    """Set once ``topic``'s queues hold ``count`` messages. An arrival is one per queue and write group, not one per
    message: deliveries due together can share a group (measured in CI: 30 timers, fewer arrivals)."""
    ends: dict[int, int] = {}
    enough = asyncio.Event()

    def grew(t, queue_id, max_offset):
        if t == topic:
            ends[queue_id] = max_offset
            if sum(ends.values()) >= count:
                enough.set()
    broker.store.add_arrival_listener(grew)
    return enough


async def test_many_timers_are_each_delivered_at_their_own_time(broker):
    all_stored = stored_count(broker, "Many", 30)
    rng = random.Random(7)
    async with Producer("P", broker.namesrv_addr) as producer:
        base = now_ms()
        dues = [base + rng.randrange(300, 1500) for _ in range(30)]
        for index, due in enumerate(dues):
            await producer.send(Message("Many", str(index).encode(), deliver_time_ms=due))
        await asyncio.wait_for(all_stored.wait(), 20)
    messages = await pulled(broker.namesrv_addr, "Many")
    assert sorted(int(m.body) for m in messages) == list(range(30))
    for m in messages:
        assert dues[int(m.body)] - 5 <= m.store_timestamp <= dues[int(m.body)] + 1000


async def test_bad_and_too_distant_times_are_refused_and_past_ones_go_at_once(broker_factory):
    broker = await broker_factory(timerMaxDelaySec=60)
    async with Producer("P", broker.namesrv_addr, retry_times=0) as producer:
        for props, remark in (({"TIMER_DELAY_SEC": "61"}, "timerMaxDelaySec 60"),
                              ({"TIMER_DELIVER_MS": "soon"}, "not an integer")):
            with pytest.raises(BrokerError) as refused:
                await producer.send(timed("Bounded", b"x", **props))
            assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL and remark in refused.value.remark
        with pytest.raises(BrokerError, match="cannot be sent in a batch"):
            await producer.send_batch([timed("Bounded", b"x", TIMER_DELAY_MS="10")])
        await producer.send(Message("Bounded", b"past", deliver_time_ms=now_ms() - 1000))
    assert [m.body for m in await pulled(broker.namesrv_addr, "Bounded")] == [b"past"]


async def test_a_delay_level_wins_over_a_timer_property(broker):
    seen = arrivals(broker, "Levels")
    async with Producer("P", broker.namesrv_addr) as producer:
        sent = now_ms()
        await producer.send(Message("Levels", b"level-1", delay_level=1, deliver_time_ms=now_ms() + 3_600_000))
        arrived = await asyncio.wait_for(seen.get(), 10)
    assert sent + 900 <= arrived <= sent + 3000  # level 1 is 1 s


async def test_what_came_due_while_the_broker_was_down_is_delivered_at_start(broker_factory, tmp_path):
    store = tmp_path / "restart"
    broker = await broker_factory(store_dir=store)
    async with Producer("P", broker.namesrv_addr) as producer:
        await producer.send(Message("Restart", b"due-while-down", deliver_time_ms=now_ms() + 400))
        await producer.send(Message("Restart", b"due-after", deliver_time_ms=now_ms() + 60_000))
    await broker.stop()
    await asyncio.sleep(0.5)  # the first comes due while no broker runs (what is tested is the clock passing)
    broker = await broker_factory(store_dir=store)
    seen = arrivals(broker, "Restart")
    if not await pulled(broker.namesrv_addr, "Restart"):
        await asyncio.wait_for(seen.get(), 10)
    assert [m.body for m in await pulled(broker.namesrv_addr, "Restart")] == [b"due-while-down"]
    assert broker.store.next_timer() is not None  # the other still waits, indexed


async def test_retention_keeps_a_timer_message_until_it_is_delivered(broker_factory):
    broker = await broker_factory(fileReservedTime=0.0001, cleanResourceInterval=3_600_000)
    seen = arrivals(broker, "Kept")
    async with Producer("P", broker.namesrv_addr) as producer:
        await producer.send(Message("Kept", b"in-2s", deliver_time_ms=now_ms() + 2000))
    await asyncio.sleep(0.5)  # older than the retention (0.36 s): what is tested is its age
    await broker.ctx.retention.run_pass()
    await asyncio.wait_for(seen.get(), 10)
    assert [m.body for m in await pulled(broker.namesrv_addr, "Kept")] == [b"in-2s"]


async def test_timers_and_delayed_messages_of_a_deleted_topic_are_deleted_with_it(broker_factory):
    """Issue 23: timer and delay-level messages sent before deleteTopic were delivered into the topic once it was
    created again, though a topic created again starts empty."""
    from halfmq.client.admin import Admin
    broker = await broker_factory(messageDelayLevel="1s 2s", cleanResourceInterval=3_600_000)
    seen = arrivals(broker, "Reborn")
    async with Producer("P", broker.namesrv_addr) as producer, Admin(broker.namesrv_addr) as admin:
        await admin.update_topic("Reborn", 1, 1)
        await producer.send(Message("Reborn", b"old timer", deliver_time_ms=now_ms() + 1500))
        await producer.send(Message("Reborn", b"old delayed", delay_level=1))
        await admin.delete_topic("Reborn")
        await admin.update_topic("Reborn", 1, 1)
        await producer.send(Message("Reborn", b"new timer", deliver_time_ms=now_ms() + 1500))
        await producer.send(Message("Reborn", b"new delayed", delay_level=1))
        for _ in range(2):  # the two of the new topic come; the old ones are due at the same times
            await asyncio.wait_for(seen.get(), 10)
        schedule_topic = "SCHEDULE_TOPIC_XXXX"
        deadline = time.monotonic() + 10
        while broker.store.next_timer() is not None or \
                broker.ctx.schedule.progress[1] < broker.store.max_offset(schedule_topic, 0):
            assert time.monotonic() < deadline, "the old timer and delayed messages were not handled"
            await asyncio.sleep(0.02)  # polling the services' state: nothing to wait on for a message not delivered
    assert sorted(m.body for m in await pulled(broker.namesrv_addr, "Reborn")) == [b"new delayed", b"new timer"]
