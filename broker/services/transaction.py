"""TransactionStates: the one component through which a half message changes state (reference §5).

Each transition (prepare, commit, rollback, reschedule, make due, discard, resume) submits one store op
(store/txops.py), which validates and writes atomically in one group commit, and attaches this component's
post-commit work to the op's Completion: the metrics, the sender channel kept for check-backs, and waking the
check scheduler. Callers get the Completion and build their answers from its value.
"""
from __future__ import annotations

import logging
import weakref

from halfmq.protocol import properties as P
from halfmq.protocol.codes import SysFlag, TransactionResolution
from halfmq.protocol.message import MessageRecord, encode_record
from halfmq.store import HalfConflictError, HalfState, HalfStatus, PutRequest, record_request
from halfmq.store.halfs import pack_parts
from halfmq.store.txops import DecideHalf, DiscardHalf, MakeDue, PrepareHalf, RescheduleChecks, ResumeHalf

from ..topics import CHECK_MAX_TIME_TOPIC, HALF_TOPIC

log = logging.getLogger(__name__)


def first_check_delay_ms(props: dict[str, str], timeout_ms: int, max_pending_ms: int) -> int:
    """Delay before the first check: the larger of transactionTimeOut and the message's immunity time, which is
    capped at ``max_pending_ms`` (fileReservedTime: an unbounded immunity kept a half, and the store, forever)."""
    text = props.get(P.CHECK_IMMUNITY_TIME_IN_SECONDS)
    try:
        immunity = min(int(text) * 1000, max_pending_ms) if text else -1
    except ValueError:
        immunity = -1
    return max(timeout_ms, immunity)


