"""Transaction ops: every transition of a half message, each as the state machine's table allows it
(halfmq.transactions: ``transition``; ARCHITECTURE.md "Transaction state machine").

PREPARED → COMMITTED | ROLLED_BACK | DISCARDED, and DISCARDED → PREPARED by a resume. Each transition is one op,
applied in one LMDB write transaction: a commit writes a commit marker that makes the half's own record visible
in its real topic (store/committed.py: the record is stored once), its consume-queue entry and the half's new state
together, so a crash can neither lose a commit nor deliver it twice, and the first durable
decision wins. The broker's TransactionStates submits these and keeps the metrics.

A batch half (halfmq's transactional batch, HalfState.batch) holds in its body the records of its messages, built
whole when it was prepared; its commit makes them all visible in the same write (a marker each), so its messages
become visible together or not at all.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from halfmq.protocol import properties as P
from halfmq.protocol.errors import MessageFormatError
from halfmq.protocol.message import batch_index, batch_spans, body_crc_matches, decode_record, rewritten_size

from .context import WriteContext
from .errors import CorruptRecordError, HalfConflictError, HalfMismatchError, HalfNotFoundError
from halfmq.transactions import Decider, Effect, Event, transition

from .halfs import STATUSES, HalfState, HalfStatus, stored_fields, unpack_parts
from .ops import Op
from .requests import PutRequest, PutResult, message_request


@dataclass(slots=True)
class Decision:
    """What a decision did: ``applied`` is False for a repeated decision acknowledged without effect. The half's
    status after it, and what its metrics need of the half (topic, store and decision times): not its whole state,
    which cost both processes microseconds per transaction to pickle and rebuild (tests/store/test_wire_forms.py).
    Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__ (1.2 us against 0.26 us,
    once per decision); nothing changes one after it is made."""

    applied: bool
    previous: HalfStatus
    status: HalfStatus
    topic: str
    store_ts: int
    decided_ts: int | None
    committed: PutResult | None = None


def _decision(applied: bool, previous: str, status: str, topic: str, store_ts: int, decided_ts: int | None,
              committed: tuple | None) -> Decision:
    return Decision(applied, STATUSES[previous], STATUSES[status], topic, store_ts, decided_ts,
                    None if committed is None else PutResult._make(committed))


def _half_record(wctx: WriteContext, half_offset: int) -> bytes:
    raw = wctx.read_record(half_offset)
    if raw is None:
        raise HalfNotFoundError(f"the half message's record at {half_offset} is missing")
    if not body_crc_matches(raw):
        raise CorruptRecordError(half_offset, "body CRC mismatch")
    return raw


def _commit(wctx: WriteContext, raw: bytes, half_offset: int, state: HalfState) -> PutResult:
    """Make the half's message visible in its real topic without copying it (store/committed.py): one commit
    marker, queue entry and KEYS entries per message — for a batch half, per record its body holds (built whole
    when it was prepared). Their names and KEYS were checked when the half was prepared (PrepareHalf). Value: the
    first message's PutResult."""
    if not state.batch:
        size = rewritten_size(raw, state.topic)
        return PutResult._make(wctx.put_committed(state.topic, state.queue_id, half_offset, (0, 0), size,
                                                  state.tags_code, state.keys))
    try:
        # The records' sizes recorded at prepare spare parsing the body (a third of committing a sink's batch half);
        # its CRC, checked by _half_record, covers what they point into.
        index = batch_spans(raw, *unpack_parts(state.parts, state.batch)) if state.parts else batch_index(raw)
        if len(index) != state.batch:
            raise MessageFormatError(f"the batch half holds {len(index)} records, not {state.batch}")
    except (MessageFormatError, struct.error) as exc:
        raise CorruptRecordError(half_offset, f"the batch half's body: {exc}") from None
    first, state.committed_last = wctx.put_committed_batch(state.topic, state.queue_id, half_offset, index)
    return PutResult._make(first)


#: The state a half is prepared in (the table's, read once: every half is filled in with it, in both processes).
_PREPARED = transition(None, Event.PREPARE).to


