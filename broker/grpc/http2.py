"""gRPC over HTTP/2 on the broker's own event loop (the ``h2`` state machine; the sockets are asyncio's).

Why not grpcio's server: on this 2-core machine it cost 267-294 µs of CPU per call with handlers that did nothing
(its poller thread switching against the loop thread ~15,000 times a second, several tasks and completion-queue
round trips a call), against 41-68 µs for the broker's own work on a receive or a send; its gRPC clients then
missed a 50 ms p99 with no attack at all. Served here, a call is parsed, handled and answered in the loop that
handles it, and the answers of one loop iteration leave in one write.

What a client sees is gRPC as grpcio serves it: ``application/grpc`` over HTTP/2 (TLS with ALPN ``h2``), unary,
server-streaming and bidirectional calls, answers then ``grpc-status``/``grpc-message`` trailers, a call reset by
the client (its deadline passed, it cancelled) cancels its handler. Bounds:

- a request message longer than ``max_request`` is refused RESOURCE_EXHAUSTED from its length prefix; the rest of
  it is never buffered;
- at most ``max_streams`` calls open on a connection (SETTINGS_MAX_CONCURRENT_STREAMS): a call beyond it is reset
  REFUSED_STREAM (RFC 9113 5.1.2; the client may retry it), the connection and its other calls go on (h2 would
  close the whole connection, ``_H2Connection``);
- a call's ``grpc-timeout`` is its deadline: once it passes, the call is answered DEADLINE_EXCEEDED and its handler
  cancelled, whether or not the client reset it;
- PINGs are answered, PING_BURST in a row and then PINGS_PER_SECOND while the broker has nothing else to send on
  the connection: a client pinging faster gets a GOAWAY ENHANCE_YOUR_CALM (``too_many_pings``, as grpc-go says it)
  and the connection is closed (each PING costs an answer, and h2 answers every one);
- GOAWAY is graceful both ways (h2 closes the connection on sending or receiving one, python-hyper/h2#1181, so the
  calls in progress died with it): a client's GOAWAY NO_ERROR lets its calls in progress finish, for at most
  GOAWAY_GRACE_S, before the broker closes the connection; at shutdown each connection gets a first GOAWAY (the
  highest stream id: open no more), then, once a PING came back, a second naming the last stream served, and its
  calls in progress have the shutdown grace to finish;
- bytes of requests held incomplete on a connection: above ``max_held_bytes`` only the oldest incomplete request's
  stream is given more flow-control window (one always finishes), so the others wait in the client; and beyond
  128 KiB they are charged to the budget the remoting connections share (serverMaxBufferedFrameBytes);
- a streaming request's next messages are not acknowledged (window) until its handler took the ones before: a
  handler that stops reading stops its client sending;
- an answer is written only as fast as the client's flow-control window and the socket allow (``write`` waits);
  with the socket's buffer full the connection is not read either (h2 answers pings and settings by itself).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
from h2.connection import ConnectionInputs
from h2.errors import ErrorCodes
from h2.stream import StreamInputs
from hyperframe.frame import GoAwayFrame, RstStreamFrame

from ..transport import FrameBudget
from .recent import remember

log = logging.getLogger(__name__)

UNARY, SERVER_STREAM, BIDI = "unary", "server-stream", "bidi"
#: gRPC status codes the transport itself answers with
OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNIMPLEMENTED, RESOURCE_EXHAUSTED, UNAVAILABLE = \
    0, 1, 2, 4, 13, 12, 8, 14
#: grpc-timeout: at most 8 digits and a unit (gRPC over HTTP/2), in seconds per unit
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
STREAM_WINDOW = 64 << 10  #: flow-control window of each call's request, bytes: what a call may send unacknowledged
_PREFIX = struct.Struct(">BI")
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"),
                     (b"grpc-accept-encoding", b"identity"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
#: an HTTP/2 frame's header (RFC 9113 4.1; its 24-bit length as 16 and 8 bits), as hyperframe packs it
_FRAME_HEADER = struct.Struct(">HBBBL")
_DATA, _HEADERS, _END_STREAM, _END_HEADERS = 0x0, 0x1, 0x1, 0x4


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: its kind, how its requests are parsed and its answers serialized, and its handler.

    A unary handler is ``async (request, context) -> response``; a server-streaming one is ``async (request,
    context)`` writing with ``context.write`` or an async generator; a bidirectional one an async generator of
    ``(requests, context)``, ``requests`` an async iterator."""

    kind: str
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]
    handler: Callable


