"""The writer process: it owns every LMDB write transaction of a store and makes groups durable.

``MessageStore`` sends it groups of ops (ops.py, txops.py) over a socket; it applies each batch of groups that
arrived together in ONE write transaction (group commit) and answers with their outcomes.

Power-loss ordering. LMDB runs with MDB_NOMETASYNC: a commit writes its data pages, fdatasyncs them, and only then
writes its meta page (unsynced). A meta page can therefore never reach the disk before the pages it points to,
which MDB_NOSYNC plus an outside fdatasync does not guarantee (a later, unsynced commit's meta page could be
written back first and point at pages that never arrived: a corrupted store after a power cut). With SYNC_FLUSH
the writer then syncs the commit's meta page at once and acknowledges its groups: two fdatasyncs per commit.
Leaving the meta page to the next commit's data sync saved one of them but made every acknowledgement wait for
the next commit's whole apply as well; syncing at once answered sends and halves sooner (p50 3.42 -> 3.30 ms and
8.39 -> 7.77 ms at 64 in flight) at no more writer CPU per message (scripts/bench.py alternate, three rounds).
With ASYNC_FLUSH groups are acknowledged at commit and the meta page is synced once the writer has been idle for
a flush interval: a power cut may lose the last interval, never the store.

One thread. The meta page's sync runs on the writer's only thread; a group arriving meanwhile waits for it (a
fraction of a millisecond here). A syncer thread that did it in parallel cost more than it
saved: its hand-offs (GIL, condition, lock around the answers) made the writer's CPU per send 10-30% higher and the
writer alone slower (benchmark of the link and writer, groups of 32 sends of 1 KiB, 2 in flight, alternated). Two
narrower variants, tried against this one with scripts/bench.py alternate (6 rounds, paired): a helper thread
syncing a meta page only while another group already waited (transactions, where the writer is the busiest
process, 0.94-0.97x, writer CPU per transaction 47 -> 51 us), and holding a commit's answers for the next commit's
data sync only while another group already waited (sends 0.99-1.03x, transactions 0.97x). Nor did applying a
burst's first ops ahead, in a write transaction left open until the rest of its group arrived, so that the writer
worked while the broker still decoded the burst (sends 0.98-1.00x, transactions 0.89-0.98x: on two cores shared
by client, broker and writer the overlap only moved CPU about, and cost messages).

What the syncs cost. The same writer with no sync at all (an unsafe experiment, never an option) gave 1.25x sends
(3 rounds, paired; its CPU per send 11.7 -> 7.1 us) and 1.06x transactions with the project's client, 1.18x with
bench.py's lean load generator: the two fdatasyncs of a commit are a fifth of a send's path at 64 in flight,
and more of a transaction's the less the client takes. What a sync costs is mostly how many separate runs of pages
it writes, not how many bytes: LMDB puts a commit's pages wherever its free list has room, and a commit of 16
transactions wrote about 13 runs (strace: 8 pwrite64 and 5 writev per data sync). On this VM's disk 25 scattered
4 KiB pages and an fdatasync took 0.6 ms and 500 us of CPU; one sequential 100 KiB write and an fdatasync took
0.14 ms and 33-67 us.

A log instead of the data sync. An unsafe prototype (never committed) opened LMDB with MDB_NOSYNC, appended each
commit's groups to a preallocated log with one fdatasync, and synced LMDB every 0.5 s (or 3 s): 1.07-1.09x sends
and 1.07-1.17x transactions against this writer (bench.py alternate --client raw, 3 rounds, paired). Little, because
the broker's event loop, not the disk, is the limit there: it ran at 0.93-0.97 of a core in both modes, while the
writer used 0.27-0.50. Made safe (the checkpoint's meta page kept aside, its pages pinned by a read transaction
until the next checkpoint, the log replayed on start with each commit's clock) it is worth its risk only once the
broker is no longer the limit.

Writing ahead. A commit that appends to the data file grows it, and its fdatasync then also writes the inode (a
second synchronous write) and the new blocks' allocation. ``Prewriter`` keeps the file written with zeros a few
MiB beyond LMDB's last page, so commits overwrite blocks that exist: measured on ext4 here, an fdatasync after a
40 KiB write took 155-190 us of CPU when appending against 80 us when overwriting, and returned sooner. LMDB
reads its size from the meta page, never from the file, so a longer file changes nothing else. The zeros are
synced as soon as they are written: left dirty, they were written out by the next commit's fdatasync, megabytes of
them inside one acknowledgement (40 KiB commits, alone on the disk: 199-230 us a commit synced against 212-380 us
unsynced). A commit that grew the file by more than ``PREWRITE_SKIP_ABOVE`` pays for its own growth many times
over and is not written ahead of: zeros first would write every byte of it twice (1 MiB commits: 0.8-0.9 ms
appending against 1.3-4.4 ms behind zeros; the Spark sink's batch halves are such commits).

A process, not a thread: the commit waits on the disk (20 ms and more on a network disk) and py-lmdb gives up the
GIL in every call, so a writer thread either stalls the event loop or fights it for the GIL at every put. Here the
broker's loop never waits on the disk: reads go on in the broker's own read transactions meanwhile.

Isolation. An op checks everything before its first write; one that fails cleanly leaves nothing. An op that
fails after writing (a broken contract, an LMDB error) aborts the transaction and the group is applied again
without it, so a group commit never holds half an op. A full map fails the whole group (nothing written).

The process is started by link.py (writer_process.py is its entry point).
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import select
import socket
import struct
import time

import lmdb

from .context import Counters, WriteContext
from .errors import StoreError, StoreFullError
from .keys import QUEUE_KEY, QUEUE_PREFIX, TOPIC_ID, U64
from .lifecycle import log_end
from .redo import RecordingTxn, pack, read_epochs, read_position, write_position

log = logging.getLogger(__name__)
DBS = ("commitlog", "cq", "topic_ids", "offsets", "topics", "halfs", "due", "meta", "keys", "timers", "receipts")
FRAME = struct.Struct(">I")
MAX_GROUP_OPS = 4096  #: most ops in one write transaction (bounds a transaction's dirty pages and its latency)
PREWRITE_AHEAD = 8 << 20  #: bytes of the data file kept written beyond LMDB's last page (see Prewriter)
PREWRITE_STEP = 2 << 20   #: written at a time, once less than AHEAD - STEP is left
PREWRITE_SKIP_ABOVE = 256 << 10  #: a commit that grew the file by more is not written ahead of (see Prewriter)


def open_env(path: str, map_size: int, readonly: bool) -> lmdb.Environment:
    # sync=True, metasync=False is MDB_NOMETASYNC (see the module docstring).
    return lmdb.open(path, map_size=map_size, max_dbs=len(DBS) + 2, max_readers=1024, sync=True, metasync=False,
                     readahead=False, lock=True, readonly=readonly, create=not readonly)


def load_counters(env: lmdb.Environment, dbs: dict) -> Counters:
    """Where writing continues: one cursor step per queue, no replay."""
    counters = Counters()
    with env.begin() as txn:
        cur = txn.cursor(db=dbs["commitlog"])
        if cur.last():
            counters.next_physical = U64.unpack(cur.key())[0] + len(cur.value())
        counters.next_physical = max(counters.next_physical, log_end(txn, dbs))
        for key, value in txn.cursor(db=dbs["topic_ids"]):
            counters.topic_ids[key.decode(errors="surrogateescape")] = TOPIC_ID.unpack(value)[0]
        names = {tid: name for name, tid in counters.topic_ids.items()}
        cur = txn.cursor(db=dbs["cq"])
        # Ids of deleted topics whose entries are still being purged are not given again.
        counters.last_tid = max(max(names, default=0), QUEUE_KEY.unpack(cur.key())[0] if cur.last() else 0)
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
            if tid in names:
                counters.queue_max[(names[tid], queue_id)] = last + 1
            found = cur.next()
    return counters


class GroupWriter:
    """Applies a group of ops in ONE LMDB write transaction and commits it."""

    def __init__(self, env: lmdb.Environment, dbs: dict, counters: Counters, max_map_size: int):
        self.env = env
        self.dbs = dbs
        self.counters = counters
        self.max_key = env.max_key_size()
        self.max_map_size = max_map_size
        #: (epoch, sequence) of the last replication record held, and the epoch history (store/redo.py)
        self.position, self.epochs = self._read_position()
        #: the epoch this writer numbers its commits in, as the leader of a group; None: it records nothing
        self.epoch: int | None = None
        self._tables = {id(dbs[name]): index for index, name in enumerate(DBS)}
        self.redo: tuple[int, int, bytes] | None = None  #: the last commit's record, while leading

    def _read_position(self) -> tuple[tuple[int, int], list]:
        with self.env.begin() as txn:
            return read_position(txn.get, self.dbs["meta"]), read_epochs(txn.get, self.dbs["meta"])

    def lead(self, epoch: int, continuing: bool = False) -> None:
        """Record every commit from now on, numbered in ``epoch``: higher than any epoch this store saw, or, for a
        writer restarted under the same leader (``continuing``), the store's last."""
        self.position, self.epochs = self._read_position()  # a follower's applied records (ApplyRedo) moved them
        last = self.epochs[-1][0] if self.epochs else 0
        if epoch < last or (epoch == last and not continuing):
            raise StoreError(f"epoch {epoch} is not above {last}, the last this store holds")
        self.epoch = epoch

    def commit(self, ops: list) -> tuple[list, dict, dict, bool]:
        """(outcomes, queue bounds grown, new topic ids, whether a commit (and so a data sync) happened); while
        leading, ``redo`` is then the commit's replication record (or None when nothing was written).

        Each outcome is (True, value) or (False, exception)."""
        outcomes: list = [None] * len(ops)
        excluded: set[int] = set()
        self.redo = None
        numbered = None
        while True:
            counters = self.counters.copy()
            txn = self.env.begin(write=True)
            recorder = RecordingTxn(txn, self._tables) if self.epoch is not None else None
            wctx = WriteContext(recorder or txn, self.dbs, counters, int(time.time() * 1000), self.max_key)
            try:
                broken = self._apply_all(ops, excluded, outcomes, wctx)
                if broken is None:
                    wctx.flush()
                    if wctx.writes:
                        if recorder is not None:
                            numbered = self._number(txn, recorder)
                        txn.commit()
                    else:
                        txn.abort()
            except lmdb.MapFullError:
                txn.abort()
                if self._grow_map():
                    continue
                log.error("the LMDB map is full: %d writes refused (raise maxMapSize)", len(ops) - len(excluded))
                return self._fail_rest(ops, excluded, outcomes, StoreFullError(
                    "the store is full: the LMDB map reached its limit (maxMapSize, the most mapSize grows to); raise "
                    "it, or let retention free space (nothing of this write was stored)"))
            except Exception as exc:  # an LMDB failure at flush or commit: nothing of the group was stored
                txn.abort()
                if _disk_full(exc, self.env.path()):
                    log.error("the disk holding the store is full: %d writes refused", len(ops) - len(excluded))
                    return self._fail_rest(ops, excluded, outcomes, StoreFullError(
                        "the store is full: no space left on its disk (nothing of this write was stored; writes "
                        "succeed again once space is freed)"))
                log.exception("store commit failed")
                return self._fail_rest(ops, excluded, outcomes, StoreError(f"the store could not commit: {exc}"))
            if broken is not None:
                txn.abort()
                index, exc = broken
                log.error("write op %s failed after it had written; its group is applied again without it: %r",
                          type(ops[index]).__name__, exc)
                excluded.add(index)
                outcomes[index] = (False, _portable(exc))
                continue
            self.counters = counters
            if numbered is not None:
                self.redo, self.epochs = numbered
                self.position = self.redo[:2]
            return outcomes, wctx.grown, wctx.new_topics, bool(wctx.writes)

    def _number(self, txn, recorder: RecordingTxn) -> tuple[tuple[int, int, bytes], list]:
        """The commit's record, the next sequence of this writer's epoch, stored with it (store/redo.py); and the
        epoch history as it is once the commit is."""
        seq = self.position[1] + 1
        epochs = write_position(txn, self.dbs["meta"], self.epoch, seq, self.epochs)
        return (self.epoch, seq, pack(recorder.entries)), epochs

    def _grow_map(self) -> bool:
        """Double the map, up to max_map_size (no transaction may be open); whether it grew."""
        size = self.env.info()["map_size"]
        if size >= self.max_map_size:
            return False
        new = min(size * 2, self.max_map_size)
        self.env.set_mapsize(new)
        log.info("the LMDB map grew from %d to %d bytes (maxMapSize %d)", size, new, self.max_map_size)
        return True

    @staticmethod
    def _apply_all(ops: list, excluded: set[int], outcomes: list, wctx: WriteContext):
        for index, op in enumerate(ops):
            if index in excluded:
                continue
            before = wctx.writes
            try:
                # A send arrives as a tuple of its request's fields (ops.PutMessage.wire).
                outcomes[index] = (True, wctx.put_fields(*op) if type(op) is tuple else op.apply(wctx))
            except lmdb.MapFullError:
                raise
            except StoreError as exc:
                if wctx.writes != before:
                    return index, exc
                outcomes[index] = (False, exc)  # refused before its first write: nothing to undo
            except Exception as exc:  # a broken op or an LMDB error in the middle of it
                return index, exc
        return None

    @staticmethod
    def _fail_rest(ops, excluded, outcomes, error) -> tuple[list, dict, dict, bool]:
        for index in range(len(ops)):
            if index not in excluded:
                outcomes[index] = (False, error)
        return outcomes, {}, {}, False


