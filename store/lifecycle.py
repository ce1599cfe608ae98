"""Deleting what is no longer kept: retention of old records, deleted topics and their purge, as write ops.

Each op keeps the ops.py contract (it reads and checks everything, then writes) and is bounded: one slice touches
at most ``max_records`` records, so it never holds the writer, and the sends grouped with it, for long. The
broker's RetentionService submits slice after slice.

What retention never deletes:
- the record of a half message still PREPARED (its check and its commit read it), of a DISCARDED one until
  ``keep_discarded_ms`` after the discard (a resume needs it), and of a COMMITTED one while a commit marker of it
  is held (its messages are read from it: store/committed.py);
- a delayed message its level has not delivered yet (at or past the level's progress in the meta table), and a
  timer message not delivered yet (its entry in the timers table).
A queue with such a record keeps its consume-queue entries from that record on: queues never get holes (readers
count offsets), and the entries left behind are removed with the next record of the queue that goes.

A queue's last entry is kept even when its record goes: it is what tells the queue's next offset after a restart.
Readers skip entries whose record is gone, and the queue's minimum offset moves past them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.properties import KEYS, TIMER_OUT_MS, decode_properties

from .committed import is_marker, place as stored_place
from .context import WriteContext, key_index_key
from .halfs import HalfState, HalfStatus
from .keys import CQ_VALUE, DELETED_TOPICS_KEY, DUE_KEY, QUEUE_KEY, QUEUE_PREFIX, U64, parse_offset_key
from .ops import Op
from .receipts import TABLE as RECEIPTS, receipt_topic

#: meta key: topics deleted whose records and queue entries are still being removed, [[tid, name, end], ...]
PURGES_KEY = "lifecycle.purges"
#: meta key: where the commit log ends, written with every deletion (the newest records may be deleted too, and
#: the end must not move back: offsets are never given twice)
LOG_END_KEY = "lifecycle.log_end"
_KEYS_MARK = KEYS + "\x01"


def log_end(txn, dbs) -> int:
    """The commit log's end as the last deletion recorded it (0: nothing was ever deleted)."""
    raw = txn.get(LOG_END_KEY.encode(), db=dbs["meta"])
    return msgpack.unpackb(raw) if raw is not None else 0


def schedule_progress_key(level: int) -> str:
    """The meta key holding how far delayed-delivery level ``level`` has delivered (schedule service)."""
    return f"schedule.offset.{level}"


@dataclass(frozen=True, slots=True)
class Protected:
    """The system topics whose records retention must look at before deleting them."""

    half_topic: str
    schedule_topic: str
    timer_topic: str
    keep_discarded_ms: int


@dataclass(slots=True)
class ExpireResult:
    deleted: int                                   #: records deleted
    freed_bytes: int                               #: their sizes
    next_start: int                                #: where the next slice of the pass goes on
    done: bool                                     #: nothing older than the cut is left past next_start
    mins: dict = field(default_factory=dict)       #: {(topic, queue id): new minimum offset}
    blocked: frozenset = frozenset()               #: queues holding a kept record (carried to the next slice)


