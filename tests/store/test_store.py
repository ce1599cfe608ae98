"""The LMDB store on a real environment in a temp folder, with its real writer process."""
from __future__ import annotations

import asyncio
import os
import signal

import lmdb
import pytest

from halfmq.protocol.message import MessageRecord, decode_record, tags_hash
from halfmq.store import (CorruptRecordError, CorruptStoreError, HalfState, HalfStatus, InvalidWriteError,
                          MessageStore, StoreConfig, StoreFullError, StoreLockedError, StoreUnavailableError,
                          message_request)
from halfmq.store.lifecycle import DeleteTopic
from halfmq.store.ops import PutMessage, PutMessages, PutMeta, PutTopic, SetConsumerOffsets
from halfmq.store.store import StoredEntry
from halfmq.store.txops import DecideHalf, PrepareHalf

from tests.support.damage import flip_body_byte


def request(topic="T", queue_id=0, body=b"x", tag=None, index=True, keys=None):
    props = {"TAGS": tag} if tag else {}
    if keys:
        props["KEYS"] = keys
    rec = MessageRecord(topic=topic, body=body, queue_id=queue_id, born_host="127.0.0.1:1", properties=props)
    return message_request(rec, index)


def put(store, *requests):
    return store.submit(PutMessages(list(requests)))


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
    results = await put(store, request(body=b"a"), request(body=b"bb"), request(queue_id=1, body=b"c"))
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
    await asyncio.gather(*(put(store, request(body=str(i).encode())) for i in range(500)))
    groups = store.stats()["total_groups"] - before
    assert groups < 50, groups  # 500 writes issued together share a handful of durable commits
    assert store.max_offset("T", 0) == 500


async def test_a_large_group_reaches_the_writer_without_waiting_for_the_loop(open_store):
    """A group of 1 MiB (a batch half's) goes to the kernel whole when it is sent: what the transport keeps for
    later waits for the loop's next turns, which a busy broker makes long (40-160 ms measured under the Spark
    sink)."""
    import socket
    from halfmq.store.link import LINK_BUFFER_BYTES
    probe, _other = socket.socketpair()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LINK_BUFFER_BYTES)
    granted = probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    probe.close(), _other.close()
    if granted < 2 << 20:
        pytest.skip(f"the kernel grants a socket {granted} bytes of buffer (net.core.wmem_max)")
    store = await open_store()
    pending = put(store, request(body=b"x" * (1 << 20)))
    store._send_group()  # as the end of this loop turn would
    assert store.link.transport.get_write_buffer_size() == 0
    await pending


async def test_a_held_group_waits_for_its_hold_and_not_for_other_holds(open_store):
    """A burst dispatched over several loop iterations holds the group (broker/transport.py): its writes go to the
    writer together when its hold ends, and then even while another burst still holds, so no write waits for more
    than the burst that held it."""
    store = await open_store()
    before = store.total_groups
    store.hold_group()  # burst A
    a = store.submit(PutMessage(request(body=b"a")))
    store.hold_group()  # burst B, overlapping A
    b = store.submit(PutMessage(request(body=b"b")))
    for _ in range(3):  # loop iterations pass: the end-of-iteration flush keeps the group open
        await asyncio.sleep(0)
    assert store.total_groups == before and not a.done()
    store.release_group()  # A ends while B still holds
    assert (store.total_groups, store.last_group_size) == (before + 1, 2)
    c = store.submit(PutMessage(request(body=b"c")))
    for _ in range(3):
        await asyncio.sleep(0)
    assert store.total_groups == before + 1  # B holds
    store.release_group()
    assert (store.total_groups, store.last_group_size) == (before + 2, 1)
    results = [await a, await b, await c]
    assert [r.queue_offset for r in results] == [0, 1, 2]
    d = store.submit(PutMessage(request(body=b"d")))  # no hold: the end of the iteration sends it
    assert (await d).queue_offset == 3 and store.total_groups == before + 3


async def test_an_op_that_cannot_be_applied_fails_alone_and_leaves_nothing(open_store):
    store = await open_store()
    kept = store.submit(PutMessage(request(body=b"kept")))
    bad_key = store.submit(PutMessage(request(body=b"long key", keys="k" * 600)))
    bad_batch = put(store, request(body=b"fine"), request(body=b"long", keys="ok " + "k" * 600))
    bad_offset = store.submit(SetConsumerOffsets({("G" * 600, "T", 0): 1, ("G", "T", 0): 1}))
    also_kept = store.submit(PutMessage(request(body=b"also kept", keys="short")))
    for refused in (bad_key, bad_batch, bad_offset):
        with pytest.raises(InvalidWriteError, match="511"):
            await refused
    first, second = await kept, await also_kept
    assert store.max_offset("T", 0) == 2  # no buffered record, no moved counter left behind
    assert second.queue_offset == 1 and second.physical_offset == first.size
    assert list(store.consumer_offsets()) == []
    assert [decode_record(r).body for r in store.messages_by_key("T", "short", 10)] == [b"also kept"]
    after = await store.submit(PutMessage(request(body=b"next")))
    assert after.queue_offset == 2