class CallContext:
    """What a handler knows of its call, in grpc.aio's terms (``peer()``, ``invocation_metadata()``, ``write``)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: "_Stream"):
        self._stream = stream

    def peer(self) -> str:
        return self._stream.conn.peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._stream.metadata

    async def write(self, message) -> None:
        await self._stream.write(self._stream.method.serialize(message))


class _Requests:
    """A bidirectional call's request messages, as its handler takes them."""

    def __init__(self, stream: "_Stream"):
        self._stream = stream

    def __aiter__(self):
        return self

    async def __anext__(self):
        stream = self._stream
        while not stream.inbox:
            if stream.remote_ended:
                raise StopAsyncIteration
            stream.inbox_waiter = asyncio.get_running_loop().create_future()
            await stream.inbox_waiter
        request = stream.inbox.popleft()
        if not stream.inbox:
            stream.conn.acknowledge(stream)  # taken: the client may send the next ones
        return request


def grpc_timeout(value: bytes) -> float | None:
    """A grpc-timeout header's seconds; None for a malformed one (the call then has no deadline, as grpc-go)."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


def _read_headers(headers) -> tuple[str, float | None, tuple[tuple[str, str], ...]]:
    """A request's path, its deadline's seconds (``grpc_timeout``, None without one) and its text metadata."""
    path = b""
    timeout = None
    metadata = []
    for name, value in headers:
        if name == b":path":
            path = value
        elif name == b"grpc-timeout":
            timeout = grpc_timeout(value)
        elif name[:1] != b":":
            try:
                metadata.append((name.decode("ascii"), value.decode("utf-8")))
            except UnicodeDecodeError:
                continue  # not text: no handler reads it
    return path.decode("latin-1"), timeout, tuple(metadata)


#: PINGs a connection may send while the broker sends it nothing else: at once, and then per second
PING_BURST, PINGS_PER_SECOND = 100, 10
#: how long the calls in progress of a client that sent GOAWAY may take to finish, s
GOAWAY_GRACE_S = 10.0
#: how long shutdown waits for a PING to come back between its two GOAWAYs (the client's round trip), s
GOAWAY_NOTICE_S = 1.0
_LAST_STREAM_ID = (1 << 31) - 1
#: header blocks each connection remembers (``_ReusingDecoder``, ``_ReusingEncoder``)
REUSED_BLOCKS = 32
#: a request's headers are remembered as read (``_Connection.requests_read``) up to this size, bytes
REUSED_HEADERS_BYTES = 4096


class _TableWatch:
    """Tells whether an HPACK dynamic table changed since ``remember``: entries are only added at the front (a new
    tuple, held here so that no other can take its place) and evicted at the back, so its first entry, its length
    and its size limit (with a size update pending) say it all."""

    __slots__ = ("first", "rest")

    def __init__(self) -> None:
        self.first, self.rest = None, None

    def same(self, table) -> bool:
        entries = table.dynamic_entries
        return (entries[0] if entries else None) is self.first and \
            (len(entries), table.maxsize, table.resized) == self.rest

    def remember(self, table) -> None:
        entries = table.dynamic_entries
        self.first, self.rest = entries[0] if entries else None, (len(entries), table.maxsize, table.resized)


class _ReusingDecoder(hpack.Decoder):
    """hpack's decoder, giving back the headers of a block it decoded before while its dynamic table is as it was
    then. A client's calls repeat the same block, every header indexed and none added, which decodes alike as long
    as the table is; decoding one was a fifth of the broker's CPU per gRPC send."""

    def __init__(self) -> None:
        super().__init__()
        self._decoded: dict[bytes, tuple] = {}
        self._table = _TableWatch()

    def decode(self, data: bytes, raw: bool = False):
        table = self.header_table
        if not self._table.same(table):
            self._decoded.clear()
            self._table.remember(table)
        elif raw:
            headers = self._decoded.get(data)
            if headers is not None:
                return list(headers)
        headers = super().decode(data, raw)
        if raw and self._table.same(table):  # the block changed nothing
            if len(self._decoded) >= REUSED_BLOCKS:
                self._decoded.clear()
            self._decoded[bytes(data)] = tuple(headers)
        return headers


