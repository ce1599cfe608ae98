"""The half-message state machine (ARCHITECTURE.md "Transaction state machine", reference §5).

Each half message has one state row in the store, keyed by the half record's commit-log offset:
PREPARED → COMMITTED | ROLLED_BACK | DISCARDED (and DISCARDED → PREPARED by a resume). Every transition is one
function run by the store's writer inside one LMDB write transaction, so a decision is atomic (the real-topic
record, its consume-queue entry and the new state are written together) and the first durable decision wins.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

from halfmq.protocol import properties as P
from halfmq.protocol.codes import ResponseCode, SysFlag
from halfmq.protocol.message import (MessageRecord, decode_record, encode_record, mark_committed,
                                     record_properties_text, rewrite_record, tags_hash)
from halfmq.store import PutRequest

from ..errors import BrokerError
from ..topics import CHECK_MAX_TIME_TOPIC, HALF_TOPIC

log = logging.getLogger(__name__)

PREPARED, COMMITTED, ROLLED_BACK, DISCARDED = "PREPARED", "COMMITTED", "ROLLED_BACK", "DISCARDED"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
_DECISION_STATE = {COMMIT: COMMITTED, ROLLBACK: ROLLED_BACK}


@dataclass(frozen=True)
class DecisionOutcome:
    """What END_TRANSACTION did: ``applied`` is False for a repeated decision acknowledged without effect."""

    state: dict
    applied: bool
    committed_offset: int | None = None


def first_check_delay_ms(props: dict[str, str], timeout_ms: int) -> int:
    """Delay before the first check: the larger of transactionTimeOut and the message's immunity time."""
    text = props.get(P.CHECK_IMMUNITY_TIME_IN_SECONDS)
    try:
        immunity = int(text) * 1000 if text else -1
    except ValueError:
        immunity = -1
    return max(timeout_ms, immunity)


