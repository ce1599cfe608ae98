"""Pull bodies (concatenated stored records, reference §4.4) straight into Arrow record batches.

Per record, Python does one struct unpack (the protocol's record layout, RECORD_HEADS) and a few byte reads to find
where the fields are; everything else (copying bodies, parsing properties, looking up tags, filtering) is done a
column at a time by Arrow.
"""
from __future__ import annotations

import struct
from array import array
from functools import lru_cache
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from halfmq.protocol.message import HOST_FLAGS, MAGIC_V2, RECORD_HEADS
from halfmq.protocol.properties import decode_properties

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("broker_name", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()),
    ("msg_id", pa.string()), ("keys", pa.string()), ("tags", pa.string()), ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", pa.timestamp("us", tz="UTC")), ("store_timestamp", pa.timestamp("us", tz="UTC"))])
_PROPERTIES = ARROW_SCHEMA.field("properties").type
_TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")

#: The layout of records with IPv4 hosts, nearly all of them.
_PLAIN = RECORD_HEADS[0]
_I64 = struct.Struct(">q")


def _int(value: int) -> pa.Scalar:
    """A typed scalar for compute calls: a bare Python value makes pyarrow infer its type, and the inference tries
    to import dateutil on every call (a file-system search per call when it is not installed)."""
    return pa.scalar(value, pa.int64())


_0, _1, _2 = _int(0), _int(1), _int(2)
_LOOKUPS = {name: pc.MapLookupOptions(pa.scalar(name, pa.string()), "last") for name in ("TAGS", "KEYS", "UNIQ_KEY")}


class _Fields(NamedTuple):
    """Per record, in columns: the decoded numbers, and where its parts are in the pull body."""

    queue_ids: list[int]
    queue_offsets: list[int]
    born: list[int]
    stored: list[int]
    store_hosts: list[bytes]
    physicals: list[int]
    #: _PARTS boundaries per record (its start, then where each part after the first begins), then the buffer's end.
    bounds: list[int]


#: The parts a record is cut into: the fixed fields, body, topic length, topic, properties length, properties.
_PARTS = 6
_BODY, _TOPIC, _PROPS = 1, 3, 5


def _scan(buf: bytes) -> _Fields:
    """Walks the records once; the hot loop of the reader, so it only unpacks and appends."""
    fields = _Fields(*([] for _ in _Fields._fields))
    queue_ids, queue_offsets, borns, storeds, store_hosts, physicals, _ = (column.append for column in fields)
    bounds = fields.bounds.extend
    plain = _PLAIN
    pos, size = 0, len(buf)
    while pos < size:
        layout = plain
        (total, magic, _crc, queue_id, _flag, queue_offset, physical, sys_flag, born, _born_host, stored, store_host,
         _reconsume, _prepared, body_len) = plain.unpack_from(buf, pos)
        if sys_flag & HOST_FLAGS:
            layout = RECORD_HEADS[sys_flag & HOST_FLAGS]
            (total, magic, _crc, queue_id, _flag, queue_offset, physical, sys_flag, born, _born_host, stored,
             store_host, _reconsume, _prepared, body_len) = layout.unpack_from(buf, pos)
        body_at = pos + layout.size
        body_end = body_at + body_len
        if magic == MAGIC_V2:  # the topic length takes two bytes instead of one
            topic_at = body_end + 2
            topic_len = buf[body_end] << 8 | buf[body_end + 1]
        else:
            topic_at = body_end + 1
            topic_len = buf[body_end]
        props_len_at = topic_at + topic_len
        bounds((pos, body_at, body_end, topic_at, props_len_at, props_len_at + 2))
        queue_ids(queue_id)
        queue_offsets(queue_offset)
        borns(born)
        storeds(stored)
        store_hosts(store_host)
        physicals(physical)
        pos += total
    fields.bounds.append(size)
    return fields


@lru_cache(maxsize=8)
def _every(count: int, first: int) -> pa.Array:
    """Indices first, first + _PARTS, ... (count of them): one part of every record."""
    return pa.array(range(first, count * _PARTS, _PARTS), pa.int32())


