"""TransactionProducer against a real broker: local decisions, check-backs, restarts, the DB-backed pattern."""
from __future__ import annotations

import asyncio
import sqlite3

import pytest

from halfmq.protocol.codes import RequestCode
from halfmq.client import (LocalTransactionState, LogCheckListener, Message, PullConsumer, TransactionLog,
                           TransactionProducer)

S = LocalTransactionState


class Listener:
    """Local decisions by message key; check answers from a dict; records every check."""

    def __init__(self, local: dict[str, S], check: dict[str, S] | None = None):
        self.local = local
        self.check = check or {}
        self.checks: asyncio.Queue = asyncio.Queue()

    async def execute_local_transaction(self, msg, arg):
        return self.local[msg.keys]

    async def check_local_transaction(self, msg):
        await self.checks.put(msg)
        return self.check.get(msg.keys, S.UNKNOW)


async def barrier(producer, broker) -> None:
    """Returns once everything the producer sent before is durable: a two-way write on the same connection is
    processed, committed and answered after the producer's earlier (oneway) END_TRANSACTIONs."""
    conn = await producer.instance.pool.get(broker.ctx.broker_addr)
    resp = await conn.request(RequestCode.UPDATE_CONSUMER_OFFSET,
                              {"consumerGroup": "BARRIER", "topic": "BARRIER", "queueId": "0", "commitOffset": "0"})
    assert resp.code == 0


async def committed_bodies(broker, topic) -> list[bytes]:
    async with PullConsumer("AUDIT", broker.namesrv_addr) as consumer:
        out = []
        for queue in await consumer.fetch_subscribe_queues(topic):
            out += [m.body for m in (await consumer.pull(queue, 0, max_nums=100)).messages]
        return sorted(out)


async def test_local_commit_rollback_and_unknown_then_check(broker_factory):
    # The first check is due a second after each half: the local decisions (oneway) are stored long before, even on
    # a busy machine, so only the UNKNOW one is ever checked.
    broker = await broker_factory(transactionTimeOut=1000, transactionCheckInterval=60_000)
    listener = Listener({"c": S.COMMIT_MESSAGE, "r": S.ROLLBACK_MESSAGE, "u": S.UNKNOW},
                        {"u": S.COMMIT_MESSAGE})
    async with TransactionProducer("TXG", listener, broker.namesrv_addr) as producer:
        results = {k: await producer.send_message_in_transaction(Message("TxT", k.encode(), keys=k)) for k in "cru"}
        assert {k: r.local_state for k, r in results.items()} == {"c": S.COMMIT_MESSAGE, "r": S.ROLLBACK_MESSAGE,
                                                                   "u": S.UNKNOW}
        checked = await asyncio.wait_for(listener.checks.get(), 5)
        assert checked.keys == "u" and checked.topic == "TxT"
        assert checked.properties["TRANSACTION_CHECK_TIMES"] == "1"
        committed = asyncio.Event()
        broker.store.add_arrival_listener(lambda t, q, m: committed.set() if t == "TxT" else None)
        while True:
            committed.clear()  # before reading: an arrival while reading is not missed
            if await committed_bodies(broker, "TxT") == [b"c", b"u"]:
                break
            await asyncio.wait_for(committed.wait(), 5)
    assert listener.checks.empty()  # decided messages are never checked


async def test_two_producers_of_a_group_check_goes_to_the_sender(broker_factory):
    broker = await broker_factory(transactionTimeOut=50, transactionCheckInterval=60_000)
    first, second = Listener({"a": S.UNKNOW}, {"a": S.ROLLBACK_MESSAGE}), Listener({"b": S.UNKNOW})
    async with TransactionProducer("TXG2", first, broker.namesrv_addr) as p1, \
            TransactionProducer("TXG2", second, broker.namesrv_addr) as p2:
        await p1.send_message_in_transaction(Message("TxT2", b"a", keys="a"))
        msg = await asyncio.wait_for(first.checks.get(), 5)
        assert msg.keys == "a" and second.checks.empty()
        assert p2.started


