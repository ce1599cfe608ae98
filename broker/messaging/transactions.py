"""Ending a transaction: a producer's COMMIT, ROLLBACK or UNKNOWN for one half, whatever door it came in by.

Each door decodes its wire form into an ``EndRequest`` (a remoting END_TRANSACTION's header; a gRPC
EndTransaction's topic, transaction id and resolution) and calls ``TransactionService.end`` with the caller's
identity, which checks the request, authorises the caller against the half's topic and hands back the store's
completion of the decision (None for UNKNOWN: the half stays pending); the door only turns it into its answer.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from halfmq.protocol.codes import TransactionResolution

from ..errors import BrokerError, Failure
from ..names import check_group

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EndRequest:
    """A decision on one half, as a door decoded it."""
    #: the producer group the half is filed under (matched against the half's by the store)
    group: str
    #: the half's commit-log offset; None when the request named no half this broker gave (``transaction_id``)
    half_offset: int | None
    #: the half's offset in the transaction state table (matched against the half's too)
    queue_offset: int
    #: COMMIT, ROLLBACK or UNKNOWN (the half stays pending); None for a value the door's wire gives no meaning
    decision: TransactionResolution | None
    #: the decision answers the broker's check of the half
    from_check: bool = False
    #: the topic the caller named (the group is then the broker's, derived from it, and the caller is authorised
    #: for this topic); None: the caller named the group, and is authorised for the half's own topic
    topic: str | None = None
    #: the transaction id as the request carried it, for the refusal of one naming no half (``half_offset`` None)
    transaction_id: str = ""
    #: with ``decision`` None, what the request's wire form got wrong (the refusal's remark; "": the default one)
    malformed: str = ""


#: the caller's identity as the service needs it: raises BrokerError FORBIDDEN (or the door's equivalent) when the
#: caller may not publish to the topic named (deciding a half writes into its topic)
Authorize = Callable[[str], None]


class TransactionService:
    def __init__(self, ctx):
        self.ctx = ctx

    def end(self, request: EndRequest, authorize: Authorize, writes=None):
        """Check and authorise a decision, then hand it to the transaction state machine.

        Args:
            authorize: the caller's identity (``Authorize``), asked only with ACL on.
            writes: what submits the store write (grpc/group_commit.py ``GroupCommit``), None to submit it at once.
        Returns:
            None for UNKNOWN (nothing is written); else a future of the decision (a store Completion, or what
            ``writes`` returns), failing with the store's refusal (unknown half, wrong group or offset, conflict).
        Raises:
            BrokerError: ILLEGAL_GROUP (the group named), FORBIDDEN, UNKNOWN_TRANSACTION (a transaction id this broker
                did not give), BAD_REQUEST (no decision).
        """
        ctx = self.ctx
        if request.topic is None:  # the group is matched against the half's and labels the decision metrics
            check_group(request.group, "producerGroup")
        if ctx.acl.enabled:  # reading the half's state is a cost every decision would pay otherwise
            topic = request.topic
            if topic is None and request.half_offset is not None:
                half = ctx.store.get_half(request.half_offset)
                topic = None if half is None else half.topic  # (an unknown half is refused by decide)
            if topic is not None:
                authorize(topic)
        if request.half_offset is None:
            broker = ctx.config.brokerName
            raise BrokerError(Failure.UNKNOWN_TRANSACTION, f"{request.transaction_id[:100]!r} is not a transaction "
                                                           f"id this broker ({broker}) gave")
        decision = request.decision
        if decision is None:
            raise BrokerError(Failure.BAD_REQUEST, request.malformed or "the resolution must be COMMIT or ROLLBACK")
        if decision is TransactionResolution.UNKNOWN:
            # The half stays pending. The reference never answers UNKNOWN; the door answers all the same, so a
            # client that waits for the reply is not left hanging until its timeout.
            log.debug("UNKNOW for half %d (check=%s)", request.half_offset, request.from_check)
            return None
        decide = ctx.transactions.decide
        if writes is None:  # (the usual remoting decision: no closure)
            return decide(request.half_offset, request.group, request.queue_offset, decision, request.from_check)
        return writes.store(lambda: decide(request.half_offset, request.group, request.queue_offset, decision,
                                           request.from_check))
