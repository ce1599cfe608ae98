"""store/receipts.py: the receipt ops check everything before writing, and what they write survives a reopen."""
from __future__ import annotations

import pytest

from halfmq.protocol.message import MessageRecord
from halfmq.store import MessageStore, StoreConfig, message_request
from halfmq.store.ops import PutMessages
from halfmq.store.receipts import (AckReceipts, ChangeInvisibility, DeadLetter, ReceiptError, TakeReceipts,
                                   read_cursor, read_receipts)


@pytest.fixture
async def open_store(tmp_path):
    stores = []

    async def make() -> MessageStore:
        store = MessageStore(StoreConfig(root=str(tmp_path), map_size=64 << 20))
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        if not store.closed:
            await store.close()


def take(cursor, new_cursor, fresh=(), again=(), dropped=(), visible_at=1_000, version=7):
    return TakeReceipts("G", "T", 0, cursor, new_cursor, list(fresh), list(again), list(dropped), visible_at, version)


async def test_take_ack_change_and_reopen(open_store):
    store = await open_store()
    assert await store.submit(take(None, 2, fresh=[(0, 100, False), (1, 200, True)])) == [(0, 1, 100), (1, 1, 200)]
    assert read_cursor(store, "G", "T", 0) == 2
    with pytest.raises(ReceiptError, match="cursor moved"):
        await store.submit(take(None, 3, fresh=[(2, 300, False)]))  # a stale cursor: nothing written
    assert read_cursor(store, "G", "T", 0) == 2
    assert await store.submit(take(2, 2, again=[(0, 7)], version=8)) == [(0, 2, 100)]  # attempt counted
    with pytest.raises(ReceiptError, match="newer handle"):
        await store.submit(ChangeInvisibility("G", "T", 0, 0, 7, 5_000, 9))  # the old version of offset 0
    changed = await store.submit(ChangeInvisibility("G", "T", 0, 0, 8, 5_000, 9))
    assert (changed.visible_at, changed.version, changed.attempts) == (5_000, 9, 2)
    errors = await store.submit(AckReceipts([("G", "T", 0, 0, 8), ("G", "T", 0, 1, 7), ("G", "T", 0, 5, 1)]))
    assert [type(e).__name__ if e else None for e in errors] == ["ReceiptError", None, "ReceiptError"]
    await store.close()
    store = await open_store()
    [held] = read_receipts(store, "G", "T", 0)
    assert (held.queue_offset, held.attempts, held.version, held.visible_at, held.grouped) == (0, 2, 9, 5_000, False)
    assert read_cursor(store, "G", "T", 0) == 2 and read_receipts(store, "other", "T", 0) == []


async def test_dead_letter_stores_the_copy_and_drops_the_receipt_in_one_write(open_store):
    store = await open_store()
    await store.submit(take(None, 1, fresh=[(0, 100, False)]))
    request = message_request(MessageRecord(topic="%DLQ%G", body=b"dead", store_host="127.0.0.1:1"))
    with pytest.raises(ReceiptError):
        await store.submit(DeadLetter("G", "T", 0, 0, 99, request))  # a stale version: no copy either
    assert store.max_offset("%DLQ%G", 0) == 0
    await store.submit(DeadLetter("G", "T", 0, 0, 7, request))
    assert store.max_offset("%DLQ%G", 0) == 1 and read_receipts(store, "G", "T", 0) == []


async def test_deleting_a_topic_drops_its_cursors_and_receipts(open_store):
    """Before: they stayed, so a topic created again (its queues starting at 0) had its first messages skipped by
    a RocketMQ 5 consumer whose cursor was past them."""
    from halfmq.store.lifecycle import DeleteTopic

    store = await open_store()
    record = MessageRecord(topic="T", body=b"m", store_host="127.0.0.1:1")
    await store.submit(PutMessages([message_request(record), message_request(record)]))
    await store.submit(take(None, 2, fresh=[(0, 100, False), (1, 200, False)]))
    await store.submit(TakeReceipts("G", "Other", 0, None, 1, [(0, 300, False)], [], [], 1_000, 7))
    await store.submit(DeleteTopic("T"))
    assert read_cursor(store, "G", "T", 0) is None and read_receipts(store, "G", "T", 0) == []
    assert read_cursor(store, "G", "Other", 0) == 1 and len(read_receipts(store, "G", "Other", 0)) == 1
