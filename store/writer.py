"""Group commit: every write of one loop iteration in one LMDB write transaction.

Operations queue up during a loop iteration; at its end ``GroupWriter`` applies them (up to ``max_group`` at a
time) in ONE LMDB write transaction on the loop thread and commits it without syncing; ``syncer.Syncer`` then
makes it durable before anything is answered (SYNC_FLUSH). A function operation runs in a child transaction,
so its failure leaves no partial write and does not affect the others of its group; a full map aborts the
whole group.

Why the loop thread writes: py-lmdb releases the GIL in every call, and a writer thread had to win it back
from the busy loop (and compete with the clients for a core) five to seven times per group, which stretched
a 0.5 ms commit to 2-3 ms and kept the broker in lock step with its clients. Records and queue entries also
go in with one ``putmulti`` per table instead of a ``put`` each.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import lmdb
import msgpack

from halfmq.protocol.message import stamp_record

from .errors import StoreFullError
from .keys import CQ_VALUE, DUE_KEY, QUEUE_KEY, TOPIC_ID, U64, offset_key

log = logging.getLogger(__name__)


@dataclass
class PutRequest:
    topic: str
    queue_id: int
    record: bytearray
    tags_code: int = 0
    index: bool = True
    keys: str | None = None  # space-separated business keys, indexed for QUERY_MESSAGE


class PutResult(NamedTuple):
    physical_offset: int
    queue_offset: int
    store_timestamp: int
    size: int


@dataclass
class Counters:
    """The writer's view of where the next record and queue entries go."""

    next_physical: int = 0
    queue_max: dict[tuple[str, int], int] = field(default_factory=dict)
    topic_ids: dict[str, int] = field(default_factory=dict)

    def copy(self) -> "Counters":
        return Counters(self.next_physical, dict(self.queue_max), dict(self.topic_ids))


class WriteContext:
    """The primitives a write operation may use; valid only inside it.

    Stored records and their queue entries wait in buffers until ``flush`` (or a read that could need them).
    """

    def __init__(self, txn, dbs, counters: Counters, now_ms: int, grown: dict):
        self.txn = txn
        self.dbs = dbs
        self.counters = counters
        self.now_ms = now_ms
        self.grown = grown
        self._records: list[tuple[bytes, bytearray]] = []
        self._first_buffered = 0  # physical offset of the first buffered record
        self._entries: list[tuple[bytes, bytes]] = []

    def flush(self) -> None:
        """Write the buffered records and queue entries into the transaction."""
        if self._records:
            records, self._records = self._records, []
            _put_all(self.txn, self.dbs["commitlog"], records, append=True)
        if self._entries:
            entries, self._entries = self._entries, []
            _put_all(self.txn, self.dbs["cq"], entries, append=False)

    def _topic_id(self, topic: str) -> int:
        tid = self.counters.topic_ids.get(topic)
        if tid is None:
            tid = len(self.counters.topic_ids) + 1
            self.counters.topic_ids[topic] = tid
            self.txn.put(topic.encode(), TOPIC_ID.pack(tid), db=self.dbs["topic_ids"])
        return tid

    def put_message(self, req: PutRequest) -> PutResult:
        counters = self.counters
        physical = counters.next_physical
        queue_offset = 0
        if req.index:
            key = (req.topic, req.queue_id)
            queue_offset = counters.queue_max.get(key, 0)
        record = req.record
        stamp_record(record, queue_offset, physical, self.now_ms)
        size = len(record)
        if not self._records:
            self._first_buffered = physical
        self._records.append((U64.pack(physical), record))
        if req.index:
            tid = self._topic_id(req.topic)
            self._entries.append((QUEUE_KEY.pack(tid, req.queue_id, queue_offset),
                                  CQ_VALUE.pack(physical, size, req.tags_code, self.now_ms)))
            counters.queue_max[key] = queue_offset + 1
            self.grown[key] = queue_offset + 1
        if req.keys:
            keys_db = self.dbs["keys"]
            prefix = req.topic.encode() + b"\x00"
            for key in req.keys.split():
                self.txn.put(prefix + key.encode() + b"\x00" + U64.pack(physical), b"", db=keys_db)
        counters.next_physical = physical + size
        return PutResult(physical, queue_offset, self.now_ms, size)

    def read_record(self, physical_offset: int) -> bytes | None:
        if self._records and physical_offset >= self._first_buffered:
            self.flush()  # the record may still be in the buffer
        return self.txn.get(U64.pack(physical_offset), db=self.dbs["commitlog"])

    def get_half(self, half_offset: int) -> dict | None:
        raw = self.txn.get(U64.pack(half_offset), db=self.dbs["halfs"])
        return None if raw is None else msgpack.unpackb(raw)

    def put_half(self, half_offset: int, state: dict) -> None:
        self.txn.put(U64.pack(half_offset), msgpack.packb(state), db=self.dbs["halfs"])

    def delete_half(self, half_offset: int) -> None:
        self.txn.delete(U64.pack(half_offset), db=self.dbs["halfs"])

    def add_due(self, due_ms: int, half_offset: int) -> None:
        self.txn.put(DUE_KEY.pack(max(0, due_ms), half_offset), b"", db=self.dbs["due"])

    def remove_due(self, due_ms: int, half_offset: int) -> None:
        self.txn.delete(DUE_KEY.pack(max(0, due_ms), half_offset), db=self.dbs["due"])

    def set_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.txn.put(offset_key(group, topic, queue_id), U64.pack(max(0, offset)), db=self.dbs["offsets"])

    def put_topic(self, name: str, config: dict) -> None:
        self.txn.put(name.encode(), msgpack.packb(config), db=self.dbs["topics"])

    def delete_topic(self, name: str) -> None:
        self.txn.delete(name.encode(), db=self.dbs["topics"])

    def put_meta(self, key: str, value) -> None:
        self.txn.put(key.encode(), msgpack.packb(value), db=self.dbs["meta"])


