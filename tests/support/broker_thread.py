"""A broker on its own event-loop thread, for tests that drive it from synchronous code."""
from __future__ import annotations

import asyncio
import threading

from halfmq.broker.server import Broker

from tests.conftest import broker_config


class BrokerThread:
    """A broker on its own event loop thread, so hypothesis can drive plain sockets from the test thread."""

    def __init__(self, store_dir, **overrides):
        self.loop = asyncio.new_event_loop()
        self.broker = Broker(broker_config(store_dir, **overrides))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.broker.start())

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.call(self.broker.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
