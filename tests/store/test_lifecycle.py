"""Retention, topic deletion and a store that grows, on the real store (issue 13): what goes, what stays."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from halfmq.protocol.message import decode_record
from halfmq.store import HalfState, HalfStatus, MessageStore, StoreConfig, StoreFullError
from halfmq.store.lifecycle import DeleteTopic, Expire, Protected, PurgeTopics, schedule_progress_key
from halfmq.store.ops import PutMessages, PutMeta, SetConsumerOffsets
from halfmq.store.txops import DecideHalf, DiscardHalf, PrepareHalf, ResumeHalf

from tests.store.test_store import request

HALF, SCHEDULE, TIMER = "RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"
KEEP = Protected(HALF, SCHEDULE, TIMER, keep_discarded_ms=3_600_000)
EVERYTHING = 1 << 62  # a cut after every record: only what must be kept stays


@pytest.fixture
async def open_store(tmp_path):
    stores = []

    async def make(**kw) -> MessageStore:
        store = MessageStore(StoreConfig(root=str(tmp_path), **{"map_size": 64 << 20, **kw}))
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def expire(store, before_ms=EVERYTHING, slice_records=7, goal=0):
    """A whole pass in small slices, as the broker's retention service runs it; records deleted."""
    start, blocked, deleted = 0, frozenset(), 0
    while True:
        result = await store.submit(Expire(before_ms, start, slice_records, goal, KEEP, blocked))
        store.advance_minimums(result.mins)
        deleted += result.deleted
        if result.done or (goal and result.freed_bytes):
            return deleted
        start, blocked = result.next_start, result.blocked


def bodies(store, topic, queue_id=0, start=0):
    records, _ = store.read_queue(topic, queue_id, start, 1000, None, 1 << 30)
    return [decode_record(r).body for r in records]


async def test_old_messages_go_oldest_first_with_their_keys_and_the_minimum_moves(open_store):
    store = await open_store()
    await store.submit(PutMessages([request("T", 0, b"old-%d" % i, keys=f"k{i}") for i in range(20)]))
    cut = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= cut:
        time.sleep(0.001)  # the next records must be stored after the cut (a clock, not a synchronisation)
    await store.submit(PutMessages([request("T", 0, b"new-%d" % i, keys=f"k{i}") for i in range(5)]))
    assert await expire(store, before_ms=cut) == 20
    assert store.min_offset("T", 0) == 20 and store.max_offset("T", 0) == 25
    assert bodies(store, "T", start=20) == [b"new-%d" % i for i in range(5)]
    assert bodies(store, "T", start=0) == []  # a reader below the minimum finds nothing (the broker says moved)
    assert [decode_record(r).body for r in store.messages_by_key("T", "k3", 10)] == [b"new-3"]
    assert [decode_record(r).body for r in store.messages_by_key("T", "k12", 10)] == []
    assert await expire(store, before_ms=cut) == 0  # a second pass finds nothing older


async def test_the_minimum_and_the_end_survive_a_restart_when_everything_went(open_store, tmp_path):
    store = await open_store()
    results = await store.submit(PutMessages([request("T", q, b"m") for q in (0, 1, 1)]))
    end = results[-1].physical_offset + results[-1].size
    assert await expire(store) == 3
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (1, 1)
    await store.close()
    store = await open_store()
    assert (store.min_offset("T", 1), store.max_offset("T", 1)) == (2, 2)
    (again,) = await store.submit(PutMessages([request("T", 1, b"after")]))
    assert again.queue_offset == 2 and again.physical_offset == end  # no offset is given twice
    assert bodies(store, "T", 1, start=2) == [b"after"]


