"""The LMDB store on a real environment in a temp folder."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from halfmq.protocol.message import MessageRecord, decode_record, encode_record, tags_hash
from halfmq.store import MessageStore, PutRequest, StoreConfig, StoreError, StoreFullError
from halfmq.store.store import StoredEntry


def request(topic="T", queue_id=0, body=b"x", tag=None, index=True) -> PutRequest:
    props = {"TAGS": tag} if tag else {}
    rec = MessageRecord(topic=topic, body=body, queue_id=queue_id, born_host="127.0.0.1:1", properties=props)
    return PutRequest(topic, queue_id, encode_record(rec), tags_hash(tag), index)


@pytest.fixture
async def open_store(tmp_path):
    stores = []

    async def make(**kw) -> MessageStore:
        store = MessageStore(StoreConfig(root=str(kw.pop("root", tmp_path)), map_size=kw.pop("map_size", 64 << 20),
                                         **kw))
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def test_put_stamps_offsets_and_reads_back(open_store):
    store = await open_store()
    results = await store.put_messages([request(body=b"a"), request(body=b"bb"), request(queue_id=1, body=b"c")])
    assert [r.queue_offset for r in results] == [0, 1, 0]
    assert results[0].physical_offset == 0
    assert results[1].physical_offset == results[0].size  # contiguous byte positions, like a commit log
    rec = decode_record(store.read_record(results[1].physical_offset))
    assert (rec.body, rec.queue_offset, rec.physical_offset, rec.store_timestamp) == (
        b"bb", 1, results[1].physical_offset, results[1].store_timestamp)
    assert store.max_offset("T", 0) == 2 and store.max_offset("T", 1) == 1 and store.max_offset("X", 0) == 0
    assert store.queue_ids("T") == [0, 1]
    entries = store.get_queue_entries("T", 0, 0, 10)
    assert [e.queue_offset for e in entries] == [0, 1] and isinstance(entries[0], StoredEntry)


async def test_concurrent_puts_are_grouped_into_few_commits(open_store):
    store = await open_store()
    before = store.stats()["total_groups"]
    await asyncio.gather(*(store.put_messages([request(body=str(i).encode())]) for i in range(500)))
    groups = store.stats()["total_groups"] - before
    assert groups < 50, groups  # 500 writes issued together share a handful of durable commits
    assert store.max_offset("T", 0) == 500


async def test_failed_function_leaves_nothing_and_spares_its_group(open_store):
    store = await open_store()

    def failing(ctx):
        ctx.put_message(request(body=b"partial"))
        ctx.put_meta("k", 1)
        raise ValueError("refused")

    ok = store.put_messages([request(body=b"kept")])
    bad = store.write(failing)
    results = await asyncio.gather(ok, bad, return_exceptions=True)
    assert isinstance(results[1], ValueError)
    assert store.max_offset("T", 0) == 1 and store.get_meta("k") is None
    assert decode_record(store.read_record(0)).body == b"kept"
    after = await store.put_messages([request(body=b"next")])
    assert after[0].queue_offset == 1 and after[0].physical_offset == results[0][0].size


async def test_full_map_fails_writes_clearly_and_keeps_reads(open_store):
    store = await open_store(map_size=1 << 20)
    first = await store.put_messages([request(body=b"early")])
    with pytest.raises(StoreFullError, match="mapSize"):
        await store.put_messages([request(body=bytes(4096)) for _ in range(400)])
    assert store.max_offset("T", 0) == 1
    assert decode_record(store.read_record(first[0].physical_offset)).body == b"early"
    more = await store.put_messages([request(body=b"small")])  # the writer survived
    assert more[0].queue_offset == 1


async def test_reopen_continues_counters_without_replay(open_store, tmp_path):
    store = await open_store()
    for q in range(3):
        await store.put_messages([request(queue_id=q, body=bytes([q]))] * (q + 2))
    await store.close()
    reopened = await open_store()
    assert [reopened.max_offset("T", q) for q in range(3)] == [2, 3, 4]
    result = await reopened.put_messages([request(queue_id=2)])
    assert result[0].queue_offset == 4
    assert result[0].physical_offset == sum(len(r.record) for r in [request(queue_id=q, body=bytes([q]))
                                                                     for q in range(3) for _ in range(q + 2)])


async def test_read_queue_filters_tags_and_respects_limits(open_store):
    store = await open_store()
    await store.put_messages([request(tag=t, body=t.encode()) for t in "ABABAB"])
    records, nxt = store.read_queue("T", 0, 0, 10, frozenset({tags_hash("B")}), 1 << 20)
    assert [decode_record(r).body for r in records] == [b"B", b"B", b"B"] and nxt == 6
    records, nxt = store.read_queue("T", 0, 0, 2, None, 1 << 20)
    assert len(records) == 2 and nxt == 2
    records, nxt = store.read_queue("T", 0, 0, 10, None, 1)
    assert len(records) == 1 and nxt == 1  # the byte limit never returns less than one record


async def test_offset_for_timestamp_boundaries(open_store):
    store = await open_store()
    stamps = [(await store.put_messages([request()]))[0].store_timestamp for _ in range(3)]
    assert store.offset_for_timestamp("T", 0, 0) == 0
    assert store.offset_for_timestamp("T", 0, stamps[-1] + 1) == 3
    assert store.offset_for_timestamp("T", 0, stamps[-1] + 1, "upper") == 2
    assert store.offset_for_timestamp("T", 0, 0, "upper") == 0
    assert store.earliest_store_time("T", 0) == stamps[0]


async def test_arrival_listener_fires_after_commit_only(open_store):
    store = await open_store()
    seen = []
    store.add_arrival_listener(lambda topic, q, m: seen.append((topic, q, m, store.max_offset(topic, q))))
    await store.put_messages([request(), request(), request(queue_id=1), request(index=False)])
    assert sorted(seen) == [("T", 0, 2, 2), ("T", 1, 1, 1)]


async def test_transaction_tables_and_due_index(open_store):
    store = await open_store()

    def write(ctx):
        for offset, due in ((100, 30), (200, 10), (300, 20)):
            ctx.put_half(offset, {"state": "PREPARED", "due": due})
            ctx.add_due(due, offset)
        ctx.remove_due(20, 300)

    await store.write(write)
    assert store.due_halves(25, 10) == [(10, 200)]
    assert store.due_halves(100, 10) == [(10, 200), (30, 100)]
    assert store.next_due() == (10, 200) and store.pending_halves_count() == 2
    assert store.get_half(300) == {"state": "PREPARED", "due": 20}
    assert sorted(o for o, _ in store.iter_halves()) == [100, 200, 300]


async def test_offsets_topics_meta_and_async_flush(open_store):
    store = await open_store(flush_disk_type="ASYNC_FLUSH", flush_interval_ms=10)
    await store.set_consumer_offset("G", "T", 1, 42)
    await store.put_topic("T", {"name": "T"})
    await store.put_meta("m", [1, 2])
    assert store.get_consumer_offset("G", "T", 1) == 42
    assert list(store.consumer_offsets()) == [("G", "T", 1, 42)]
    assert store.topics() == {"T": {"name": "T"}} and store.get_meta("m") == [1, 2]
    await store.delete_topic("T")
    assert store.get_topic("T") is None


async def test_close_drains_queued_writes(open_store, tmp_path):
    store = await open_store()
    futures = [store.submit_messages([request()]) for _ in range(50)]  # queued, not yet committed
    await store.close()
    assert all(f.done() and not f.exception() for f in futures)
    reopened = await open_store()
    assert reopened.max_offset("T", 0) == 50


async def test_writes_wait_for_the_sync_helper_and_fail_clearly_when_it_dies(open_store):
    store = await open_store()
    helper = store.syncer.pid
    os.kill(helper, signal.SIGSTOP)  # the disk "hangs": nothing may be acknowledged
    pending = asyncio.ensure_future(store.put_messages([request(body=b"unsynced")]))
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done and store.max_offset("T", 0) == 0  # neither answered nor visible before it is synced
    os.kill(helper, signal.SIGKILL)
    with pytest.raises(StoreError, match="sync helper"):
        await asyncio.wait_for(pending, 10)
    assert store.syncer.pid != helper  # a new helper took over
    results = await asyncio.wait_for(store.put_messages([request(body=b"after")]), 10)
    assert decode_record(store.read_record(results[0].physical_offset)).body == b"after"