class TransactionStates:
    """Writes every transition of the state machine; readers use the store directly."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.store = ctx.store
        #: Channel each pending half arrived on, so its check goes back there first (in memory only).
        self.sender_channels: weakref.WeakValueDictionary[int, object] = weakref.WeakValueDictionary()
        self.on_prepared = []  # callbacks(due_ms) for the check scheduler

    async def prepare(self, rec: MessageRecord, group: str, channel) -> tuple:
        """Store ``rec`` as a half message (reference §5.2). Returns (PutResult, transaction id)."""
        future, finish = self.submit_prepare(rec, group, channel)
        return finish(await future)

    def submit_prepare(self, rec: MessageRecord, group: str, channel) -> tuple:
        """As prepare, without a coroutine: (store future, finish) where finish(future's value) gives
        (PutResult, transaction id)."""
        props = rec.properties
        uniq = props.get(P.UNIQ_KEY, "")
        if uniq:
            props[P.TRANSACTION_ID] = uniq
        props[P.REAL_TOPIC] = rec.topic
        props[P.REAL_QID] = str(rec.queue_id)
        props.setdefault(P.PGROUP, group)
        rec.topic = HALF_TOPIC
        rec.queue_id = 0
        rec.sys_flag &= ~SysFlag.TRANSACTION_MASK
        request = PutRequest(HALF_TOPIC, 0, encode_record(rec), tags_hash(props.get(P.TAGS)))
        delay = first_check_delay_ms(props, self.ctx.config.transactionTimeOut)
        real_topic, real_qid, pgroup = props[P.REAL_TOPIC], int(props[P.REAL_QID]), props[P.PGROUP]
        client_id = getattr(channel, "client_id", None)

        def write(wctx):
            result = wctx.put_message(request)
            due = result.store_timestamp + delay
            wctx.put_half(result.physical_offset, {
                "state": PREPARED, "group": pgroup, "topic": real_topic, "queue_id": real_qid, "uniq": uniq,
                "queue_offset": result.queue_offset, "store_ts": result.store_timestamp, "checks": 0,
                "due": due, "client_id": client_id, "size": result.size, "tags_code": request.tags_code,
                "keys": props.get(P.KEYS)})
            wctx.add_due(due, result.physical_offset)
            return result, due

        def finish(value) -> tuple:
            result, due = value
            self.sender_channels[result.physical_offset] = channel
            if self.ctx.metrics is not None:
                self.ctx.metrics.half_prepared(real_topic)
            for callback in self.on_prepared:
                callback(due)
            return result, uniq

        future, pick = self.store.submit_checked(write)
        return future, lambda outcomes: finish(pick(outcomes))

    async def decide(self, half_offset: int, group: str, queue_offset: int, decision: int,
                     from_check: bool) -> DecisionOutcome:
        """Apply COMMIT or ROLLBACK (reference §5.3, with a first-decision-wins guard).

        Raises:
            BrokerError: SYSTEM_ERROR when the half is unknown or the group/offsets do not match;
                ILLEGAL_OPERATION when the decision conflicts with an earlier one.
        """
        future, finish = self.submit_decide(half_offset, group, queue_offset, decision, from_check)
        return finish(await future)

    def submit_decide(self, half_offset: int, group: str, queue_offset: int, decision: int,
                      from_check: bool) -> tuple:
        """As decide, without a coroutine: (store future, finish) where finish(value) gives the outcome."""
        wanted = _DECISION_STATE[decision]

        def write(wctx):
            state = wctx.get_half(half_offset)
            if state is None:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
            if state["group"] != group:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
            if state["queue_offset"] != queue_offset:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
            current = state["state"]
            if current == wanted:
                return DecisionOutcome(state, False, state.get("committed_offset"))
            if current == COMMITTED or wanted == COMMITTED and current != PREPARED:
                raise BrokerError(ResponseCode.ILLEGAL_OPERATION,
                                  f"the transaction is already {current}; {wanted} refused")
            committed_offset = None
            if wanted == COMMITTED:
                result = wctx.put_message(committed_request(wctx.read_record(half_offset), half_offset, state))
                committed_offset = result.physical_offset
                state["committed_offset"] = committed_offset
            if current == PREPARED:
                wctx.remove_due(state["due"], half_offset)
            state["state"] = wanted
            state["decided_ts"] = wctx.now_ms
            state["decided_by"] = "check" if from_check else "producer"
            wctx.put_half(half_offset, state)
            return DecisionOutcome(state, True, committed_offset)

        def finish(outcome: DecisionOutcome) -> DecisionOutcome:
            if outcome.applied:
                self.sender_channels.pop(half_offset, None)
            return outcome

        future, pick = self.store.submit_checked(write)
        return future, lambda outcomes: finish(pick(outcomes))

    async def discard(self, half_offset: int, max_checks: int) -> dict | None:
        """Move a half that used up its checks to TRANS_CHECK_MAX_TIME_TOPIC, where it stays readable.

        Returns the new state, or None when the half was decided (or resumed) meanwhile.
        """
        store_host = self.ctx.store_host

        def write(wctx):
            state = wctx.get_half(half_offset)
            if state is None or state["state"] != PREPARED or state["checks"] < max_checks:
                return None
            rec = decode_record(wctx.read_record(half_offset))
            rec.topic, rec.queue_id, rec.store_host = CHECK_MAX_TIME_TOPIC, 0, store_host
            rec.properties[P.TRANSACTION_CHECK_TIMES] = str(state["checks"])
            result = wctx.put_message(PutRequest(CHECK_MAX_TIME_TOPIC, 0, encode_record(rec),
                                                 tags_hash(rec.properties.get(P.TAGS))))
            wctx.remove_due(state["due"], half_offset)
            state.update(state=DISCARDED, decided_ts=wctx.now_ms, decided_by="discard",
                         discarded_offset=result.physical_offset)
            wctx.put_half(half_offset, state)
            return state

        state = await self.store.write(write)
        if state is not None:
            self.sender_channels.pop(half_offset, None)
        return state

    async def resume(self, half_offset: int) -> int:
        """RESUME_CHECK_HALF_MESSAGE: a discarded (or pending) half gets a fresh set of checks, due now.

        Raises:
            BrokerError: SYSTEM_ERROR when the half is unknown or already committed/rolled back.
        """
        def write(wctx):
            state = wctx.get_half(half_offset)
            if state is None:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, f"no half message at offset {half_offset}")
            if state["state"] not in (PREPARED, DISCARDED):
                raise BrokerError(ResponseCode.SYSTEM_ERROR, f"the transaction is already {state['state']}")
            if state["state"] == PREPARED:
                wctx.remove_due(state["due"], half_offset)
            state.update(state=PREPARED, checks=0, due=wctx.now_ms)
            state.pop("decided_ts", None)
            state.pop("decided_by", None)
            wctx.put_half(half_offset, state)
            wctx.add_due(state["due"], half_offset)
            return state["due"]

        due = await self.store.write(write)
        for callback in self.on_prepared:
            callback(due)
        return due


def committed_request(raw: bytes, half_offset: int, state: dict) -> PutRequest:
    """The real-topic record of a committed half (reference §5.3 step 6: the full property set is kept), made
    from the stored half by rewriting topic, queue, transaction type and preparedTransactionOffset."""
    record = rewrite_record(raw, state["topic"], state["queue_id"], record_properties_text(raw))
    mark_committed(record, half_offset)
    return PutRequest(state["topic"], state["queue_id"], record, state.get("tags_code", 0), True, state.get("keys"))