def _parts(buf: bytes, f: _Fields) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Body, topic and properties columns: the pull body seen as one binary array of record parts (no copy),
    from which Arrow gathers every record's part of each kind into a contiguous column."""
    count = len(f.queue_offsets)
    parts = pa.Array.from_buffers(pa.binary(), count * _PARTS,
                                  [None, pa.py_buffer(array("i", f.bounds)), pa.py_buffer(buf)])
    # The casts to string check UTF-8, as bytes.decode() would.
    return (pc.take(parts, _every(count, _BODY)), pc.take(parts, _every(count, _TOPIC)).cast(pa.string()),
            pc.take(parts, _every(count, _PROPS)).cast(pa.string()))


def _properties(raw: pa.StringArray) -> pa.MapArray:
    """Property strings parsed as decode_properties does, a column at a time."""
    segments = pc.split_pattern(raw, "\x02")
    flat = segments.flatten()
    parts = pc.split_pattern(flat, "\x01", max_splits=1)
    # Kept: a name, the first \x01, a value; both non-empty (so the trailing empty segment goes too).
    name_len = pc.binary_length(pc.list_element(parts, _0))
    kept = pc.and_(pc.and_(pc.equal(pc.list_value_length(parts), _2), pc.greater(name_len, _0)),
                   pc.greater(pc.subtract(pc.binary_length(flat), name_len), _1))
    # Each message's entries end where its segments end, less the segments dropped before that point.
    kept_before = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(kept.cast(pa.int64()))])
    offsets = pc.take(kept_before, segments.offsets).cast(pa.int32())
    pairs = parts.filter(kept)
    keys, values = pc.list_element(pairs, _0), pc.list_element(pairs, _1)
    if _repeats_a_name(pc.list_parent_indices(segments).filter(kept), keys):
        # The last value wins, at the first one's place, as in a dict (rare: no client sends that).
        return pa.array([list(decode_properties(text).items()) for text in raw.to_pylist()], _PROPERTIES)
    return pa.MapArray.from_arrays(offsets, keys, values, type=_PROPERTIES)


def _repeats_a_name(owners: pa.Array, names: pa.Array) -> bool:
    """Whether some message has two properties of the same name (owners: the message of each property)."""
    codes = pc.dictionary_encode(names).indices.cast(pa.int64())
    pairs = pc.add(pc.multiply(owners.cast(pa.int64()), _int(len(names) + 1)), codes)
    return pc.count_distinct(pairs).as_py() < len(names)


def _msg_ids(uniq: pa.StringArray, hosts, physicals) -> pa.Array:
    """UNIQ_KEY, else the offset message id (store host and commit-log offset in hex), as the reference does."""
    if not uniq.null_count:
        return uniq
    return pa.array([u if u is not None else (host + _I64.pack(physical)).hex().upper()
                     for u, host, physical in zip(uniq.to_pylist(), hosts, physicals)], pa.string())


def _timestamps(millis) -> pa.Array:
    return pa.array(millis, _TIMESTAMP_MS).cast(ARROW_SCHEMA.field("born_timestamp").type)


def records_to_batch(buf: bytes, end: int, tags: set[str] | None, broker_name: str) -> pa.RecordBatch | None:
    """The records of pull bodies (one, or several concatenated) of one queue of ``broker_name`` as a batch of
    ARROW_SCHEMA, without offsets >= ``end`` nor tags not in ``tags`` (None: any); None when nothing is left."""
    f = _scan(buf)
    if not f.queue_offsets:
        return None
    bodies, topics, raw_properties = _parts(buf, f)
    properties = _properties(raw_properties)
    tag_column = pc.map_lookup(properties, options=_LOOKUPS["TAGS"])
    offsets = pa.array(f.queue_offsets, pa.int64())
    batch = pa.RecordBatch.from_arrays([
        topics, pa.repeat(pa.scalar(broker_name, pa.string()), len(offsets)), pa.array(f.queue_ids, pa.int32()),
        offsets,
        _msg_ids(pc.map_lookup(properties, options=_LOOKUPS["UNIQ_KEY"]), f.store_hosts, f.physicals),
        pc.map_lookup(properties, options=_LOOKUPS["KEYS"]), tag_column, bodies, properties,
        _timestamps(f.born), _timestamps(f.stored)], schema=ARROW_SCHEMA)
    wanted = pc.less(offsets, _int(end))
    if tags is not None:  # the broker filters by tag hash code only; collisions are removed here
        wanted = pc.and_(wanted, pc.is_in(tag_column, value_set=pa.array(sorted(tags), pa.string())))
    if not pc.all(wanted).as_py():
        batch = batch.filter(wanted)
    return batch if batch.num_rows else None