async def test_full_map_fails_writes_clearly_and_keeps_reads(open_store):
    store = await open_store(map_size=1 << 20, max_map_size=1 << 20)
    first = await put(store, request(body=b"early"))
    with pytest.raises(StoreFullError, match="mapSize"):
        await put(store, *[request(body=bytes(4096)) for _ in range(400)])
    assert store.max_offset("T", 0) == 1
    assert decode_record(store.read_record(first[0].physical_offset)).body == b"early"
    more = await put(store, request(body=b"small"))  # the writer survived
    assert more[0].queue_offset == 1


async def test_reopen_continues_counters_without_replay(open_store):
    store = await open_store()
    for q in range(3):
        await put(store, *[request(queue_id=q, body=bytes([q]))] * (q + 2))
    await store.close()
    reopened = await open_store()
    assert [reopened.max_offset("T", q) for q in range(3)] == [2, 3, 4]
    result = await put(reopened, request(queue_id=2))
    assert result[0].queue_offset == 4
    assert result[0].physical_offset == sum(len(request(queue_id=q, body=bytes([q])).record)
                                            for q in range(3) for _ in range(q + 2))


async def test_read_queue_filters_tags_and_respects_limits(open_store):
    store = await open_store()
    await put(store, *[request(tag=t, body=t.encode()) for t in "ABABAB"])
    records, nxt = store.read_queue("T", 0, 0, 10, frozenset({tags_hash("B")}), 1 << 20)
    assert [decode_record(r).body for r in records] == [b"B", b"B", b"B"] and nxt == 6
    records, nxt = store.read_queue("T", 0, 0, 2, None, 1 << 20)
    assert len(records) == 2 and nxt == 2
    records, nxt = store.read_queue("T", 0, 0, 10, None, 1)
    assert len(records) == 1 and nxt == 1  # the byte limit never returns less than one record


async def test_offset_for_timestamp_boundaries(open_store):
    store = await open_store()
    stamps = [(await put(store, request()))[0].store_timestamp for _ in range(3)]
    assert store.offset_for_timestamp("T", 0, 0) == 0
    assert store.offset_for_timestamp("T", 0, stamps[-1] + 1) == 3
    assert store.offset_for_timestamp("T", 0, stamps[-1] + 1, "upper") == 2
    assert store.offset_for_timestamp("T", 0, 0, "upper") == 0
    assert store.earliest_store_time("T", 0) == stamps[0]


async def test_arrival_listener_fires_after_commit_only(open_store):
    store = await open_store()
    seen = []
    store.add_arrival_listener(lambda topic, q, m: seen.append((topic, q, m, store.max_offset(topic, q))))
    await put(store, request(), request(), request(queue_id=1), request(index=False))
    assert sorted(seen) == [("T", 0, 2, 2), ("T", 1, 1, 1)]


async def test_half_prepare_and_first_decision_wins(open_store):
    store = await open_store()
    state = HalfState(HalfStatus.PREPARED, "PG", "Real", 2, "uniq-1", queue_offset=0, store_ts=0, due=0)
    result, prepared = await store.submit(PrepareHalf(request(topic="HALF", body=b"half"), state, 5000))
    assert prepared.due == result.store_timestamp + 5000 and store.pending_halves_count() == 1
    assert store.next_due() == (prepared.due, result.physical_offset)
    commit = DecideHalf(result.physical_offset, "PG", result.queue_offset, True, False)
    rollback = DecideHalf(result.physical_offset, "PG", result.queue_offset, False, False)
    first, again = store.submit(commit), store.submit(commit)
    conflicting = store.submit(rollback)
    decision = await first
    assert decision.applied and decision.status is HalfStatus.COMMITTED
    assert not (await again).applied
    with pytest.raises(Exception, match="already COMMITTED"):
        await conflicting
    assert store.pending_halves_count() == 0 and store.get_half(result.physical_offset).status is HalfStatus.COMMITTED
    records, _ = store.read_queue("Real", 2, 0, 10, None, 1 << 20)
    assert [decode_record(r).body for r in records] == [b"half"]


