"""Redo records: what one write transaction of the leader put and deleted, shipped to its group's followers.

Physical, not logical. Ops read the clock, the counters and the map size, so running them again on a follower
could store something else; the puts and deletes one transaction made cannot diverge. The writer (writer.py) runs
each commit of a replicated store through a ``RecordingTxn``; the entries it kept become one record, numbered
``(epoch, sequence)``, whose sequence is stored in the same transaction (``POSITION_KEY``). A follower applies a
record with ``ApplyRedo``, through its own writer: durable (the same commit and syncs as any write) before it is
acknowledged, and no other op ever writes a follower's store, so it holds exactly what the leader's does.

Record layout (msgpack): a list of entries, each ``[PUT, table, key, value]``, ``[DELETE, table, key]`` or
``[PUT_MANY, table, [[key, value], ...]]``; ``table`` is the index of its table in ``DBS``.

Epochs. Every leadership (a leader's start, a switchover) has an epoch higher than every one before it, and the
first record of an epoch adds ``[epoch, first sequence]`` to the epoch history (``EPOCHS_KEY``, the equivalent of
Kafka's leader-epoch checkpoint). Comparing histories tells whether a member coming back holds records the
leader does not (``is_prefix``).
"""
from __future__ import annotations

from dataclasses import dataclass

import msgpack

from .context import WriteContext
from .errors import InvalidWriteError
from .keys import QUEUE_KEY, TOPIC_ID, U64, parse_offset_key
from .ops import Op

PUT, DELETE, PUT_MANY = 0, 1, 2
POSITION_KEY = b"repl.position"  #: meta: [epoch, sequence] of the last record this store holds
EPOCHS_KEY = b"repl.epochs"      #: meta: [[epoch, first sequence], ...], oldest first


class RecordingTxn:
    """An LMDB write transaction that keeps every put and delete made through it (and its cursors)."""

    __slots__ = ("txn", "entries", "tables")

    def __init__(self, txn, tables: dict[int, int]):
        self.txn = txn
        self.entries: list = []
        self.tables = tables  # id(db handle) -> index in DBS

    def put(self, key, value, db=None, **kw):
        done = self.txn.put(key, value, db=db, **kw)
        if done:
            self.entries.append((PUT, self.tables[id(db)], key, value))
        return done

    def delete(self, key, value=b"", db=None):
        done = self.txn.delete(key, value, db=db)
        if done:
            self.entries.append((DELETE, self.tables[id(db)], key))
        return done

    def cursor(self, db=None):
        return _RecordingCursor(self.txn.cursor(db=db), self.entries, self.tables[id(db)])

    def __getattr__(self, name):  # reads (get, stat, ...) go to the transaction itself
        return getattr(self.txn, name)


class _RecordingCursor:
    __slots__ = ("cursor", "entries", "table")

    def __init__(self, cursor, entries: list, table: int):
        self.cursor = cursor
        self.entries = entries
        self.table = table

    def putmulti(self, items, **kw):
        consumed, added = self.cursor.putmulti(items, **kw)
        self.entries.append((PUT_MANY, self.table, items))
        return consumed, added

    def delete(self, dupdata: bool = False) -> bool:
        key = self.cursor.key()
        done = self.cursor.delete(dupdata)
        if done:
            self.entries.append((DELETE, self.table, key))
        return done

    def __iter__(self):
        return iter(self.cursor)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.cursor.close()

    def __getattr__(self, name):
        return getattr(self.cursor, name)


def pack(entries: list) -> bytes:
    return msgpack.packb(entries)


def read_position(get, meta_db) -> tuple[int, int]:
    """(epoch, sequence) of the last record a store holds; (0, 0) for one that never took part in a group."""
    raw = get(POSITION_KEY, db=meta_db)
    return tuple(msgpack.unpackb(raw)) if raw is not None else (0, 0)


def read_epochs(get, meta_db) -> list[tuple[int, int]]:
    raw = get(EPOCHS_KEY, db=meta_db)
    return [tuple(row) for row in msgpack.unpackb(raw)] if raw is not None else []