class _ReusingEncoder(hpack.Encoder):
    """hpack's encoder, giving back the block it encoded for the same headers while its dynamic table is as it
    was then: the answers' headers and OK trailers are the same for every call, and once in the table they encode
    to the same indexed block, changing nothing."""

    def __init__(self) -> None:
        super().__init__()
        self._encoded: dict[tuple, bytes] = {}
        self._table = _TableWatch()

    def encode(self, headers, huffman: bool = True) -> bytes:
        table = self.header_table
        # h2 hands over a list of tuples; a HeaderTuple (NeverIndexedHeaderTuple) equals its plain tuple but encodes
        # otherwise, so only plain tuples are looked up
        key = tuple(headers) if type(headers) in (list, tuple) and all(type(h) is tuple for h in headers) else None
        if not self._table.same(table):
            self._encoded.clear()
            self._table.remember(table)
        elif key is not None:
            block = self._encoded.get(key)
            if block is not None:
                return block
        block = super().encode(headers, huffman)
        if key is not None and self._table.same(table):
            if len(self._encoded) >= REUSED_BLOCKS:
                self._encoded.clear()
            self._encoded[key] = block
        return block

    def reused(self, headers) -> bytes | None:
        """The block ``encode`` would give back for ``headers`` (a tuple of plain tuples) without encoding them
        anew, or None: what it encodes changes nothing then, so it may be left uncalled."""
        if type(headers) is not tuple or not self._table.same(self.header_table):
            return None
        block = self._encoded.get(headers)
        if block is None or not all(type(h) is tuple for h in headers):
            return None
        return block


class _H2Connection(h2.connection.H2Connection):
    """h2's connection with header blocks reused (``_ReusingDecoder``, ``_ReusingEncoder``), less its own
    SETTINGS_MAX_CONCURRENT_STREAMS check: it closes the whole connection when a client opens one stream too many
    (TooManyStreamsError), where RFC 9113 allows refusing that stream alone (``_Connection._request``). Its count
    also walked every stream for each new one."""

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config=config)
        decoder = _ReusingDecoder()
        decoder.max_header_list_size = self.decoder.max_header_list_size
        self.decoder, self.encoder = decoder, _ReusingEncoder()

    def send_headers(self, stream_id, headers, end_stream=False, priority_weight=None, priority_depends_on=None,
                     priority_exclusive=None):
        """h2's, with a header block the encoder gives back (``_ReusingEncoder.reused``: the answers' headers and
        trailers of every call) written as its HEADERS frame at once: the same state transitions of the connection
        and the stream, by h2's state machines, and the same bytes, without the frame objects, header checks
        (turned off) and per-header encoding h2 goes through for each. It was a third of the transport's CPU per
        call. tests/grpc_endpoint/test_http2.py checks the bytes and states against h2's own."""
        stream = self.streams.get(stream_id)
        block = self.encoder.reused(headers) if stream is not None else None
        if block is None or len(block) > self.max_outbound_frame_size or priority_weight is not None or \
                priority_depends_on is not None or priority_exclusive is not None or \
                headers[0][0] == b":status" and headers[0][1][:1] == b"1":  # informational: h2's own way
            return super().send_headers(stream_id, headers, end_stream, priority_weight, priority_depends_on,
                                        priority_exclusive)
        self.state_machine.process_input(ConnectionInputs.SEND_HEADERS)
        machine = stream.state_machine
        machine.process_input(StreamInputs.SEND_HEADERS)
        flags = _END_HEADERS
        if end_stream:
            machine.process_input(StreamInputs.SEND_END_STREAM)
            flags |= _END_STREAM
        if machine.trailers_sent and not end_stream:
            raise h2.exceptions.ProtocolError("Trailers must have END_STREAM set.")
        stream.request_method = None  # what h2 reads of an answer's headers: no :method
        self._data_to_send += _FRAME_HEADER.pack(len(block) >> 8, len(block) & 0xFF, _HEADERS, flags, stream_id)
        self._data_to_send += block

    def send_data(self, stream_id, data, end_stream=False, pad_length=None):
        """h2's, without padding, its DATA frame written at once (as ``send_headers``): h2's checks of the flow-control
        window and the frame size, the same state transitions by h2's state machines, the windows counted down."""
        stream = self.streams.get(stream_id)
        if stream is None or pad_length is not None:
            return super().send_data(stream_id, data, end_stream, pad_length)
        size = len(data)
        if size > 0 and size > self.local_flow_control_window(stream_id):
            raise h2.exceptions.FlowControlError(f"Cannot send {size} bytes, flow control window is "
                                                 f"{self.local_flow_control_window(stream_id)}")
        if size > self.max_outbound_frame_size:
            raise h2.exceptions.FrameTooLargeError(f"Cannot send frame size {size}, max frame size is "
                                                   f"{self.max_outbound_frame_size}")
        self.state_machine.process_input(ConnectionInputs.SEND_DATA)
        machine = stream.state_machine
        machine.process_input(StreamInputs.SEND_DATA)
        flags = 0
        if end_stream:
            machine.process_input(StreamInputs.SEND_END_STREAM)
            flags = _END_STREAM
        stream.outbound_flow_control_window -= size
        self._data_to_send += _FRAME_HEADER.pack(size >> 8, size & 0xFF, _DATA, flags, stream_id)
        self._data_to_send += data
        self.outbound_flow_control_window -= size

    def _receive_goaway_frame(self, frame):
        """A GOAWAY NO_ERROR is the client leaving: h2 closed the connection at once (python-hyper/h2#1181) and
        dropped what was still to send; here it stays open for the calls in progress (``_Connection.leave``)."""
        if frame.error_code != ErrorCodes.NO_ERROR:
            return super()._receive_goaway_frame(frame)
        event = h2.events.ConnectionTerminated()
        event.error_code, event.last_stream_id = ErrorCodes.NO_ERROR, frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]

    def _receive_frame(self, frame):
        # h2's own, less its first line: ``logger.trace("Received frame: %s", repr(frame))`` built the repr of every
        # frame received (a hex dump of its whole body: ~30 us of a 1 KiB send, milliseconds of a 4 MiB one) for a
        # logger that drops it. tests/grpc_endpoint/test_http2.py checks that h2's is still this plus that line.
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except h2.exceptions.StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise h2.exceptions.StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events

    @property
    def open_inbound_streams(self) -> int:
        if len(self.streams) > 2 * self.local_settings.max_concurrent_streams:
            super().open_inbound_streams  # h2 forgets its closed streams as it counts
        return 0


