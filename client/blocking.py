"""Blocking facades for synchronous code: an event loop runs in a background thread.

    with BlockingProducer("PG", "127.0.0.1:9876") as producer:
        result = producer.send(Message("Topic", b"body"))
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Self

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


class _Blocking:
    """A started client (``make(group, namesrv, **kwargs)``) run on a loop thread of its own: each method blocks until
    done (at most ``timeout`` seconds); ``close`` closes the client, then stops the thread."""

    def __init__(self, make, group: str, namesrv: str, timeout: float, kwargs: dict):
        self._thread = _LoopThread(timeout)
        self._client = self._thread.run(self._started(make, group, namesrv, kwargs))

    @staticmethod
    async def _started(make, group, namesrv, kwargs):
        client = make(group, namesrv, **kwargs)
        await client.start()
        return client

    def close(self) -> None:
        try:
            self._thread.run(self._client.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BlockingProducer(_Blocking):
    """``Producer`` for synchronous code. Methods block until done (at most ``timeout`` seconds)."""

    def __init__(self, group: str, namesrv: str, timeout: float = 30.0, **kwargs):
        super().__init__(Producer, group, namesrv, timeout, kwargs)

    def send(self, msg: Message, queue: MessageQueue | None = None) -> SendResult:
        return self._thread.run(self._client.send(msg, queue))

    def send_oneway(self, msg: Message, queue: MessageQueue | None = None) -> None:
        self._thread.run(self._client.send_oneway(msg, queue))

    def send_batch(self, msgs: list[Message], queue: MessageQueue | None = None) -> SendResult:
        return self._thread.run(self._client.send_batch(msgs, queue))


class BlockingPullConsumer(_Blocking):
    """``PullConsumer`` for synchronous code."""

    def __init__(self, group: str, namesrv: str, timeout: float = 60.0, **kwargs):
        super().__init__(PullConsumer, group, namesrv, timeout, kwargs)

    def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        return self._thread.run(self._client.fetch_subscribe_queues(topic))

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
             suspend_ms: int = 0) -> PullResult:
        return self._thread.run(self._client.pull(queue, offset, max_nums, expression, suspend_ms))

    def query_offset(self, queue: MessageQueue) -> int | None:
        return self._thread.run(self._client.query_offset(queue))

    def update_offset(self, queue: MessageQueue, offset: int) -> None:
        self._thread.run(self._client.update_offset(queue, offset))