async def test_pending_and_resumable_halves_stay_and_can_still_be_decided(open_store):
    store = await open_store()

    async def half(n):
        state = HalfState(HalfStatus.PREPARED, "PG", "Real", 0, f"uniq-{n}", queue_offset=0, store_ts=0, due=0)
        result, _ = await store.submit(PrepareHalf(request(HALF, 0, b"half-%d" % n), state, 0))
        return result

    pending, committed, discarded = await half(0), await half(1), await half(2)
    await store.submit(DecideHalf(committed.physical_offset, "PG", committed.queue_offset, True, False))
    await store.submit(PutMessages([request("T", 0, b"plain")]))
    assert (await store.submit(DiscardHalf(discarded.physical_offset, 0, "TRANS_CHECK_MAX_TIME_TOPIC", "1.2.3.4:5")))
    deleted = await expire(store)
    # Gone: the commit marker, the plain message, the discarded copy. The committed half's record stays while
    # its marker is held (the committed message is read from it), and goes with the next pass, state and all.
    assert deleted == 3
    assert store.get_half(committed.physical_offset) is not None
    assert await expire(store) == 1
    assert store.get_half(committed.physical_offset) is None
    assert store.min_offset(HALF, 0) == 0  # the half queue keeps its entries from the pending half on
    decision = await store.submit(DecideHalf(pending.physical_offset, "PG", pending.queue_offset, True, False))
    assert decision.applied and bodies(store, "Real")[-1] == b"half-0"
    before, after = await store.submit(ResumeHalf(discarded.physical_offset))
    assert before is HalfStatus.DISCARDED and after.status is HalfStatus.PREPARED
    assert await expire(store) == 1  # the first half's commit marker; its record follows; the resumed one stays
    assert await expire(store) == 1
    assert store.get_half(pending.physical_offset) is None
    assert store.read_record(discarded.physical_offset) is not None


async def test_a_discarded_half_goes_once_its_keep_time_is_over(open_store):
    store = await open_store()
    state = HalfState(HalfStatus.PREPARED, "PG", "Real", 0, "uniq", queue_offset=0, store_ts=0, due=0)
    result, _ = await store.submit(PrepareHalf(request(HALF, 0, b"half"), state, 0))
    await store.submit(DiscardHalf(result.physical_offset, 0, "TRANS_CHECK_MAX_TIME_TOPIC", "1.2.3.4:5"))
    short = Protected(HALF, SCHEDULE, TIMER, keep_discarded_ms=0)
    done = await store.submit(Expire(EVERYTHING, 0, 100, 0, short, frozenset()))
    assert done.deleted == 2 and store.get_half(result.physical_offset) is None


async def test_undelivered_delayed_messages_stay(open_store):
    store = await open_store()
    await store.submit(PutMessages([request(SCHEDULE, 2, b"delayed-%d" % i) for i in range(3)]))
    await store.submit(PutMeta(schedule_progress_key(3), 1))  # level 3 (queue 2) delivered the first one
    assert await expire(store) == 1
    assert store.min_offset(SCHEDULE, 2) == 1 and bodies(store, SCHEDULE, 2, start=1) == [b"delayed-1", b"delayed-2"]


async def test_a_deleted_topic_is_purged_and_starts_empty_when_created_again(open_store):
    store = await open_store()
    await store.submit(PutMessages([request("T", q, b"secret", keys="alice") for q in (0, 1)]
                                   + [request("T", 0, b"unindexed", index=False, keys="bob"),
                                      request("Other", 0, b"kept", keys="alice")]))
    await store.submit(SetConsumerOffsets({("G", "T", 0): 1, ("G", "Other", 0): 1}))
    store.forget_topic("T", await store.submit(DeleteTopic("T")))
    assert store.max_offset("T", 0) == 0 and store.get_consumer_offset("G", "T", 0) is None
    assert store.get_consumer_offset("G", "Other", 0) == 1
    (fresh,) = await store.submit(PutMessages([request("T", 0, b"fresh", keys="alice")]))
    assert fresh.queue_offset == 0 and bodies(store, "T") == [b"fresh"]
    while not (await store.submit(PurgeTopics(1))).done:
        pass
    assert [decode_record(r).body for r in store.messages_by_key("T", "alice", 10)] == [b"fresh"]
    assert store.messages_by_key("T", "bob", 10) == [] and bodies(store, "Other") == [b"kept"]
    assert store.stats()["entries"]["commitlog"] == 3  # the unindexed record stays until retention takes it
    await store.close()
    store = await open_store()
    assert bodies(store, "T") == [b"fresh"] and store.max_offset("T", 0) == 1