class TransactionStates:
    def __init__(self, ctx):
        self.ctx = ctx
        self.store = ctx.store
        #: A weak reference to the channel each pending half arrived on, so its check goes back there first (in
        #: memory only; ``sender``). Not a WeakValueDictionary: its Python-level setitem cost every half three calls.
        self.sender_channels: dict[int, weakref.ref] = {}
        self.on_due = []  # callbacks(due_ms): a half became due at that time (the check scheduler)
        #: how long a half may wait with no producer answering before it is discarded (resumable): the retention
        #: age, as RocketMQ drops halves with their commit-log files at fileReservedTime
        self.max_pending_ms = int(ctx.config.fileReservedTime * 3_600_000)

    def _when_done(self, completion, on_value, on_error=None):
        """Run ``on_value(value)`` (or ``on_error(exc)``) once the op is durable; returns the completion."""
        def done(c) -> None:
            try:
                value = c.result()  # not exception() then result(): two calls more per transition
            except Exception as exc:
                if on_error is not None:
                    on_error(exc)
                else:
                    log.warning("a transaction state write failed: %s", exc)
            else:
                on_value(value)

        completion.add_done_callback(done)
        return completion

    def sender(self, half_offset: int):
        """The channel the pending half at ``half_offset`` arrived on, or None once that channel is gone (a reference
        to a gone one stays until its half is decided or discarded: no more entries than pending halves)."""
        ref = self.sender_channels.get(half_offset)
        return None if ref is None else ref()

    def _due(self, due_ms: int | None) -> None:
        if due_ms is not None:
            for callback in self.on_due:
                callback(due_ms)

    # --- transitions ---
    def prepare(self, rec: MessageRecord, group: str, channel, batch: list[PutRequest] | None = None):
        """Store ``rec`` as a half message (reference §5.2). Value: (PutResult, HalfState).

        With ``batch`` (the requests storing messages in rec's topic and queue), a batch half: a halfmq extension
        (RocketMQ refuses transactional batches) giving many messages one decision, so a writer such as the Spark
        sink pays one half and one decision per batch, not per message. Its body is the batch's records, which its
        commit stores (txops.py).
        """
        props = rec.properties
        batch_keys: tuple[str, ...] = ()
        if batch is not None:
            rec.body = b"".join([request.record for request in batch])
            props.pop(P.KEYS, None)  # each message's own KEYS become its index entries (checked by PrepareHalf)
            props[P.HALF_BATCH] = str(len(batch))
            batch_keys = tuple(request.keys for request in batch if request.keys)
        uniq = props.get(P.UNIQ_KEY, "")
        if uniq:
            props[P.TRANSACTION_ID] = uniq
        props[P.REAL_TOPIC] = rec.topic
        props[P.REAL_QID] = str(rec.queue_id)
        props.setdefault(P.PGROUP, group)
        state = HalfState(HalfStatus.PREPARED, props[P.PGROUP], rec.topic, rec.queue_id, uniq, queue_offset=0,
                          store_ts=0, due=0, client_id=getattr(channel, "client_id", None),
                          keys=props.get(P.KEYS) or None, batch=None if batch is None else len(batch))
        if batch is not None and not batch_keys:
            state.parts = pack_parts([len(request.record) for request in batch],
                                     [request.tags_code for request in batch])
        rec.topic, rec.queue_id = HALF_TOPIC, 0
        rec.sys_flag &= ~SysFlag.TRANSACTION_MASK
        request = record_request(encode_record(rec), HALF_TOPIC, 0, props)
        # The half is not indexed by KEYS (that would show uncommitted bodies to QUERY_MESSAGE); its commit is.
        request.keys = None
        state.tags_code = request.tags_code
        delay = first_check_delay_ms(props, self.ctx.config.transactionTimeOut, self.max_pending_ms)

        def prepared(completion) -> None:  # _when_done's work written out: once per half
            try:
                result, state = completion.result()
            except Exception as exc:
                log.warning("a transaction state write failed: %s", exc)
                return
            self.sender_channels[result.physical_offset] = weakref.ref(channel)
            if self.ctx.metrics is not None:
                self.ctx.metrics.half_prepared(state.topic)
            self._due(state.due)

        completion = self.store.submit(PrepareHalf(request, state, delay, batch_keys))
        completion.add_done_callback(prepared)
        return completion

    def decide(self, half_offset: int, group: str, queue_offset: int, decision: TransactionResolution,
               from_check: bool):
        """COMMIT or ROLLBACK (reference §5.3) with the first-decision-wins guard. Value: a txops.Decision.

        Fails with HalfNotFoundError or HalfMismatchError (unknown half, wrong group or offset) or
        HalfConflictError (the decision conflicts with an earlier one).
        """
        metrics = self.ctx.metrics

        def decided(completion) -> None:  # _when_done's work written out: once per decision
            try:
                outcome = completion.result()
            except Exception as exc:
                if isinstance(exc, HalfConflictError) and metrics is not None:
                    metrics.decision_conflict(group)
                log.info("END_TRANSACTION %s for half %d refused: %s", decision.name, half_offset, exc)
                return
            if outcome.applied:
                self.sender_channels.pop(half_offset, None)
                if metrics is not None:
                    metrics.half_decided(outcome, outcome.previous is HalfStatus.PREPARED)
            elif metrics is not None:
                metrics.repeated_decision(from_check)

        completion = self.store.submit(DecideHalf(half_offset, group, queue_offset,
                                                  decision is TransactionResolution.COMMIT, from_check))
        completion.add_done_callback(decided)
        return completion

    def reschedule(self, attempts: dict[int, int], postponed: list[int], stale: list[tuple[int, int]],
                   interval_ms: int):
        """After a check pass: new check counts and due times; halves waiting for a producer; stale index rows."""
        return self.store.submit(RescheduleChecks(attempts, postponed, stale, interval_ms))

    def make_due(self, offsets: list[int]):
        """A producer of the group (re)registered: its waiting halves are due now."""
        return self._when_done(self.store.submit(MakeDue(offsets)), self._due)

    def discard(self, half_offset: int, max_checks: int, aged: bool = False):
        """Move a half that used up its checks, or (``aged``) that no producer answered for ``max_pending_ms``, to
        TRANS_CHECK_MAX_TIME_TOPIC, where it stays readable and resumable. A store refusing messages (full) gets no
        copy: the copies of large halves took the room left for retention and decisions (the discards failed, and
        the halves stayed); the half stays resumable from its own record while retention keeps it.
        Value: the new state, or None when the half was decided (or resumed) meanwhile."""
        def discarded(state) -> None:
            if state is None:
                return
            self.sender_channels.pop(half_offset, None)
            if aged:
                log.info("half message at %d of group %s discarded: no producer answered for %d ms", half_offset,
                         state.group, self.max_pending_ms)
            else:
                log.info("half message at %d discarded after %d checks", half_offset, max_checks)
            if self.ctx.metrics is not None:
                self.ctx.metrics.half_decided(state)

        op = DiscardHalf(half_offset, max_checks, CHECK_MAX_TIME_TOPIC, self.ctx.store_host,
                         self.max_pending_ms if aged else None, copy=self.store.refusing is None)
        return self._when_done(self.store.submit(op), discarded)

    def resume(self, half_offset: int):
        """RESUME_CHECK_HALF_MESSAGE: a discarded (or pending) half gets a fresh set of checks, due now.
        Fails with HalfNotFoundError, or HalfConflictError when it is already committed or rolled back."""
        def resumed(value) -> None:
            before, state = value
            if before is HalfStatus.DISCARDED and self.ctx.metrics is not None:
                self.ctx.metrics.half_reopened(state.topic)
            self._due(state.due)

        return self._when_done(self.store.submit(ResumeHalf(half_offset)), resumed)