def write_position(txn, meta_db, epoch: int, seq: int, epochs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Store that the record (epoch, seq) is the last one held, starting ``epoch`` in the history if it is new;
    the history as it now is."""
    if not epochs or epochs[-1][0] != epoch:
        epochs = [*epochs, (epoch, seq)]
        txn.put(EPOCHS_KEY, msgpack.packb(epochs), db=meta_db)
    txn.put(POSITION_KEY, msgpack.packb((epoch, seq)), db=meta_db)
    return epochs


def is_prefix(leader_epochs: list[tuple[int, int]], leader_seq: int, epoch: int, seq: int) -> bool:
    """Are the records of a member whose last one is (epoch, seq) a prefix of the leader's (whose history is
    ``leader_epochs`` and last record ``leader_seq``)? Not when it holds records of an epoch the leader never had,
    or more of an epoch than the leader kept before its next epoch began (an unacknowledged tail, KIP-101)."""
    if seq == 0:
        return True
    for index, (known, _first) in enumerate(leader_epochs):
        if known == epoch:
            end = leader_epochs[index + 1][1] - 1 if index + 1 < len(leader_epochs) else leader_seq
            return seq <= end
    return False


@dataclass(slots=True)
class RedoSummary:
    """What an applied record changed that the follower's broker keeps in memory: topic configurations and
    consumer offsets (by key), and the first offsets retention left in queues."""

    topics: set
    offsets: dict
    minimums: dict
    deleted_topics: dict


@dataclass(slots=True)
class ApplyRedo(Op):
    """A follower stores the leader's record ``seq`` of ``epoch``: its puts and deletes, verbatim. Refused
    (nothing written) unless it is the record after the last one held."""

    epoch: int
    seq: int
    payload: bytes

    def apply(self, wctx: WriteContext) -> RedoSummary:
        from .writer import DBS  # the writer imports this module for RecordingTxn
        txn, dbs, meta = wctx.txn, wctx.dbs, wctx.dbs["meta"]
        epoch, seq = read_position(txn.get, meta)
        if self.seq != seq + 1 or self.epoch < epoch:
            raise InvalidWriteError(f"replication record ({self.epoch}, {self.seq}) does not follow ({epoch}, {seq})")
        handles = [dbs[name] for name in DBS]
        counters = wctx.counters
        names: dict[int, str] | None = None
        summary = RedoSummary(set(), {}, {}, {})
        for entry in msgpack.unpackb(self.payload, use_list=False):
            kind, table = entry[0], entry[1]
            name, db = DBS[table], handles[table]
            if kind == PUT_MANY:
                with txn.cursor(db=db) as cursor:
                    cursor.putmulti(entry[2])
                pairs = entry[2]
            elif kind == PUT:
                txn.put(entry[2], entry[3], db=db)
                pairs = (entry[2:],)
            else:
                txn.delete(entry[2], db=db)
                pairs = ()
            # Keep the writer's counters and the readers' view as the leader's writer keeps them.
            if name == "commitlog":
                for key, value in pairs:
                    counters.next_physical = max(counters.next_physical, U64.unpack(key)[0] + len(value))
            elif name == "topic_ids":
                topic = entry[2].decode(errors="surrogateescape")
                if kind == DELETE:
                    summary.deleted_topics[topic] = counters.topic_ids.pop(topic, None)
                else:
                    tid = TOPIC_ID.unpack(entry[3])[0]
                    counters.topic_ids[topic] = wctx.new_topics[topic] = tid
                    counters.last_tid = max(counters.last_tid, tid)
                names = None
            elif name == "cq":
                if names is None:
                    names = {tid: topic for topic, tid in counters.topic_ids.items()}
                if kind == DELETE:
                    tid, queue_id, offset = QUEUE_KEY.unpack(entry[2])
                    if tid in names:
                        queue = (names[tid], queue_id)
                        summary.minimums[queue] = max(summary.minimums.get(queue, 0), offset + 1)
                for key, _value in pairs:
                    tid, queue_id, offset = QUEUE_KEY.unpack(key)
                    counters.last_tid = max(counters.last_tid, tid)
                    if tid in names:
                        queue = (names[tid], queue_id)
                        if offset + 1 > counters.queue_max.get(queue, 0):
                            counters.queue_max[queue] = wctx.grown[queue] = offset + 1
            elif name == "topics":
                summary.topics.add(entry[2].decode(errors="surrogateescape"))
            elif name == "offsets":
                group, topic, queue_id = parse_offset_key(entry[2])
                summary.offsets[(group, topic, queue_id)] = None if kind == DELETE else U64.unpack(entry[3])[0]
        write_position(txn, meta, self.epoch, self.seq, read_epochs(txn.get, meta))
        wctx.writes += 1
        return summary