async def test_a_committed_batch_half_reads_from_its_markers_until_retention_takes_them(open_store):
    """A committed half is stored once (store/committed.py): its messages are markers read from the half's record.
    Retention removes the markers with their KEYS entries (read from the half's record) and keeps the half's record
    while a marker of it is held; the next pass takes it."""
    store = await open_store()
    parts = [request("Real", 0, b"one", keys="k1").record, request("Real", 0, b"two", keys="k2 shared").record]
    state = HalfState(HalfStatus.PREPARED, "PG", "Real", 0, "uniq", queue_offset=0, store_ts=0, due=0, batch=2)
    half, _ = await store.submit(PrepareHalf(request(HALF, 0, b"".join(parts)), state, 0, ("k1", "k2 shared")))
    await store.submit(DecideHalf(half.physical_offset, "PG", half.queue_offset, True, False))
    assert bodies(store, "Real") == [b"one", b"two"]
    assert [decode_record(r).body for r in store.messages_by_key("Real", "shared", 10)] == [b"two"]
    assert await expire(store, before_ms=0) == 0  # nothing is old enough
    assert await expire(store) == 2  # the two markers; the half's record was looked at while they were held
    assert store.stats()["entries"]["keys"] == 0 and store.read_record(half.physical_offset) is not None
    assert await expire(store) == 1 and store.get_half(half.physical_offset) is None  # no marker holds it now


async def test_the_map_grows_up_to_its_maximum(open_store):
    store = await open_store(map_size=1 << 20, max_map_size=8 << 20)
    body = os.urandom(64 << 10)
    for _ in range(40):  # 2.5 MiB: more than the starting map
        await store.submit(PutMessages([request("T", 0, body)]))
    assert store.stats()["entries"]["commitlog"] == 40
    with pytest.raises(StoreFullError, match="maxMapSize"):
        for _ in range(200):
            await store.submit(PutMessages([request("T", 0, body)]))
    assert len(bodies(store, "T")) >= 40  # reads go on


async def test_freed_pages_are_reused(open_store, tmp_path):
    store = await open_store()
    body = os.urandom(8 << 10)
    data = tmp_path / "lmdb" / "data.mdb"
    sizes = []
    for _round in range(6):
        for _ in range(8):
            await store.submit(PutMessages([request("T", 0, body) for _ in range(16)]))  # 1 MiB a round
        await expire(store, slice_records=64)
        sizes.append(data.stat().st_size)
    # Six rounds wrote 6 MiB; the file stays at what one or two rounds need: deleted pages were written again.
    assert sizes[-1] <= sizes[1] * 1.25, sizes
    assert store.usage().used_bytes < 1 << 20


@pytest.mark.parametrize("seed", range(5))
async def test_a_writer_killed_in_the_middle_of_a_pass_leaves_a_consistent_store(open_store, seed):
    """SIGKILL of the writer while retention slices are in flight, then the store opened again from disk: what
    stays is whole and readable, offsets continue where they were, and nothing is given twice."""
    rng = random.Random(seed)
    store = await open_store()
    for _ in range(10):
        await store.submit(PutMessages([request("T", q, b"m", keys="k") for q in (0, 1) for _ in range(50)]))
    end = store.stats()["entries"]["commitlog"]
    tops = {q: store.max_offset("T", q) for q in (0, 1)}
    slices = [store.submit(Expire(EVERYTHING, 0, 13, 0, KEEP, frozenset()))]
    kill_after = rng.randrange(0, 4)
    for _ in range(kill_after):
        result = await slices[-1]
        slices.append(store.submit(Expire(EVERYTHING, result.next_start, 13, 0, KEEP, result.blocked)))
    os.kill(store.link.pid, signal.SIGKILL)
    await asyncio.gather(*slices, return_exceptions=True)
    await store.close()
    store = await open_store()
    context = f"seed {seed}, killed after {kill_after} slices"
    for queue_id, top in tops.items():
        assert store.max_offset("T", queue_id) == top, context
        low = store.min_offset("T", queue_id)
        assert len(bodies(store, "T", queue_id, start=low)) == top - low, context
    assert store.stats()["entries"]["commitlog"] <= end
    (after,) = await store.submit(PutMessages([request("T", 0, b"after")]))
    assert after.queue_offset == tops[0], context
    assert all(decode_record(r).physical_offset < after.physical_offset
               for r in store.messages_by_key("T", "k", 10_000)), context
