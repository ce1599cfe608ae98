"""The admin commands that send, read and position messages, built on Producer and PullConsumer (the same
requests an application makes, so access control treats them as it treats the application's): sendMessage,
consumeMessage, printMsg, queryMsgByOffset, queryMsgByUniqueKey, queryMsgById (either id form),
resetOffsetByTime and statsAll."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from halfmq.protocol.codes import ResponseCode
from halfmq.protocol.rules import DLQ_PREFIX, RETRY_PREFIX

from .admin import Admin
from .consumer import PullConsumer, PullStatus
from .errors import BrokerError, ClientError
from .message import Message, MessageExt, MessageQueue, SendResult
from .producer import Producer

#: mqadmin's groups for its own producer and reader (MixAll.TOOLS_CONSUMER_GROUP and the sendMessage command's).
TOOLS_PRODUCER_GROUP = "PID_SMSC"
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
#: A message id's born time and the store time of the message differ by the sender's clock and the send: messages
#: stored this long before or after the time in a unique key are searched.
UNIQUE_KEY_WINDOW_MS = 10 * 60 * 1000
#: The most messages a unique-key search reads, over all queues it searches.
UNIQUE_KEY_MAX_SCAN = 200_000
#: Messages per pull of a read (the broker's default most is 1024: maxTransferCountOnMessageInMemory).
PULL_BATCH = 256
#: RocketMQ's system topics (its TopicValidator's), which the name server lists with the others: the half topic's
#: records carry the unique keys of the transactions' messages, and none of these is what an operator counts.
SYSTEM_TOPICS = frozenset({"TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                           "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX", "SELF_TEST_TOPIC",
                           "OFFSET_MOVED_EVENT"})


@dataclass(frozen=True)
class Range:
    """Which messages of a topic a read covers."""

    broker_name: str | None = None
    queue_id: int | None = None
    offset: int | None = None          #: first offset (instead of begin_ms)
    begin_ms: int | None = None        #: first message stored at or after
    end_ms: int | None = None          #: last message stored before
    expression: str = "*"


class MessageTools:
    """Producer and reader of the admin tool, opened on first use, closed with ``close``."""

    def __init__(self, admin: Admin):
        self.admin = admin
        self._producer: Producer | None = None
        self._consumer: PullConsumer | None = None

    async def close(self) -> None:
        for client in (self._producer, self._consumer):
            if client is not None:
                await client.close()

    async def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(TOOLS_PRODUCER_GROUP, self.admin.namesrv, credentials=self.admin.credentials,
                                      tls=self.admin.tls)
            await self._producer.start()
        return self._producer

    async def consumer(self, group: str = TOOLS_CONSUMER_GROUP) -> PullConsumer:
        if self._consumer is None or self._consumer.group != group:
            if self._consumer is not None:
                await self._consumer.close()
            self._consumer = PullConsumer(group, self.admin.namesrv, credentials=self.admin.credentials,
                                          tls=self.admin.tls, request_timeout=self.admin.timeout)
            await self._consumer.start()
        return self._consumer

    async def queues(self, topic: str, broker_name: str | None = None, queue_id: int | None = None
                     ) -> list[MessageQueue]:
        queues = await (self._consumer or await self.consumer()).fetch_subscribe_queues(topic)
        chosen = [q for q in queues if (broker_name is None or q.broker_name == broker_name)
                  and (queue_id is None or q.queue_id == queue_id)]
        if not chosen:
            where = " ".join(filter(None, (broker_name and f"broker {broker_name}",
                                           queue_id is not None and f"queue {queue_id}")))
            raise ClientError(f"topic {topic} has no readable queue {where}".rstrip())
        return chosen

    # --- sendMessage ---
    async def send(self, topic: str, body: str, keys: str | None = None, tags: str | None = None,
                   broker_name: str | None = None, queue_id: int | None = None) -> SendResult:
        producer = await self.producer()
        queue = None
        if broker_name is not None or queue_id is not None:
            routes = await producer.instance.routes.get(topic, auto_create=True)
            matching = [q for q in routes.write_queues if (broker_name is None or q.broker_name == broker_name)
                        and (queue_id is None or q.queue_id == queue_id)]
            if not matching:
                raise ClientError(f"topic {topic} has no writable queue of broker {broker_name or '*'} "
                                  f"with id {'*' if queue_id is None else queue_id}")
            queue = matching[0]
        return await producer.send(Message(topic, body, tags=tags, keys=keys), queue)

    # --- consumeMessage, printMsg ---
    async def read(self, topic: str, rng: Range, limit: int | None = None, group: str = TOOLS_CONSUMER_GROUP
                   ) -> AsyncIterator[MessageExt]:
        """Messages of the queues ``rng`` selects, queue by queue, in offset order; at most ``limit``. Pulled as
        ``group`` (access control checks it), storing no offset."""
        consumer = await self.consumer(group)
        count = 0
        for queue in await self.queues(topic, rng.broker_name, rng.queue_id):
            start, end = await self._bounds(consumer, queue, rng)
            offset = start
            while offset < end and (limit is None or count < limit):
                result = await consumer.pull(queue, offset, min(PULL_BATCH, end - offset), rng.expression)
                if result.status is PullStatus.OFFSET_ILLEGAL or result.next_begin_offset <= offset:
                    break
                for message in result.messages:
                    if message.queue_offset >= end or (limit is not None and count >= limit):
                        break
                    count += 1
                    yield message
                offset = result.next_begin_offset

    @staticmethod
    async def _bounds(consumer: PullConsumer, queue: MessageQueue, rng: Range) -> tuple[int, int]:
        if rng.offset is not None:
            start = rng.offset
        elif rng.begin_ms is not None:
            start = await consumer.search_offset(queue, rng.begin_ms)
        else:
            start = await consumer.min_offset(queue)
        end = await consumer.max_offset(queue)
        if rng.end_ms is not None:
            end = min(end, await consumer.search_offset(queue, rng.end_ms))
        return max(start, 0), end

    # --- queryMsgByOffset ---
    async def by_offset(self, topic: str, broker_name: str, queue_id: int, offset: int) -> MessageExt:
        async for message in self.read(topic, Range(broker_name, queue_id, offset), limit=1):
            if message.queue_offset == offset:
                return message
            break
        raise ClientError(f"no message at offset {offset} of {topic} queue {queue_id} on {broker_name}")

    # --- queryMsgByUniqueKey, queryMsgById ---
    async def by_unique_key(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """Messages whose UNIQ_KEY is ``msg_id``, searched around the time the id was made (the store keeps no
        index of unique keys): in ``topic``, or in every user topic."""
        born = born_time(msg_id)
        if born is None:
            raise ClientError(f"{msg_id!r} is not a message id (32 hex digits)")
        topics = [topic] if topic else [t for t in await self.admin.topic_list() if is_user_topic(t)]
        found, scanned = [], 0
        rng = Range(begin_ms=born - UNIQUE_KEY_WINDOW_MS, end_ms=born + UNIQUE_KEY_WINDOW_MS)
        for name in topics:
            async for message in self.read(name, rng):
                scanned += 1
                if message.uniq_key == msg_id:
                    found.append(message)
                if scanned >= UNIQUE_KEY_MAX_SCAN:
                    raise ClientError(f"{msg_id} not found in the {scanned} messages stored within "
                                      f"{UNIQUE_KEY_WINDOW_MS // 60000} minutes of its time; name its topic (-t)")
        if not found:
            where = f"topic {topic}" if topic else "any topic"
            raise ClientError(f"no message with id {msg_id} in {where} (searched the messages stored within "
                              f"{UNIQUE_KEY_WINDOW_MS // 60000} minutes of {time.strftime('%F %T', time.localtime(born / 1000))})")
        return found

    async def by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """queryMsgById: an offsetMsgId of a known broker is read at its offset; any other id is a unique key."""
        if await self.admin.is_offset_msg_id(msg_id):
            return [await self.admin.view_message(msg_id)]
        return await self.by_unique_key(msg_id, topic)

    # --- resetOffsetByTime ---
    async def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int | None, force: bool = False
                                   ) -> list[dict]:
        """Set ``group``'s offset of every queue of ``topic`` to the first message stored at or after
        ``timestamp_ms`` (None: the end, as mqadmin's ``now``). Refused while the group has consumers online
        (they would write their own offsets over it) unless ``force``."""
        if not force:
            try:
                online = (await self.admin.consumer_connections(group))["connectionSet"]
            except BrokerError as exc:
                if exc.code != ResponseCode.CONSUMER_NOT_ONLINE:  # then nothing will overwrite the reset
                    raise
                online = []
            if online:
                raise ClientError(f"group {group} has {len(online)} consumer(s) online, which would write their "
                                  f"own offsets over the reset: stop them first, or force it with -f")
        consumer = await self.consumer(group)
        rows = []
        for queue in await self.queues(topic):
            if timestamp_ms is None:
                offset = await consumer.max_offset(queue)
            else:
                offset = await consumer.search_offset(queue, timestamp_ms)
            await consumer.update_offset(queue, offset)
            rows.append({"brokerName": queue.broker_name, "queueId": queue.queue_id, "offset": offset})
        return rows

    # --- statsAll ---
    async def stats_all(self, topic: str | None = None) -> list[dict]:
        """Per topic: messages held; per consuming group (a group is its %RETRY% topic): its backlog."""
        topics = await self.admin.topic_list()
        groups = [t[len(RETRY_PREFIX):] for t in topics if t.startswith(RETRY_PREFIX)]
        wanted = [topic] if topic else sorted(t for t in topics if is_user_topic(t))
        backlog: dict[str, dict[str, int]] = {t: {} for t in wanted}
        for group in groups:
            for row in await self.admin.consumer_progress(group, topic):
                if row["topic"] in backlog and row["consumerOffset"] >= 0:
                    per_group = backlog[row["topic"]]
                    per_group[group] = per_group.get(group, 0) + row["diff"]
        rows = []
        for name in wanted:
            held = sum(q["maxOffset"] - q["minOffset"] for q in await self.admin.topic_status(name))
            for group, accumulation in sorted(backlog[name].items()) or [("", None)]:
                rows.append({"topic": name, "consumerGroup": group, "accumulation": accumulation,
                             "messages": held})
        return rows


def is_user_topic(topic: str) -> bool:
    return topic not in SYSTEM_TOPICS and not topic.startswith((RETRY_PREFIX, DLQ_PREFIX))


def born_time(msg_id: str, now_ms: int | None = None) -> int | None:
    """When a client made a unique key (UniqKeyGenerator's layout: ms since the start of its month at digits
    20-27), as epoch ms: the latest such time not after now (plus the search window). None: not a unique key.

    The month's start is reckoned as UniqKeyGenerator reckons it; an id from a client that reckons it in another
    time zone is dated off by the difference, and is found only if it is within the search window."""
    if len(msg_id) != 32:
        return None
    try:
        since_month = int(msg_id[20:28], 16)
        bytes.fromhex(msg_id)
    except ValueError:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    year, month = time.gmtime(now_ms / 1000)[:2]
    for _ in range(2):  # this month, else the one before
        start = int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)
        if start + since_month <= now_ms + UNIQUE_KEY_WINDOW_MS:
            return start + since_month
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    return None

