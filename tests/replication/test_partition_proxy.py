"""The partition proxy of the failover tests (tests/support/proxy.py): a cut holds a link open with nothing crossing,
a heal delivers what was held or resets the connection, and a cut can apply to one client's connections only."""
from __future__ import annotations

import asyncio

import pytest

from tests.support.proxy import Proxy


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def echo_addr():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()


async def connect(proxy: Proxy, hello: bytes):
    host, _, port = proxy.addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(hello)
    return reader, writer


async def test_a_cut_holds_what_is_sent_and_a_heal_delivers_it(echo_addr):
    proxy = await Proxy(echo_addr).start()
    try:
        reader, writer = await connect(proxy, b"before ")
        assert await reader.readexactly(7) == b"before "
        proxy.cut()
        writer.write(b"during")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(6), 0.3)
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(6), 5) == b"during"
        writer.close()
    finally:
        await proxy.stop()


async def test_a_heal_with_reset_fails_the_held_connections_and_new_ones_get_through(echo_addr):
    proxy = await Proxy(echo_addr).start()
    try:
        proxy.cut()
        reader, writer = await connect(proxy, b"held")  # accepted, held: it reaches the target only once healed
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(4), 0.3)
        proxy.heal(reset=True)
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(4), 5)
        writer.close()
        reader, writer = await connect(proxy, b"after")
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"after"
        writer.close()
    finally:
        await proxy.stop()


async def test_a_cut_of_one_client_leaves_the_others_connected(echo_addr):
    proxy = await Proxy(echo_addr, identify=lambda data: data[:1].decode() if data else None).start()
    try:
        cut_reader, cut_writer = await connect(proxy, b"a1")
        other_reader, other_writer = await connect(proxy, b"b1")
        assert await asyncio.wait_for(cut_reader.readexactly(2), 5) == b"a1"
        assert await asyncio.wait_for(other_reader.readexactly(2), 5) == b"b1"
        proxy.cut({"a"})
        cut_writer.write(b"a2")
        other_writer.write(b"b2")
        assert await asyncio.wait_for(other_reader.readexactly(2), 5) == b"b2"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(cut_reader.readexactly(2), 0.3)
        proxy.heal()
        assert await asyncio.wait_for(cut_reader.readexactly(2), 5) == b"a2"
        cut_writer.close()
        other_writer.close()
    finally:
        await proxy.stop()
