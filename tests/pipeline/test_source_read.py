"""A task's read of one queue range against a real broker (no Spark): the rows, and messages lost while it reads
(issue 12: failOnDataLoss is enforced by every task, not only when planning)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from halfmq.client import BlockingProducer, Message, MessageQueue, PullConsumer
from halfmq.client.admin import Admin
from halfmq.client.errors import RequestTimeoutError
from halfmq.pipeline import broker_io
from halfmq.pipeline.broker_io import READER_GROUP, DataLossError, RangeRead, _read_chunk, queue_bounds, read_range

from tests.support.broker_thread import BrokerThread


@pytest.fixture
def bt(tmp_path):
    broker_thread = BrokerThread(tmp_path / "store")
    yield broker_thread
    broker_thread.stop()


def fill_queue(broker, topic, count):
    """count messages, all in queue 0 (a topic of one queue)."""
    async def create():
        async with Admin(broker.namesrv_addr) as admin:
            await admin.update_topic(topic, read_queues=1, write_queues=1)
    asyncio.run(create())
    with BlockingProducer("PG_READ", broker.namesrv_addr) as producer:
        for i in range(count):
            producer.send(Message(topic, f"m{i}".encode()))


def offsets(bt, topic, start, end, **read):
    name = bt.broker.config.brokerName
    assert list(queue_bounds(bt.broker.namesrv_addr, [topic])[topic]) == [f"{name}:0"]  # queues by broker and id
    batches = list(read_range(bt.broker.namesrv_addr, topic, name, 0, start, end, RangeRead(**read)))
    assert all(set(batch.column("broker_name").to_pylist()) == {name} for batch in batches)
    return [o for batch in batches for o in batch.column("queue_offset").to_pylist()]


def test_a_range_is_read_whole_across_chunks_and_stops_early_cleanly(bt, monkeypatch):
    monkeypatch.setattr(broker_io, "CHUNK", 7)  # many chunks in flight over 40 messages
    monkeypatch.setattr(broker_io, "PULL_BATCH", 3)
    fill_queue(bt.broker, "ReadT", 40)
    assert offsets(bt, "ReadT", 5, 38) == list(range(5, 38))
    batches = read_range(bt.broker.namesrv_addr, "ReadT", bt.broker.config.brokerName, 0, 0, 40)
    assert next(batches).num_rows == 7
    batches.close()  # Spark stopping early (a limit): the pulling thread ends, nothing left running


def test_messages_deleted_under_a_read_fail_it_or_are_skipped(bt):
    fill_queue(bt.broker, "GoneUnderT", 10)

    async def delete_below():  # what retention does: the queue now starts at 6
        bt.broker.store.advance_minimums({("GoneUnderT", 0): 6})
    bt.call(delete_below())
    with pytest.raises(DataLossError, match=r"GoneUnderT/broker-a:0 offsets 2\.\.5 are gone .*failOnDataLoss=false"):
        offsets(bt, "GoneUnderT", 2, 10)
    assert offsets(bt, "GoneUnderT", 2, 10, fail_on_data_loss=False) == [6, 7, 8, 9]


def test_a_queue_whose_offsets_went_backwards_under_a_read(bt):
    fill_queue(bt.broker, "ShrunkT", 4)
    with pytest.raises(DataLossError, match=r"ShrunkT/broker-a:0 offsets 4\.\.9 are gone .*now ends at 4"):
        offsets(bt, "ShrunkT", 0, 10)  # planned to 10, the queue holds 4
    assert offsets(bt, "ShrunkT", 0, 10, fail_on_data_loss=False) == [0, 1, 2, 3]


def test_a_pull_waits_at_most_the_poll_timeout(bt):
    """kafkaConsumer.pollTimeoutMs becomes each pull's timeout: a stalled broker fails the task that long after."""
    fill_queue(bt.broker, "StallT", 3)
    name = bt.broker.config.brokerName
    resume = threading.Event()

    async def pull_from_a_stalled_broker():
        async with PullConsumer(READER_GROUP, bt.broker.namesrv_addr) as consumer:
            queue = MessageQueue("StallT", name, 0)
            assert len(await _read_chunk(consumer, queue, 0, 3, RangeRead())) == 1  # route and connection ready
            bt.loop.call_soon_threadsafe(resume.wait, 30)  # the broker's loop stops answering
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError, match="after 0.3"):
                await _read_chunk(consumer, queue, 0, 3, RangeRead(pull_timeout_s=0.3))
            return time.monotonic() - started
    try:
        assert asyncio.run(pull_from_a_stalled_broker()) < 2.5  # not the client's 3 s request timeout
    finally:
        resume.set()
