"""MessageStore: the commit log, consume queues, offsets, topics and transaction tables in one LMDB env.

Writes are coroutines that go through group commit (see writer.py); reads are plain methods on the event loop
thread, in short read-only transactions. Readers see a queue's new entries only once the group that wrote
them is durable: the loop-side queue bounds advance in the same hand-off that resolves the writers' futures.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import lmdb
import msgpack

from .config import StoreConfig
from .errors import StoreClosedError
from .keys import (CQ_VALUE, DUE_KEY, QUEUE_KEY, QUEUE_PREFIX, TOPIC_ID, U64, offset_key, parse_offset_key)
from .completion import Completion
from .syncer import Syncer
from .writer import Counters, GroupWriter, PutRequest, WriteContext, _Op

log = logging.getLogger(__name__)
_DBS = ("commitlog", "cq", "topic_ids", "offsets", "topics", "halfs", "due", "meta", "keys")
MIN_SCAN = 800


@dataclass(frozen=True)
class StoredEntry:
    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int


class MessageStore:
    def __init__(self, config: StoreConfig):
        self.config = config
        self.env: lmdb.Environment | None = None
        self.dbs: dict = {}
        self.writer: GroupWriter | None = None
        self.syncer: Syncer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue_max: dict[tuple[str, int], int] = {}
        self.topic_ids: dict[str, int] = {}
        self.listeners: list[Callable[[str, int, int], None]] = []
        #: called after each batch of writes was resolved (the broker writes the answers they completed)
        self.publish_hooks: list[Callable[[], None]] = []
        self._outbox: list[_Op] = []
        self._open: _Op | None = None  # the outbox's last op, while single records or checked writes may join it
        self.closed = True

    # --- lifecycle ---
    async def open(self) -> None:
        """Open (creating) the environment and start the writer. Costs one cursor step per queue, no replay."""
        cfg = self.config
        path = os.path.join(cfg.root, "lmdb")
        os.makedirs(path, exist_ok=True)
        self.env = lmdb.open(path, map_size=cfg.map_size, max_dbs=len(_DBS) + 2, max_readers=1024, sync=False,
                             metasync=False, readahead=False, lock=True)
        self.dbs = {name: self.env.open_db(name.encode()) for name in _DBS}
        counters = self._load_counters()
        self.queue_max = dict(counters.queue_max)
        self.topic_ids = dict(counters.topic_ids)
        self.loop = asyncio.get_running_loop()
        self.writer = GroupWriter(self.env, self.dbs, counters)
        self.syncer = Syncer(os.path.join(path, "data.mdb"), self.loop, cfg.flush_disk_type == "SYNC_FLUSH",
                             cfg.flush_interval_ms / 1000, self._publish)
        self.syncer.start()
        self.closed = False

    def _load_counters(self) -> Counters:
        counters = Counters()
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["commitlog"])
            if cur.last():
                counters.next_physical = U64.unpack(cur.key())[0] + len(cur.value())
            for key, value in txn.cursor(db=self.dbs["topic_ids"]):
                counters.topic_ids[key.decode()] = TOPIC_ID.unpack(value)[0]
            names = {tid: name for name, tid in counters.topic_ids.items()}
            cur = txn.cursor(db=self.dbs["cq"])
            found = cur.first()
            while found:
                tid, queue_id, _offset = QUEUE_KEY.unpack(cur.key())
                # Jump to the first key after this queue, step back once: that is the queue's last entry.
                if cur.set_range(QUEUE_PREFIX.pack(tid, queue_id + 1) if queue_id < 0xFFFFFFFF
                                 else QUEUE_PREFIX.pack(tid + 1, 0)):
                    cur.prev()
                else:
                    cur.last()
                last = QUEUE_KEY.unpack(cur.key())[2]
                counters.queue_max[(names[tid], queue_id)] = last + 1
                found = cur.next()
        return counters

    async def close(self) -> None:
        """Refuse new writes, let queued ones finish and sync, close."""
        if self.closed:
            return
        self.closed = True
        self._flush_outbox()
        await self.syncer.close()
        self.env.sync(True)
        self.env.close()

    # --- writes ---
    def _submit(self, kind: str, payload, eager: bool = False) -> asyncio.Future | Completion:
        if self.closed:
            raise StoreClosedError("the store is closed")
        fut = Completion(self.loop) if eager else self.loop.create_future()
        # Writes made in one loop iteration are committed together at its end: one group.
        if not self._outbox:
            self.loop.call_soon(self._flush_outbox)
        self._outbox.append(_Op(kind, payload, fut))
        return fut

    def _flush_outbox(self) -> None:
        ops, self._outbox = self._outbox, []
        self._open = None
        step = self.config.max_group
        for start in range(0, len(ops), step):
            group = ops[start:start + step]
            grown = self.writer.commit(group)
            if grown is None:  # nothing was stored: answer the failures at once
                self._publish(group, {})
                continue
            if not self.syncer.sync_each:
                self._publish(group, grown)
            self.syncer.submit(group, grown)

    async def put_messages(self, reqs: list[PutRequest]) -> list:
        """Store records atomically; each gets its physical offset, queue offset and store timestamp."""
        return await self._submit("put", reqs)

    def submit_write(self, fn: Callable[[WriteContext], object]) -> Completion:
        """As write, but returns a Completion at once (callbacks run as soon as the write is durable)."""
        return self._submit("fn", fn, eager=True)

    def submit_messages(self, reqs: list[PutRequest]) -> asyncio.Future:
        """As put_messages, but returns the future at once (for callers that chain a callback)."""
        return self._submit("put", reqs)

    def submit_message(self, req: PutRequest) -> tuple[Completion, int]:
        """Queue one record: (completion, index), where the completion's value lists the PutResults of every
        record queued in a row in this loop iteration and ``index`` is this record's place in it.

        One completion and one callback for a whole burst of sends instead of a future each; its callbacks run
        as soon as the group is durable (see completion.py).
        """
        op, index = self._join("put", req)
        return op.future, index

    def submit_checked(self, fn: Callable[[WriteContext], object]) -> tuple[Completion, Callable[[list], object]]:
        """Queue a function that raises only before its first write (it validates, then writes), so it needs no
        child transaction. It shares one Completion with the other such writes queued in a row in this loop
        iteration (the transaction halves and decisions of a burst): (completion, pick), where
        ``pick(completion's value)`` returns this write's value or raises its exception."""
        op, index = self._join("checked", fn)

        def pick(outcomes: list):
            ok, value = outcomes[index]
            if not ok:
                raise value
            return value

        return op.future, pick

    def _join(self, kind: str, item) -> tuple[_Op, int]:
        """Add ``item`` to the outbox's last op when it is an op of ``kind`` open for joining, else to a new one."""
        op = self._open
        if op is None or op.kind != kind or not self._outbox or self._outbox[-1] is not op:
            self._submit(kind, [], eager=True)
            op = self._open = self._outbox[-1]
        op.payload.append(item)
        return op, len(op.payload) - 1

    async def write(self, fn: Callable[[WriteContext], object], validated: bool = False):
        """Run ``fn`` in the writer's transaction, atomically; returns its result or raises its exception.

        Args:
            validated: ``fn`` raises only before its first write, so it needs no child transaction (faster).
        """
        if validated:
            future, pick = self.submit_checked(fn)
            return pick(await future)
        return await self._submit("fn", fn)

    async def set_consumer_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        await self.write(lambda ctx: ctx.set_consumer_offset(group, topic, queue_id, offset))

    async def put_topic(self, name: str, config: dict) -> None:
        await self.write(lambda ctx: ctx.put_topic(name, config))

    async def delete_topic(self, name: str) -> None:
        await self.write(lambda ctx: ctx.delete_topic(name))

    async def put_meta(self, key: str, value) -> None:
        await self.write(lambda ctx: ctx.put_meta(key, value))

    def _publish(self, ops: list[_Op], grown: dict) -> None:
        """Once a group is durable (or failed): advance queue bounds, resolve futures, notify."""
        for key, new_max in grown.items():
            if new_max > self.queue_max.get(key, 0):
                self.queue_max[key] = new_max
        self.topic_ids = self.writer.counters.topic_ids
        for op in ops:
            if op.future.done():
                continue
            ok, value = op.outcome
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)
        for (topic, queue_id), new_max in grown.items():
            for listener in self.listeners:
                try:
                    listener(topic, queue_id, new_max)
                except Exception:
                    log.exception("arrival listener failed")
        for hook in self.publish_hooks:
            try:
                hook()
            except Exception:
                log.exception("publish hook failed")

    def add_arrival_listener(self, callback: Callable[[str, int, int], None]) -> None:
        self.listeners.append(callback)

    # --- reads: messages ---
    def read_record(self, physical_offset: int) -> bytes | None:
        with self.env.begin(buffers=False) as txn:
            return txn.get(U64.pack(physical_offset), db=self.dbs["commitlog"])

    def read_records(self, physical_offsets: list[int]) -> list[bytes]:
        with self.env.begin() as txn:
            db = self.dbs["commitlog"]
            return [txn.get(U64.pack(p), db=db) for p in physical_offsets]

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.queue_max.get((topic, queue_id), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return 0  # nothing is deleted yet

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for (t, q) in self.queue_max if t == topic)

    def _entries(self, txn, topic: str, queue_id: int, start: int, limit: int) -> Iterator[StoredEntry]:
        tid = self.topic_ids.get(topic)
        end = self.queue_max.get((topic, queue_id), 0)
        if tid is None or start >= end or limit <= 0:
            return
        start = max(start, 0)
        cur = txn.cursor(db=self.dbs["cq"])
        if not cur.set_key(QUEUE_KEY.pack(tid, queue_id, start)):
            return
        count = 0
        for key, value in cur:
            _tid, _qid, offset = QUEUE_KEY.unpack(key)
            if _tid != tid or _qid != queue_id or offset >= end:
                return
            physical, size, tags_code, ts = CQ_VALUE.unpack(value)
            yield StoredEntry(offset, physical, size, tags_code, ts)
            count += 1
            if count >= limit:
                return

    def get_queue_entries(self, topic: str, queue_id: int, start_offset: int, max_entries: int) -> list[StoredEntry]:
        with self.env.begin() as txn:
            return list(self._entries(txn, topic, queue_id, start_offset, max_entries))

    def read_queue(self, topic: str, queue_id: int, start_offset: int, max_entries: int,
                   tag_codes: set[int] | frozenset[int] | None, max_bytes: int) -> tuple[list[bytes], int]:
        """Records from ``start_offset`` matching ``tag_codes`` (None = all) and the offset after the last entry
        scanned. Scans at most max(800, 20 × max_entries) entries.

        Every pull runs this, entry by entry: a queue's offsets are consecutive, so the scan counts them instead of
        decoding keys, and no object is made per entry."""
        records: list[bytes] = []
        tid = self.topic_ids.get(topic)
        next_offset = max(start_offset, 0)
        stop = min(self.queue_max.get((topic, queue_id), 0), next_offset + max(MIN_SCAN, 20 * max_entries))
        if tid is None or next_offset >= stop:
            return records, start_offset
        total = 0
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["cq"])
            if not cur.set_key(QUEUE_KEY.pack(tid, queue_id, next_offset)):
                return records, start_offset
            get, log_db, unpack_entry, pack_offset = txn.get, self.dbs["commitlog"], CQ_VALUE.unpack, U64.pack
            for value in cur.iternext(keys=False):
                if next_offset >= stop:
                    break
                physical, size, tags_code, _ts = unpack_entry(value)
                if tag_codes is not None and tags_code not in tag_codes:
                    next_offset += 1
                    continue
                if records and total + size > max_bytes:
                    break
                next_offset += 1
                raw = get(pack_offset(physical), db=log_db)
                if raw is None:
                    continue
                records.append(raw)
                total += size
                if len(records) >= max_entries:
                    break
        return records, next_offset

    def _entry_at(self, txn, tid: int, queue_id: int, offset: int) -> StoredEntry:
        value = txn.get(QUEUE_KEY.pack(tid, queue_id, offset), db=self.dbs["cq"])
        physical, size, tags_code, ts = CQ_VALUE.unpack(value)
        return StoredEntry(offset, physical, size, tags_code, ts)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int, boundary: str = "lower") -> int:
        """lower: first offset stored at or after ``ts_ms`` (max offset if none); upper: last at or before."""
        tid = self.topic_ids.get(topic)
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        if tid is None or lo >= hi:
            return 0
        with self.env.begin() as txn:
            if boundary == "upper":
                left, right = lo, hi  # find the first offset with store time > ts, answer the one before it
                while left < right:
                    mid = (left + right) // 2
                    if self._entry_at(txn, tid, queue_id, mid).store_timestamp <= ts_ms:
                        left = mid + 1
                    else:
                        right = mid
                return max(lo, left - 1)
            left, right = lo, hi
            while left < right:
                mid = (left + right) // 2
                if self._entry_at(txn, tid, queue_id, mid).store_timestamp < ts_ms:
                    left = mid + 1
                else:
                    right = mid
            return left

    def messages_by_key(self, topic: str, key: str, max_num: int) -> list[bytes]:
        """Records of ``topic`` carrying ``key`` among their KEYS, newest last, at most ``max_num``."""
        prefix = topic.encode() + b"\x00" + key.encode() + b"\x00"
        offsets = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["keys"])
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(prefix) or len(k) != len(prefix) + 8:
                        break
                    offsets.append(U64.unpack(k[len(prefix):])[0])
            log_db = self.dbs["commitlog"]
            return [raw for raw in (txn.get(U64.pack(o), db=log_db) for o in offsets[-max_num:]) if raw]

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        entries = self.get_queue_entries(topic, queue_id, self.min_offset(topic, queue_id), 1)
        return entries[0].store_timestamp if entries else 0

    # --- reads: offsets, topics, meta ---
    def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        with self.env.begin() as txn:
            raw = txn.get(offset_key(group, topic, queue_id), db=self.dbs["offsets"])
        return None if raw is None else U64.unpack(raw)[0]

    def consumer_offsets(self, group: str | None = None) -> Iterator[tuple[str, str, int, int]]:
        with self.env.begin() as txn:
            rows = [(*parse_offset_key(k), U64.unpack(v)[0]) for k, v in txn.cursor(db=self.dbs["offsets"])]
        return iter([r for r in rows if group is None or r[0] == group])

    def get_topic(self, name: str) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(name.encode(), db=self.dbs["topics"])
        return None if raw is None else msgpack.unpackb(raw)

    def topics(self) -> dict[str, dict]:
        with self.env.begin() as txn:
            return {k.decode(): msgpack.unpackb(v) for k, v in txn.cursor(db=self.dbs["topics"])}

    def get_meta(self, key: str):
        with self.env.begin() as txn:
            raw = txn.get(key.encode(), db=self.dbs["meta"])
        return None if raw is None else msgpack.unpackb(raw)

    # --- reads: transactions ---
    def get_half(self, half_offset: int) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(U64.pack(half_offset), db=self.dbs["halfs"])
        return None if raw is None else msgpack.unpackb(raw)

    def halves_with_records(self, half_offsets: list[int]) -> list[tuple[dict | None, bytes | None]]:
        """(state, stored record) of each half, read in one transaction."""
        out = []
        with self.env.begin() as txn:
            halfs, log_db = self.dbs["halfs"], self.dbs["commitlog"]
            for offset in half_offsets:
                key = U64.pack(offset)
                raw = txn.get(key, db=halfs)
                out.append((None if raw is None else msgpack.unpackb(raw), txn.get(key, db=log_db)))
        return out

    def due_halves(self, until_ms: int, limit: int) -> list[tuple[int, int]]:
        out = []
        with self.env.begin() as txn:
            for key in txn.cursor(db=self.dbs["due"]).iternext(keys=True, values=False):
                due, offset = DUE_KEY.unpack(key)
                if due > until_ms or len(out) >= limit:
                    break
                out.append((due, offset))
        return out

    def next_due(self) -> tuple[int, int] | None:
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["due"])
            return DUE_KEY.unpack(cur.key()) if cur.first() else None

    def pending_halves_count(self) -> int:
        with self.env.begin() as txn:
            return txn.stat(self.dbs["due"])["entries"]

    def iter_halves(self) -> Iterator[tuple[int, dict]]:
        with self.env.begin() as txn:
            rows = [(U64.unpack(k)[0], msgpack.unpackb(v)) for k, v in txn.cursor(db=self.dbs["halfs"])]
        return iter(rows)

    def stats(self) -> dict:
        info = self.env.info()
        stat = self.env.stat()
        with self.env.begin() as txn:
            entries = {name: txn.stat(db)["entries"] for name, db in self.dbs.items()}
        w = self.writer
        return {"map_size": info["map_size"], "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
                "entries": entries, "last_group_size": w.last_group_size if w else 0,
                "last_commit_seconds": w.last_commit_seconds if w else 0.0,
                "last_sync_seconds": self.syncer.last_sync_seconds if self.syncer else 0.0,
                "total_groups": w.total_groups if w else 0, "total_ops": w.total_ops if w else 0}
