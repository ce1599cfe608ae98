"""Receipts of the RocketMQ 5 consumption model (receive with invisibility), kept in the ``receipts`` table.

Per (consumer group, topic, queue) the table holds a *cursor* (the next queue offset never handed out) and one
*receipt* per message handed out and not yet acknowledged: when it becomes visible again, how many times it was
delivered, its commit-log offset, its version (a receipt handle names one version: a redelivery or a changed
invisible duration makes the older handle stale) and whether the message has a message group (FIFO). Every change
is one op below, so a restart forgets no receipt and redelivers nothing acknowledged.

Keys: ``c`` + scope → cursor; ``r`` + scope + queue offset (big-endian) → receipt; scope = group NUL topic NUL
queue id (4 bytes). Names never hold NUL (broker/names.py).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from .context import WriteContext
from .errors import StoreError
from .ops import Op
from .requests import PutRequest

TABLE = "receipts"
_QUEUE = struct.Struct(">I")
_OFFSET = struct.Struct(">Q")


class ReceiptError(StoreError):
    """The receipt handle names no receipt held now (acknowledged, or redelivered with a newer handle)."""


class Receipt(NamedTuple):
    queue_offset: int
    visible_at: int       #: broker ms at which it is delivered again
    attempts: int         #: deliveries so far
    physical_offset: int
    version: int
    grouped: bool         #: the message has a message group: later grouped messages of its queue wait for it


def scope_key(group: str, topic: str, queue_id: int) -> bytes:
    return b"%s\x00%s\x00%s" % (group.encode(), topic.encode(), _QUEUE.pack(queue_id))


def receipt_topic(key: bytes) -> str | None:
    """The topic a key of the table (a cursor's or a receipt's) belongs to."""
    try:
        return key[1:].split(b"\x00", 2)[1].decode()
    except (IndexError, UnicodeDecodeError):
        return None


def _cursor_key(scope: bytes) -> bytes:
    return b"c" + scope


def _receipt_key(scope: bytes, queue_offset: int) -> bytes:
    return b"r" + scope + _OFFSET.pack(queue_offset)


def _pack(visible_at: int, attempts: int, physical: int, version: int, grouped: bool) -> bytes:
    return msgpack.packb((visible_at, attempts, physical, version, grouped))


def _unpack(queue_offset: int, raw: bytes) -> Receipt:
    visible_at, attempts, physical, version, grouped = msgpack.unpackb(raw)
    return Receipt(queue_offset, visible_at, attempts, physical, version, bool(grouped))


# --- reads (the broker's read handle) ---
def read_cursor(store, group: str, topic: str, queue_id: int) -> int | None:
    with store.env.begin() as txn:
        raw = txn.get(_cursor_key(scope_key(group, topic, queue_id)), db=store.dbs[TABLE])
    return None if raw is None else msgpack.unpackb(raw)


def read_receipts(store, group: str, topic: str, queue_id: int) -> list[Receipt]:
    """The receipts held for one queue, by queue offset (as many as are in flight: bounded by
    grpcMaxReceiptsPerQueue)."""
    prefix = b"r" + scope_key(group, topic, queue_id)
    out = []
    with store.env.begin() as txn:
        cur = txn.cursor(db=store.dbs[TABLE])
        if not cur.set_range(prefix):
            return out
        for key, value in cur:
            if not key.startswith(prefix):
                break
            out.append(_unpack(_OFFSET.unpack_from(key, len(prefix))[0], value))
    return out


def _get(wctx: WriteContext, key: bytes):
    return wctx.txn.get(key, db=wctx.dbs[TABLE])


def _check_receipt(wctx: WriteContext, key: bytes, version: int | None) -> Receipt:
    raw = _get(wctx, key)
    if raw is None:
        raise ReceiptError("the receipt handle is not held (acknowledged, or its message was deleted)")
    receipt = _unpack(_OFFSET.unpack_from(key, len(key) - 8)[0], raw)
    if version is not None and receipt.version != version:
        raise ReceiptError("the receipt handle has expired: the message was delivered again with a newer handle")
    return receipt


# --- writes ---
@dataclass(slots=True)
class TakeReceipts(Op):
    """One receive from one queue: messages handed out for the first time (the cursor moves past them) and
    messages handed out again; receipts of messages no longer stored are dropped. Value: [(queue offset, attempts,
    physical offset)] of what was handed out."""

    group: str
    topic: str
    queue_id: int
    cursor: int | None          #: the cursor the broker read (None: none stored yet)
    new_cursor: int
    fresh: list[tuple[int, int, bool]]      #: (queue offset, physical offset, grouped)
    again: list[tuple[int, int]]            #: (queue offset, version read)
    dropped: list[tuple[int, int]]          #: (queue offset, version read)
    visible_at: int
    version: int

    def apply(self, wctx: WriteContext) -> list[tuple[int, int, int]]:
        scope = scope_key(self.group, self.topic, self.queue_id)
        wctx.check_key(_receipt_key(scope, 0), f"the receipts of group {self.group[:40]!r}")
        raw = _get(wctx, _cursor_key(scope))
        current = None if raw is None else msgpack.unpackb(raw)
        if current != self.cursor:
            raise ReceiptError(f"the cursor moved ({self.cursor} read, {current} stored): receive again")
        again = [_check_receipt(wctx, _receipt_key(scope, offset), version) for offset, version in self.again]
        for offset, version in self.dropped:
            _check_receipt(wctx, _receipt_key(scope, offset), version)
        db, put = wctx.dbs[TABLE], wctx.txn.put
        out = []
        wctx.writes += 1
        for offset, physical, grouped in self.fresh:
            put(_receipt_key(scope, offset), _pack(self.visible_at, 1, physical, self.version, grouped), db=db)
            out.append((offset, 1, physical))
        for receipt in again:
            attempts = receipt.attempts + 1
            put(_receipt_key(scope, receipt.queue_offset),
                _pack(self.visible_at, attempts, receipt.physical_offset, self.version, receipt.grouped), db=db)
            out.append((receipt.queue_offset, attempts, receipt.physical_offset))
        for offset, _version in self.dropped:
            wctx.txn.delete(_receipt_key(scope, offset), db=db)
        if self.new_cursor != current:
            put(_cursor_key(scope), msgpack.packb(self.new_cursor), db=db)
        return out


@dataclass(slots=True)
class AckReceipts(Op):
    """Acknowledgements: each (group, topic, queue id, queue offset, version) drops its receipt when that version
    is held. Value: a list of None (done) or the ReceiptError of each entry (the others still go in)."""

    items: list[tuple[str, str, int, int, int]]

    def apply(self, wctx: WriteContext) -> list[ReceiptError | None]:
        checked = []
        for group, topic, queue_id, offset, version in self.items:
            key = _receipt_key(scope_key(group, topic, queue_id), offset)
            wctx.check_key(key, f"the receipts of group {group[:40]!r}")
            try:
                _check_receipt(wctx, key, version)
                checked.append((key, None))
            except ReceiptError as exc:
                checked.append((key, exc))
        done = set()
        for key, error in checked:
            if error is None and key not in done:  # the same handle twice in one request: the second is a no-op
                wctx.writes += 1
                wctx.txn.delete(key, db=wctx.dbs[TABLE])
                done.add(key)
        return [error for _key, error in checked]


@dataclass(slots=True)
class ChangeInvisibility(Op):
    """A received message becomes visible again at ``visible_at``; its handle changes to ``new_version``."""

    group: str
    topic: str
    queue_id: int
    queue_offset: int
    version: int
    visible_at: int
    new_version: int

    def apply(self, wctx: WriteContext) -> Receipt:
        key = _receipt_key(scope_key(self.group, self.topic, self.queue_id), self.queue_offset)
        wctx.check_key(key, f"the receipts of group {self.group[:40]!r}")
        receipt = _check_receipt(wctx, key, self.version)
        wctx.writes += 1
        wctx.txn.put(key, _pack(self.visible_at, receipt.attempts, receipt.physical_offset, self.new_version,
                                receipt.grouped), db=wctx.dbs[TABLE])
        return receipt._replace(visible_at=self.visible_at, version=self.new_version)


@dataclass(slots=True)
class DeadLetter(Op):
    """A message moved to its group's dead-letter topic: the copy stored and the receipt dropped in one write
    (``version`` None: whatever version is held)."""

    group: str
    topic: str
    queue_id: int
    queue_offset: int
    version: int | None
    request: PutRequest

    def apply(self, wctx: WriteContext):
        key = _receipt_key(scope_key(self.group, self.topic, self.queue_id), self.queue_offset)
        wctx.check_key(key, f"the receipts of group {self.group[:40]!r}")
        _check_receipt(wctx, key, self.version)
        wctx.check_message(self.request)
        result = wctx.put_message(self.request)
        wctx.txn.delete(key, db=wctx.dbs[TABLE])
        return result


@dataclass(slots=True)
class RenewReceipts(Op):
    """Auto-renewal (a push consumer's receipts): each (group, topic, queue id, queue offset, version) still held at
    that version becomes visible at ``visible_at`` instead; its handle stays valid. Value: the items renewed."""

    items: list[tuple[str, str, int, int, int]]
    visible_at: int

    def apply(self, wctx: WriteContext) -> list[tuple[str, str, int, int, int]]:
        held = []
        for item in self.items:
            group, topic, queue_id, offset, version = item
            key = _receipt_key(scope_key(group, topic, queue_id), offset)
            wctx.check_key(key, f"the receipts of group {group[:40]!r}")
            raw = _get(wctx, key)
            if raw is not None and _unpack(offset, raw).version == version:
                held.append((key, _unpack(offset, raw), item))
        for key, receipt, _item in held:
            wctx.writes += 1
            wctx.txn.put(key, _pack(self.visible_at, receipt.attempts, receipt.physical_offset, receipt.version,
                                    receipt.grouped), db=wctx.dbs[TABLE])
        return [item for _key, _receipt, item in held]
