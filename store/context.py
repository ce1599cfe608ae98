"""WriteContext: the primitives a write op may use inside the writer's transaction, and the writer's counters.

An op validates everything before its first write (``check_*`` raise InvalidWriteError and write nothing); the
context counts writes so the writer can tell an op that failed cleanly from one that failed half way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from halfmq.protocol.message import stamp_record

from .committed import pack_marker, pack_markers
from .errors import InvalidWriteError
from .halfs import HalfState
from .keys import CQ_VALUE, DELETED_TOPICS_KEY, DUE_KEY, QUEUE_KEY, TOPIC_ID, U64, offset_key
from .requests import PutRequest, PutResult

import msgpack


@dataclass
class Counters:
    """Where the next record and queue entries go (owned by the writer process)."""

    next_physical: int = 0
    queue_max: dict[tuple[str, int], int] = field(default_factory=dict)
    topic_ids: dict[str, int] = field(default_factory=dict)
    #: the highest topic id ever given: a deleted topic's id is not given again (its purge may still run)
    last_tid: int = 0

    def copy(self) -> "Counters":
        return Counters(self.next_physical, dict(self.queue_max), dict(self.topic_ids), self.last_tid)


class WriteContext:
    """Valid only inside one group's transaction. Records and queue entries wait in buffers until ``flush`` (or a
    read that could need them) and then go in with one putmulti per table."""

    def __init__(self, txn, dbs, counters: Counters, now_ms: int, max_key: int):
        self.txn = txn
        self.dbs = dbs
        self.counters = counters
        self.now_ms = now_ms
        self.max_key = max_key
        self.grown: dict[tuple[str, int], int] = {}
        self.new_topics: dict[str, int] = {}
        self.writes = 0  # how many writes ops made so far (an op that fails must not have moved it)
        self._records: list[tuple[bytes, bytearray]] = []
        self._first_buffered = 0
        self._entries: list[tuple[bytes, bytes]] = []

    # --- validation (no writes) ---
    def check_key(self, key: bytes, what: str) -> None:
        if not key or len(key) > self.max_key:
            raise InvalidWriteError(f"{what} makes a store key of {len(key)} bytes; the store takes 1 to "
                                    f"{self.max_key} bytes")

    def check_message(self, req: PutRequest) -> None:
        """Raises InvalidWriteError when ``req`` cannot be stored whole."""
        self.check_names(req.topic, req.keys)

    def check_names(self, topic: str, keys: str | None) -> None:
        """Raises InvalidWriteError when a message of ``topic`` with ``keys`` cannot be stored whole."""
        if topic not in self.counters.topic_ids:  # a known topic was checked when it got its id
            self.check_key(topic.encode(), f"the topic name {topic[:40]!r}")
        if keys:
            encoded = topic.encode()
            for key in keys.split():
                self.check_key(key_index_key(encoded, key, 0), f"the KEYS entry {key[:40]!r}")

    # --- writes ---
    def flush(self) -> None:
        if self._records:
            records, self._records = self._records, []
            _put_all(self.txn, self.dbs["commitlog"], records, append=True)
        if self._entries:
            entries, self._entries = self._entries, []
            _put_all(self.txn, self.dbs["cq"], entries, append=False)

    def _topic_id(self, topic: str) -> int:
        tid = self.counters.topic_ids.get(topic)
        if tid is None:
            tid = self.counters.last_tid = self.counters.last_tid + 1
            self.counters.topic_ids[topic] = tid
            self.new_topics[topic] = tid
            self.txn.put(topic.encode(), TOPIC_ID.pack(tid), db=self.dbs["topic_ids"])
        return tid

    def put_message(self, req: PutRequest) -> PutResult:
        """Store one record (checked first: it writes nothing when it raises)."""
        return PutResult._make(self.put_fields(req.topic, req.queue_id, req.record, req.tags_code, req.index,
                                               req.keys))

    def put_fields(self, topic: str, queue_id: int, record: bytearray, tags_code: int, index: bool,
                   keys: str | None) -> tuple[int, int, int, int]:
        """put_message of a request given field by field (a send's wire form, see ops.PutMessage), its PutResult's
        fields as a plain tuple: a send's outcome goes back to the broker, and pickling a named tuple runs Python
        per result (0.86 us against 0.12 us a plain tuple)."""
        self.check_names(topic, keys)
        counters = self.counters
        physical = counters.next_physical
        queue_offset = counters.queue_max.get((topic, queue_id), 0) if index else 0
        stamp_record(record, queue_offset, physical, self.now_ms)
        self._append(topic, queue_id, record, len(record), tags_code, index, keys, queue_offset)
        return physical, queue_offset, self.now_ms, len(record)

    def put_committed(self, topic: str, queue_id: int, half_offset: int, part: tuple[int, int], size: int,
                      tags_code: int, keys: str | None) -> tuple[int, int, int, int]:
        """A committed half's message, made visible without copying it: a commit marker (store/committed.py)
        naming the half record at ``half_offset`` (``part``: which record of a batch half's body, (0, 0): the
        whole half), with a queue entry and KEYS entries for the ``size`` bytes it reads as. Its names and KEYS
        were checked when the half was prepared. Same value as put_fields."""
        counters = self.counters
        physical = counters.next_physical
        queue_offset = counters.queue_max.get((topic, queue_id), 0)
        marker = pack_marker(half_offset, part, topic, queue_id, queue_offset, self.now_ms)
        self._append(topic, queue_id, marker, size, tags_code, True, keys, queue_offset)
        return physical, queue_offset, self.now_ms, size

    def put_committed_batch(self, topic: str, queue_id: int, half_offset: int,
                            index: list[tuple[int, int, int, str | None]]) -> tuple[tuple[int, int, int, int], int]:
        """put_committed of each record of a batch half's body, ``index`` (protocol.message.batch_index: start,
        size, tags code, KEYS of each), at consecutive queue offsets: the first's value and the last's commit-log
        offset. One loop of the batch's own: per record, _append's checks and counter updates were most of a batch
        commit."""
        counters, now = self.counters, self.now_ms
        tid = self._topic_id(topic)
        queue = (topic, queue_id)
        first_queue_offset = counters.queue_max.get(queue, 0)
        physical = counters.next_physical
        if not self._records:
            self._first_buffered = physical
        records, entries = self._records, self._entries
        queue_key, cq_value, u64 = QUEUE_KEY.pack, CQ_VALUE.pack, U64.pack
        keys_db, encoded, put = self.dbs["keys"], topic.encode(), self.txn.put
        first = (physical, first_queue_offset, now, index[0][1])
        queue_offset = first_queue_offset
        for marker, (_start, size, tags_code, keys) in zip(
                pack_markers(half_offset, index, topic, queue_id, first_queue_offset, now), index):
            records.append((u64(physical), marker))
            entries.append((queue_key(tid, queue_id, queue_offset), cq_value(physical, size, tags_code, now)))
            if keys:
                for key in keys.split():
                    put(key_index_key(encoded, key, physical), b"", db=keys_db)
            last = physical
            physical += len(marker)
            queue_offset += 1
        self.writes += len(index)
        counters.next_physical = physical
        counters.queue_max[queue] = self.grown[queue] = queue_offset
        return first, last

    def _append(self, topic: str, queue_id: int, stored: bytes, size: int, tags_code: int, index: bool,
                keys: str | None, queue_offset: int) -> None:
        """Buffer ``stored`` at the commit log's end, its queue entry (for ``size`` bytes) and its KEYS entries."""
        self.writes += 1
        counters = self.counters
        physical = counters.next_physical
        if not self._records:
            self._first_buffered = physical
        self._records.append((U64.pack(physical), stored))
        if index:
            key = (topic, queue_id)
            tid = self._topic_id(topic)
            self._entries.append((QUEUE_KEY.pack(tid, queue_id, queue_offset),
                                  CQ_VALUE.pack(physical, size, tags_code, self.now_ms)))
            counters.queue_max[key] = queue_offset + 1
            self.grown[key] = queue_offset + 1
        if keys:
            keys_db, encoded = self.dbs["keys"], topic.encode()
            for key in keys.split():
                self.txn.put(key_index_key(encoded, key, physical), b"", db=keys_db)
        counters.next_physical = physical + len(stored)

    def read_record(self, physical_offset: int) -> bytes | None:
        if self._records and physical_offset >= self._first_buffered:
            self.flush()  # the record may still be in the buffer
        return self.txn.get(U64.pack(physical_offset), db=self.dbs["commitlog"])

    def get_half(self, half_offset: int) -> HalfState | None:
        raw = self.txn.get(U64.pack(half_offset), db=self.dbs["halfs"])
        return None if raw is None else HalfState.from_bytes(raw)

    def put_half(self, half_offset: int, state: HalfState) -> None:
        self.writes += 1
        self.txn.put(U64.pack(half_offset), state.to_bytes(), db=self.dbs["halfs"])

    def add_due(self, due_ms: int, half_offset: int) -> None:
        self.writes += 1
        self.txn.put(DUE_KEY.pack(max(0, due_ms), half_offset), b"", db=self.dbs["due"])

    def remove_due(self, due_ms: int, half_offset: int) -> None:
        self.writes += 1
        self.txn.delete(DUE_KEY.pack(max(0, due_ms), half_offset), db=self.dbs["due"])

    def set_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.writes += 1
        self.txn.put(offset_key(group, topic, queue_id), U64.pack(max(0, offset)), db=self.dbs["offsets"])

    def put_topic(self, name: str, config: dict) -> None:
        self.writes += 1
        self.txn.put(name.encode(), msgpack.packb(config), db=self.dbs["topics"])

    def delete_topic(self, name: str) -> None:
        self.writes += 1
        self.txn.delete(name.encode(), db=self.dbs["topics"])

    def deleted_topics(self) -> dict[str, int]:
        """Topic name → the commit-log offset when it was last deleted (DELETED_TOPICS_KEY)."""
        raw = self.txn.get(DELETED_TOPICS_KEY.encode(), db=self.dbs["meta"])
        return msgpack.unpackb(raw) if raw is not None else {}

    def put_meta(self, key: str, value) -> None:
        self.writes += 1
        self.txn.put(key.encode(), msgpack.packb(value), db=self.dbs["meta"])


def stored_before_deletion(deleted: dict[str, int], topic: str, physical_offset: int) -> bool:
    """Was the record at ``physical_offset``, bound for ``topic``, stored before the topic's last deletion?"""
    boundary = deleted.get(topic)
    return boundary is not None and physical_offset < boundary


def key_index_key(topic: bytes, key: str, physical: int) -> bytes:
    return b"%s\x00%s\x00%s" % (topic, key.encode(), U64.pack(physical))


def _put_all(txn, db, items: list, append: bool) -> None:
    """All ``items`` in one call (one GIL release); every key must be new."""
    with txn.cursor(db=db) as cursor:
        _consumed, added = cursor.putmulti(items, append=append)
    if added != len(items):
        raise RuntimeError(f"only {added} of {len(items)} records were written (a key already existed)")
