"""The broker calls the Spark tasks and driver make, as plain functions (each runs its own event loop: Spark's
Python workers are separate processes, so nothing here is opened before it is needed)."""
from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import NamedTuple

import pyarrow as pa

from halfmq.client import MessageQueue, PullConsumer, PullStatus
from halfmq.client.admin import Admin
from halfmq.client.consumer import parse_expression

from .records import records_to_batch

READER_GROUP = "halfmq-spark-reader"
#: Messages per pull (the broker answers at most maxTransferCountOnMessageInMemory, 1024 by default).
PULL_BATCH = 1000
#: Offsets per chunk, the unit read ahead and decoded into one Arrow batch: fewer, larger batches cost less per
#: message, in the decoder and in Spark.
CHUNK = 4 * PULL_BATCH
#: A pull under a tag filter may scan (and read matches) up to 20 × its count past its start; matches past the
#: chunk's end are dropped, so filtered chunks are long enough to keep that waste a small share.
FILTERED_CHUNK = 16 * PULL_BATCH
#: Chunks being pulled while the one before them is handed to Spark, so the broker is already serving the next
#: pulls while this task decodes and Spark consumes.
CHUNKS_AHEAD = 2


class QueueBounds(NamedTuple):
    """A queue's offsets as the broker has them now, and the broker that holds it (its brokerName)."""

    low: int
    high: int
    broker_name: str


def queue_bounds(namesrv: str, topics: list[str]) -> dict[str, dict[int, QueueBounds]]:
    """{topic: {queue id: (min offset, max offset, broker name)}} as the routes and the broker have them now."""
    async def run():
        async with PullConsumer(READER_GROUP, namesrv) as consumer:
            out: dict[str, dict[int, QueueBounds]] = {}
            for topic in topics:
                out[topic] = {}
                for queue in await consumer.fetch_subscribe_queues(topic):
                    out[topic][queue.queue_id] = QueueBounds(await consumer.min_offset(queue),
                                                             await consumer.max_offset(queue), queue.broker_name)
            return out
    return asyncio.run(run())


async def _read_chunk(consumer: PullConsumer, queue: MessageQueue, start: int, end: int, expression: str,
                      wanted: set[str] | None) -> pa.RecordBatch | None:
    """The messages with start <= offset < end, as one batch (None if there are none)."""
    bodies = []
    offset = start
    while offset < end:
        status, next_offset, _low, _high, body = await consumer.pull_raw(
            queue, offset, min(PULL_BATCH, end - offset), expression)
        bodies.append(body)
        if status is PullStatus.OFFSET_ILLEGAL or next_offset <= offset:
            break
        offset = next_offset
    return records_to_batch(b"".join(bodies), end, wanted)


def read_range(namesrv: str, topic: str, broker_name: str, queue_id: int, start: int, end: int,
               tags: str = "*") -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the messages of one queue with start <= offset < end, in offset order."""
    wanted = parse_expression(tags)
    span = CHUNK if wanted is None else FILTERED_CHUNK
    queue = MessageQueue(topic, broker_name, queue_id)
    chunks = iter(range(start, end, span))
    loop = asyncio.new_event_loop()
    consumer = PullConsumer(READER_GROUP, namesrv)
    pending: deque[asyncio.Task] = deque()

    def read_ahead() -> None:
        for lo in islice(chunks, 1 + CHUNKS_AHEAD - len(pending)):
            pending.append(loop.create_task(_read_chunk(consumer, queue, lo, min(lo + span, end), tags, wanted)))

    try:
        loop.run_until_complete(consumer.start())
        read_ahead()
        while pending:
            batch = loop.run_until_complete(pending.popleft())
            read_ahead()
            if batch is not None:
                yield batch
    finally:  # also when Spark stops reading early
        loop.run_until_complete(_close(consumer, pending))
        loop.close()


async def _close(consumer: PullConsumer, tasks) -> None:
    """Cancels the chunks still being read (Spark may stop early, e.g. for a limit) and closes the consumer."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await consumer.close()


def transaction_records(namesrv: str, page_size: int | None = None) -> Iterator[dict]:
    """Every transaction record the broker keeps (HALFMQ_GET_TRANSACTION_RECORDS), read a page at a time
    (``page_size`` rows a request; default and most: the broker's page), so no more than a page is held here."""
    loop = asyncio.new_event_loop()
    admin = Admin(namesrv)
    pages = admin.transaction_record_pages(page_size)
    try:
        while True:
            try:
                page = loop.run_until_complete(anext(pages))
            except StopAsyncIteration:
                return
            yield from page
    finally:  # also when the caller stops early
        loop.run_until_complete(pages.aclose())
        loop.run_until_complete(admin.close())
        loop.close()


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