@dataclass
class _Op:
    kind: str                      # "put" (records), "checked" (functions, one outcome each) or "fn"
    payload: Any
    future: Any
    outcome: tuple | None = None   # (ok, value)


class GroupWriter:
    """Applies a group of operations in ONE LMDB write transaction and commits it (without syncing).

    It runs on the event loop thread, once per loop iteration, so the loop never waits for another thread to
    give the GIL back in the middle of a group.
    """

    def __init__(self, env: lmdb.Environment, dbs: dict, counters: Counters):
        self.env = env
        self.dbs = dbs
        self.counters = counters
        self.total_groups = 0
        self.total_ops = 0
        self.last_group_size = 0
        self.last_commit_seconds = 0.0

    def commit(self, batch: list[_Op]) -> dict | None:
        """Set every op's outcome; the queue bounds grown by the group, or None when nothing was stored."""
        started = time.perf_counter()
        counters = self.counters.copy()
        grown: dict[tuple[str, int], int] = {}
        now_ms = int(time.time() * 1000)
        try:
            with self.env.begin(write=True) as txn:
                shared = WriteContext(txn, self.dbs, counters, now_ms, grown)
                for op in batch:
                    self._apply(op, shared)
                shared.flush()
        except lmdb.MapFullError:
            log.error("the LMDB map is full: %d writes refused (raise mapSize)", len(batch))
            error = StoreFullError("the store is full: the LMDB map reached its size limit; raise the mapSize "
                                   "configuration key (nothing of this write was stored)")
            for op in batch:
                op.outcome = (False, error)
            return None
        except Exception as exc:  # an LMDB failure at commit: nothing of the group was stored
            log.exception("store commit failed")
            for op in batch:
                op.outcome = (False, exc)
            return None
        finally:
            self.total_groups += 1
            self.total_ops += len(batch)
            self.last_group_size = len(batch)
            self.last_commit_seconds = time.perf_counter() - started
        self.counters = counters
        return grown

    def _apply(self, op: _Op, shared: WriteContext) -> None:
        if op.kind == "put":
            # Validated before queueing: a failure here can only be LMDB's, which aborts the whole group.
            op.outcome = (True, [shared.put_message(req) for req in op.payload])
            return
        if op.kind == "checked":
            # Each function raises only before its first write (it validates, then writes): no child
            # transaction is needed to undo anything, which saves a nested commit per function.
            outcomes = []
            for fn in op.payload:
                try:
                    outcomes.append((True, fn(shared)))
                except lmdb.MapFullError:
                    raise
                except Exception as exc:
                    outcomes.append((False, exc))
            op.outcome = (True, outcomes)
            return
        shared.flush()  # the child transaction must see (and may read) everything written before it
        counters, grown = shared.counters, shared.grown
        saved = counters.copy()
        saved_grown = dict(grown)
        child = self.env.begin(write=True, parent=shared.txn)
        try:
            context = WriteContext(child, self.dbs, counters, shared.now_ms, grown)
            value = op.payload(context)
            context.flush()
        except lmdb.MapFullError:
            child.abort()
            raise
        except Exception as exc:
            child.abort()
            counters.next_physical = saved.next_physical
            counters.queue_max = saved.queue_max
            counters.topic_ids = saved.topic_ids
            grown.clear()
            grown.update(saved_grown)
            op.outcome = (False, exc)
            return
        child.commit()
        op.outcome = (True, value)


def _put_all(txn, db, items: list, append: bool) -> None:
    """All ``items`` in one call (one GIL release); every key must be new."""
    with txn.cursor(db=db) as cursor:
        _consumed, added = cursor.putmulti(items, append=append)
    if added != len(items):
        raise lmdb.Error(f"only {added} of {len(items)} records were written")
