"""Batch halves (halfmq's transactional batch): many messages, one half, one decision, against a real broker."""
from __future__ import annotations

import asyncio

import pytest

from halfmq.client import LocalTransactionState, Message, MessageQueue, PullConsumer, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import BrokerError
from halfmq.protocol import properties as P
from halfmq.protocol.codes import ResponseCode, SysFlag
from halfmq.protocol.message import decode_offset_msg_id

S = LocalTransactionState


class Checks:
    """Answers every check-back with ``answer`` and hands the checked message over."""

    def __init__(self, answer: S = S.UNKNOW):
        self.answer = answer
        self.checked: asyncio.Queue = asyncio.Queue()

    async def execute_local_transaction(self, msg, arg):
        return S.UNKNOW

    async def check_local_transaction(self, msg):
        await self.checked.put(msg)
        return self.answer


async def pulled(broker, topic: str, queue_id: int = 0) -> list:
    async with PullConsumer("AUDIT", broker.namesrv_addr) as consumer:
        return (await consumer.pull(MessageQueue(topic, broker.ctx.config.brokerName, queue_id), 0,
                                    max_nums=1000)).messages


def batch(topic: str, count: int, **kwargs) -> list[Message]:
    return [Message(topic, f"row-{i}".encode(), keys=f"k{i}", tags="T", properties={"n": str(i)}, **kwargs)
            for i in range(count)]


async def decide(producer, result, state: S) -> None:
    await producer.decide(result.queue, result.queue_offset, result.offset_msg_id, result.msg_id, state)


async def test_a_committed_batch_half_publishes_every_message_at_once(broker):
    async with TransactionProducer("PG_HB", Checks(), broker.namesrv_addr) as producer:
        queue = MessageQueue("HB", broker.ctx.config.brokerName, 1)
        await producer.send(Message("HB", b"before"), queue)
        result = await producer.send_half_batch(batch("HB", 300), queue, properties={"job": "j1"})
        assert result.transaction_id and result.queue == queue
        assert [m.body for m in await pulled(broker, "HB", 1)] == [b"before"]  # nothing visible before the commit
        async with Admin(broker.namesrv_addr) as admin:
            (pending,) = [h async for h in admin.pending_halves()]
            assert pending["messages"] == 300 and pending["transactionId"] == result.transaction_id
        await decide(producer, result, S.COMMIT_MESSAGE)
        await decide(producer, result, S.COMMIT_MESSAGE)  # a repeated decision changes nothing
    messages = await pulled(broker, "HB", 1)
    assert [m.body for m in messages] == [b"before"] + [f"row-{i}".encode() for i in range(300)]
    _host, half_offset = decode_offset_msg_id(result.offset_msg_id)
    for i, msg in enumerate(messages[1:]):
        assert msg.queue_offset == i + 1 and msg.keys == f"k{i}" and msg.tags == "T"
        assert msg.properties["n"] == str(i) and msg.properties["job"] == "j1"  # its own, and the half's
        assert msg.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_COMMIT_TYPE
        assert msg.prepared_transaction_offset == half_offset and P.HALF_BATCH not in msg.properties
    assert len({m.msg_id for m in messages}) == 301
    async with Admin(broker.namesrv_addr) as admin:  # each message is indexed by its own KEYS once committed
        (found,) = await admin.query_msg_by_key("HB", "k299", 10)
        assert found.body == b"row-299"


async def test_a_batch_half_without_keys_commits_from_the_sizes_it_was_prepared_with(broker):
    """A Spark sink's batch halves have no KEYS: their records' sizes and tags codes are kept with the pending half
    (HalfState.parts), its commit places each message from them, and a decided half keeps none."""
    rows = [Message("HBP", f"row-{i}".encode() * (i % 7 + 1), tags="T" if i % 2 else None) for i in range(200)]
    async with TransactionProducer("PG_HBP", Checks(), broker.namesrv_addr) as producer:
        queue = MessageQueue("HBP", broker.ctx.config.brokerName, 0)
        result = await producer.send_half_batch(rows, queue)
        _host, half_offset = decode_offset_msg_id(result.offset_msg_id)
        pending = broker.ctx.store.get_half(half_offset)
        assert pending.batch == 200 and len(pending.parts) == 200 * 12
        await decide(producer, result, S.COMMIT_MESSAGE)
    assert broker.ctx.store.get_half(half_offset).parts is None
    messages = await pulled(broker, "HBP", 0)
    assert [(m.body, m.tags, m.queue_offset) for m in messages] == [(r.body, r.tags, i) for i, r in enumerate(rows)]