#: free bytes below which a failed write is taken for a full disk: LMDB reports a short write as EIO, not ENOSPC
NEARLY_FULL = 64 << 20


def _disk_full(exc: BaseException, path: str) -> bool:
    """Whether an LMDB failure is its disk running out of space: ENOSPC or EDQUOT, or an I/O error (a short
    write) with almost no space left."""
    if not isinstance(exc, lmdb.Error):
        return False
    text = str(exc)
    if any(os.strerror(code) in text for code in (errno.ENOSPC, errno.EDQUOT)):
        return True
    if os.strerror(errno.EIO) not in text:
        return False
    disk = os.statvfs(path)
    return disk.f_bavail * disk.f_frsize < NEARLY_FULL


def _portable(exc: BaseException) -> StoreError:
    """``exc`` as an error that survives pickling to the broker."""
    if isinstance(exc, StoreError):
        return exc
    return StoreError(f"the write failed: {type(exc).__name__}: {exc}")


def take_messages(buffer: bytearray) -> list:
    """The whole frames at the start of ``buffer``, unpickled and removed from it."""
    messages, pos, end = [], 0, len(buffer)
    while end - pos >= 4:
        (size,) = FRAME.unpack_from(buffer, pos)
        if end - pos - 4 < size:
            break
        messages.append(pickle.loads(memoryview(buffer)[pos + 4:pos + 4 + size]))
        pos += 4 + size
    del buffer[:pos]
    return messages


