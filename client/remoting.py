"""One TCP connection to a broker or name server: requests matched to responses by opaque, out of order.

The broker may also send requests down the same connection (CHECK_TRANSACTION_STATE,
NOTIFY_CONSUMER_IDS_CHANGED); they are dispatched to handlers registered by code.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import ssl
from typing import Callable

from halfmq.protocol.codes import FLAG_ONEWAY, LanguageCode
from halfmq.protocol.command import RemotingCommand, decode_command
from halfmq.protocol.errors import ProtocolError
from halfmq.protocol.frame import FrameDecoder
from halfmq.protocol.signing import sign

from .errors import AddressError, ConnectionClosedError, RequestTimeoutError

log = logging.getLogger(__name__)
RequestHandler = Callable[["Connection", RemotingCommand], None]
TIMEOUT_SWEEP_S = 0.05  #: how often overdue requests are expired: a request times out at most this late
#: Requests at least this large are remembered while in flight: a broker refuses a frame larger than its
#: serverMaxFrameSize by closing the connection, and the error then says how large the request was.
LARGE_REQUEST = 1 << 20


def parse_address(addr: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``IPv6:PORT`` (the port after the last colon) → (host, port).

    Raises:
        AddressError: no port, or a port that is not a number in 1..65535.
    """
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host.strip("[]:"):
        raise AddressError(f"address {addr!r} has no port: write HOST:PORT, e.g. {addr.strip() or 'localhost'}:9876"
                           if ":" not in addr else f"address {addr!r} is not HOST:PORT ([HOST]:PORT for IPv6)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"address {addr!r}: the port {port!r} is not a number in 1..65535")
    return host.strip("[]"), int(port)


def _reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not isinstance(exc, OSError) or \
            isinstance(exc, OSError) and exc.errno is None and not str(exc):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Credentials:
    """An ACL account: every request is signed as RocketMQ 4.x clients sign them."""

    def __init__(self, access_key: str, secret_key: str):
        self.access_key = access_key
        self.secret_key = secret_key

    def sign(self, ext_fields: dict[str, str] | None, body: bytes) -> dict[str, str]:
        return sign(ext_fields, body, self.access_key, self.secret_key)


class Connection(asyncio.Protocol):
    def __init__(self, addr: str, handlers: dict[int, RequestHandler] | None = None,
                 credentials: Credentials | None = None):
        self.addr = addr
        self.handlers = handlers if handlers is not None else {}
        self.credentials = credentials
        self.decoder = FrameDecoder(64 << 20)
        self.pending: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self._opaque = itertools.count(1)
        self._drain_waiter: asyncio.Future | None = None
        self._pending_writes: list[bytes] | None = None
        self._deadlines: dict[int, tuple[float, int, float]] = {}  # opaque → (deadline, code, timeout)
        self._sweeper: asyncio.TimerHandle | None = None
        self._large: dict[int, int] = {}  # opaque → size, of requests of LARGE_REQUEST bytes or more

    @classmethod
    async def open(cls, addr: str, handlers: dict[int, RequestHandler] | None = None, timeout: float = 5.0,
                   credentials: Credentials | None = None, tls: ssl.SSLContext | None = None) -> "Connection":
        """Connect to ``addr`` (HOST:PORT).

        Raises:
            AddressError: ``addr`` is not HOST:PORT.
            ConnectionClosedError: nothing answers there (refused, unknown host, no answer within ``timeout``).
        """
        host, port = parse_address(addr)
        loop = asyncio.get_running_loop()
        try:
            _t, conn = await asyncio.wait_for(
                loop.create_connection(lambda: cls(addr, handlers, credentials), host, port, ssl=tls), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ConnectionClosedError(f"cannot connect to {addr}: {_reason(exc, timeout)}") from None
        return conn

    # --- asyncio.Protocol ---
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as exc:
            log.error("closing connection to %s: %s", self.addr, exc)
            self.transport.abort()
            return
        for frame in frames:
            try:
                cmd = decode_command(frame)
            except ProtocolError as exc:
                log.error("closing connection to %s: %s", self.addr, exc)
                self.transport.abort()
                return
            if cmd.is_response:
                fut = self.pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
                continue
            handler = self.handlers.get(cmd.code)
            if handler is None:
                log.debug("ignoring broker request %s from %s", cmd.code, self.addr)
                continue
            try:
                handler(self, cmd)
            except Exception:
                log.exception("handler for broker request %s failed", cmd.code)

    def connection_lost(self, exc) -> None:
        self.closed.set()
        pending, self.pending = self.pending, {}
        large, self._large = self._large, {}
        for opaque, fut in pending.items():
            if not fut.done():
                size = large.get(opaque)
                why = "" if size is None else (
                    f" while it was sent a {size:,}-byte request: larger than the broker accepts? (a broker closes "
                    f"the connection on a frame above its serverMaxFrameSize, 16 MiB by default)")
                fut.set_exception(ConnectionClosedError(f"connection to {self.addr} closed{why}"))
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def pause_writing(self) -> None:
        self._drain_waiter = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        self._drain_waiter = None

    # --- API ---
    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.closed.is_set() and not self.transport.is_closing()

    async def request(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"",
                      timeout: float = 3.0) -> RemotingCommand:
        """Send a request and wait for its response.

        Raises:
            ConnectionClosedError: the connection is closed, or closes before the response.
            RequestTimeoutError: no response within ``timeout`` seconds.
        """
        if not self.is_open:
            raise ConnectionClosedError(f"connection to {self.addr} is closed")
        opaque = next(self._opaque) & 0x7FFFFFFF
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending[opaque] = fut
        if self.credentials is not None:
            ext_fields = self.credentials.sign(ext_fields, body)
        data = RemotingCommand(code, opaque, 0, None, ext_fields, body, language=LanguageCode.PYTHON).encode()
        if len(data) >= LARGE_REQUEST:
            self._large[opaque] = len(data)
        self._write(data)
        # One sweep every TIMEOUT_SWEEP_S expires overdue requests: a timer per request cost 2.4 us each, and
        # asyncio.wait_for a task per request.
        self._deadlines[opaque] = (loop.time() + timeout, code, timeout)
        if self._sweeper is None:
            self._sweeper = loop.call_later(TIMEOUT_SWEEP_S, self._expire_overdue)
        try:
            if self._drain_waiter is not None:
                await self._drain_waiter
            return await fut
        finally:
            self.pending.pop(opaque, None)
            self._deadlines.pop(opaque, None)
            if self._large:
                self._large.pop(opaque, None)

    def _expire_overdue(self) -> None:
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for opaque, (deadline, code, timeout) in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[opaque]
                fut = self.pending.get(opaque)
                if fut is not None and not fut.done():
                    fut.set_exception(RequestTimeoutError(f"request {code} to {self.addr} timed out after "
                                                          f"{timeout} s"))
        if self._deadlines:
            self._sweeper = loop.call_later(TIMEOUT_SWEEP_S, self._expire_overdue)

    def oneway(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"") -> None:
        """Send a request that gets no response.

        Raises:
            ConnectionClosedError: the connection is closed.
        """
        if not self.is_open:
            raise ConnectionClosedError(f"connection to {self.addr} is closed")
        opaque = next(self._opaque) & 0x7FFFFFFF
        if self.credentials is not None:
            ext_fields = self.credentials.sign(ext_fields, body)
        self._write(RemotingCommand(code, opaque, FLAG_ONEWAY, None, ext_fields, body,
                                    language=LanguageCode.PYTHON).encode())

    def _write(self, data: bytes) -> None:
        """Requests made in one loop iteration leave in one system call."""
        if self._pending_writes is None:
            self._pending_writes = [data]
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._pending_writes.append(data)

    def _flush(self) -> None:
        pending, self._pending_writes = self._pending_writes, None
        if pending and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(pending))

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            await self.closed.wait()


class ConnectionPool:
    """One connection per address, reopened when it closed."""

    def __init__(self, handlers: dict[int, RequestHandler] | None = None, connect_timeout: float = 5.0,
                 credentials: Credentials | None = None, tls: ssl.SSLContext | None = None):
        self.handlers = handlers if handlers is not None else {}
        self.connect_timeout = connect_timeout
        self.credentials = credentials
        self.tls = tls
        self.connections: dict[str, Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def open_connection(self, addr: str) -> Connection | None:
        """The open connection to ``addr``, if there is one."""
        conn = self.connections.get(addr)
        return conn if conn is not None and conn.is_open else None

    async def get(self, addr: str) -> Connection:
        conn = self.connections.get(addr)
        if conn is not None and conn.is_open:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self.connections.get(addr)
            if conn is None or not conn.is_open:
                conn = await Connection.open(addr, self.handlers, self.connect_timeout, self.credentials, self.tls)
                self.connections[addr] = conn
            return conn

    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections.values() if c.is_open]

    async def close(self) -> None:
        conns, self.connections = list(self.connections.values()), {}
        for conn in conns:
            await conn.close()
