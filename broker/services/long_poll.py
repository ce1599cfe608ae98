"""Held pulls (reference §3.6 long polling): woken at once when their queue grows, or answered on timeout.

A held pull is a request in progress of its connection (the dispatcher waits on its future, so it counts against
``serverMaxInflightPerConnection``), at most ``longPollingMaxHeldPerConnection`` per connection and
``longPollingMaxHeld`` in all; beyond them a pull is answered SYSTEM_BUSY at once. The pulls of a connection are
dropped when it closes. Each pull sits in its queue's insertion-ordered dict and in its connection's, so taking it
out is O(1), and its timeout is a loop timer (the loop's heap: O(log n) to arm, O(1) to cancel). Measured before:
one connection parked 100k pulls that outlived it, and their expiry scanned a list each (O(n²) in all), which kept
another client's request unanswered for over 120 s.

Both doors hold their long polls here: a remoting pull waits on its queue, a gRPC receive (broker/grpc/receive.py)
on its whole topic (queue ANY_QUEUE, woken by any arrival of the topic); a gRPC connection's receives count as its
held pulls, against the same two limits.
"""
from __future__ import annotations

import asyncio
import logging


from ..errors import BrokerError, Failure

log = logging.getLogger(__name__)
#: the queue id of a pull that waits for any queue of its topic (queue ids are never negative)
ANY_QUEUE = -1


class HeldPull:
    """One parked pull; ``future`` resolves (True) when it should be run again, once, without holding."""

    __slots__ = ("topic", "queue_id", "offset", "channel", "future", "timer")

    def __init__(self, topic: str, queue_id: int, offset: int, channel=None):
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.channel = channel
        self.future: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"HeldPull({self.topic}/{self.queue_id}@{self.offset})"


class LongPollService:
    def __init__(self, max_per_connection: int = 512, max_total: int = 50_000):
        self.max_per_connection = max_per_connection
        self.max_total = max_total
        self.held: dict[tuple[str, int], dict[HeldPull, None]] = {}
        self.by_channel: dict[object, dict[HeldPull, None]] = {}
        self.total = 0

    def configure(self, max_per_connection: int, max_total: int) -> None:
        self.max_per_connection = max_per_connection
        self.max_total = max_total

    def hold(self, pull: HeldPull, timeout_s: float) -> asyncio.Future:
        """Park ``pull``; the returned future resolves when it should run again (data arrived, timeout, shutdown)
        and is cancelled when its connection closes.

        Raises:
            BrokerError: BUSY, the connection or the broker holds as many pulls as it may.
        """
        mine = self.by_channel.get(pull.channel)
        if mine is not None and len(mine) >= self.max_per_connection:
            raise BrokerError(Failure.BUSY,
                              f"[OVERLOAD] this connection already holds {len(mine)} pulls "
                              f"(longPollingMaxHeldPerConnection={self.max_per_connection})")
        if self.total >= self.max_total:
            raise BrokerError(Failure.BUSY,
                              f"[OVERLOAD] the broker already holds {self.total} pulls "
                              f"(longPollingMaxHeld={self.max_total})")
        loop = asyncio.get_running_loop()
        pull.future = loop.create_future()
        self.held.setdefault((pull.topic, pull.queue_id), {})[pull] = None
        if mine is None:
            mine = self.by_channel[pull.channel] = {}
        mine[pull] = None
        self.total += 1
        pull.timer = loop.call_later(timeout_s, self._expire, pull)
        return pull.future

    def _remove(self, pull: HeldPull) -> bool:
        key = (pull.topic, pull.queue_id)
        waiting = self.held.get(key)
        if waiting is None or waiting.pop(pull, 0) is not None:
            return False
        if not waiting:
            del self.held[key]
        self._forget(pull)
        return True

    def _forget(self, pull: HeldPull) -> None:
        """Out of its connection's set and the count (it already left its queue's)."""
        self.total -= 1
        mine = self.by_channel.get(pull.channel)
        if mine is not None:
            mine.pop(pull, None)
            if not mine:
                del self.by_channel[pull.channel]

    def _expire(self, pull: HeldPull) -> None:
        if self._remove(pull):
            self._wake(pull)

    def drop(self, pull: HeldPull) -> None:
        """Take ``pull`` out if it is still held (its request went away); O(1)."""
        if self._remove(pull) and pull.timer is not None:
            pull.timer.cancel()

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store hook: a queue grew to ``max_offset``."""
        self._wake_ready((topic, queue_id), max_offset)
        self._wake_ready((topic, ANY_QUEUE), max_offset)

    def wake_topic(self, topic: str) -> None:
        """Wake the pulls waiting for any queue of ``topic`` (a message of it became receivable again)."""
        self._wake_ready((topic, ANY_QUEUE), 0)

    def _wake_ready(self, key: tuple[str, int], max_offset: int) -> None:
        """Wake the pulls of ``key`` whose offset is below ``max_offset`` (all of a topic's: their offset is -1)."""
        waiting = self.held.get(key)
        if not waiting:
            return
        ready = [p for p in waiting if p.offset < max_offset]
        if not ready:
            return
        if len(ready) == len(waiting):
            del self.held[key]
        else:
            for pull in ready:
                del waiting[pull]
        for pull in ready:
            self._forget(pull)
            if pull.timer is not None:
                pull.timer.cancel()
            self._wake(pull)

    @staticmethod
    def _wake(pull: HeldPull) -> None:
        if pull.future is not None and not pull.future.done():
            pull.future.set_result(True)

    def channel_closed(self, channel) -> None:
        """Drop the pulls of a connection that is gone: nobody reads their answers."""
        mine = self.by_channel.pop(channel, None)
        if not mine:
            return
        for pull in mine:
            key = (pull.topic, pull.queue_id)
            waiting = self.held.get(key)
            if waiting is not None:
                waiting.pop(pull, None)
                if not waiting:
                    del self.held[key]
            self.total -= 1
            if pull.timer is not None:
                pull.timer.cancel()
            if pull.future is not None and not pull.future.done():
                pull.future.cancel()

    def release_all(self) -> None:
        """Answer every held pull now (shutdown)."""
        held, self.held = self.held, {}
        self.by_channel = {}
        self.total = 0
        for pulls in held.values():
            for pull in pulls:
                if pull.timer is not None:
                    pull.timer.cancel()
                self._wake(pull)

    def count(self) -> int:
        return self.total
