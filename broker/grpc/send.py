"""SendMessage, EndTransaction and RecallMessage: through the remoting send path and TransactionStates.

A message is stored by the send processor's ``submit_message`` (delay levels, timer messages, the one write
path) and a half by ``ctx.transactions.prepare``, as a remoting send is; a FIFO message's group picks its queue
(``fifo_queue``), so a group's messages keep their order in one queue. Sends, halves and decisions of concurrent
calls go through one GroupCommit, so they share write groups.
"""
from __future__ import annotations

import random
import zlib

from halfmq.protocol import properties as P
from halfmq.store import HalfMismatchError, HalfNotFoundError

from ..errors import BrokerError
from ..names import check_message
from ..services.transaction import COMMIT, ROLLBACK
from ..topics import SEND_FORBIDDEN, check_message_type
from .auth import PUB, TOPIC, Caller, require
from .convert import peer_host, to_record
from .group_commit import GroupCommit
from .route import checked_topic
from .schema import Code, TransactionResolution, TransactionSource, pb
from .sessions import parse_transaction_id, transaction_group, transaction_id
from .status import GrpcError, ok, status_for


def fifo_queue(message_group: str, queues: int) -> int:
    """A message group's queue: a stable hash (Python's str hash changes per process)."""
    return zlib.crc32(message_group.encode()) % queues


class SendService:
    def __init__(self, endpoint, send_processor):
        self.endpoint = endpoint
        self.ctx = endpoint.ctx
        self.sessions = endpoint.sessions
        self.send_processor = send_processor
        self.writes = GroupCommit()

    async def send_message(self, request, caller: Caller, context):
        if not request.messages:
            raise GrpcError(Code["BAD_REQUEST"], "the request holds no message")
        most = self.ctx.config.maxBatchMessageCount
        if len(request.messages) > most:
            raise GrpcError(Code["BAD_REQUEST"], f"the request holds {len(request.messages)} messages, more than "
                                                 f"maxBatchMessageCount {most}")
        session = self.sessions.get(caller.client_id)
        born_host = peer_host(context.peer())
        response = pb.SendMessageResponse()
        failures = 0
        for msg in request.messages:
            entry = response.entries.add()
            try:
                await self._send_one(msg, caller, session, born_host, entry)
                entry.status.CopyFrom(ok())
            except Exception as exc:
                entry.status.CopyFrom(status_for(exc))
                failures += 1
        if failures == 0:
            response.status.CopyFrom(ok())
        elif failures == len(request.messages):
            response.status.CopyFrom(response.entries[0].status)
        else:
            response.status.CopyFrom(pb.Status(code=Code["MULTIPLE_RESULTS"], message="some messages failed"))
        return response

    async def _send_one(self, msg, caller: Caller, session, born_host: str, entry) -> None:
        ctx = self.ctx
        topic = checked_topic(msg.topic)
        require(caller, (TOPIC, topic, PUB))
        if topic in SEND_FORBIDDEN:
            raise GrpcError(Code["FORBIDDEN"], f"Sending message to topic[{topic}] is forbidden.")
        if not msg.body:
            raise GrpcError(Code["MESSAGE_BODY_EMPTY"], "the message body is empty")
        if len(msg.body) > ctx.config.maxMessageSize:
            raise GrpcError(Code["MESSAGE_BODY_TOO_LARGE"], f"the message body size {len(msg.body)} is larger "
                                                            f"than maxMessageSize {ctx.config.maxMessageSize}")
        rec = to_record(msg, born_host, ctx.store_host)
        if len(rec.body) > ctx.config.maxMessageSize:  # a gzip body is bounded once decompressed too
            raise GrpcError(Code["MESSAGE_BODY_TOO_LARGE"], f"the decompressed body size {len(rec.body)} is larger "
                                                            f"than maxMessageSize {ctx.config.maxMessageSize}")
        props = rec.properties
        transactional = props.get(P.TRAN_MSG) == "true"
        group = transaction_group(topic) if transactional else None
        check_message(topic, props, group)
        config = await self.endpoint.route.topic_config(topic)
        try:
            check_message_type(config, props)
        except BrokerError as exc:
            raise GrpcError(Code["MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"], exc.remark) from None
        if not config.writable:
            raise GrpcError(Code["FORBIDDEN"], f"the topic[{topic}] sending message is forbidden")
        message_group = props.get(P.SHARDING_KEY)
        queues = config.write_queue_nums
        rec.queue_id = fifo_queue(message_group, queues) if message_group else random.randrange(queues)
        props[P.CLUSTER] = ctx.config.brokerClusterName
        size = len(rec.body)
        if transactional:
            if ctx.config.rejectTransactionMessage:
                raise GrpcError(Code["FORBIDDEN"], "the broker rejects transaction messages "
                                                   "(rejectTransactionMessage=true)")
            self.sessions.publishes(session, (topic,))
            result, state = await self.writes.store(lambda: ctx.transactions.prepare(rec, group, session))
            entry.transaction_id = transaction_id(result.physical_offset, state.queue_offset)
        else:
            try:
                result = await self.writes.store(lambda: self.send_processor.submit_message(rec))
            except BrokerError as exc:
                if P.TIMER_DELIVER_MS in props:  # beyond timerMaxDelaySec, or not a time: the reference's code
                    raise GrpcError(Code["ILLEGAL_DELIVERY_TIME"], exc.remark) from None
                raise
            if ctx.metrics is not None:
                ctx.metrics.message_in(topic, size)
        entry.message_id = props.get(P.UNIQ_KEY, "")
        entry.offset = result.queue_offset

    async def end_transaction(self, request, caller: Caller):
        topic = checked_topic(request.topic)
        require(caller, (TOPIC, topic, PUB))
        place = parse_transaction_id(request.transaction_id)
        if place is None:
            raise GrpcError(Code["INVALID_TRANSACTION_ID"], f"{request.transaction_id!r} is not a transaction id "
                                                            f"this broker gave")
        resolution = request.resolution
        if resolution == TransactionResolution["COMMIT"]:
            decision = COMMIT
        elif resolution == TransactionResolution["ROLLBACK"]:
            decision = ROLLBACK
        else:
            raise GrpcError(Code["BAD_REQUEST"], "the resolution must be COMMIT or ROLLBACK")
        self.sessions.get(caller.client_id)
        half_offset, queue_offset = place
        from_check = request.source == TransactionSource["SOURCE_SERVER_CHECK"]
        try:
            await self.writes.store(lambda: self.ctx.transactions.decide(
                half_offset, transaction_group(topic), queue_offset, decision, from_check))
        except (HalfNotFoundError, HalfMismatchError) as exc:
            raise GrpcError(Code["INVALID_TRANSACTION_ID"], str(exc)) from None
        return pb.EndTransactionResponse(status=ok())

    async def recall_message(self, request, caller: Caller):
        raise GrpcError(Code["UNSUPPORTED"], "recalling a delay message is not supported: halfmq gives no recall "
                                             "handles")
