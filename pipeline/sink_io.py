"""The broker calls the Spark sink's tasks and driver make, as plain functions (each runs its own event loop)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from halfmq.client import LocalTransactionState, Message, MessageQueue, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.errors import BrokerError
from halfmq.protocol.codes import RequestCode, ResponseCode
from halfmq.protocol.headers import QueryMessageRequestHeader, UpdateConsumerOffsetRequestHeader

from .broker_io import READER_GROUP


@dataclass
class HalfRecord:
    """What a sink task hands the driver for each half message it stored."""

    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str


#: Sink halves are not checked before this many seconds (CHECK_IMMUNITY_TIME_IN_SECONDS): no job runs longer, so
#: a half still undecided then belongs to a job that died between a task's write and the job's commit or abort.
SINK_IMMUNITY_SECONDS = 3600


class _NoLocalDecision:
    """Sink halves are decided by the job's commit or abort. A check-back (only after SINK_IMMUNITY_SECONDS)
    can only concern an orphan of a dead job: roll it back."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.ROLLBACK_MESSAGE


def send_halves(namesrv: str, group: str, messages: list[Message]) -> list[HalfRecord]:
    """Store messages as half messages (invisible until the job commits). On failure, roll back what was sent."""
    async def run():
        sent: list[HalfRecord] = []
        async with TransactionProducer(group, _NoLocalDecision(), namesrv) as producer:
            try:
                for msg in messages:
                    r = await producer.send_half(msg)
                    sent.append(HalfRecord(r.queue.topic, r.queue.broker_name, r.queue.queue_id, r.queue_offset,
                                           r.msg_id, r.offset_msg_id))
            except BaseException:
                await _end(producer, sent, LocalTransactionState.ROLLBACK_MESSAGE)
                raise
        return sent
    return asyncio.run(run())


async def _end(producer: TransactionProducer, halves: list[HalfRecord], state: LocalTransactionState) -> None:
    from halfmq.client.message import SendResult, SendStatus

    for h in halves:
        result = SendResult(SendStatus.SEND_OK, h.msg_id, h.offset_msg_id, MessageQueue(h.topic, h.broker_name,
                                                                                         h.queue_id),
                            h.queue_offset, h.msg_id)
        await producer.end_transaction(result, state)


def end_halves(namesrv: str, group: str, halves: list[HalfRecord], commit: bool) -> None:
    """Commit or roll back halves; returns once the broker has applied every decision."""
    async def run():
        async with TransactionProducer(group, _NoLocalDecision(), namesrv) as producer:
            state = LocalTransactionState.COMMIT_MESSAGE if commit else LocalTransactionState.ROLLBACK_MESSAGE
            await _end(producer, halves, state)
            # END_TRANSACTION is oneway; a two-way write on the same connections after it returns only once
            # the decisions before it are durable.
            for conn in producer.instance.pool.open_connections():
                if conn.addr != producer.instance.routes.namesrv[0]:
                    await conn.request(RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
                        consumerGroup=READER_GROUP, topic="%HALFMQ_SINK_BARRIER%", queueId=0,
                        commitOffset=0).to_ext())
    asyncio.run(run())


SINK_COMMITS_TOPIC = "HALFMQ_SINK_COMMITS"


def _batch_key(sink_id: str, batch_id: int) -> str:
    return f"{sink_id}:{batch_id}"


def batch_committed(namesrv: str, sink_id: str, batch_id: int) -> bool:
    """Whether a streaming sink already published this batch (its marker is in HALFMQ_SINK_COMMITS)."""
    async def run():
        admin = Admin(namesrv)
        try:
            await admin.call(await admin.broker_addr(), RequestCode.QUERY_MESSAGE, QueryMessageRequestHeader(
                topic=SINK_COMMITS_TOPIC, key=_batch_key(sink_id, batch_id), maxNum=1, beginTimestamp=0,
                endTimestamp=2 ** 62).to_ext())
            return True
        except BrokerError as exc:
            # Only the broker's word that there is no marker means "not committed"; any other failure must fail
            # the batch (Spark retries it) rather than publish it a second time.
            if exc.code == ResponseCode.QUERY_NOT_FOUND:
                return False
            raise
        finally:
            await admin.close()
    return asyncio.run(run())


def mark_batch_committed(namesrv: str, group: str, sink_id: str, batch_id: int) -> None:
    async def run():
        from halfmq.client import Producer

        async with Producer(group, namesrv) as producer:
            await producer.send(Message(SINK_COMMITS_TOPIC, str(batch_id).encode(), keys=_batch_key(sink_id, batch_id)))
    asyncio.run(run())