class _Link:
    """The writer's end of the socket: length-prefixed pickles both ways."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = bytearray()
        self.scratch = bytearray(1 << 20)
        self.scratch_view = memoryview(self.scratch)

    def send(self, message) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        parts = [FRAME.pack(len(payload)), payload]
        while parts:  # one sendmsg in the usual case
            sent = self.sock.sendmsg(parts)
            while parts and sent >= len(parts[0]):
                sent -= len(parts.pop(0))
            if parts and sent:
                parts[0] = parts[0][sent:]

    def receive(self, timeout: float | None) -> list | None:
        """The messages that arrived within ``timeout`` seconds (None: wait for one); None at EOF."""
        messages = take_messages(self.buffer)
        if messages:
            return messages
        while True:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return []
            # Into a reused buffer: recv(1 MiB) would map and unmap a fresh megabyte every call.
            size = self.sock.recv_into(self.scratch)
            if not size:
                return None
            self.buffer += self.scratch_view[:size]
            messages = take_messages(self.buffer)
            if messages or timeout is not None:
                return messages


class Prewriter:
    """Keeps the data file written (with zeros, synced) ``PREWRITE_AHEAD`` bytes beyond LMDB's last page, so that
    commits overwrite existing blocks instead of growing the file, except after a commit that grew it by more than
    ``PREWRITE_SKIP_ABOVE`` (see the module docstring).

    Called only between write transactions, and it writes only beyond the last page of the last commit, so it never
    overwrites a page LMDB uses; pages past it belong to no commit (an aborted one's at most). Never past the map:
    LMDB cannot use pages there before the map grows. A failed write (a full disk) stops it for the writer's life:
    commits then grow the file as LMDB does on its own, and report a full disk when they fail."""

    def __init__(self, env: lmdb.Environment):
        self.env = env
        self.page = env.stat()["psize"]
        self.fd = os.open(os.path.join(env.path(), "data.mdb"), os.O_WRONLY)
        self.end = os.fstat(self.fd).st_size  # the file is written up to here
        self.zeros = memoryview(bytes(PREWRITE_STEP))
        self.failed = False
        self.used = (env.info()["last_pgno"] + 1) * self.page  #: where LMDB's pages ended at the last call

    def after_commit(self) -> None:
        if self.failed:
            return
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.page
        grown, self.used = used - self.used, used
        if grown > PREWRITE_SKIP_ABOVE or self.end - used >= PREWRITE_AHEAD - PREWRITE_STEP:
            return
        start = max(self.end, used)
        end = min(start + PREWRITE_STEP, info["map_size"])
        try:
            while start < end:
                start += os.pwrite(self.fd, self.zeros[:end - start], start)
            os.fdatasync(self.fd)  # clean and allocated before a commit writes over them (module docstring)
        except OSError as exc:
            log.warning("writing ahead in the data file failed (%s); commits grow the file from now on", exc)
            self.failed = True
        self.end = max(self.end, start)

    def close(self) -> None:
        os.close(self.fd)


def _sync(env: lmdb.Environment) -> bool:
    """Make the last commit's meta page durable; False if the disk refused."""
    try:
        env.sync(True)
        return True
    except lmdb.Error as exc:  # not durable: the broker fails what waits and restarts the writer
        log.error("sync failed: %s", exc)
        return False


def serve(path: str, map_size: int, max_map_size: int, sync_each: bool, flush_interval_s: float,
          sock: socket.socket) -> int:
    link = _Link(sock)
    try:
        env = open_env(path, map_size, readonly=False)
        with env.begin(write=True) as txn:
            dbs = {name: env.open_db(name.encode(), txn=txn) for name in DBS}
        writer = GroupWriter(env, dbs, counters := load_counters(env, dbs), max_map_size)
        env.sync(True)  # whatever an earlier writer committed is durable before anything new is acknowledged
        # A broker killed in the middle of a read leaves its reader slot behind, and pages it pinned would never be
        # reused: clear such slots of dead processes.
        env.reader_check()
        prewriter = Prewriter(env)
    except (lmdb.Error, struct.error, UnicodeDecodeError, KeyError, OSError) as exc:
        link.send(("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    link.send(("ready", counters.queue_max, counters.topic_ids))
    last_gid = synced_gid = 0  # the newest group committed, and the newest whose meta page is durable
    while True:
        # ASYNC_FLUSH: groups are answered at commit; the meta page is synced once idle for a flush interval.
        messages = link.receive(None if sync_each or synced_gid == last_gid else flush_interval_s)
        if messages is None:
            return 0  # the broker is gone: stop at once (what was acknowledged is durable already)
        if not messages:
            if not _sync(env):
                return 2
            synced_gid = last_gid
            continue
        for message in messages:
            if message[0] == "lead":
                try:
                    writer.lead(message[1], message[2])
                    link.send(("led",))
                except StoreError as exc:
                    link.send(("lead-refused", str(exc)))
        groups = [m for m in messages if m[0] == "group"]
        for chunk in _chunks(groups):
            ops = [op for _kind, _gid, group_ops in chunk for op in group_ops]
            started = time.perf_counter()
            outcomes, grown, new_topics, synced = writer.commit(ops)
            took = time.perf_counter() - started
            per_group, start = [], 0
            for _kind, gid, group_ops in chunk:
                per_group.append((gid, outcomes[start:start + len(group_ops)]))
                start += len(group_ops)
            previous, last_gid = last_gid, chunk[-1][1]
            redo = writer.redo
            if redo is not None:
                # Shipped while its meta page is synced here: the followers apply it meanwhile. It is answered
                # only once durable here as well ("done"); one a power cut takes from this store was never
                # answered, and a follower holding it drops it when it follows again (store/redo.py is_prefix).
                link.send(("redo", redo))
            if sync_each:
                # Every earlier commit is durable already (each was synced at once): this one's meta page is all a
                # sync has left to cover, and a commit that wrote nothing needs none.
                if synced and not _sync(env):
                    return 2
            elif synced:
                synced_gid = previous  # this commit's data sync flushed every earlier commit's meta page too
            # The chunk's outcomes, now durable (SYNC_FLUSH) or committed (ASYNC_FLUSH), in group order.
            link.send(("done", [(last_gid, per_group, grown, new_topics, took, redo[1] if redo else None)]))
        # After the answers: writing ahead never delays an acknowledgement.
        prewriter.after_commit()
        if any(m[0] == "close" for m in messages):
            env.sync(True)
            prewriter.close()
            env.close()
            return 0


def _chunks(groups: list):
    chunk, size = [], 0
    for group in groups:
        if chunk and size + len(group[2]) > MAX_GROUP_OPS:
            yield chunk
            chunk, size = [], 0
        chunk.append(group)
        size += len(group[2])
    if chunk:
        yield chunk
