"""A batch half's commit writes, in one loop of its own (WriteContext.put_committed_batch), exactly what
put_committed writes for each of its records in turn: markers, queue entries, KEYS entries and counters."""
from __future__ import annotations

import pytest

from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import MessageRecord, batch_index, batch_spans, encode_record
from halfmq.store.committed import pack_marker, pack_markers
from halfmq.store.context import WriteContext
from halfmq.store.halfs import pack_parts, unpack_parts
from halfmq.store.writer import DBS, load_counters, open_env

PROPS = [{}, {"TAGS": "red"}, {"KEYS": "a b"}, {"TAGS": "blue", "KEYS": "c"}, {"XKEYS": "not-a-key"}]


def half_record() -> bytes:
    body = b"".join(encode_record(MessageRecord(topic="Real", body=b"row %d" % i, queue_id=2,
                                                properties=dict(PROPS[i % len(PROPS)]))) for i in range(12))
    return bytes(encode_record(MessageRecord(topic="HALF", body=body)))


def written(env, dbs, counters, commit) -> tuple:
    txn = env.begin(write=True)
    try:
        wctx = WriteContext(txn, dbs, counters.copy(), 1_700_000_000_000, env.max_key_size())
        wctx.counters.queue_max[("Real", 2)] = 40  # the queue holds messages already
        value = commit(wctx)
        keys = list(txn.cursor(db=dbs["keys"]).iternext(values=False))
        return (value, wctx._records, wctx._entries, keys, wctx.counters.next_physical, wctx.counters.queue_max,
                wctx.grown, wctx.writes)
    finally:
        txn.abort()


def test_a_batch_commit_writes_what_committing_each_record_writes(tmp_path):
    env = open_env(str(tmp_path), 1 << 26, readonly=False)
    with env.begin(write=True) as txn:
        dbs = {name: env.open_db(name.encode(), txn=txn) for name in DBS}
    counters = load_counters(env, dbs)
    counters.next_physical = 5_000
    index = batch_index(half_record())

    def each(wctx):
        results = [wctx.put_committed("Real", 2, 777, (start, size), size, tags_code, keys)
                   for start, size, tags_code, keys in index]
        return results[0], results[-1][0]

    batch = written(env, dbs, counters, lambda wctx: wctx.put_committed_batch("Real", 2, 777, index))
    assert batch == written(env, dbs, counters, each)
    assert any(keys for *_, keys in index) and any(tags for _, _, tags, _ in index)
    env.close()


def test_batch_markers_are_the_markers_of_each_part():
    parts = [(100, 60), (160, 75), (235, 61)]
    assert pack_markers(9, parts, "Rëal", 3, 17, 123) == [pack_marker(9, part, "Rëal", 3, 17 + i, 123)
                                                          for i, part in enumerate(parts)]


def test_a_batch_half_without_keys_is_indexed_from_the_sizes_recorded_at_prepare():
    """The commit of a batch half whose messages have no KEYS (a Spark sink's) reads each record's place from the
    sizes and tags codes recorded when it was prepared (HalfState.parts) instead of parsing the body: the same
    index, and sizes that do not add up to the body are refused as batch_index refuses a malformed body."""
    records = [encode_record(MessageRecord(topic="Real", body=b"row %d" % i, queue_id=2,
                                           properties={"TAGS": "red"} if i % 3 else {})) for i in range(12)]
    half = bytes(encode_record(MessageRecord(topic="HALF", body=b"".join(records))))
    tags = [index_tags for _start, _size, index_tags, _keys in batch_index(half)]
    parts = pack_parts([len(r) for r in records], tags)
    assert batch_spans(half, *unpack_parts(parts, len(records))) == batch_index(half)
    short = pack_parts([len(r) for r in records[:-1]] + [len(records[-1]) - 1], tags)
    with pytest.raises(MessageFormatError):
        batch_spans(half, *unpack_parts(short, len(records)))
