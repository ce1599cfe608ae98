"""MessageStore: the commit log, consume queues, offsets, topics and transaction tables in one LMDB env.

Writes: ``submit(op)`` (ops.py, txops.py) returns a Completion. The ops of one loop iteration go to the writer
process (writer.py) as one group; a Completion resolves once its group is durable (SYNC_FLUSH) or committed
(ASYNC_FLUSH), with the op's value or its exception. Reads are plain methods on the event loop thread, in short
read-only transactions of the broker's own environment handle. Readers see a queue's new entries only once the
group that wrote them is published: the queue bounds advance in the same hand-off that resolves the Completions.

Integrity: every record served is checked against its body CRC (a mismatch is logged, counted and raised as
CorruptRecordError, never served), and at start the newest records are checked before the store is used.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import lmdb
import msgpack

from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import body_crc_matches

from .committed import MARKER_MAGIC_BYTES, place, resolve
from .completion import Completion
from .config import StoreConfig
from .errors import CorruptRecordError, CorruptStoreError, StoreClosedError, StoreFullError
from .halfs import HalfState, HalfStatus
from .keys import CQ_VALUE, DUE_KEY, QUEUE_KEY, U64, offset_key, parse_offset_key
from .lifecycle import log_end
from .link import ReplicationGate, WriterLink
from .ops import Op, PutMessage, PutMessages
from .timers import PutTimed
from .txops import PrepareHalf
from .owner import StoreOwner
from .redo import ApplyRedo, read_epochs, read_position
from .writer import DBS, open_env

log = logging.getLogger(__name__)
MIN_SCAN = 800
#: ops that store new messages: refused while the store is above its hard use ratio (decisions still go through)
ADDS_MESSAGES = (PutMessage, PutMessages, PrepareHalf, PutTimed)
START_CHECK_RECORDS = 64  #: newest records whose CRC is checked at start


class StoreUsage(NamedTuple):
    used_bytes: int    #: pages holding data
    file_bytes: int    #: the data file (pages in use, free pages LMDB reuses, and up to 8 MiB written ahead)
    limit_bytes: int   #: the most the store can take: min(maxMapSize, data file + free disk space)

    @property
    def ratio(self) -> float:
        return self.used_bytes / self.limit_bytes if self.limit_bytes else 1.0


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
        self.path = os.path.join(config.root, "lmdb")
        self.env: lmdb.Environment | None = None
        self.dbs: dict = {}
        self.link: WriterLink | None = None
        self.owner = StoreOwner(self.path)
        self._lock_fd = -1
        self._replacing = False
        self._position: tuple[int, int] = (0, 0)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.queue_max: dict[tuple[str, int], int] = {}
        #: why readers of queues see nothing yet (a group member whose store its leader has not seen since it
        #: started: it may hold a tail that a failover took back), or None
        self.reads_held: str | None = None
        #: first offset still held per queue (absent: 0); it moves up as retention deletes
        self.queue_min: dict[tuple[str, int], int] = {}
        #: why new messages are refused (the store is above its hard use ratio), or None
        self.refusing: str | None = None
        #: why no write but a leader's records (ApplyRedo) is taken now (a follower; a leader short of in-sync
        #: copies), or None: broker/replication/ sets it
        self.write_refusal: Callable[[], Exception | None] | None = None
        self.topic_ids: dict[str, int] = {}
        self.listeners: list[Callable[[str, int, int], None]] = []
        #: called after each batch of writes was resolved (the broker writes the answers they completed)
        self.publish_hooks: list[Callable[[], None]] = []
        self._outbox: list[Op] = []
        self._outbox_completions: list[Completion] = []
        self._group_holds = 0  # bursts keeping the outbox open past the loop iteration (hold_group)
        self.closed = True
        self.corrupt_records = 0
        self.total_groups = 0
        self.total_ops = 0
        self.last_group_size = 0

    # --- lifecycle ---
    async def open(self) -> None:
        """Take ownership of the folder, start the writer process, open the read handle and check the store.

        Raises:
            StoreLockedError: another broker owns the folder.
            CorruptStoreError: the store cannot be opened, or its newest records fail their check.
        """
        cfg = self.config
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = self.owner.acquire()
        self.loop = asyncio.get_running_loop()
        self.link = self._new_link()
        try:
            await self.link.start()
            try:
                # Readers map the most the store may grow to: the writer's growth never invalidates their map.
                self.env = open_env(self.path, max(cfg.map_size, cfg.max_map_size), readonly=True)
                self.dbs = {name: self.env.open_db(name.encode(), create=False) for name in DBS}
            except lmdb.Error as exc:
                raise CorruptStoreError(f"the store at {self.path} cannot be opened: {exc}") from None
            self._check_newest()
            self._load_minimums()
        except BaseException:
            await self.link.close()
            if self.env is not None:
                self.env.close()
            self.owner.release()
            raise
        self.closed = False

    # --- replication (broker/replication/) ---
    @property
    def position(self) -> tuple[int, int]:
        """(epoch, sequence) of the last replication record committed here (store/redo.py); while a snapshot
        replaces the store, the last one read before."""
        if self._replacing:
            return self._position
        with self.env.begin() as txn:
            self._position = read_position(txn.get, self.dbs["meta"])
        return self._position

    @property
    def epochs(self) -> list[tuple[int, int]]:
        """The epoch history: (epoch, first sequence), oldest first."""
        with self.env.begin() as txn:
            return read_epochs(txn.get, self.dbs["meta"])

    def set_gate(self, gate: ReplicationGate | None) -> None:
        """Answers wait for ``gate`` (a leader: its in-sync followers' acknowledgements; a follower: its
        leader's committed sequence)."""
        self.link.gate = gate

    async def lead(self, epoch: int) -> None:
        """Number every write from now on as a replication record of ``epoch``."""
        await self.link.lead(epoch)

    def snapshot(self, path: str) -> tuple[int, int]:
        """A consistent copy of the store, taken while writes go on, at ``path`` (a file); the (epoch, sequence)
        it holds. Blocking: run it in a thread."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # copyfd copies one read transaction's view: the position key in it is the copy's own.
            self.env.copyfd(fd, compact=True)
        finally:
            os.close(fd)
        copy = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=len(DBS) + 2)
        try:
            with copy.begin() as txn:
                meta = copy.open_db(b"meta", txn=txn, create=False)
                return read_position(txn.get, meta)
        finally:
            copy.close()

    async def replace(self, snapshot_path: str) -> None:
        """Become ``snapshot_path`` (a leader's snapshot): the writer stops, the file takes the data file's place,
        a new writer starts on it. Writes and reads wait for nothing meanwhile: a follower has no writes of its
        own, and reads of the old file go on until it is closed."""
        self._send_group()
        self.position  # noqa: B018 - read once more: what status shows while the store is replaced
        self._replacing = True
        try:
            await self._replace(snapshot_path)
        finally:
            self._replacing = False

    async def _replace(self, snapshot_path: str) -> None:
        await self.link.close()
        self.env.close()
        os.replace(snapshot_path, os.path.join(self.path, "data.mdb"))
        lock = os.path.join(self.path, "lock.mdb")
        if os.path.exists(lock):
            os.unlink(lock)  # its reader table describes the old file
        gate = self.link.gate
        self.link = self._new_link()
        self.link.gate = gate
        self.queue_min = {}
        await self.link.start()
        cfg = self.config
        self.env = open_env(self.path, max(cfg.map_size, cfg.max_map_size), readonly=True)
        self.dbs = {name: self.env.open_db(name.encode(), create=False) for name in DBS}
        self._load_minimums()

    def _new_link(self) -> WriterLink:
        cfg = self.config
        link = WriterLink(self.path, cfg.map_size, max(cfg.map_size, cfg.max_map_size),
                          cfg.flush_disk_type == "SYNC_FLUSH", cfg.flush_interval_ms,
                          self._publish, self._on_writer_ready, inherit_fds=(self._lock_fd,))
        link.new_topics = lambda topics: self.topic_ids.update(topics)
        return link

    def _on_writer_ready(self, queue_max: dict, topic_ids: dict) -> None:
        self.queue_max = dict(queue_max)
        self.topic_ids = dict(topic_ids)

    def _check_newest(self) -> None:
        """The newest records must be whole and match their CRCs, and every queue must point into the log."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["commitlog"])
            checked = 0
            found = cur.last()
            end = max(U64.unpack(cur.key())[0] + len(cur.value()) if found else 0, log_end(txn, self.dbs))
            while found and checked < START_CHECK_RECORDS:
                offset = U64.unpack(cur.key())[0]
                try:
                    record = resolve(txn.get, self.dbs["commitlog"], offset, cur.value())
                except MessageFormatError:
                    record = b""
                if record is not None and not body_crc_matches(record):
                    raise CorruptStoreError(f"the store at {self.path} is corrupted: the message at commit-log "
                                            f"offset {offset} fails its body CRC check; restore it from a backup "
                                            "(or move it aside to start empty)")
                checked += 1
                found = cur.prev()
            for (topic, queue_id), top in self.queue_max.items():
                tid = self.topic_ids.get(topic)
                value = txn.get(QUEUE_KEY.pack(tid, queue_id, top - 1), db=self.dbs["cq"]) if tid else None
                if value is None or CQ_VALUE.unpack(value)[0] >= end:
                    raise CorruptStoreError(f"the store at {self.path} is corrupted: queue {topic}/{queue_id} "
                                            "points past the end of the commit log")

    def _load_minimums(self) -> None:
        """Each queue's first offset whose record is still held (retention deletes records oldest first and may
        leave a queue's entries behind a record it had to keep: they are skipped here, as readers skip them)."""
        with self.env.begin() as txn:
            cq, log_db = txn.cursor(db=self.dbs["cq"]), self.dbs["commitlog"]
            for (topic, queue_id), top in self.queue_max.items():
                tid = self.topic_ids.get(topic)
                if tid is None or not cq.set_range(QUEUE_KEY.pack(tid, queue_id, 0)):
                    continue
                low = top
                for key, value in cq:
                    key_tid, key_queue, offset = QUEUE_KEY.unpack(key)
                    if key_tid != tid or key_queue != queue_id:
                        break
                    if txn.get(U64.pack(CQ_VALUE.unpack(value)[0]), db=log_db) is not None:
                        low = offset
                        break
                if low:
                    self.queue_min[(topic, queue_id)] = low

    def advance_minimums(self, mins: dict) -> None:
        """Retention deleted the records below these offsets: {(topic, queue id): new first offset}."""
        queue_min = self.queue_min
        for queue, low in mins.items():
            if low > queue_min.get(queue, 0):
                queue_min[queue] = low

    def forget_topic(self, name: str, tid: int | None) -> None:
        """A deleted topic (DeleteTopic's value is its old id): its queues are gone from the readers' view, unless
        the name already has a new id (created again in the same group)."""
        if tid is None or self.topic_ids.get(name) not in (tid, None):
            return
        self.topic_ids.pop(name, None)
        for queue in [q for q in self.queue_max if q[0] == name]:
            del self.queue_max[queue]
            self.queue_min.pop(queue, None)

    async def close(self) -> None:
        """Refuse new writes, let queued ones finish and sync, close."""
        if self.closed:
            return
        self.closed = True
        self._send_group()
        await self.link.close()
        self.env.close()
        self.owner.release()

    # --- writes ---
    def submit(self, op: Op) -> Completion:
        """Queue ``op`` for this loop iteration's group; its Completion resolves once the group is durable.

        Raises:
            StoreClosedError: the store is closed.
        """
        if self.closed:
            raise StoreClosedError("the store is closed")
        completion = Completion(self.loop)
        if self.write_refusal is not None and type(op) is not ApplyRedo:
            refusal = self.write_refusal()
            if refusal is not None:
                self.loop.call_soon(self._publish, [(completion, (False, refusal))], {})
                return completion
        if self.refusing is not None and isinstance(op, ADDS_MESSAGES):
            # Through the same hand-off as a write's outcome: the broker writes answers when a batch is published.
            self.loop.call_soon(self._publish, [(completion, (False, StoreFullError(self.refusing)))], {})
            return completion
        # Writes made in one loop iteration go to the writer together at its end (or at the end of a held burst):
        # one group.
        if not self._outbox:
            self.loop.call_soon(self._flush_outbox)
        self._outbox.append(op)
        self._outbox_completions.append(completion)
        return completion

    def hold_group(self) -> None:
        """Keep the writes submitted from now on in one group across loop iterations, until release_group.

        A connection dispatching a burst of requests over several iterations (broker/transport.py) holds the
        group for the burst, so that the burst costs one writer commit while answers that became durable meanwhile
        still go out between its slices."""
        self._group_holds += 1

    def release_group(self) -> None:
        """End a hold_group: what was submitted goes to the writer now, even while other bursts hold (so writes
        never wait for more than the burst that held them)."""
        self._group_holds -= 1
        self._send_group()

    def _flush_outbox(self) -> None:
        if not self._group_holds:  # else the release of the hold sends the group
            self._send_group()

    def _send_group(self) -> None:
        ops, completions = self._outbox, self._outbox_completions
        if not ops:
            return
        self._outbox, self._outbox_completions = [], []
        refusal = self.write_refusal() if self.write_refusal is not None else None
        if refusal is not None:
            # Taken before the refusal was in place (a burst's held group, this loop iteration): the role that took
            # them has ended, and the writer would number them as records of an epoch this member no longer leads.
            refused = [(c, (False, refusal)) for op, c in zip(ops, completions) if type(op) is not ApplyRedo]
            if refused:
                self.loop.call_soon(self._publish, refused, {})
                kept = [(op, c) for op, c in zip(ops, completions) if type(op) is ApplyRedo]
                ops, completions = [op for op, _ in kept], [c for _, c in kept]
                if not ops:
                    return
        self.total_groups += 1
        self.total_ops += len(ops)
        self.last_group_size = len(ops)
        self.link.send(ops, completions)

    def _publish(self, items: list, grown: dict) -> None:
        """Groups are durable (or failed): advance queue bounds, resolve Completions, notify."""
        queue_max = self.queue_max
        for key, new_max in grown.items():
            if new_max > queue_max.get(key, 0):
                queue_max[key] = new_max
        for completion, (ok, value) in items:
            if ok:
                completion.set_result(value)
            else:
                completion.set_exception(value)
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

    def remove_arrival_listener(self, callback: Callable[[str, int, int], None]) -> None:
        self.listeners.remove(callback)

    # --- integrity ---
    def _corrupt(self, physical_offset: int, where: str) -> CorruptRecordError:
        self.corrupt_records += 1
        log.error("the stored message at commit-log offset %d (%s) fails its body CRC check; not served",
                  physical_offset, where)
        return CorruptRecordError(physical_offset, "body CRC mismatch")

    # --- reads: messages ---
    def read_record(self, physical_offset: int) -> bytes | None:
        """The record at ``physical_offset``, or None.

        Raises:
            CorruptRecordError: it fails its body CRC check.
        """
        found = self.read_records([physical_offset]) if physical_offset >= 0 else None
        return found[0] if found else None

    def read_records(self, physical_offsets: list[int]) -> list[bytes]:
        """Records that exist, each checked (raises CorruptRecordError); a committed half's message is read as
        its record (store/committed.py)."""
        with self.env.begin(buffers=False) as txn:
            get, db = txn.get, self.dbs["commitlog"]
            raws = [(p, self._resolved(get, db, p, get(U64.pack(p), db=db))) for p in physical_offsets]
        for p, raw in raws:
            if raw is not None and not body_crc_matches(raw):
                raise self._corrupt(p, "read by offset")
        return [raw for _p, raw in raws if raw is not None]

    def _resolved(self, get, log_db, physical_offset: int, raw):
        """committed.resolve, a marker whose half record cannot be read counting as a corrupt record."""
        try:
            return resolve(get, log_db, physical_offset, raw)
        except MessageFormatError:
            raise self._corrupt(physical_offset, "committed half message") from None

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.queue_max.get((topic, queue_id), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.queue_min.get((topic, queue_id), 0)

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
        decoding keys, and no object is made per entry. A record failing its CRC check ends the answer before it;
        when it would be the first, CorruptRecordError is raised (it is never served)."""
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
            crc_ok, marker_magic = body_crc_matches, MARKER_MAGIC_BYTES
            for value in cur.iternext(keys=False):
                if next_offset >= stop:
                    break
                physical, size, tags_code, _ts = unpack_entry(value)
                if tag_codes is not None and tags_code not in tag_codes:
                    next_offset += 1
                    continue
                if records and total + size > max_bytes:
                    break
                raw = get(pack_offset(physical), db=log_db)
                if raw is not None and raw[4:8] == marker_magic:
                    raw = self._resolved(get, log_db, physical, raw)
                if raw is None:
                    next_offset += 1
                    continue
                if not crc_ok(raw):
                    if records:
                        break
                    raise self._corrupt(physical, f"queue {topic}/{queue_id} offset {next_offset}")
                next_offset += 1
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
        return self.read_records(offsets[-max_num:])

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        entries = self.get_queue_entries(topic, queue_id, self.min_offset(topic, queue_id), 1)
        return entries[0].store_timestamp if entries else 0

    # --- reads: offsets, topics, meta ---
    def get_consumer_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        with self.env.begin() as txn:
            raw = txn.get(offset_key(group, topic, queue_id), db=self.dbs["offsets"])
        return None if raw is None else U64.unpack(raw)[0]

    def consumer_offsets(self, group: str | None = None) -> Iterator[tuple[str, str, int, int]]:
        """Every stored consumer offset; a row whose key cannot be read (written before names were validated) is
        logged and skipped, so it never stops the broker from starting."""
        rows = []
        with self.env.begin() as txn:
            for key, value in txn.cursor(db=self.dbs["offsets"]):
                try:
                    rows.append((*parse_offset_key(key), U64.unpack(value)[0]))
                except (ValueError, UnicodeDecodeError, struct.error):
                    log.warning("skipping an unreadable consumer offset row %r in %s", bytes(key[:80]), self.path)
        return iter([r for r in rows if group is None or r[0] == group])

    def get_topic(self, name: str) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(name.encode(), db=self.dbs["topics"])
        return None if raw is None else msgpack.unpackb(raw)

    def topics(self) -> dict[str, dict]:
        """Every stored topic configuration; an unreadable row is logged and skipped (it never stops a start)."""
        out = {}
        with self.env.begin() as txn:
            for key, value in txn.cursor(db=self.dbs["topics"]):
                try:
                    out[key.decode()] = msgpack.unpackb(value)
                except (ValueError, msgpack.UnpackException):
                    log.warning("skipping an unreadable topic row %r in %s", bytes(key[:80]), self.path)
        return out

    def get_meta(self, key: str):
        with self.env.begin() as txn:
            raw = txn.get(key.encode(), db=self.dbs["meta"])
        return None if raw is None else msgpack.unpackb(raw)

    # --- reads: transactions ---
    def get_half(self, half_offset: int) -> HalfState | None:
        with self.env.begin() as txn:
            raw = txn.get(U64.pack(half_offset), db=self.dbs["halfs"])
        return None if raw is None else HalfState.from_bytes(raw)

    def halves_with_records(self, half_offsets: list[int]) -> list[tuple[HalfState | None, bytes | None]]:
        """(state, stored record) of each half, read in one transaction; a record failing its CRC check is
        reported (logged, counted) and given as None."""
        out = []
        with self.env.begin(buffers=False) as txn:
            halfs, log_db = self.dbs["halfs"], self.dbs["commitlog"]
            for offset in half_offsets:
                key = U64.pack(offset)
                raw = txn.get(key, db=halfs)
                out.append((None if raw is None else HalfState.from_bytes(raw), txn.get(key, db=log_db)))
        for index, (state, record) in enumerate(out):
            if record is not None and not body_crc_matches(record):
                self._corrupt(half_offsets[index], "half message")
                out[index] = (state, None)
        return out

    def due_halves(self, until_ms: int, limit: int) -> list[tuple[int, int]]:
        """(due ms, half offset) of the halves whose check is due by ``until_ms``, soonest first."""
        return self._due("due", until_ms, limit)

    def next_due(self) -> tuple[int, int] | None:
        return self._next("due")

    def due_timers(self, until_ms: int, limit: int) -> list[tuple[int, int]]:
        """(deliver ms, record offset) of the timer messages due by ``until_ms``, soonest first."""
        return self._due("timers", until_ms, limit)

    def next_timer(self) -> tuple[int, int] | None:
        return self._next("timers")

    def _due(self, table: str, until_ms: int, limit: int) -> list[tuple[int, int]]:
        out = []
        with self.env.begin() as txn:
            for key in txn.cursor(db=self.dbs[table]).iternext(keys=True, values=False):
                due, offset = DUE_KEY.unpack(key)
                if due > until_ms or len(out) >= limit:
                    break
                out.append((due, offset))
        return out

    def _next(self, table: str) -> tuple[int, int] | None:
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs[table])
            return DUE_KEY.unpack(cur.key()) if cur.first() else None

    def pending_halves_count(self) -> int:
        with self.env.begin() as txn:
            return txn.stat(self.dbs["due"])["entries"]

    def due_page(self, after: tuple[int, int] | None, limit: int, reverse: bool = False) -> list[tuple[int, int]]:
        """A page of the halves' due index: (due ms, half offset) after ``after`` (None: from the first), soonest
        first (``reverse``: latest first), at most ``limit``."""
        start = None if after is None else DUE_KEY.pack(*after)
        rows = []
        with self.env.begin(buffers=False) as txn:
            cursor = txn.cursor(db=self.dbs["due"])
            if _seek(cursor, start, reverse):
                for key in (cursor.iterprev if reverse else cursor.iternext)(keys=True, values=False):
                    rows.append(DUE_KEY.unpack(key))
                    if len(rows) >= limit:
                        break
        return rows

    def halves_scan(self, status: HalfStatus | None, after: int | None, limit: int, max_scan: int,
                    reverse: bool = False) -> tuple[list[tuple[int, HalfState]], int | None]:
        """A page of the halves in ``status`` (None: every half) in store order (``reverse``: newest first), after
        half offset ``after`` (None: from the start): at most ``limit`` of them, looking at no more than ``max_scan``
        rows. Also gives where the next page starts: the offset of the last row looked at, or None when the table
        was read to its end. A row of another status is passed over by its first bytes, without decoding it."""
        wanted = None if status is None else msgpack.packb(status.value)
        end = 3 + len(wanted or b"")
        rows: list[tuple[int, HalfState]] = []
        scanned = 0
        with self.env.begin(buffers=False) as txn:
            cursor = txn.cursor(db=self.dbs["halfs"])
            if not _seek(cursor, None if after is None else U64.pack(after), reverse):
                return rows, None
            # Values only, the key read where needed (the cursor is on the value's row): a third faster, and a row
            # of today's layout (an array of over 15 items: a 3-byte header) is matched without a call.
            for value in (cursor.iterprev if reverse else cursor.iternext)(keys=False, values=True):
                scanned += 1
                if wanted is None or (value[3:end] == wanted if value[0] == 0xdc else _status_is(value, wanted)):
                    rows.append((U64.unpack(cursor.key())[0], HalfState.from_bytes(value)))
                if len(rows) >= limit or scanned >= max_scan:
                    return rows, U64.unpack(cursor.key())[0]
        return rows, None

    def iter_halves(self) -> Iterator[tuple[int, HalfState]]:
        with self.env.begin() as txn:
            rows = [(U64.unpack(k)[0], HalfState.from_bytes(v)) for k, v in txn.cursor(db=self.dbs["halfs"])]
        return iter(rows)

    def oldest_store_timestamp(self) -> int | None:
        """When the oldest record held was stored (ms), or None for an empty store."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.dbs["commitlog"])
            found = cur.first()
            while found:
                try:
                    return place(txn.get, self.dbs["commitlog"], cur.value()).store_timestamp
                except MessageFormatError:
                    found = cur.next()  # an unreadable record tells no time: the next one does
        return None

    def usage(self) -> StoreUsage:
        """How full the store is: pages in use against its limit, the smaller of maxMapSize and what its disk
        can hold (the data file plus the disk's free space)."""
        stat = self.env.stat()
        page = stat["psize"]
        with self.env.begin() as txn:
            pages = sum(txn.stat(db)[k] for db in self.dbs.values()
                        for k in ("branch_pages", "leaf_pages", "overflow_pages"))
        pages += stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"] + 2  # the table of tables, metas
        file_bytes = os.stat(os.path.join(self.path, "data.mdb")).st_size
        disk = os.statvfs(self.path)
        limit = min(max(self.config.map_size, self.config.max_map_size), file_bytes + disk.f_bavail * disk.f_frsize)
        return StoreUsage(pages * page, file_bytes, limit)

    def stats(self) -> dict:
        info = self.env.info()
        stat = self.env.stat()
        with self.env.begin() as txn:
            entries = {name: txn.stat(db)["entries"] for name, db in self.dbs.items()}
        link = self.link
        return {"map_size": info["map_size"], "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
                "entries": entries, "last_group_size": self.last_group_size,
                "last_commit_seconds": link.last_commit_seconds, "last_sync_seconds": link.last_sync_seconds,
                "total_groups": self.total_groups, "total_ops": self.total_ops,
                "corrupt_records": self.corrupt_records}


def _seek(cursor, after: bytes | None, reverse: bool) -> bool:
    """Put ``cursor`` on the first key after ``after`` in the direction read (None: the table's first, or last
    when ``reverse``); False when there is none."""
    if after is None:
        return cursor.last() if reverse else cursor.first()
    if reverse:
        return cursor.prev() if cursor.set_range(after) else cursor.last()
    if not cursor.set_range(after):
        return False
    return cursor.next() if cursor.key() == after else True


def _status_is(raw: bytes, packed_status: bytes) -> bool:
    """Does the half state row ``raw`` have the status whose msgpack form is ``packed_status``? A row is an array
    whose first item is the status (read after the array's header); a named map of earlier versions is decoded."""
    lead = raw[0]
    start = 1 if 0x90 <= lead <= 0x9f else 3 if lead == 0xdc else 5 if lead == 0xdd else None
    if start is None:
        return msgpack.packb(HalfState.from_bytes(raw).status.value) == packed_status
    return raw[start:start + len(packed_status)] == packed_status
