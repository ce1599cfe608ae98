"""The store's write ops. Every write goes through ``MessageStore.submit(op)`` as one of these.

An op is plain data (it is pickled to the writer process; a send goes as ``PutMessage.wire()``) with
``apply(wctx)``, run inside the group's LMDB transaction. Contract: ``apply`` checks everything first and raises (InvalidWriteError, or another StoreError for a
refused transition) only before its first write; its value is the op's result. An op that breaks the contract
is still undone: the writer retries the group without it (writer.py). An op whose value goes back to the broker in
a cheaper form than the one its callers get (plain tuples for PutResults) has a ``result`` turning one into the
other; the link applies it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .context import WriteContext, stored_before_deletion
from .keys import offset_key
from .requests import PutRequest, PutResult


class Op:
    __slots__ = ()
    result = None  #: value from the writer -> the op's result, for an op whose value travels in another form

    def apply(self, wctx: WriteContext):
        raise NotImplementedError


@dataclass(slots=True)
class PutMessage(Op):
    """One message (a send)."""

    request: PutRequest

    def apply(self, wctx: WriteContext) -> tuple[int, int, int, int]:
        return wctx.put_fields(*self.wire())

    def wire(self) -> tuple:
        """What goes to the writer for a send: a plain tuple of the request's fields. Unpickling objects cost the
        writer as much as applying them (their constructors run in Python); a tuple is rebuilt in C, and the writer
        applies it with ``WriteContext.put_fields``, whose plain-tuple value comes back and ``result`` makes a
        PutResult of."""
        r = self.request
        return r.topic, r.queue_id, r.record, r.tags_code, r.index, r.keys

    result = staticmethod(PutResult._make)  #: the op's value from what the writer answered for its wire form


@dataclass(slots=True)
class PutMessages(Op):
    """Messages stored all or none (a batch, a retry or DLQ copy)."""

    requests: list[PutRequest]

    def apply(self, wctx: WriteContext) -> list[tuple[int, int, int, int]]:
        for req in self.requests:
            wctx.check_message(req)
        return [wctx.put_fields(r.topic, r.queue_id, r.record, r.tags_code, r.index, r.keys) for r in self.requests]

    @staticmethod
    def result(values: list[tuple[int, int, int, int]]) -> list[PutResult]:
        return [PutResult._make(value) for value in values]


@dataclass(slots=True)
class DeliverDelayed(Op):
    """Delayed messages re-stored to their real topics, with the level's progress advanced in the same write; one
    whose topic was deleted since it was stored is not (``items``: (its schedule record's offset, request))."""

    items: list[tuple[int, PutRequest]]
    progress_key: str
    next_offset: int

    def apply(self, wctx: WriteContext) -> None:
        wctx.check_key(self.progress_key.encode(), "the schedule progress key")
        deleted = wctx.deleted_topics()
        requests = [req for offset, req in self.items if not stored_before_deletion(deleted, req.topic, offset)]
        for req in requests:
            wctx.check_message(req)
        for req in requests:
            wctx.put_message(req)
        wctx.put_meta(self.progress_key, self.next_offset)


@dataclass(slots=True)
class SetConsumerOffsets(Op):
    """Consumer offsets: {(group, topic, queue id): offset}."""

    offsets: dict[tuple[str, str, int], int]

    def apply(self, wctx: WriteContext) -> None:
        for (group, topic, queue_id) in self.offsets:
            wctx.check_key(offset_key(group, topic, queue_id), f"the consumer offset of group {group[:40]!r}")
        for (group, topic, queue_id), offset in self.offsets.items():
            wctx.set_consumer_offset(group, topic, queue_id, offset)


@dataclass(slots=True)
class PutTopic(Op):
    name: str
    config: dict

    def apply(self, wctx: WriteContext) -> None:
        wctx.check_key(self.name.encode(), f"the topic name {self.name[:40]!r}")
        wctx.put_topic(self.name, self.config)


@dataclass(slots=True)
class PutMeta(Op):
    key: str
    value: object

    def apply(self, wctx: WriteContext) -> None:
        wctx.check_key(self.key.encode(), "the meta key")
        wctx.put_meta(self.key, self.value)