@dataclass(slots=True)
class Expire(Op):
    """One slice of a retention pass: from commit-log offset ``start``, delete records stored before
    ``before_ms``, oldest first, skipping what must be kept; stop after ``max_records`` records or once
    ``max_bytes`` are freed (0: no byte goal)."""

    before_ms: int
    start: int
    max_records: int
    max_bytes: int
    protected: Protected
    blocked: frozenset = frozenset()

    def apply(self, wctx: WriteContext) -> ExpireResult:
        wctx.flush()  # records buffered by this group are older than nothing, but reads below must see them
        txn, dbs = wctx.txn, wctx.dbs
        blocked = set(self.blocked)
        # (physical, place, whether its queue keeps its entries): everything is read and decided first
        doomed = []
        freed = 0
        next_start, done = self.start, True
        cur = txn.cursor(db=dbs["commitlog"])
        found = cur.set_range(U64.pack(self.start))
        examined = 0
        while found:
            physical = U64.unpack(cur.key())[0]
            if examined >= self.max_records or (self.max_bytes and freed >= self.max_bytes):
                next_start, done = physical, False
                break
            raw = cur.value()
            examined += 1
            try:
                place = stored_place(txn.get, dbs["commitlog"], raw)
            except MessageFormatError:
                place = None  # an unreadable record has no queue entry or key we could find: it just goes
            if place is not None and place.store_timestamp >= self.before_ms:
                next_start = physical
                break
            if place is not None and self._kept(wctx, physical, place):
                blocked.add((place.topic, place.queue_id))
            else:
                # A queue blocked by a later record still loses the entries before that record.
                doomed.append((physical, place, place is not None and (place.topic, place.queue_id) in blocked))
                freed += len(raw)
            found = cur.next()
        else:
            next_start = wctx.counters.next_physical
        mins: dict = {}
        if doomed:
            wctx.put_meta(LOG_END_KEY, wctx.counters.next_physical)
        for physical, place, keeps_entries in doomed:
            wctx.writes += 1
            txn.delete(U64.pack(physical), db=dbs["commitlog"])
            if place is not None:
                self._forget(wctx, physical, place, keeps_entries, mins)
        return ExpireResult(len(doomed), freed, next_start, done, mins, frozenset(blocked))

    def _kept(self, wctx: WriteContext, physical: int, place) -> bool:
        protected = self.protected
        if place.topic == protected.half_topic:
            raw = wctx.txn.get(U64.pack(physical), db=wctx.dbs["halfs"])
            if raw is None:
                return False
            state = HalfState.from_bytes(raw)
            if state.status is HalfStatus.COMMITTED:  # its messages are read from it while a marker is held
                last = state.committed_last if state.committed_last is not None else state.committed_offset
                marker = None if last is None else wctx.txn.get(U64.pack(last), db=wctx.dbs["commitlog"])
                return marker is not None and is_marker(marker)
            return state.pending or (state.status is HalfStatus.DISCARDED
                                     and (state.decided_ts or 0) + protected.keep_discarded_ms > wctx.now_ms)
        if place.topic == protected.schedule_topic:
            raw = wctx.txn.get(schedule_progress_key(place.queue_id + 1).encode(), db=wctx.dbs["meta"])
            return place.queue_offset >= (msgpack.unpackb(raw) if raw is not None else 0)
        if place.topic == protected.timer_topic:  # kept while its index entry says it is not delivered
            try:
                due = int(decode_properties(place.properties_text).get(TIMER_OUT_MS, ""))
            except ValueError:
                return False
            return wctx.txn.get(DUE_KEY.pack(due, physical), db=wctx.dbs["timers"]) is not None
        return False

    def _forget(self, wctx: WriteContext, physical: int, place, keeps_entries: bool, mins: dict) -> None:
        """Everything that points at a deleted record: its KEYS entries, its half state, its queue entries."""
        txn, dbs = wctx.txn, wctx.dbs
        topic_bytes = place.topic.encode()
        if _KEYS_MARK in place.properties_text:
            for key in (decode_properties(place.properties_text).get(KEYS) or "").split():
                txn.delete(key_index_key(topic_bytes, key, physical), db=dbs["keys"])
        if place.topic == self.protected.half_topic:
            txn.delete(U64.pack(physical), db=dbs["halfs"])
        queue = (place.topic, place.queue_id)
        tid = wctx.counters.topic_ids.get(place.topic)
        if tid is None or keeps_entries:
            return  # a deleted topic (its purge removes its entries) or a queue that must keep them
        value = txn.get(QUEUE_KEY.pack(tid, place.queue_id, place.queue_offset), db=dbs["cq"])
        if value is None or CQ_VALUE.unpack(value)[0] != physical:
            return  # stored without a queue entry
        last = wctx.counters.queue_max.get(queue, 0) - 1
        delete_entries(txn, dbs["cq"], tid, place.queue_id, min(place.queue_offset, last - 1))
        mins[queue] = place.queue_offset + 1


def delete_entries(txn, cq_db, tid: int, queue_id: int, upto: int) -> int:
    """Delete a queue's entries from its first through offset ``upto``; how many went."""
    cur = txn.cursor(db=cq_db)
    count = 0
    if not cur.set_range(QUEUE_KEY.pack(tid, queue_id, 0)):
        return 0
    while True:
        key_tid, key_queue, offset = QUEUE_KEY.unpack(cur.key())
        if key_tid != tid or key_queue != queue_id or offset > upto:
            return count
        count += 1
        if not cur.delete():
            return count


