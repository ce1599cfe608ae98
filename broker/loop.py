"""The one place the event loop is chosen: uvloop when installed. The broker, the name server and ``halfmq cluster``
(broker/local_cluster.py: uvloop runs child processes without watcher threads) all run on it."""
from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
