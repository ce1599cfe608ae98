"""The broker calls the Spark tasks and driver make, as plain functions (each runs its own event loop: Spark's
Python workers are separate processes, so nothing here is opened before it is needed)."""
from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass

import pyarrow as pa

from halfmq.client import LocalTransactionState, Message, MessageQueue, PullConsumer, PullStatus, TransactionProducer
from halfmq.client.admin import Admin
from halfmq.client.consumer import parse_expression
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.properties import decode_properties

READER_GROUP = "halfmq-spark-reader"
PULL_BATCH = 1000
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("queue_id", pa.int32()), ("queue_offset", pa.int64()), ("msg_id", pa.string()),
    ("keys", pa.string()), ("tags", pa.string()), ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", pa.timestamp("us", tz="UTC")), ("store_timestamp", pa.timestamp("us", tz="UTC"))])


def queue_bounds(namesrv: str, topics: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """{topic: {queue id: (min offset, max offset)}} as the broker has them now."""
    async def run():
        async with PullConsumer(READER_GROUP, namesrv) as consumer:
            out: dict[str, dict[int, tuple[int, int]]] = {}
            for topic in topics:
                out[topic] = {}
                for queue in await consumer.fetch_subscribe_queues(topic):
                    out[topic][queue.queue_id] = (await consumer.min_offset(queue), await consumer.max_offset(queue))
            return out
    return asyncio.run(run())


_HEAD = struct.Struct(">iIiiiqqiq")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")


def records_to_batch(buf: bytes, end: int, tags: set[str] | None) -> tuple[pa.RecordBatch | None, int]:
    """Stored records (a pull body) straight into Arrow columns, skipping offsets >= ``end`` and tags not in
    ``tags``; returns the batch and the last queue offset seen. Decodes only what the schema needs."""
    cols: dict[str, list] = {name: [] for name in ARROW_SCHEMA.names}
    pos, size, last = 0, len(buf), -1
    view = memoryview(buf)
    while pos < size:
        (total, _magic, _crc, queue_id, _flag, queue_offset, physical, sys_flag, born) = _HEAD.unpack_from(buf, pos)
        last = queue_offset
        p = pos + 48 + (20 if sys_flag & 0x10 else 8)
        (stored,) = _I64.unpack_from(buf, p)
        host_len = 20 if sys_flag & 0x20 else 8
        store_host = buf[p + 8:p + 8 + host_len]
        p += 8 + host_len + 12
        (body_len,) = _I32.unpack_from(buf, p)
        body = bytes(view[p + 4:p + 4 + body_len])
        p += 4 + body_len
        if _magic == 0xDAA320AB:
            (topic_len,) = _U16.unpack_from(buf, p)
            p += 2
        else:
            topic_len = buf[p]
            p += 1
        topic = bytes(view[p:p + topic_len]).decode()
        p += topic_len
        (props_len,) = _U16.unpack_from(buf, p)
        props = decode_properties(bytes(view[p + 2:p + 2 + props_len]).decode())
        pos += total
        if queue_offset >= end or (tags is not None and props.get("TAGS") not in tags):
            continue
        cols["topic"].append(topic)
        cols["queue_id"].append(queue_id)
        cols["queue_offset"].append(queue_offset)
        cols["msg_id"].append(props.get("UNIQ_KEY") or (store_host + _I64.pack(physical)).hex().upper())
        cols["keys"].append(props.get("KEYS"))
        cols["tags"].append(props.get("TAGS"))
        cols["body"].append(body)
        cols["properties"].append(list(props.items()))
        cols["born_timestamp"].append(born * 1000)
        cols["store_timestamp"].append(stored * 1000)
    if not cols["topic"]:
        return None, last
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in ARROW_SCHEMA],
                                      schema=ARROW_SCHEMA), last


def read_range(namesrv: str, topic: str, broker_name: str, queue_id: int, start: int, end: int,
               tags: str = "*"):
    """Arrow record batches of the messages of one queue with start <= offset < end."""
    wanted = parse_expression(tags)

    async def run():
        batches = []
        async with PullConsumer(READER_GROUP, namesrv) as consumer:
            queue = MessageQueue(topic, broker_name, queue_id)
            offset = start
            while offset < end:
                status, next_offset, _low, _high, body = await consumer.pull_raw(
                    queue, offset, min(PULL_BATCH, end - offset), tags)
                if body:
                    batch, _last = records_to_batch(body, end, wanted)
                    if batch is not None:
                        batches.append(batch)
                if status is PullStatus.OFFSET_ILLEGAL or next_offset <= offset:
                    break
                offset = next_offset
        return batches
    return asyncio.run(run())


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
                    await conn.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
                        "consumerGroup": READER_GROUP, "topic": "%HALFMQ_SINK_BARRIER%", "queueId": "0",
                        "commitOffset": "0"})
    asyncio.run(run())


def transaction_records(namesrv: str, limit: int = 100_000) -> list[dict]:
    """Every transaction record the broker keeps (HALFMQ_GET_TRANSACTION_RECORDS)."""
    async def run():
        admin = Admin(namesrv)
        try:
            return (await admin.json_call(await admin.broker_addr(), RequestCode.HALFMQ_GET_TRANSACTION_RECORDS,
                                          {"limit": limit}))["records"]
        finally:
            await admin.close()
    return asyncio.run(run())


def parse_offsets(text: str | None, default: str) -> str | dict[str, dict[int, int]]:
    """"earliest", "latest" or JSON {"topic": {"queueId": offset}}."""
    value = (text or default).strip()
    if value in ("earliest", "latest"):
        return value
    try:
        raw = json.loads(value)
        return {topic: {int(q): int(o) for q, o in queues.items()} for topic, queues in raw.items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"offsets {value!r} are not earliest, latest or JSON like {{\"topic\": {{\"0\": 42}}}}") \
            from None


SINK_COMMITS_TOPIC = "HALFMQ_SINK_COMMITS"


def _batch_key(sink_id: str, batch_id: int) -> str:
    return f"{sink_id}:{batch_id}"


def batch_committed(namesrv: str, sink_id: str, batch_id: int) -> bool:
    """Whether a streaming sink already published this batch (its marker is in HALFMQ_SINK_COMMITS)."""
    async def run():
        admin = Admin(namesrv)
        try:
            await admin.call(await admin.broker_addr(), RequestCode.QUERY_MESSAGE, {
                "topic": SINK_COMMITS_TOPIC, "key": _batch_key(sink_id, batch_id), "maxNum": 1,
                "beginTimestamp": 0, "endTimestamp": 2 ** 62})
            return True
        except Exception:  # QUERY_NOT_FOUND (or no topic yet): not committed
            return False
        finally:
            await admin.close()
    return asyncio.run(run())


def mark_batch_committed(namesrv: str, group: str, sink_id: str, batch_id: int) -> None:
    async def run():
        from halfmq.client import Producer

        async with Producer(group, namesrv) as producer:
            await producer.send(Message(SINK_COMMITS_TOPIC, str(batch_id).encode(), keys=_batch_key(sink_id, batch_id)))
    asyncio.run(run())