class _Stream:
    __slots__ = ("conn", "id", "method", "metadata", "buffer", "needed", "task", "inbox", "inbox_waiter",
                 "remote_ended", "headers_sent", "closed", "window_waiter", "unacked", "deadline")

    def __init__(self, conn: "_Connection", stream_id: int, method: Method, metadata):
        self.conn, self.id, self.method, self.metadata = conn, stream_id, method, metadata
        self.buffer = bytearray()
        self.needed = 5  #: bytes the message being read needs in ``buffer`` (its prefix, then prefix and body)
        self.task: asyncio.Task | None = None
        self.inbox: deque = deque()
        self.inbox_waiter: asyncio.Future | None = None
        self.remote_ended = False
        self.headers_sent = False
        self.closed = False
        self.window_waiter: asyncio.Future | None = None
        self.unacked = 0  #: flow-controlled bytes received and not yet acknowledged
        self.deadline: asyncio.TimerHandle | None = None  #: grpc-timeout's

    def wake_reader(self) -> None:
        if self.inbox_waiter is not None and not self.inbox_waiter.done():
            self.inbox_waiter.set_result(None)

    def wake_writer(self) -> None:
        self.conn.blocked.discard(self)
        if self.window_waiter is not None and not self.window_waiter.done():
            self.window_waiter.set_result(None)

    async def write(self, payload: bytes) -> None:
        """Send one answer message, as fast as the stream's window and the socket take it."""
        conn = self.conn
        data = memoryview(_PREFIX.pack(0, len(payload)) + payload)
        while True:
            if self.closed:
                raise asyncio.CancelledError("the call was reset")
            if conn.paused is not None:
                await conn.paused
                continue
            h2c = conn.h2
            try:
                if not self.headers_sent:
                    h2c.send_headers(self.id, _RESPONSE_HEADERS)
                    self.headers_sent = True
                window = min(h2c.local_flow_control_window(self.id), h2c.max_outbound_frame_size)
                if window > 0:
                    chunk, data = data[:window], data[window:]
                    h2c.send_data(self.id, chunk.tobytes())
            except h2.exceptions.H2Error:  # the connection is closing (GOAWAY, a protocol error)
                self.closed = True
                raise asyncio.CancelledError("the connection is closing") from None
            conn.flush_soon()
            if not data:
                return
            if window <= 0:
                self.window_waiter = asyncio.get_running_loop().create_future()
                conn.blocked.add(self)
                await self.window_waiter

    def finish(self, code: int = OK, message: str = "", response: bytes | None = None) -> None:
        """End the call: its answer if it fits the window now (else it is written first), then the trailers."""
        if self.closed:
            return
        if response is not None:
            framed = _PREFIX.pack(0, len(response)) + response
            h2c = self.conn.h2
            try:
                fits = (self.conn.paused is None and len(framed) <= h2c.max_outbound_frame_size
                        and len(framed) <= h2c.local_flow_control_window(self.id))
                if fits:
                    h2c.send_headers(self.id, _RESPONSE_HEADERS)
                    h2c.send_data(self.id, framed)
                    self.headers_sent = True
            except h2.exceptions.H2Error:  # the connection is closing: nothing more can be said on it
                self.conn.forget(self)
                return
            if not fits:
                task = asyncio.ensure_future(self._write_then_finish(response))
                self.conn.tasks.add(task)
                task.add_done_callback(self.conn.tasks.discard)
                return
        self._send_trailers(code, message)

    async def _write_then_finish(self, response: bytes) -> None:
        try:
            await self.write(response)
        except asyncio.CancelledError:
            return
        self._send_trailers(OK, "")

    def _send_trailers(self, code: int, message: str) -> None:
        trailers = [(b"grpc-status", str(code).encode())]
        if message:
            trailers.append((b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()))
        h2c = self.conn.h2
        try:
            if self.headers_sent:
                h2c.send_headers(self.id, _OK_TRAILERS if code == OK and not message else trailers, end_stream=True)
            else:  # trailers-only
                h2c.send_headers(self.id, _RESPONSE_HEADERS[:2] + tuple(trailers), end_stream=True)
            if not self.remote_ended:  # the rest of the request is not wanted
                h2c.reset_stream(self.id, ErrorCodes.NO_ERROR)
        except h2.exceptions.H2Error:  # the stream or connection closed meanwhile
            pass
        self.conn.flush_soon()
        self.conn.forget(self)