async def test_producer_gone_then_back_checks_resume_without_burning_attempts(broker_factory):
    # Due a second after it is sent: its producer is gone by then (a check while it is still there would count).
    broker = await broker_factory(transactionTimeOut=1000, transactionCheckInterval=3_600_000, transactionCheckMax=1)
    undeliverable = asyncio.Event()
    service = broker.ctx.check_back
    original = service.run_pass

    async def observed():
        handled = await original()
        if service.checks_undeliverable:
            undeliverable.set()
        return handled

    service.run_pass = observed
    gone = Listener({"x": S.UNKNOW})
    producer = TransactionProducer("TXG3", gone, broker.namesrv_addr)
    await producer.start()
    result = await producer.send_message_in_transaction(Message("TxT3", b"x", keys="x"))
    await producer.close()
    await asyncio.wait_for(undeliverable.wait(), 10)
    half = broker.store.get_half(int(result.send_result.offset_msg_id[-16:], 16))
    assert half.checks == 0 and half.status.value == "PREPARED"
    back = Listener({}, {"x": S.COMMIT_MESSAGE})
    async with TransactionProducer("TXG3", back, broker.namesrv_addr):
        msg = await asyncio.wait_for(back.checks.get(), 5)  # the interval is an hour: the registration did it
        assert msg.keys == "x" and msg.properties["TRANSACTION_CHECK_TIMES"] == "1"


async def test_pending_halves_are_checked_after_a_broker_restart(broker_factory, tmp_path):
    store = tmp_path / "s"
    broker = await broker_factory(store_dir=store, transactionTimeOut=300, transactionCheckInterval=60_000)
    async with TransactionProducer("TXG4", Listener({"p": S.UNKNOW}), broker.namesrv_addr) as producer:
        await producer.send_message_in_transaction(Message("TxT4", b"p", keys="p"))
    await broker.stop()  # stopped before the first check was due
    broker = await broker_factory(store_dir=store, transactionTimeOut=300, transactionCheckInterval=60_000)
    assert broker.store.pending_halves_count() == 1
    listener = Listener({}, {"p": S.COMMIT_MESSAGE})
    async with TransactionProducer("TXG4", listener, broker.namesrv_addr):
        msg = await asyncio.wait_for(listener.checks.get(), 5)
        assert msg.keys == "p" and msg.properties["TRANSACTION_CHECK_TIMES"] == "1"


def make_db(path):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    db.commit()
    return db


async def test_message_published_only_when_the_database_transaction_commits(broker, tmp_path):
    path = str(tmp_path / "app.db")
    db = make_db(path)
    tx_log = TransactionLog(lambda: sqlite3.connect(path))
    tx_log.create_table(db)
    async with TransactionProducer("TXDB", LogCheckListener(tx_log), broker.namesrv_addr) as producer:
        async with producer.transaction(Message("Orders", b"order-1"), db, tx_log) as half:
            db.execute("INSERT INTO orders (item) VALUES ('book')")
        assert tx_log.exists(half.msg_id)
        with pytest.raises(RuntimeError):
            async with producer.transaction(Message("Orders", b"order-2"), db, tx_log) as failed:
                db.execute("INSERT INTO orders (item) VALUES ('pen')")
                raise RuntimeError("application failure")
        assert not tx_log.exists(failed.msg_id)
        await barrier(producer, broker)
    assert db.execute("SELECT item FROM orders").fetchall() == [("book",)]
    committed = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: committed.set() if t == "Orders" else None)
    while await committed_bodies(broker, "Orders") != [b"order-1"]:
        committed.clear()
        await asyncio.wait_for(committed.wait(), 5)
    states = sorted(s.status.value for _o, s in broker.store.iter_halves())
    assert states == ["COMMITTED", "ROLLED_BACK"]


async def test_crash_between_database_commit_and_message_commit_is_settled_by_the_check(broker_factory, tmp_path):
    broker = await broker_factory(transactionTimeOut=30, transactionCheckInterval=60_000)
    path = str(tmp_path / "app.db")
    db = make_db(path)
    tx_log = TransactionLog(lambda: sqlite3.connect(path))
    tx_log.create_table(db)
    crashed = TransactionProducer("TXDB2", LogCheckListener(tx_log), broker.namesrv_addr)
    await crashed.start()
    # What transaction() does up to the crash: half stored, id recorded, database committed — no END_TRANSACTION.
    half = await crashed.send_half(Message("Orders2", b"paid"))
    tx_log.record(db, half.msg_id)
    db.commit()
    await crashed.instance.close()  # the process "dies": its connections drop without a decision
    committed = asyncio.Event()
    broker.store.add_arrival_listener(lambda t, q, m: committed.set() if t == "Orders2" else None)
    async with TransactionProducer("TXDB2", LogCheckListener(tx_log), broker.namesrv_addr):
        await asyncio.wait_for(committed.wait(), 5)
    assert await committed_bodies(broker, "Orders2") == [b"paid"]
