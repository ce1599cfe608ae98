"""Committed halves are stored once: a commit writes a small *commit marker* into the commit log, not a copy.

A half message's record (in RMQ_SYS_TRANS_HALF_TOPIC) already holds everything its committed message is made of.
Committing it used to copy it into the real topic; now the commit stores, at the committed message's own
commit-log offset, a marker naming the half record (and, for a batch half, which of the records its body holds)
with the fields only the commit knows: real topic, queue id, queue offset, store time. Its queue entry, KEYS
entries and the half's new state are written with it, in one transaction, as before.

Every read of a message (``MessageStore``'s reads, the start-up check) passes what it finds through ``resolve``,
which turns a marker into the record a copy would have been, byte for byte: the half's record with the real topic
and queue id, the transaction type COMMIT, preparedTransactionOffset = the half's offset, and the commit's queue
offset, commit-log offset and store time. So consumers, views by id, queries by key, the Spark source and the audit
job read what they read before. Retention and topic purges, which need only where a record belongs and its
properties, read them with ``place`` (nothing is rebuilt). Retention keeps a committed half's record while a marker
of it is held (lifecycle.Expire).

A marker is told from a record by its magic code, which no record has.
"""
from __future__ import annotations

import struct
from functools import lru_cache

from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import (RecordPlace, mark_committed, record_place, record_properties_text,
                                     rewrite_record, stamp_record)

from .keys import U64

#: totalSize (of the marker), magic, half offset, part start and size (0, 0: the whole half), queue id,
#: queue offset, store timestamp; the real topic's name follows
MARKER = struct.Struct(">iIQIIiQq")
MARKER_MAGIC = 0xDAA3C0AD
MARKER_MAGIC_BYTES = MARKER_MAGIC.to_bytes(4, "big")


def pack_marker(half_offset: int, part: tuple[int, int], topic: str, queue_id: int, queue_offset: int,
                store_timestamp: int) -> bytes:
    name = topic.encode()
    return _marker_struct(len(name)).pack(MARKER.size + len(name), MARKER_MAGIC, half_offset, part[0], part[1],
                                          queue_id, queue_offset, store_timestamp, name)


def pack_markers(half_offset: int, parts, topic: str, queue_id: int, queue_offset: int,
                 store_timestamp: int) -> list[bytes]:
    """pack_marker of each part (start, size, ...) of a batch half, at consecutive queue offsets from
    ``queue_offset``."""
    name = topic.encode()
    pack, size = _marker_struct(len(name)).pack, MARKER.size + len(name)
    return [pack(size, MARKER_MAGIC, half_offset, part[0], part[1], queue_id, offset, store_timestamp, name)
            for offset, part in enumerate(parts, queue_offset)]


@lru_cache(maxsize=512)
def _marker_struct(name_bytes: int) -> struct.Struct:
    """MARKER followed by a topic name of ``name_bytes``: a marker in one pack."""
    return struct.Struct(f"{MARKER.format}{name_bytes}s")


def is_marker(raw) -> bool:
    return raw[4:8] == MARKER_MAGIC_BYTES


def marker_half(raw) -> int:
    """The commit-log offset of the half record a marker names."""
    return MARKER.unpack_from(raw)[2]


def materialize(raw, physical_offset: int, half_record) -> bytearray:
    """The record the marker ``raw`` (stored at ``physical_offset``) stands for, built from ``half_record``.

    Raises:
        MessageFormatError: the half's record (or its part) is not well formed.
    """
    _size, _magic, half_offset, start, size, queue_id, queue_offset, store_ts = MARKER.unpack_from(raw)
    if size:  # one of the records a batch half's body holds: built whole, with its real topic, at prepare
        if start + size > len(half_record):
            raise MessageFormatError(f"the batch half at {half_offset} has no record at {start}+{size}")
        record = bytearray(half_record[start:start + size])
    else:
        topic = bytes(raw[MARKER.size:]).decode()
        record = rewrite_record(half_record, topic, queue_id, record_properties_text(half_record))
    mark_committed(record, half_offset)
    stamp_record(record, queue_offset, physical_offset, store_ts)
    return record


def resolve(get, log_db, physical_offset: int, raw):
    """``raw`` as read from the commit log at ``physical_offset``, with a marker turned into its record; None when
    a marker's half record is gone. ``get`` is a transaction's ``get``.

    Raises:
        MessageFormatError: the half's record cannot be made into the committed one.
    """
    if raw is None or raw[4:8] != MARKER_MAGIC_BYTES:
        return raw
    half = get(U64.pack(marker_half(raw)), db=log_db)
    return None if half is None else materialize(raw, physical_offset, half)


def place(get, log_db, raw) -> RecordPlace:
    """record_place of what the commit log holds: a marker's topic, queue, offset and time are its own,
    its properties those of the record it stands for ("" when the half's record is gone); nothing is rebuilt.

    Raises:
        MessageFormatError: neither a well-formed record nor a marker whose half record is well formed.
    """
    if raw[4:8] != MARKER_MAGIC_BYTES:
        return record_place(raw)
    _size, _magic, half_offset, start, size, queue_id, queue_offset, store_ts = MARKER.unpack_from(raw)
    half = get(U64.pack(half_offset), db=log_db)
    properties = ""
    if half is not None:
        properties = record_place(memoryview(half)[start:start + size] if size else half).properties_text
    return RecordPlace(bytes(raw[MARKER.size:]).decode(), queue_id, queue_offset, store_ts, properties)