@dataclass(slots=True)
class DeleteTopic(Op):
    """A topic's configuration, queue bounds and consumer offsets go now; its records and queue entries are
    purged in slices afterwards (PurgeTopic), under its old topic id, so a topic created again with the name gets
    a new id and starts empty at once; its timer and delayed messages waiting in the system topics are not delivered
    into a topic created again (DELETED_TOPICS_KEY). Value: the old topic id, or None when it had no messages."""

    name: str

    def apply(self, wctx: WriteContext) -> int | None:
        wctx.check_key(self.name.encode(), f"the topic name {self.name[:40]!r}")
        txn, dbs, counters = wctx.txn, wctx.dbs, wctx.counters
        offsets = [key for key in txn.cursor(db=dbs["offsets"]).iternext(keys=True, values=False)
                   if _offset_topic(key) == self.name]
        # RocketMQ 5 consumers' cursors and receipts go too: a cursor left behind would skip that many messages
        # of a topic created again with the name (its queues start at 0).
        receipts = [key for key in txn.cursor(db=dbs[RECEIPTS]).iternext(keys=True, values=False)
                    if receipt_topic(key) == self.name]
        wctx.delete_topic(self.name)
        deleted = wctx.deleted_topics()
        deleted[self.name] = counters.next_physical
        wctx.put_meta(DELETED_TOPICS_KEY, deleted)
        for key in offsets:
            txn.delete(key, db=dbs["offsets"])
        for key in receipts:
            txn.delete(key, db=dbs[RECEIPTS])
        tid = counters.topic_ids.pop(self.name, None)
        if tid is None:
            return None
        txn.delete(self.name.encode(), db=dbs["topic_ids"])
        for queue in [q for q in counters.queue_max if q[0] == self.name]:
            del counters.queue_max[queue]
        purges = _purges(txn, dbs)
        purges.append([tid, self.name, counters.next_physical])
        wctx.put_meta(PURGES_KEY, purges)
        return tid


def _offset_topic(key: bytes) -> str | None:
    try:
        return parse_offset_key(key)[1]
    except (ValueError, UnicodeDecodeError):
        return None


def _purges(txn, dbs) -> list:
    raw = txn.get(PURGES_KEY.encode(), db=dbs["meta"])
    return msgpack.unpackb(raw) if raw is not None else []


@dataclass(slots=True)
class PurgeResult:
    deleted: int        #: records deleted
    done: bool          #: no deleted topic has anything left


@dataclass(slots=True)
class PurgeTopics(Op):
    """One slice of purging deleted topics: up to ``max_records`` of their queue entries, with the records and KEYS
    entries they point at. A topic whose entries are all gone loses the KEYS entries left under its name from before
    its deletion, and leaves the purge list."""

    max_records: int

    def apply(self, wctx: WriteContext) -> PurgeResult:
        txn, dbs = wctx.txn, wctx.dbs
        purges = _purges(txn, dbs)
        if not purges:
            return PurgeResult(0, True)
        tid, name, end = purges[0]
        cur = txn.cursor(db=dbs["cq"])
        entries = []
        found = cur.set_range(QUEUE_PREFIX.pack(tid, 0))
        while found and len(entries) < self.max_records:
            key = cur.key()
            if QUEUE_KEY.unpack(key)[0] != tid:
                break
            entries.append((bytes(key), CQ_VALUE.unpack(cur.value())[0]))
            found = cur.next()
        records = [(physical, txn.get(U64.pack(physical), db=dbs["commitlog"])) for _key, physical in entries]
        stale_keys = [] if len(entries) == self.max_records else _stale_keys(txn, dbs, name, end)
        topic_bytes = name.encode()
        if entries:
            wctx.put_meta(LOG_END_KEY, wctx.counters.next_physical)
        for (key, _physical), (physical, raw) in zip(entries, records):
            wctx.writes += 1
            txn.delete(key, db=dbs["cq"])
            if raw is None:
                continue
            try:
                props = stored_place(txn.get, dbs["commitlog"], raw).properties_text
            except MessageFormatError:
                props = ""
            txn.delete(U64.pack(physical), db=dbs["commitlog"])
            if _KEYS_MARK in props:
                for k in (decode_properties(props).get(KEYS) or "").split():
                    txn.delete(key_index_key(topic_bytes, k, physical), db=dbs["keys"])
        if len(entries) < self.max_records:
            for key in stale_keys:
                txn.delete(key, db=dbs["keys"])
            wctx.put_meta(PURGES_KEY, purges[1:])
        return PurgeResult(len(entries), len(entries) < self.max_records and len(purges) == 1)


def _stale_keys(txn, dbs, name: str, end: int) -> list[bytes]:
    """KEYS entries under ``name`` of records stored before ``end`` (the topic's deletion): records stored without
    a queue entry are not found through the queues."""
    prefix = name.encode() + b"\x00"
    out = []
    cur = txn.cursor(db=dbs["keys"])
    if cur.set_range(prefix):
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            if len(key) >= 8 and U64.unpack(key[-8:])[0] < end:
                out.append(bytes(key))
    return out
