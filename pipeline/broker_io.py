"""The broker calls the Spark tasks and driver make, as plain functions (each runs its own event loop: Spark's
Python workers are separate processes, so nothing here is opened before it is needed)."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple

import pyarrow as pa

from halfmq.client import MessageQueue, PullConsumer, PullStatus
from halfmq.client.admin import Admin
from halfmq.client.admin_messages import is_user_topic
from halfmq.client.consumer import parse_expression
from halfmq.client.errors import TopicNotExistError

from .records import records_to_batch

log = logging.getLogger(__name__)

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
#: How long a task waits for one pull's answer by default: Kafka's default poll timeout (spark.network.timeout).
DEFAULT_PULL_TIMEOUT_S = 120.0


class QueueBounds(NamedTuple):
    """A queue's offsets as its broker has them now."""

    low: int
    high: int


def queue_key(broker_name: str, queue_id: int) -> str:
    """How the source names a queue in its offsets and options: "brokerName:queueId" (queue ids repeat on every
    broker of a topic)."""
    return f"{broker_name}:{queue_id}"


def parse_queue_key(key: str) -> tuple[str | None, int]:
    """(broker name, queue id) of a queue key; the broker is None for a bare queue id, the form of offsets written
    before the source read several brokers. Raises ValueError if it is neither."""
    broker, sep, queue_id = str(key).rpartition(":")
    if (sep and not broker) or not queue_id.strip().isdecimal():
        raise ValueError(f"{key!r} is not a queue: brokerName:queueId or a queue id")
    return (broker if sep else None), int(queue_id)


def queue_label(topic: str, key: str) -> str:
    """A queue as messages name it: topic/brokerName:queueId."""
    return f"{topic}/{key}"


class DataLossError(RuntimeError):
    """Messages a read needed are gone (deleted below its start, a deleted topic, offsets gone backwards); the
    message names them and failOnDataLoss=false, which skips them instead."""


def queue_bounds(namesrv: str, topics: list[str],
                 select: Callable[[str, list[str]], Iterable[str]] | None = None) -> dict[str, dict[str, QueueBounds]]:
    """{topic: {queue key: (min offset, max offset)}} for the readable queues of every broker the routes list, as
    their brokers have them now; with ``select``, only the queue keys it picks from each topic's (it sees them
    before any offset is asked for). A topic the name server does not know has no entry."""
    async def run():
        async with PullConsumer(READER_GROUP, namesrv) as consumer:
            out: dict[str, dict[str, QueueBounds]] = {}
            for topic in topics:
                try:
                    queues = {queue_key(q.broker_name, q.queue_id): q
                              for q in await consumer.fetch_subscribe_queues(topic)}
                except TopicNotExistError:
                    continue
                keys = list(queues) if select is None else select(topic, list(queues))
                out[topic] = {key: QueueBounds(await consumer.min_offset(queues[key]),
                                               await consumer.max_offset(queues[key])) for key in keys}
            return out
    return asyncio.run(run())


def user_topics(namesrv: str) -> list[str]:
    """The topics the name server knows, without RocketMQ's system topics and the groups' retry and DLQ topics."""
    async def run():
        async with Admin(namesrv) as admin:
            return sorted(t for t in await admin.topic_list() if is_user_topic(t))
    return asyncio.run(run())


