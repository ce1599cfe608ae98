"""SendMessage, EndTransaction and RecallMessage: the gRPC adapter of the messaging service.

A message is checked and stored by ProducerService (broker/messaging/producer.py), the rules a remoting send
obeys; what is gRPC's own is decoding the Message (convert.py), the group a half is filed under (``%GRPC%``topic:
5.x producers have no group) and a FIFO message's queue (``fifo_queue``: a group's messages keep their order in
one queue). Sends, halves and decisions of concurrent calls go through one GroupCommit, so they share write
groups.
"""
from __future__ import annotations

import zlib

from halfmq.protocol import properties as P
from halfmq.protocol.codes import TransactionResolution as Resolution

from ..errors import BrokerError, Failure
from .auth import PUB, TOPIC, Caller, require
from .convert import peer_host, to_record
from .group_commit import GroupCommit
from .route import checked_topic
from .schema import Code, Encoding, TransactionResolution, TransactionSource, pb
from .sessions import parse_transaction_id, transaction_group, transaction_id
from .status import GrpcError, ok, status_for


#: gRPC's TransactionResolution onto the broker's (UNKNOWN is not an answer EndTransaction may give)
_RESOLUTIONS = {TransactionResolution["COMMIT"]: Resolution.COMMIT,
                TransactionResolution["ROLLBACK"]: Resolution.ROLLBACK}


def fifo_queue(message_group: str, queues: int) -> int:
    """A message group's queue: a stable hash (Python's str hash changes per process)."""
    return zlib.crc32(message_group.encode()) % queues


class SendService:
    def __init__(self, endpoint, producer):
        self.endpoint = endpoint
        self.ctx = endpoint.ctx
        self.sessions = endpoint.sessions
        self.producer = producer
        self.writes = GroupCommit()
        self.refused = endpoint.refused

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
        producer = self.producer
        topic = checked_topic(msg.topic)
        require(caller, (TOPIC, topic, PUB))
        producer.check_topic(topic)
        producer.check_body(len(msg.body))
        gzipped = msg.system_properties.body_encoding == Encoding["GZIP"]
        if gzipped:
            await self.refused.paid(caller.remote)
        try:
            rec = to_record(msg, born_host, self.ctx.store_host, producer.max_body)
        except BrokerError as exc:
            if gzipped and exc.failure is Failure.BODY_TOO_LARGE:  # inflated to maxMessageSize for nothing
                await self.refused.pay(caller.remote, producer.max_body)
            raise
        producer.check_body(len(rec.body), "decompressed body")  # (a gzip body inflates no further than that)
        props = rec.properties
        transactional = props.get(P.TRAN_MSG) == "true"
        group = transaction_group(topic) if transactional else None
        config = await producer.topic_for_send(topic)
        producer.check_message(config, topic, props, group)
        message_group = props.get(P.SHARDING_KEY)
        queue_id = producer.writable_queue(config, -1)
        rec.queue_id = fifo_queue(message_group, config.write_queue_nums) if message_group else queue_id
        producer.stamp(rec)
        size = len(rec.body)
        if transactional:
            self.sessions.publishes(session, (topic,))
            result, state = await self.writes.store(lambda: producer.prepare_half(rec, group, session))
            entry.transaction_id = transaction_id(self.ctx.config.brokerName, result.physical_offset,
                                                  state.queue_offset)
        else:
            result = await self.writes.store(lambda: producer.submit_message(rec))
            producer.stored(topic, size)
        entry.message_id = props.get(P.UNIQ_KEY, "")
        entry.offset = result.queue_offset

    async def end_transaction(self, request, caller: Caller):
        topic = checked_topic(request.topic)
        require(caller, (TOPIC, topic, PUB))
        broker = self.ctx.config.brokerName
        place = parse_transaction_id(request.transaction_id, broker)
        if place is None:
            raise GrpcError(Code["INVALID_TRANSACTION_ID"], f"{request.transaction_id[:100]!r} is not a transaction "
                                                            f"id this broker ({broker}) gave")
        decision = _RESOLUTIONS.get(request.resolution)
        if decision is None:
            raise GrpcError(Code["BAD_REQUEST"], "the resolution must be COMMIT or ROLLBACK")
        self.sessions.get(caller.client_id)
        half_offset, queue_offset = place
        from_check = request.source == TransactionSource["SOURCE_SERVER_CHECK"]
        await self.writes.store(lambda: self.ctx.transactions.decide(
            half_offset, transaction_group(topic), queue_offset, decision, from_check))
        return pb.EndTransactionResponse(status=ok())

    async def recall_message(self, request, caller: Caller):
        raise GrpcError(Code["UNSUPPORTED"], "recalling a delay message is not supported: halfmq gives no recall "
                                             "handles")
