"""END_TRANSACTION (37) and RESUME_CHECK_HALF_MESSAGE (323) — reference §3.2, §5.3, §5.5."""
from __future__ import annotations

import logging

from halfmq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode, ResponseCode, TransactionResolution
from halfmq.protocol.command import RemotingCommand
from halfmq.protocol.headers import EndTransactionRequestHeader, ResumeCheckHalfMessageRequestHeader
from halfmq.protocol.message import decode_offset_msg_id

from ..context import BrokerContext
from ..dispatch import Deferred
from ..errors import BrokerError
from ..messaging.transactions import EndRequest, TransactionService
from .base import Processor, handles

log = logging.getLogger(__name__)
#: commitOrRollback → the resolution (a dict lookup: the enum's constructor costs two Python calls per decision)
_RESOLUTIONS = {int(resolution): resolution for resolution in TransactionResolution}
#: What a oneway decision's completion answers: the dispatcher counts it (its code) and sends nothing.
_UNHEARD = RemotingCommand(ResponseCode.SUCCESS, flag=FLAG_RESPONSE)


def _unheard(_outcome) -> RemotingCommand:
    return _UNHEARD


class EndTransactionProcessor(Processor):
    def __init__(self, ctx: BrokerContext, transactions: TransactionService):
        self.ctx = ctx
        self.transactions = transactions

    @handles(RequestCode.END_TRANSACTION)
    def end_transaction(self, channel, cmd: RemotingCommand):
        h = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
        decision = _RESOLUTIONS.get(h.commitOrRollback)
        request = EndRequest(h.producerGroup, h.commitLogOffset, h.tranStateTableOffset, decision,
                             bool(h.fromTransactionCheck))
        if decision is None:
            request.malformed = f"commitOrRollback {h.commitOrRollback} is not 0, 8 or 12"
        try:
            completion = self.transactions.end(request, lambda topic: self.ctx.acl.check_decision(cmd, topic))
        except BrokerError as exc:
            if cmd.is_oneway:  # stock producers send their decision oneway: leave a trace of the refusal
                log.info("oneway END_TRANSACTION from %s refused: %s", channel.remote, exc.remark)
            raise
        if completion is None:  # UNKNOWN: the half stays pending
            return cmd.response(ResponseCode.SUCCESS, "the transaction stays pending")
        if cmd.flag & FLAG_ONEWAY:  # the usual decision: nobody hears the answer, none is built
            return Deferred(completion, _unheard)
        return Deferred(completion, lambda _outcome: cmd.response(ResponseCode.SUCCESS))

    @handles(RequestCode.RESUME_CHECK_HALF_MESSAGE)
    async def resume(self, channel, cmd: RemotingCommand) -> RemotingCommand:
        h = ResumeCheckHalfMessageRequestHeader.from_ext(cmd.ext_fields)
        _host, offset = decode_offset_msg_id(h.msgId)
        await self.ctx.transactions.resume(offset)
        return cmd.response(ResponseCode.SUCCESS)
