"""PushConsumer: clustering consumption with rebalance, long polling, offsets kept on the broker and retries.

Each assigned queue has one pull loop: long-poll, hand the messages to the listener, advance. Failed messages go
back to the broker (%RETRY%group) and the queue moves on. The group's queues are re-divided among its live
consumers every 20 s and at once when the broker announces a membership change.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from enum import Enum
from typing import Awaitable, Callable

from halfmq.protocol import properties as P
from halfmq.protocol.codes import RequestCode
from halfmq.protocol.rules import RETRY_PREFIX

from .consumer import PullConsumer, PullStatus
from .instance import Startable
from .errors import ClientError
from .message import MessageExt, MessageQueue

log = logging.getLogger(__name__)
REBALANCE_INTERVAL_S = 20.0
PERSIST_INTERVAL_S = 5.0
ERROR_BACKOFF_S = 1.0


class ConsumeStatus(Enum):
    SUCCESS = 0
    RECONSUME_LATER = 1


class ConsumeFrom(Enum):
    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


Listener = Callable[[list[MessageExt]], ConsumeStatus | None | Awaitable[ConsumeStatus | None]]


def allocate_average(queues: list[MessageQueue], client_ids: list[str], me: str) -> list[MessageQueue]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, nearly equal shares of the sorted queues."""
    queues = sorted(queues)
    ids = sorted(client_ids)
    if me not in ids or not queues:
        return []
    index = ids.index(me)
    n, k = len(queues), len(ids)
    mod = n % k
    size = (n // k + 1 if index < mod else n // k) if n > k else 1
    start = index * size if index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))] if start < n else []


