"""A TCP proxy on 127.0.0.1 that a test can cut, to partition processes that share the host's network: there is no
tc netem here, and rules in the host's network namespace are off limits. A link that goes through one (a broker's
connections to an etcd member, followers' connections to a broker's replication port) is partitioned by cutting
its proxy, wholly or for the connections of some clients.

- ``cut``: connections stay open and nothing crosses either way, closes included: what a link that drops every
  packet looks like to both ends (each waits for its timeouts). A connection opened meanwhile is accepted and held
  the same way, and reaches its target only once healed.
- ``heal()``: what was held crosses, as TCP delivers it once packets get through again after a short cut;
  ``heal(reset=True)``: each connection that was held is reset instead (both ends see it fail), as after a cut
  long enough for TCP to give up.

``delay``: each chunk crosses that many seconds late, as over a slow link.

``identify`` names a connection's client from the first bytes it sends (None: more bytes needed), so that a cut
can apply to some clients only; it runs before anything of the connection is forwarded.
"""
from __future__ import annotations

import asyncio
import socket
import struct
from typing import Callable

CHUNK = 64 << 10


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.client = (reader, writer)
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.who: str | None = None
        self.held = False  #: a cut applied to it: ``heal(reset=True)`` resets it
        self.aborted = False
        self.tasks: list[asyncio.Task] = []

    def abort(self) -> None:
        """Closes both ends with a reset (SO_LINGER 0), not an orderly close."""
        self.aborted = True
        for stream in (self.client, self.upstream):
            if stream is None:
                continue
            sock = stream[1].get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            stream[1].transport.abort()


class Proxy:
    """Forwards connections to ``target`` (HOST:PORT) from ``addr`` once started."""

    def __init__(self, target: str, identify: Callable[[bytes], str | None] | None = None, delay: float = 0.0):
        self.target = target
        self.identify = identify
        self.delay = delay
        self.addr = ""
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._cut: set[str] | None = set()     #: the clients cut off; None: every connection
        self._healed = asyncio.Event()
        self._healed.set()

    async def start(self) -> "Proxy":
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.addr = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = []
        for connection in list(self._connections):
            connection.abort()
            tasks += connection.tasks
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # --- the test's handles ---
    def cut(self, clients: set[str] | None = None) -> None:
        """Holds the connections of ``clients`` (as ``identify`` names them), or every connection (None)."""
        self._cut = None if clients is None else set(clients)
        if self._healed.is_set():
            self._healed = asyncio.Event()
        for connection in self._connections:
            if self._blocks(connection):
                connection.held = True

    def heal(self, reset: bool = False) -> None:
        if reset:
            for connection in list(self._connections):
                if connection.held:
                    connection.abort()
        self._cut = set()
        for connection in self._connections:
            connection.held = False
        self._healed.set()

    def _blocks(self, connection: _Connection) -> bool:
        return self._cut is None or (connection.who is not None and connection.who in self._cut)

    async def _gate(self, connection: _Connection) -> None:
        while self._blocks(connection):
            connection.held = True
            await self._healed.wait()

    # --- forwarding ---
    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader, writer)
        self._connections.add(connection)
        connection.tasks.append(asyncio.current_task())
        try:
            first = await self._first_bytes(connection)
            if first is None:
                return
            await self._gate(connection)
            if connection.aborted:
                return
            host, _, port = self.target.rpartition(":")
            try:
                connection.upstream = await asyncio.open_connection(host, int(port))
            except OSError:
                connection.abort()  # as a refused connection would end (the client sees it fail at once)
                return
            connection.upstream[1].write(first)
            back = asyncio.ensure_future(self._pump(connection, connection.upstream[0], writer))
            connection.tasks.append(back)
            await asyncio.gather(self._pump(connection, reader, connection.upstream[1]), back)
        except OSError:  # a reset, or a write to an end that went
            connection.abort()
        finally:
            self._connections.discard(connection)
            for stream in (connection.client, connection.upstream):
                if stream is not None:
                    stream[1].close()  # after what is buffered (an aborted one is closed already)
            for task in connection.tasks:
                if task is not asyncio.current_task():
                    task.cancel()

    async def _first_bytes(self, connection: _Connection) -> bytes | None:
        """What the client sent first, once ``identify`` could name it from that (None: it closed before)."""
        data = b""
        while True:
            chunk = await connection.client[0].read(CHUNK)
            if not chunk:
                return None
            data += chunk
            if self.identify is None:
                return data
            connection.who = self.identify(data)
            if connection.who is not None:
                return data

    async def _pump(self, connection: _Connection, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """One direction: each chunk (and the end) crosses only while the connection is not cut."""
        while True:
            chunk = await reader.read(CHUNK)
            if self.delay:
                await asyncio.sleep(self.delay)  # the link's latency, not a wait for anything
            await self._gate(connection)
            if connection.aborted:
                return
            if not chunk:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()