async def test_a_rolled_back_batch_half_publishes_nothing_and_cannot_commit(broker):
    async with TransactionProducer("PG_HB", Checks(), broker.namesrv_addr) as producer:
        result = await producer.send_half_batch(batch("HB2", 50), MessageQueue("HB2", broker.ctx.config.brokerName, 0))
        await decide(producer, result, S.ROLLBACK_MESSAGE)
        with pytest.raises(BrokerError) as refused:
            await decide(producer, result, S.COMMIT_MESSAGE)
        assert refused.value.code == ResponseCode.ILLEGAL_OPERATION
        await producer.send(Message("HB2", b"after"), result.queue)
    assert [m.body for m in await pulled(broker, "HB2")] == [b"after"]


async def test_a_batch_half_is_checked_back_once_and_the_answer_decides_all(broker_factory):
    broker = await broker_factory(transactionTimeOut=50, transactionCheckInterval=60_000)
    checks = Checks(S.COMMIT_MESSAGE)
    async with TransactionProducer("PG_HB3", checks, broker.namesrv_addr) as producer:
        committed = asyncio.Event()
        broker.store.add_arrival_listener(lambda t, q, m: committed.set() if t == "HB3" else None)
        result = await producer.send_half_batch(batch("HB3", 20), properties={"job": "j3"})
        checked = await asyncio.wait_for(checks.checked.get(), 10)
        assert checked.properties["job"] == "j3" and checked.properties[P.HALF_BATCH] == "20"
        assert checked.body == b"" and checked.topic == "HB3"  # the half without the messages it holds
        await asyncio.wait_for(committed.wait(), 10)
    assert [m.body for m in await pulled(broker, "HB3", result.queue.queue_id)] == \
        [f"row-{i}".encode() for i in range(20)]
    assert checks.checked.empty()


async def test_a_bad_message_refuses_the_whole_batch_half(broker):
    async with TransactionProducer("PG_HB", Checks(), broker.namesrv_addr) as producer:
        queue = MessageQueue("HB4", broker.ctx.config.brokerName, 0)
        rows = batch("HB4", 5)
        rows[3] = Message("HB4", b"bad", keys="x" * 600)
        with pytest.raises(BrokerError) as refused:
            await producer.send_half_batch(rows, queue)
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL and "KEYS" in refused.value.remark
        with pytest.raises(ValueError, match="reserved"):  # the half's own properties are user names only
            await producer.send_half_batch(batch("HB4", 2), queue, properties={P.DELAY: "3"})
        async with Admin(broker.namesrv_addr) as admin:
            assert [h async for h in admin.pending_halves()] == []  # nothing of it was stored
        result = await producer.send_half_batch(batch("HB4", 2), queue)
        await decide(producer, result, S.COMMIT_MESSAGE)
    assert [m.body for m in await pulled(broker, "HB4")] == [b"row-0", b"row-1"]


async def test_a_batch_half_outlives_a_restart_and_commits_whole(broker_factory, tmp_path):
    broker = await broker_factory(store_dir=tmp_path / "s")
    async with TransactionProducer("PG_HB6", Checks(), broker.namesrv_addr) as producer:
        result = await producer.send_half_batch(batch("HB6", 40), MessageQueue("HB6", broker.ctx.config.brokerName, 2))
    await broker.stop()
    broker = await broker_factory(store_dir=tmp_path / "s")
    async with TransactionProducer("PG_HB6", Checks(), broker.namesrv_addr) as producer:
        queue = MessageQueue("HB6", broker.ctx.config.brokerName, 2)  # the route now names the new broker's port
        await producer.decide(queue, result.queue_offset, result.offset_msg_id, result.msg_id, S.COMMIT_MESSAGE)
    assert [m.body for m in await pulled(broker, "HB6", 2)] == [f"row-{i}".encode() for i in range(40)]