@dataclass(slots=True)
class PrepareHalf(Op):
    """Store a half message (in the half topic) and its PREPARED state, first check due ``delay_ms`` later."""

    request: PutRequest          #: the half record, in the half topic (not indexed by KEYS there)
    state: HalfState             #: its state, without the fields only the store knows
    delay_ms: int
    batch_keys: tuple[str, ...] = ()  #: a batch half: the KEYS of its messages (those that have some)

    def __reduce__(self):
        # To the writer as one flat tuple of plain values (the request's fields, the state's, as HalfState and
        # PutRequest reduce them): 4.9 us to pickle and unpickle, against 8.2 us nesting their own reduces.
        r, state = self.request, self.state
        return _prepare_half, (r.topic, r.queue_id, r.record, r.tags_code, r.index, r.keys, state.status.value,
                               stored_fields(state), self.delay_ms, self.batch_keys)

    def apply(self, wctx: WriteContext) -> tuple[tuple[int, int, int, int], int]:
        # The commit will index the real topic by these KEYS: refuse them now, not at the commit.
        state = self.state
        for keys in (state.keys, *self.batch_keys):
            wctx.check_names(state.topic, keys)
        stored = wctx.put_message(self.request)
        self._fill(state, stored, stored.store_timestamp + self.delay_ms)
        wctx.put_half(stored.physical_offset, state)
        wctx.add_due(state.due, stored.physical_offset)
        # Back to the broker only what it does not know (``result`` fills in its own copy of the state): the whole
        # state, pickled both ways, cost each process microseconds per transaction.
        return tuple(stored), state.due

    def result(self, value: tuple[tuple[int, int, int, int], int]) -> tuple[PutResult, HalfState]:
        """The op's value, (PutResult, HalfState), from what the writer answered: this op's state, completed."""
        fields, due = value
        stored = PutResult._make(fields)
        return stored, self._fill(self.state, stored, due)

    @staticmethod
    def _fill(state: HalfState, stored: PutResult, due: int) -> HalfState:
        state.status = _PREPARED
        state.queue_offset, state.store_ts, state.size = stored.queue_offset, stored.store_timestamp, stored.size
        state.due = due
        return state


def _prepare_half(topic: str, queue_id: int, record: bytearray, tags_code: int, index: bool, keys: str | None,
                  status: str, stored: tuple, delay_ms: int, batch_keys: tuple[str, ...]) -> PrepareHalf:
    """A PrepareHalf from its pickled form (``PrepareHalf.__reduce__``)."""
    return PrepareHalf(PutRequest(topic, queue_id, record, tags_code, index, keys),
                       HalfState(STATUSES[status], *stored), delay_ms, batch_keys)


@dataclass(slots=True)
class DecideHalf(Op):
    """COMMIT or ROLLBACK (reference §5.3) with the first-decision-wins guard."""

    half_offset: int
    group: str
    queue_offset: int
    commit: bool
    from_check: bool

    def __reduce__(self):  # to the writer as a plain tuple (see PrepareHalf)
        return DecideHalf, (self.half_offset, self.group, self.queue_offset, self.commit, self.from_check)

    @staticmethod
    def result(value: tuple) -> Decision:
        """The op's value, a Decision, from the plain tuple the writer answered (``decision_wire``)."""
        return _decision(*value)

    def apply(self, wctx: WriteContext) -> tuple:
        offset = self.half_offset
        state = wctx.get_half(offset)
        if state is None:
            raise HalfNotFoundError("Find prepared transaction message failed")
        if state.group != self.group:
            raise HalfMismatchError("The producer group wrong")
        if state.queue_offset != self.queue_offset:
            raise HalfMismatchError("The transaction state table offset wrong")
        current = state.status
        move = transition(current, Event.COMMIT if self.commit else Event.ROLLBACK)
        if move.effect is Effect.REPEAT:
            return decision_wire(state, False, current, None)
        if move.effect is Effect.REFUSE:
            wanted = HalfStatus.COMMITTED if self.commit else HalfStatus.ROLLED_BACK
            raise HalfConflictError(f"the transaction is already {current.value}; {wanted.value} refused")
        committed = None
        if self.commit:
            committed = _commit(wctx, _half_record(wctx, offset), offset, state)
            state.committed_offset = committed.physical_offset
        if current is HalfStatus.PREPARED:
            wctx.remove_due(state.due, offset)
        state.status = move.to
        state.decided_ts = wctx.now_ms
        state.decided_by = (Decider.CHECK if self.from_check else Decider.PRODUCER).value
        state.parts = None  # decided: nothing indexes the body again
        wctx.put_half(offset, state)
        return decision_wire(state, True, current, committed)


def decision_wire(state: HalfState, applied: bool, previous: HalfStatus, committed: PutResult | None) -> tuple:
    """A decision's value as it goes back to the broker (DecideHalf.result makes it a Decision)."""
    return (applied, previous.value, state.status.value, state.topic, state.store_ts, state.decided_ts,
            None if committed is None else tuple(committed))


#: the statuses the table lets a check pass move (read once: a pass reschedules up to PASS_LIMIT halves)
_CHECKABLE = frozenset(s for s in HalfStatus if transition(s, Event.CHECK_SENT).effect is Effect.APPLY)
_WAITABLE = frozenset(s for s in HalfStatus if transition(s, Event.NO_PRODUCER).effect is Effect.APPLY)


