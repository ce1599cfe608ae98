"""SendMessage, EndTransaction and RecallMessage: the gRPC adapter of the messaging service.

A message is decoded (convert.py) into a ``SendRequest`` and checked and stored by ``ProducerService.send``
(broker/messaging/producer.py), the operation a remoting send calls; what is gRPC's own is the Message's form, the
group a half is filed under (``%GRPC%``topic: 5.x producers have no group, ``SessionSender``) and how a session is
known as a producer (the topics it publishes). A decision is decoded into an ``EndRequest`` (its transaction id
read back into the half's offsets) and checked, authorised and written by ``TransactionService.end``
(broker/messaging/transactions.py), the operation a remoting END_TRANSACTION calls. Sends, halves and decisions of
concurrent calls go through one GroupCommit, so they share write groups.
"""
from __future__ import annotations

from halfmq.protocol import properties as P
from halfmq.protocol.codes import TransactionResolution as Resolution

from ..errors import BrokerError, Failure
from ..messaging.producer import Sender, SendRequest
from ..messaging.transactions import EndRequest, TransactionService
from .auth import PUB, TOPIC, Caller, require
from .convert import peer_host, to_record
from .group_commit import GroupCommit
from .route import checked_topic
from .schema import Code, Encoding, TransactionResolution, TransactionSource, pb
from .sessions import parse_transaction_id, transaction_group, transaction_id
from .status import OK, GrpcError, ok, status_for


#: gRPC's TransactionResolution onto the broker's (UNKNOWN is not an answer EndTransaction may give)
_RESOLUTIONS = {TransactionResolution["COMMIT"]: Resolution.COMMIT,
                TransactionResolution["ROLLBACK"]: Resolution.ROLLBACK}


class SessionSender(Sender):
    """A gRPC producer: its halves of a topic are filed under ``transaction_group(topic)``, and a half makes its
    session a producer of that topic (checks go to it once its Telemetry stream is live)."""

    __slots__ = ("sessions",)

    def __init__(self, topic: str, session, sessions):
        super().__init__(transaction_group(topic), session)
        self.sessions = sessions

    def half_sent(self, producers, group: str, topic: str) -> None:
        self.sessions.publishes(self.channel, (topic,))


class SendService:
    def __init__(self, endpoint, producer, transactions: TransactionService):
        self.endpoint = endpoint
        self.ctx = endpoint.ctx
        self.sessions = endpoint.sessions
        self.producer = producer
        self.transactions = transactions
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
                entry.status.CopyFrom(OK)
            except Exception as exc:
                entry.status.CopyFrom(status_for(exc))
                failures += 1
        if failures == 0:
            response.status.CopyFrom(OK)
        elif failures == len(request.messages):
            response.status.CopyFrom(response.entries[0].status)
        else:
            response.status.CopyFrom(pb.Status(code=Code["MULTIPLE_RESULTS"], message="some messages failed"))
        return response

    async def _send_one(self, msg, caller: Caller, session, born_host: str, entry) -> None:
        producer = self.producer
        topic = checked_topic(msg.topic)
        require(caller, (TOPIC, topic, PUB))
        producer.check_topic(topic)  # before the body is decoded (a gzip body inflated): checked again by send
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
        request = SendRequest(rec, message_group=rec.properties.get(P.SHARDING_KEY))
        result = await producer.send(request, SessionSender(topic, session, self.sessions), self.writes)
        if request.half:
            result, state = result
            entry.transaction_id = transaction_id(self.ctx.config.brokerName, result.physical_offset,
                                                  state.queue_offset)
        entry.message_id = rec.properties.get(P.UNIQ_KEY, "")
        entry.offset = result.queue_offset

    async def end_transaction(self, request, caller: Caller):
        topic = checked_topic(request.topic)
        self.sessions.get(caller.client_id)
        place = parse_transaction_id(request.transaction_id, self.ctx.config.brokerName)
        half_offset, queue_offset = place if place is not None else (None, 0)
        decided = self.transactions.end(
            EndRequest(transaction_group(topic), half_offset, queue_offset, _RESOLUTIONS.get(request.resolution),
                       request.source == TransactionSource["SOURCE_SERVER_CHECK"], topic, request.transaction_id),
            lambda named: require(caller, (TOPIC, named, PUB)), self.writes)
        if decided is not None:  # (gRPC has no UNKNOWN: never None)
            await decided
        return pb.EndTransactionResponse(status=ok())

    async def recall_message(self, request, caller: Caller):
        raise GrpcError(Code["UNSUPPORTED"], "recalling a delay message is not supported: halfmq gives no recall "
                                             "handles")