async def test_offsets_topics_meta_and_async_flush(open_store):
    store = await open_store(flush_disk_type="ASYNC_FLUSH", flush_interval_ms=10)
    await store.submit(SetConsumerOffsets({("G", "T", 1): 42}))
    await store.submit(PutTopic("T", {"name": "T"}))
    await store.submit(PutMeta("m", [1, 2]))
    assert store.get_consumer_offset("G", "T", 1) == 42
    assert list(store.consumer_offsets()) == [("G", "T", 1, 42)]
    assert store.topics() == {"T": {"name": "T"}} and store.get_meta("m") == [1, 2]
    await store.submit(DeleteTopic("T"))
    assert store.get_topic("T") is None


async def test_close_drains_queued_writes(open_store):
    store = await open_store()
    completions = [put(store, request()) for _ in range(50)]  # queued, not yet committed
    await store.close()
    assert all(c.done() and not c.exception() for c in completions)
    reopened = await open_store()
    assert reopened.max_offset("T", 0) == 50


async def test_writes_wait_for_the_writer_and_fail_clearly_when_it_dies(open_store):
    store = await open_store()
    writer = store.link.pid
    os.kill(writer, signal.SIGSTOP)  # the disk "hangs": nothing may be acknowledged
    pending = asyncio.ensure_future(put(store, request(body=b"unsynced")))
    done, _ = await asyncio.wait({pending}, timeout=0.3)
    assert not done and store.max_offset("T", 0) == 0  # neither answered nor visible before it is durable
    os.kill(writer, signal.SIGKILL)
    with pytest.raises(StoreUnavailableError, match="writer process"):
        await asyncio.wait_for(pending, 10)
    results = await asyncio.wait_for(put(store, request(body=b"after")), 10)  # a new writer took over
    assert store.link.pid != writer
    assert decode_record(store.read_record(results[0].physical_offset)).body == b"after"


async def test_a_second_owner_is_refused_naming_the_folder_and_process(open_store, tmp_path):
    await open_store()
    with pytest.raises(StoreLockedError, match=f"{tmp_path}.*process {os.getpid()}"):
        await open_store()


async def test_a_flipped_body_byte_is_never_served(open_store, tmp_path):
    store = await open_store()
    old = await put(store, request(body=b"old-body-0123456789"))
    await put(store, *[request(body=b"newer %d" % i) for i in range(100)])
    await store.close()
    flip_body_byte(tmp_path, b"old-body-0123456789")
    store = await open_store()  # the damage is older than what the start-up check reads
    with pytest.raises(CorruptRecordError, match=f"offset {old[0].physical_offset}"):
        store.read_queue("T", 0, 0, 10, None, 1 << 20)
    with pytest.raises(CorruptRecordError):
        store.read_record(old[0].physical_offset)
    records, nxt = store.read_queue("T", 0, 1, 10, None, 1 << 20)
    assert len(records) == 10 and nxt == 11  # the rest of the queue is served
    assert store.stats()["corrupt_records"] == 2


async def test_a_corrupted_store_refuses_to_open_naming_it(open_store, tmp_path):
    store = await open_store()
    await put(store, request(body=b"newest-body-abcdef"))
    await store.close()
    flip_body_byte(tmp_path, b"newest-body-abcdef")
    with pytest.raises(CorruptStoreError, match=f"{tmp_path}.*CRC"):
        await open_store()
    os.truncate(os.path.join(tmp_path, "lmdb", "data.mdb"), 8192)  # a torn file: LMDB cannot open it
    with pytest.raises(CorruptStoreError, match="cannot be opened"):
        await open_store()


async def test_unreadable_offset_and_topic_rows_do_not_stop_the_store(open_store, tmp_path):
    store = await open_store()
    await store.submit(SetConsumerOffsets({("G", "T", 0): 7}))
    await store.close()
    env = lmdb.open(os.path.join(tmp_path, "lmdb"), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"offsets")) as txn:
        txn.put(b"bad\x00group\x00T\x000", b"\x00" * 8)  # written before names were validated
        txn.put(b"\xff\xfe\x00T\x000", b"\x00" * 8)
    with env.begin(write=True, db=env.open_db(b"topics")) as txn:
        txn.put(b"\xff-not-utf8", b"\xc1")
    env.close()
    store = await open_store()
    assert list(store.consumer_offsets()) == [("G", "T", 0, 7)]
    assert store.topics() == {}