@dataclass(slots=True)
class RescheduleChecks(Op):
    """After a check pass: halves checked (new check counts), halves waiting for a producer, and due-index
    entries left behind by decisions."""

    attempts: dict[int, int]
    postponed: list[int]
    stale: list[tuple[int, int]]
    interval_ms: int

    def apply(self, wctx: WriteContext) -> None:
        for offset, checks in self.attempts.items():
            self._reschedule(wctx, offset, checks)
        for offset in self.postponed:
            self._reschedule(wctx, offset, None)
        for due_ms, offset in self.stale:
            state = wctx.get_half(offset)
            if state is None or not state.pending or state.due != due_ms:
                wctx.remove_due(due_ms, offset)

    def _reschedule(self, wctx: WriteContext, offset: int, checks: int | None) -> None:
        state = wctx.get_half(offset)
        if state is None or state.status not in (_CHECKABLE if checks is not None else _WAITABLE):
            return  # decided meanwhile: its index entry is already gone
        wctx.remove_due(state.due, offset)
        if checks is not None:
            state.checks = checks
            state.last_check_ts = wctx.now_ms
            state.waiting = False
        else:
            state.waiting = True
        state.due = wctx.now_ms + self.interval_ms
        wctx.put_half(offset, state)
        wctx.add_due(state.due, offset)


@dataclass(slots=True)
class MakeDue(Op):
    """Pending halves of a group whose producer (re)registered: due now. Value: the earliest due time or None."""

    offsets: list[int]

    def apply(self, wctx: WriteContext) -> int | None:
        earliest = None
        for offset in self.offsets:
            state = wctx.get_half(offset)
            if state is None or transition(state.status, Event.PRODUCER_SEEN).effect is Effect.REFUSE:
                continue
            wctx.remove_due(state.due, offset)
            state.due, state.waiting = wctx.now_ms, False
            wctx.put_half(offset, state)
            wctx.add_due(state.due, offset)
            earliest = state.due
        return earliest


def pending_since(state: HalfState) -> int:
    """When a half's current wait began: its store time, or its last resume (a resumed half was discarded
    before, at ``decided_ts``)."""
    return max(state.store_ts, state.decided_ts or 0)


@dataclass(slots=True)
class DiscardHalf(Op):
    """A half that used up its checks, or (``max_age_ms``) that no producer answered for that long since it was
    stored or last resumed, moves to ``topic`` (TRANS_CHECK_MAX_TIME_TOPIC), where it stays readable and
    resumable. Without ``copy`` (a store too full to write one: a large half's copy needs as much room as the
    half) nothing is written to ``topic``: the half is DISCARDED, resumable from its own record while retention
    keeps it. Value: the new state, or None when it was decided (or resumed) meanwhile."""

    half_offset: int
    max_checks: int
    topic: str
    store_host: str
    max_age_ms: int | None = None
    copy: bool = True

    def apply(self, wctx: WriteContext) -> HalfState | None:
        offset = self.half_offset
        state = wctx.get_half(offset)
        if state is None:
            return None
        move = transition(state.status, Event.DISCARD)
        if move.effect is Effect.REFUSE:
            return None
        if self.max_age_ms is None:
            if state.checks < self.max_checks:
                return None
        elif wctx.now_ms - pending_since(state) < self.max_age_ms:
            return None
        if self.copy:
            rec = decode_record(_half_record(wctx, offset))
            rec.topic, rec.queue_id, rec.store_host = self.topic, 0, self.store_host
            rec.properties[P.TRANSACTION_CHECK_TIMES] = str(state.checks)
            state.discarded_offset = wctx.put_message(message_request(rec)).physical_offset
        wctx.remove_due(state.due, offset)
        state.status, state.decided_ts, state.decided_by = move.to, wctx.now_ms, Decider.DISCARD.value
        wctx.put_half(offset, state)
        return state


@dataclass(slots=True)
class ResumeHalf(Op):
    """RESUME_CHECK_HALF_MESSAGE: a discarded (or pending) half gets a fresh set of checks, due now.
    Value: (state before, state after)."""

    half_offset: int

    def apply(self, wctx: WriteContext) -> tuple[HalfStatus, HalfState]:
        offset = self.half_offset
        state = wctx.get_half(offset)
        if state is None:
            raise HalfNotFoundError(f"no half message at offset {offset}")
        before = state.status
        move = transition(before, Event.RESUME)
        if move.effect is Effect.REFUSE:
            raise HalfConflictError(f"the transaction is already {before.value}")
        if before is HalfStatus.PREPARED:
            wctx.remove_due(state.due, offset)
        state.status, state.checks, state.due, state.waiting = move.to, 0, wctx.now_ms, False
        state.decided_ts = state.decided_by = None
        wctx.put_half(offset, state)
        wctx.add_due(state.due, offset)
        return before, state