class PushConsumer(Startable):
    """Clustering push consumer.

    Args:
        group: consumer group.
        namesrv: name server address(es).
        listener: called with a list of messages; returns ConsumeStatus (None means SUCCESS). A plain function
            runs in an executor, a coroutine function on the loop. An exception means RECONSUME_LATER.
        consume_from: where a group without a stored offset starts.
        batch_size: most messages per listener call.
    """

    def __init__(self, group: str, namesrv: str, listener: Listener,
                 consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET, batch_size: int = 1, pull_batch_size: int = 32,
                 max_reconsume_times: int = 16, client_ip: str = "127.0.0.1", timestamp_ms: int = 0,
                 credentials=None, tls=None):
        self.group = group
        self.listener = listener
        self.consume_from = consume_from
        self.timestamp_ms = timestamp_ms
        self.batch_size = batch_size
        self.pull_batch_size = pull_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.puller = PullConsumer(group, namesrv, client_ip, credentials=credentials, tls=tls)
        self.instance = self.puller.instance
        self.instance.consumer_data = self._consumer_data
        self.instance.handlers[RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] = lambda _c, _cmd: self._rebalance_now.set()
        self.subscriptions: dict[str, str] = {}
        self.tasks: dict[MessageQueue, asyncio.Task] = {}
        self.offsets: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}
        self._rebalance_now = asyncio.Event()
        self._stop = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self.subscriptions[topic] = expression or "*"

    def _consumer_data(self) -> list[dict]:
        subs = dict(self.subscriptions)
        subs.setdefault(RETRY_PREFIX + self.group, "*")
        return [{"groupName": self.group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                 "consumeFromWhere": self.consume_from.value, "unitMode": False,
                 "subscriptionDataSet": [{"topic": t, "subString": e, "tagsSet": [], "codeSet": [], "subVersion": 0,
                                          "expressionType": "TAG", "classFilterMode": False}
                                         for t, e in subs.items()]}]

    async def start(self) -> None:
        """Register with the brokers of the subscribed topics and start consuming."""
        await self.puller.start()
        for topic in self.subscriptions:
            route = await self.instance.routes.get(topic)
            for addr in route.broker_addrs.values():
                await self.instance.heartbeat(addr)
        await self.rebalance()
        self._loop_task = asyncio.get_running_loop().create_task(self._maintain())

    async def close(self) -> None:
        """Stop pulling, persist offsets, leave the group."""
        self._stop.set()
        if self._loop_task is not None:
            await self._loop_task
        await self._stop_queues(list(self.tasks))
        await self.persist_offsets()
        await self.instance.unregister(consumer_group=self.group)
        await self.puller.close()

    async def _maintain(self) -> None:
        loop = asyncio.get_running_loop()
        next_persist = loop.time() + PERSIST_INTERVAL_S
        next_rebalance = loop.time() + REBALANCE_INTERVAL_S
        while not self._stop.is_set():
            timeout = max(0.0, min(next_persist, next_rebalance) - loop.time())
            stop = loop.create_task(self._stop.wait())
            rebalance = loop.create_task(self._rebalance_now.wait())
            await asyncio.wait({stop, rebalance}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            rebalance.cancel()
            if self._stop.is_set():
                return
            try:
                if self._rebalance_now.is_set() or loop.time() >= next_rebalance:
                    self._rebalance_now.clear()
                    await self.rebalance()
                    next_rebalance = loop.time() + REBALANCE_INTERVAL_S
                if loop.time() >= next_persist:
                    await self.persist_offsets()
                    next_persist = loop.time() + PERSIST_INTERVAL_S
            except Exception as exc:
                log.warning("consumer %s maintenance failed: %s", self.group, exc)

    async def rebalance(self) -> None:
        """Re-divide the group's queues among its live consumers; start and stop pull loops to match."""
        wanted: set[MessageQueue] = set()
        topics = list(self.subscriptions) + [RETRY_PREFIX + self.group]
        for topic in topics:
            try:
                queues = await self.puller.fetch_subscribe_queues(topic)
                await self._join_new_brokers(topic)
                ids = await self.puller.consumer_ids(topic)
            except ClientError as exc:
                log.debug("rebalance of %s skipped: %s", topic, exc)
                continue
            wanted.update(allocate_average(queues, ids, self.instance.client_id))
        await self._stop_queues([q for q in self.tasks if q not in wanted])
        for queue in sorted(wanted - set(self.tasks)):
            self.tasks[queue] = asyncio.get_running_loop().create_task(self._consume_queue(queue))

    async def _join_new_brokers(self, topic: str) -> None:
        """A broker that joined the cluster since we started learns of this consumer before we pull from it (and
        before any consumer asks it who is in the group)."""
        route = await self.instance.routes.get(topic)
        for addr in route.broker_addrs.values():
            if addr not in self.instance.brokers:
                await self.instance.heartbeat(addr)

    async def _stop_queues(self, queues: list[MessageQueue]) -> None:
        tasks = [self.tasks.pop(q) for q in queues]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for queue in queues:
            await self._persist(queue)

    async def _initial_offset(self, queue: MessageQueue) -> int:
        stored = await self.puller.query_offset(queue)
        if stored is not None and stored >= 0:
            return stored
        if queue.topic.startswith(RETRY_PREFIX) or self.consume_from is ConsumeFrom.FIRST_OFFSET:
            return 0
        if self.consume_from is ConsumeFrom.TIMESTAMP:
            return await self.puller.search_offset(queue, self.timestamp_ms)
        return await self.puller.max_offset(queue)

    async def _consume_queue(self, queue: MessageQueue) -> None:
        expression = self.subscriptions.get(queue.topic, "*")
        offset = None
        while not self._stop.is_set():
            try:
                if offset is None:
                    offset = await self._initial_offset(queue)
                    self.offsets[queue] = offset
                result = await self.puller.pull(queue, offset, self.pull_batch_size, expression, suspend_ms=15_000,
                                                timeout=30.0, commit_offset=self.offsets.get(queue))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("pull of %s failed: %s", queue, exc)
                await asyncio.sleep(ERROR_BACKOFF_S)  # back off before retrying a failing broker
                continue
            if result.status is PullStatus.FOUND:
                # A close while the listener has the messages lets it finish and counts what it consumed: cut off
                # there, the offset stayed behind and the queue's next consumer got them again.
                stopping = asyncio.Event()  # set when this queue's consumption is stopped (close, rebalance)
                delivery = asyncio.ensure_future(self._deliver_all(result.messages, stopping))
                try:
                    await asyncio.shield(delivery)
                except asyncio.CancelledError:
                    stopping.set()
                    if await delivery:  # else what was neither consumed nor sent back goes to the next consumer
                        self.offsets[queue] = result.next_begin_offset
                    raise
            offset = result.next_begin_offset
            self.offsets[queue] = offset

    async def _deliver_all(self, messages: list[MessageExt], stopping: asyncio.Event) -> bool:
        for start in range(0, len(messages), self.batch_size):
            if not await self._deliver(messages[start:start + self.batch_size], stopping):
                return False
        return True

    async def _deliver(self, messages: list[MessageExt], stopping: asyncio.Event) -> bool:
        """Hand ``messages`` to the listener; False when ``stopping`` cut off sending back what it asked to see
        later (a broker refusing send-backs never holds a close or a rebalance)."""
        for msg in messages:  # retried messages are shown with the topic they were first sent to
            original = msg.properties.get(P.RETRY_TOPIC)
            if original and msg.topic.startswith(RETRY_PREFIX):
                msg.topic = original
        try:
            if inspect.iscoroutinefunction(self.listener):
                status = await self.listener(messages)
            else:
                status = await asyncio.get_running_loop().run_in_executor(None, self.listener, messages)
        except Exception as exc:
            log.warning("listener of %s failed: %s", self.group, exc)
            status = ConsumeStatus.RECONSUME_LATER
        if status is None or status is ConsumeStatus.SUCCESS:
            return True
        for msg in messages:
            while True:
                if stopping.is_set():
                    return False
                try:
                    await self.puller.send_back(msg, 0, self.max_reconsume_times)
                    break
                except ClientError as exc:
                    log.warning("send-back of %s failed, retrying: %s", msg.msg_id, exc)
                    await asyncio.sleep(ERROR_BACKOFF_S)
        return True

    async def _persist(self, queue: MessageQueue) -> None:
        offset = self.offsets.get(queue)
        if offset is None or self._persisted.get(queue) == offset:
            return
        try:
            await self.puller.update_offset(queue, offset)
            self._persisted[queue] = offset
        except ClientError as exc:
            log.warning("could not persist the offset of %s: %s", queue, exc)

    async def persist_offsets(self) -> None:
        for queue in list(self.offsets):
            await self._persist(queue)
