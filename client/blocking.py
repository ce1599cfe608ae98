"""Blocking facades for synchronous code: an event loop runs in a background thread.

    with BlockingProducer("PG", "127.0.0.1:9876") as producer:
        result = producer.send(Message("Topic", b"body"))
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine

from .consumer import PullConsumer, PullResult
from .message import Message, MessageQueue, SendResult
from .producer import Producer


class _LoopThread:
    def __init__(self, timeout: float):
        self.timeout = timeout
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="halfmq-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout)
        self.loop.close()


class BlockingProducer:
    """``Producer`` for synchronous code. Methods block until done (at most ``timeout`` seconds)."""

    def __init__(self, group: str, namesrv: str, timeout: float = 30.0, **kwargs):
        self._thread = _LoopThread(timeout)
        self._producer = self._thread.run(self._make(group, namesrv, kwargs))

    @staticmethod
    async def _make(group, namesrv, kwargs) -> Producer:
        producer = Producer(group, namesrv, **kwargs)
        await producer.start()
        return producer

    def send(self, msg: Message, queue: MessageQueue | None = None) -> SendResult:
        return self._thread.run(self._producer.send(msg, queue))

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        self._thread.run(self._producer.send_oneway(msg, queue))

    def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None) -> SendResult:
        return self._thread.run(self._producer.send_batch(msgs, queue))

    def close(self) -> None:
        try:
            self._thread.run(self._producer.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "BlockingProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BlockingPullConsumer:
    """``PullConsumer`` for synchronous code."""

    def __init__(self, group: str, namesrv: str, timeout: float = 60.0, **kwargs):
        self._thread = _LoopThread(timeout)
        self._consumer = self._thread.run(self._make(group, namesrv, kwargs))

    @staticmethod
    async def _make(group, namesrv, kwargs) -> PullConsumer:
        consumer = PullConsumer(group, namesrv, **kwargs)
        await consumer.start()
        return consumer

    def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        return self._thread.run(self._consumer.fetch_subscribe_queues(topic))

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
             suspend_ms: int = 0) -> PullResult:
        return self._thread.run(self._consumer.pull(queue, offset, max_nums, expression, suspend_ms))

    def query_offset(self, queue: MessageQueue) -> int | None:
        return self._thread.run(self._consumer.query_offset(queue))

    def update_offset(self, queue: MessageQueue, offset: int) -> None:
        self._thread.run(self._consumer.update_offset(queue, offset))

    def close(self) -> None:
        try:
            self._thread.run(self._consumer.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "BlockingPullConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
