"""Timer messages (RocketMQ 5's TIMER_DELIVER_MS and kin): stored now in the timer topic, delivered at their time.

The ``timers`` table indexes them by (deliver ms, commit-log offset), so the next due is the table's first key: found
in O(log n) whatever how many wait, and a restart finds what came due while the broker was down. Delivery re-stores
the message to its real topic and removes its index entry in one write: never lost, never delivered twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from .context import WriteContext, stored_before_deletion
from .keys import DUE_KEY
from .ops import Op
from .requests import PutRequest, PutResult


@dataclass(slots=True)
class PutTimed(Op):
    """A message to deliver at ``due_ms``: its record (in the timer topic) and its index entry."""

    request: PutRequest
    due_ms: int

    def apply(self, wctx: WriteContext) -> PutResult:
        wctx.check_message(self.request)
        result = wctx.put_message(self.request)
        wctx.writes += 1
        wctx.txn.put(DUE_KEY.pack(self.due_ms, result.physical_offset), b"", db=wctx.dbs["timers"])
        return result


@dataclass(slots=True)
class DeliverTimed(Op):
    """Timer messages come due: each ``(due ms, timer record offset, request)`` stores the request (the message in
    its real topic) and drops the index entry, unless an earlier delivery already did. Value: how many were
    delivered."""

    items: list[tuple[int, int, PutRequest | None]]   #: None: the record is unreadable, only its entry goes

    def apply(self, wctx: WriteContext) -> int:
        txn, timers = wctx.txn, wctx.dbs["timers"]
        deleted = wctx.deleted_topics()
        # a timer message of a topic deleted since it was stored only loses its entry
        pending = [(DUE_KEY.pack(due, offset),
                    None if request is None or stored_before_deletion(deleted, request.topic, offset) else request)
                   for due, offset, request in self.items
                   if txn.get(DUE_KEY.pack(due, offset), db=timers) is not None]
        for _key, request in pending:
            if request is not None:
                wctx.check_message(request)
        for key, request in pending:
            wctx.writes += 1
            if request is not None:
                wctx.put_message(request)
            txn.delete(key, db=timers)
        return sum(1 for _key, request in pending if request is not None)