def offsets_for_times(namesrv: str, times: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """{topic: {queue key: the first offset stored at or after the time}} (the queue's max offset if none is)."""
    async def run():
        async with PullConsumer(READER_GROUP, namesrv) as consumer:
            return {topic: {key: await consumer.search_offset(MessageQueue(topic, *parse_queue_key(key)), ts)
                            for key, ts in queues.items()} for topic, queues in times.items()}
    return asyncio.run(run())


@dataclass(frozen=True)
class RangeRead:
    """How a task reads its range: tag expression, whether lost messages fail it, how long one pull may take."""

    tags: str = "*"
    fail_on_data_loss: bool = True
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S


def _lost(queue: MessageQueue, start: int, end: int, why: str, read: RangeRead) -> None:
    text = (f"messages {queue_label(queue.topic, queue_key(queue.broker_name, queue.queue_id))} offsets "
            f"{start}..{end - 1} are gone ({why}): they cannot be read")
    if read.fail_on_data_loss:
        raise DataLossError(f"{text}; set failOnDataLoss=false to skip lost messages")
    log.warning("%s; skipped (failOnDataLoss=false)", text)


async def _read_chunk(consumer: PullConsumer, queue: MessageQueue, start: int, end: int, read: RangeRead
                      ) -> list[bytes]:
    """The pull bodies covering start <= offset < end (stored records; a filtered pull may run past end). Messages
    the queue no longer holds are data loss: an error, or skipped under failOnDataLoss=false."""
    bodies = []
    offset = start
    while offset < end:
        try:
            status, next_offset, low, high, body = await consumer.pull_raw(
                queue, offset, min(PULL_BATCH, end - offset), read.tags, timeout=read.pull_timeout_s)
        except TopicNotExistError:
            _lost(queue, offset, end, "the topic was deleted", read)
            break
        if status is PullStatus.OFFSET_ILLEGAL and offset < next_offset:
            _lost(queue, offset, min(next_offset, end), f"deleted: the queue now starts at {low}", read)
        elif status in (PullStatus.OFFSET_ILLEGAL, PullStatus.NO_NEW_MSG):
            _lost(queue, offset, end, f"the queue now ends at {high}: its offsets went backwards", read)
            break
        bodies.append(body)
        if next_offset <= offset:
            break
        offset = next_offset
    return bodies


class _Handover:
    """Decoded batches passed from the pulling thread to the task's thread, at most CHUNKS_AHEAD waiting."""

    END = object()

    def __init__(self):
        self.items: queue.Queue = queue.Queue(maxsize=CHUNKS_AHEAD)
        self.stopped = threading.Event()

    def put(self, item) -> bool:
        """Blocks while the reader is behind; False once it has stopped reading (nothing more is wanted)."""
        if self.stopped.is_set():
            return False
        self.items.put(item)
        return not self.stopped.is_set()

    def stop(self) -> None:
        """The reader is done: a put blocked on a full queue returns (emptied here), later puts are refused."""
        self.stopped.set()
        while True:
            try:
                self.items.get_nowait()
            except queue.Empty:
                return


def read_range(namesrv: str, topic: str, broker_name: str, queue_id: int, start: int, end: int,
               read: RangeRead = RangeRead()) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of the messages of one queue with start <= offset < end, in offset order.

    A thread of its own pulls and decodes ahead while Spark consumes the batches already handed over: pulling
    only while Spark waits for the next batch would leave the broker idle during Spark's share of the work."""
    handover = _Handover()
    puller = threading.Thread(target=_pull_range, name=f"halfmq-pull-{topic}-{queue_id}", daemon=True,
                              args=(handover, namesrv, MessageQueue(topic, broker_name, queue_id), start, end, read))
    puller.start()
    try:
        while (item := handover.items.get()) is not _Handover.END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:  # also when Spark stops reading early (e.g. for a limit)
        handover.stop()
        puller.join()


def _pull_range(handover: _Handover, namesrv: str, queue: MessageQueue, start: int, end: int, read: RangeRead
                ) -> None:
    try:
        asyncio.run(_pull_chunks(handover, namesrv, queue, start, end, read))
        handover.put(_Handover.END)
    except BaseException as exc:  # noqa: BLE001 - raised again in the task's thread, where Spark reports it
        handover.put(exc)


async def _pull_chunks(handover: _Handover, namesrv: str, queue: MessageQueue, start: int, end: int,
                       read: RangeRead) -> None:
    wanted = parse_expression(read.tags)
    span = CHUNK if wanted is None else FILTERED_CHUNK
    chunks = iter(range(start, end, span))
    pending: deque[tuple[int, asyncio.Task]] = deque()
    async with PullConsumer(READER_GROUP, namesrv) as consumer:
        def read_ahead() -> None:
            for lo in islice(chunks, 1 + CHUNKS_AHEAD - len(pending)):
                hi = min(lo + span, end)
                pending.append((hi, asyncio.create_task(_read_chunk(consumer, queue, lo, hi, read))))

        try:
            read_ahead()
            while pending:
                chunk_end, task = pending.popleft()
                bodies = await task
                read_ahead()
                batch = records_to_batch(b"".join(bodies), chunk_end, wanted, queue.broker_name)
                if batch is not None and not handover.put(batch):
                    return
        finally:  # the reader stopped early or a pull failed: the chunks still being pulled are not wanted
            for _end, task in pending:
                task.cancel()
            await asyncio.gather(*(task for _end, task in pending), return_exceptions=True)


def transaction_records(namesrv: str, page_size: int | None = None) -> Iterator[dict]:
    """Every transaction record of every broker the name servers know (HALFMQ_GET_TRANSACTION_RECORDS), each with
    its broker's ``brokerName``, read a page at a time (``page_size`` rows a request; default and most: the
    broker's page), so no more than a page is held here. A broker that does not answer fails the read."""
    loop = asyncio.new_event_loop()
    admin = Admin(namesrv)
    try:
        for broker in loop.run_until_complete(admin.brokers()):
            pages = admin.transaction_record_pages(page_size, broker.addr)
            try:
                while True:
                    try:
                        page = loop.run_until_complete(anext(pages))
                    except StopAsyncIteration:
                        break
                    for row in page:
                        yield {**row, "brokerName": broker.name}
            finally:  # also when the caller stops early
                loop.run_until_complete(pages.aclose())
    finally:
        loop.run_until_complete(admin.close())
        loop.close()