class _Connection(asyncio.Protocol):
    def __init__(self, server: "Http2GrpcServer"):
        self.server = server
        # Header validation and normalisation cost as much as the rest of a call (measured: half the broker's CPU
        # per gRPC send); the only headers read are :path and text metadata, bounded by MAX_HEADER_LIST_SIZE.
        config = h2.config.H2Configuration(client_side=False, header_encoding=None, validate_inbound_headers=False,
                                           normalize_inbound_headers=False, validate_outbound_headers=False,
                                           normalize_outbound_headers=False, split_outbound_cookies=False)
        self.h2 = _H2Connection(config=config)
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: server.max_streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 16,
        })
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown:"
        self.streams: dict[int, _Stream] = {}
        #: streams whose request is incomplete, oldest first, and the bytes they hold
        self.incomplete: dict[int, _Stream] = {}
        self.held = 0  #: bytes in ``incomplete``
        self.charged = 0  #: what ``held`` takes of the broker's shared budget (FrameBudget)
        self.waiting_for_budget = False  #: set and cleared by the budget
        self.tasks: set[asyncio.Future] = set()
        self.blocked: set[_Stream] = set()  #: streams whose answer waits for flow-control window
        self.paused: asyncio.Future | None = None  #: set while the socket's write buffer is full
        self._flush_pending = False
        self.last_active = time.monotonic()  #: when the client last sent anything (Http2GrpcServer.close_idle)
        self.ping_tokens = float(PING_BURST)  #: PINGs the client may send now (``_pinged``)
        #: new streams above this are refused (a GOAWAY named it); ``leaving``: the connection closes once its
        #: streams are done (the client's GOAWAY, or shutdown)
        self.last_stream_id = _LAST_STREAM_ID
        self.leaving = False
        self.round_trip: asyncio.Future | None = None  #: shutdown's PING, until it comes back
        self.on_closed: asyncio.Future | None = None  #: shutdown waits on it
        self.last_ping = self.last_active
        #: what ``_read_headers`` read of the requests' headers lately: a client's calls repeat theirs
        self.requests_read: dict[tuple, tuple[str, float | None, tuple]] = {}

    # --- asyncio.Protocol ---
    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.server.max_connections:
            log.warning("gRPC connection refused: %d connections already", len(self.server.connections))
            transport.close()
            return
        self.server.connections.add(self)
        address = transport.get_extra_info("peername") or ("", 0)
        self.peer = f"ipv6:[{address[0]}]:{address[1]}" if ":" in str(address[0]) else \
            f"ipv4:{address[0]}:{address[1]}"
        self.h2.initiate_connection()
        # the connection's own window: every stream's window together, so no stream's unread window starves others
        self.h2.increment_flow_control_window(self.server.max_streams * STREAM_WINDOW)
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("gRPC connection %s closed: %s", self.peer, exc)
            self.flush()
            self.transport.close()
            return
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                self._data(event)
            elif kind is h2.events.RequestReceived:
                self._request(event)
            elif kind is h2.events.StreamEnded:
                self._ended(event.stream_id)
            elif kind is h2.events.WindowUpdated:
                if event.stream_id:
                    stream = self.streams.get(event.stream_id)
                    if stream is not None:
                        stream.wake_writer()
                else:
                    self._wake_writers()
            elif kind is h2.events.StreamReset:
                self._reset(event.stream_id)
            elif kind is h2.events.RemoteSettingsChanged:
                self._wake_writers()  # a new initial window changes every stream's
            elif kind is h2.events.PingReceived:
                if not self._pinged():
                    return
            elif kind is h2.events.PingAckReceived:
                if self.round_trip is not None and not self.round_trip.done():
                    self.round_trip.set_result(None)
            elif kind is h2.events.ConnectionTerminated:
                if event.error_code != ErrorCodes.NO_ERROR:
                    self.transport.close()
                    return
                self.leave(GOAWAY_GRACE_S)
        self.flush()

    def go_away(self, last_stream_id: int) -> None:
        """Send a GOAWAY NO_ERROR naming ``last_stream_id`` without closing the connection (h2 would: it is
        written here, after what h2 has to send); streams above it are refused from now on."""
        if self.transport is None or self.transport.is_closing():
            return
        self.last_stream_id = min(self.last_stream_id, last_stream_id)
        self.flush()
        self.transport.write(GoAwayFrame(0, last_stream_id=last_stream_id,
                                         error_code=ErrorCodes.NO_ERROR).serialize())

    def leave(self, grace_s: float) -> None:
        """The connection serves its calls in progress, for at most ``grace_s``, then closes."""
        if self.leaving:
            return
        self.leaving = True
        asyncio.get_running_loop().call_later(grace_s, self.close)
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.leaving and not self.streams:
            self.close()

    def close(self) -> None:
        """GOAWAY (h2's: the connection is done) and close; calls still in progress are cancelled."""
        if self.transport is None:
            return
        try:  # a GOAWAY never names a later stream than one before it (RFC 9113 6.8)
            self.h2.close_connection(last_stream_id=min(self.last_stream_id, self.h2.highest_inbound_stream_id))
        except h2.exceptions.H2Error:
            pass
        self.flush()
        self.transport.close()

    def _pinged(self) -> bool:
        """Count a PING against the connection's allowance (refilled by whatever else the broker sends it,
        ``flush_soon``); False once it is closed for a flood."""
        now = time.monotonic()
        self.ping_tokens = min(PING_BURST, self.ping_tokens + (now - self.last_ping) * PINGS_PER_SECOND) - 1
        self.last_ping = now
        if self.ping_tokens >= 0:
            return True
        log.warning("closing gRPC connection %s: PINGs faster than %d a second while nothing else was said",
                    self.peer, PINGS_PER_SECOND)
        try:
            self.h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM, additional_data=b"too_many_pings")
        except h2.exceptions.H2Error:
            pass
        self.flush()
        self.transport.close()
        return False

    def pause_writing(self) -> None:
        if self.paused is None:
            self.paused = asyncio.get_running_loop().create_future()
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        paused, self.paused = self.paused, None
        if paused is not None:
            paused.set_result(None)
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        if self.on_closed is not None and not self.on_closed.done():
            self.on_closed.set_result(None)
        self.server.frame_budget.forget(self)
        for stream in list(self.streams.values()):
            self._reset(stream.id)
        self.transport = None  # its requests' charge goes back to the budget, and nothing waits again
        self.incomplete.clear()
        self._recount()
        for task in list(self.tasks):
            task.cancel()
        if self.paused is not None:
            self.paused.set_result(None)
            self.paused = None

    # --- writing ---
    def flush_soon(self) -> None:
        """Write what h2 has to send once this loop iteration is done: the answers of concurrent calls leave
        in one write."""
        self.ping_tokens = PING_BURST  # the connection is in use: its client's PINGs measure it
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_pending = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _wake_writers(self) -> None:
        for stream in list(self.blocked):
            stream.wake_writer()

    # --- requests ---
    def _request(self, event) -> None:
        if len(self.streams) >= self.server.max_streams or self.leaving or event.stream_id > self.last_stream_id:
            self.h2.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
            return
        key = tuple(event.headers)
        read = self.requests_read.get(key)
        if read is None:
            read = _read_headers(key)
            remember(self.requests_read, key, read, key, REUSED_BLOCKS, REUSED_HEADERS_BYTES)
        path, timeout, metadata = read
        method = self.server.methods.get(path)
        if method is None:
            self._refuse(event.stream_id, UNIMPLEMENTED, f"method {path} is not served")
            return
        stream = _Stream(self, event.stream_id, method, metadata)
        self.streams[stream.id] = stream
        if timeout is not None:
            stream.deadline = asyncio.get_running_loop().call_later(timeout, self._deadline_passed, stream.id)
        if method.kind == BIDI:
            self._start(stream, _Requests(stream))

    def _deadline_passed(self, stream_id: int) -> None:
        self._refuse(stream_id, DEADLINE_EXCEEDED, "the call's deadline (grpc-timeout) passed")
        self.flush()

    def _refuse(self, stream_id: int, code: int, message: str) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            stream = _Stream(self, stream_id, None, ())
            self.streams[stream_id] = stream
        if stream.task is not None:
            stream.task.cancel()
        stream.finish(code, message)

    def _data(self, event) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None or stream.closed:  # answered already (refused): acknowledged and dropped
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        stream.unacked += event.flow_controlled_length
        buffer, data = stream.buffer, event.data
        if not buffer and len(data) >= 5:  # a whole message alone (a unary request): taken as it came
            compressed, length = _PREFIX.unpack_from(data)
            if len(data) == 5 + length and not compressed and length <= self.server.max_request:
                self._message(stream, data[5:])
                if not stream.closed:
                    self._account(stream)
                return
        buffer += data
        while len(buffer) >= stream.needed:
            compressed, length = _PREFIX.unpack_from(buffer)
            if length > self.server.max_request:
                self._forget_incomplete(stream)
                self._refuse(stream.id, RESOURCE_EXHAUSTED,
                             f"grpc: received message larger than max ({length} vs. {self.server.max_request})")
                return
            if compressed:
                self._forget_incomplete(stream)
                self._refuse(stream.id, UNIMPLEMENTED, "compressed messages are not accepted (grpc-accept-encoding "
                                                       "identity)")
                return
            if len(buffer) < 5 + length:
                stream.needed = 5 + length
                break
            payload = bytes(buffer[5:5 + length])
            del buffer[:5 + length]
            stream.needed = 5
            self._message(stream, payload)
            if stream.closed:
                return
        self._account(stream)

    def _account(self, stream: _Stream) -> None:
        """Acknowledge what the stream's request holds, within the connection's budget of incomplete requests."""
        if stream.buffer:
            self.incomplete[stream.id] = stream  # an incomplete request keeps its place in line
        elif self.incomplete.pop(stream.id, None) is None:
            self.acknowledge(stream)
            return
        self._recount()
        if stream.buffer:
            if not self.waiting_for_budget and (self.held <= self.server.max_held_bytes
                                                or next(iter(self.incomplete)) == stream.id):
                self.acknowledge(stream)
            # else it waits, unacknowledged, until the budgets allow (``_release``)
        else:
            self.acknowledge(stream)
            self._release()

    def acknowledge(self, stream: _Stream) -> None:
        """Give back the window of what the stream received (a bidirectional stream's only once its handler took
        the messages waiting)."""
        if stream.unacked and not (stream.inbox and stream.method.kind == BIDI and not stream.closed):
            self.h2.acknowledge_received_data(stream.unacked, stream.id)
            stream.unacked = 0
            self.flush_soon()

    def _recount(self) -> None:
        """``held`` anew, and this connection's charge on the broker's budget of incomplete requests, shared with
        the remoting connections (serverMaxBufferedFrameBytes): over it, no request of this connection gets more
        window until others' requests complete (``budget_granted``), for at most serverBufferedFrameWaitSeconds."""
        self.held = sum(len(s.buffer) for s in self.incomplete.values())
        self.server.frame_budget.charge(self, self.held,
                                        self.transport is not None and not self.transport.is_closing())

    def budget_granted(self) -> None:
        self._release()

    def budget_timed_out(self) -> None:
        if self.transport is not None:
            log.warning("closing gRPC connection %s: it waited %ss for room to buffer its requests "
                        "(serverMaxBufferedFrameBytes=%d in use by other connections' incomplete requests)",
                        self.peer, self.server.frame_budget.wait_seconds, self.server.frame_budget.limit)
            self.transport.abort()

    def _release(self) -> None:
        """Incomplete requests that waited for the budgets, oldest first, while they allow."""
        if self.waiting_for_budget:
            return
        for index, stream in enumerate(list(self.incomplete.values())):
            if index and self.held > self.server.max_held_bytes:
                break
            self.acknowledge(stream)

    def _forget_incomplete(self, stream: _Stream) -> None:
        stream.buffer.clear()
        if self.incomplete.pop(stream.id, None) is not None:
            self._recount()
            self._release()

    def _message(self, stream: _Stream, payload: bytes) -> None:
        method = stream.method
        try:
            request = method.deserialize(payload)
        except Exception as exc:  # a message that does not parse: this call fails, the connection goes on
            self._forget_incomplete(stream)
            self._refuse(stream.id, INTERNAL, f"the request does not parse: {type(exc).__name__}: {exc}")
            return
        if method.kind == BIDI:
            stream.inbox.append(request)
            stream.wake_reader()
        elif stream.task is None:
            self._start(stream, request)
        # a second message of a unary call is ignored, as its answer is already on its way

    def _ended(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.remote_ended = True
        if stream.buffer:  # it ended within a message
            self._forget_incomplete(stream)
            self._refuse(stream_id, INTERNAL, "the request ended within a message")
            return
        if stream.method.kind == BIDI:
            stream.wake_reader()
        elif stream.task is None and not stream.closed:
            self._refuse(stream_id, INTERNAL, "the request has no message")

    def _reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        stream.closed = True
        if stream.deadline is not None:
            stream.deadline.cancel()
        self._forget_incomplete(stream)
        self.acknowledge(stream)  # the connection's window
        if stream.task is not None:
            stream.task.cancel()
        stream.wake_writer()
        stream.wake_reader()
        self._close_if_done()

    def forget(self, stream: _Stream) -> None:
        """The call is answered: what more arrives for it is acknowledged and dropped."""
        stream.closed = True
        if stream.deadline is not None:
            stream.deadline.cancel()
        self.streams.pop(stream.id, None)
        self._forget_incomplete(stream)
        self.acknowledge(stream)
        stream.wake_writer()
        if self.leaving and not self.streams:
            asyncio.get_running_loop().call_soon(self._close_if_done)  # after the answer's flush

    # --- handlers ---
    def _start(self, stream: _Stream, request) -> None:
        stream.task = task = asyncio.ensure_future(self._run(stream, request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, stream: _Stream, request) -> None:
        method, context = stream.method, CallContext(stream)
        try:
            if method.kind == UNARY:
                response = await method.handler(request, context)
                stream.finish(response=method.serialize(response))
                return
            result = method.handler(request, context)
            if inspect.isasyncgen(result):
                async for item in result:
                    await stream.write(method.serialize(item))
            else:
                await result
            stream.finish()
        except asyncio.CancelledError:
            if not stream.closed:  # the server is stopping: the call ends unanswered
                stream.finish(UNAVAILABLE, "the broker is shutting down")
        except Exception as exc:
            log.exception("gRPC call %s failed", stream.method)
            stream.finish(UNKNOWN, f"{type(exc).__name__}: {exc}")


class Http2GrpcServer:
    """Serves ``methods`` (``/package.Service/Method`` → Method) on one listening socket."""

    def __init__(self, methods: dict[str, Method], *, max_request: int, max_streams: int, max_held_bytes: int,
                 max_connections: int, frame_budget: FrameBudget):
        self.methods = methods
        self.max_request = max_request
        self.max_streams = max_streams
        self.max_held_bytes = max_held_bytes
        self.max_connections = max_connections
        self.frame_budget = frame_budget
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, listen: Callable[[Callable[[], asyncio.Protocol]], Awaitable]) -> int:
        """Serve on the listening socket ``listen(protocol_factory)`` makes (an asyncio Server; with TLS its
        context offers ALPN ``h2``); returns the bound port."""
        self._server = await listen(lambda: _Connection(self))
        return self._server.sockets[0].getsockname()[1]

    def close_idle(self, idle_seconds: float) -> None:
        """Close (GOAWAY, then the socket) every connection whose client sent nothing for ``idle_seconds``
        (serverChannelMaxIdleTimeSeconds, as remoting connections): RocketMQ 5 clients heartbeat every 10 s, and a
        connection held open without a word kept its place under serverMaxConnections for ever. Its calls in
        progress are cancelled with it."""
        cutoff = time.monotonic() - idle_seconds
        for conn in list(self.connections):
            if conn.last_active < cutoff and conn.transport is not None:
                log.info("closing idle gRPC connection %s", conn.peer)
                conn.close()

    async def stop(self, grace_s: float) -> None:
        """Listen no more and go away in two steps: a GOAWAY of the highest stream id (open no more), a PING's round
        trip later (at most GOAWAY_NOTICE_S) a GOAWAY naming the last stream served, whose calls in progress then
        have ``grace_s`` to end; what is left is cancelled and the connections closed."""
        if self._server is None:
            return
        self._server.close()
        connections = [conn for conn in self.connections if conn.transport is not None]
        loop = asyncio.get_running_loop()
        for conn in connections:
            conn.go_away(_LAST_STREAM_ID)
            conn.round_trip = loop.create_future()
            try:
                conn.h2.ping(b"goaway!!")
            except h2.exceptions.H2Error:
                conn.round_trip.set_result(None)
            conn.flush()
        if connections:
            await asyncio.wait([conn.round_trip for conn in connections], timeout=GOAWAY_NOTICE_S)
        for conn in connections:
            conn.go_away(conn.h2.highest_inbound_stream_id)
            conn.leave(grace_s)
        ended = [loop.create_future() for _ in connections]
        for conn, done in zip(connections, ended):
            conn.on_closed = done
            if conn.transport is None:
                done.set_result(None)
        if ended:
            await asyncio.wait(ended, timeout=grace_s + 1)
        for conn in list(self.connections):
            for task in list(conn.tasks):
                task.cancel()
            conn.close()
        await self._server.wait_closed()
        self._server = None
