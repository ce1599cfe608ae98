"""Starting the official RocketMQ 5 Python client (rocketmq-python-client 5.x) in a test."""
from __future__ import annotations

import asyncio

from rocketmq.v5.client.connection.rpc_client import RpcClient


def started(client):
    """``client.startup()``, once the calling thread's current event loop is the client's IO loop; returns it.

    The client opens its telemetry stream from the thread that handles a route answer: its IO loop's thread, or
    the calling thread when the answer came before the client attached its callback (a fast broker, a loaded
    machine). grpc.aio then takes the calling thread's current event loop, which an executor's thread never has and
    which pytest-asyncio clears in the main thread after each async test: the stream is not opened ("There is no
    current event loop in thread 'MainThread'") and every send fails to fetch its route (CI, once). Its IO loop is
    the one it runs that stream on anyway."""
    asyncio.set_event_loop(RpcClient.get_channel_io_loop())
    client.startup()
    return client
