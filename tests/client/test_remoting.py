"""The client connection against a real socket whose peer never answers."""
from __future__ import annotations

import asyncio
import time

import pytest

from halfmq.client.errors import RequestTimeoutError
from halfmq.client.remoting import Connection
from halfmq.protocol.codes import RequestCode


async def test_unanswered_requests_time_out_each_after_its_own_timeout():
    received = asyncio.Event()

    async def silent(reader, writer):  # reads requests, answers none
        while await reader.read(65536):
            received.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = await Connection.open(f"127.0.0.1:{port}")
    try:
        started = time.monotonic()
        short = asyncio.ensure_future(conn.request(RequestCode.HEART_BEAT, {}, b"", timeout=0.2))
        long = asyncio.ensure_future(conn.request(RequestCode.HEART_BEAT, {}, b"", timeout=5))
        with pytest.raises(RequestTimeoutError, match="timed out after 0.2 s"):
            await asyncio.wait_for(short, 3)
        assert 0.2 <= time.monotonic() - started < 1.0
        assert received.is_set() and not long.done()  # the other request keeps waiting for its own deadline
        long.cancel()
        await asyncio.gather(long, return_exceptions=True)
        assert conn.pending == {}
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()
