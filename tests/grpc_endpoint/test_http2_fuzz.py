"""The gRPC door's HTTP/2 rules under random input (issue 43: "the fuzzer covers the new paths"): sequences of
calls with good and bad ``grpc-timeout`` values, messages cut anywhere, resets, PINGs in floods, window updates,
SETTINGS changes (the stream limit), GOAWAYs and raw frames of any type, on one broker. After each sequence the
connection still answers a PING or is closed (never a hang), a fresh connection's call completes, and the broker's
loop reported no unhandled error."""
from __future__ import annotations

import select
import socket
import struct

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halfmq.broker.grpc.schema import SERVICE

from tests.support.broker_thread import BrokerThread

from .test_http2 import RawClient, prefix

pytestmark = [pytest.mark.grpc, pytest.mark.slow, pytest.mark.xdist_group("http2-fuzz")]

PATHS = [f"/{SERVICE}/SendMessage", f"/{SERVICE}/QueryRoute", f"/{SERVICE}/ReceiveMessage",
         f"/{SERVICE}/Telemetry", f"/{SERVICE}/EndTransaction", "/not.a.Service/Nothing", "no-slash"]
TIMEOUTS = [None, "1m", "0n", "10S", "99999999H", "123456789S", "x", "-1m", "1", "5u", "1000000000000M"]

call = st.tuples(st.just("call"), st.sampled_from(PATHS), st.sampled_from(TIMEOUTS))
data = st.tuples(st.just("data"), st.integers(0, 7),
                 st.one_of(st.binary(max_size=64),
                           st.builds(lambda n, c, tail: prefix(n, c) + tail, st.integers(0, 1 << 32 - 1),
                                     st.booleans(), st.binary(max_size=32))),
                 st.booleans())
reset = st.tuples(st.just("reset"), st.integers(0, 7), st.integers(0, 15))
ping = st.tuples(st.just("ping"), st.integers(1, 40))
window = st.tuples(st.just("window"), st.integers(-1, 7), st.integers(1, (1 << 31) - 1))
setting = st.tuples(st.just("settings"), st.sampled_from([0x3, 0x4, 0x5, 0x6]), st.integers(0, 1 << 24))
goaway = st.tuples(st.just("goaway"), st.integers(0, 13))
raw = st.tuples(st.just("raw"), st.integers(0, 12), st.integers(0, 255), st.integers(0, 99),
                st.binary(max_size=40), st.integers(-8, 8))
actions = st.lists(st.one_of(call, call, data, data, reset, ping, window, setting, goaway, raw),
                   min_size=1, max_size=30)


@pytest.fixture(scope="module")
def fuzzed_broker(tmp_path_factory):
    bt = BrokerThread(tmp_path_factory.mktemp("http2-fuzz"), grpcListenPort=0)
    errors: list[dict] = []
    bt.loop.call_soon_threadsafe(bt.loop.set_exception_handler, lambda _loop, context: errors.append(context))
    yield bt, errors
    bt.stop()


def endpoint(bt) -> tuple[str, int]:
    return "127.0.0.1", bt.broker.grpc_port


def raw_frame(kind: int, flags: int, stream_id: int, payload: bytes, length_skew: int) -> bytes:
    """A frame as it goes on the wire, its declared length off by ``length_skew`` (a frame cut short, or run on)."""
    length = max(0, len(payload) + length_skew)
    return struct.pack(">I", length)[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


class FuzzClient:
    """A client-side h2 connection that carries out ``actions``; after a raw frame its h2 state no longer matches
    the wire, so it only writes bytes from then on."""

    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.streams: list[int] = []
        self.raw_sent = False
        self.closed = False
        self.flush()

    def flush(self) -> None:
        if not self.raw_sent and not self.closed:
            self._write(self.h2.data_to_send())

    def _write(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def read_ready(self) -> list:
        """What the broker sent so far, without waiting."""
        events = []
        while not self.closed and select.select([self.sock], [], [], 0)[0]:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            if not self.raw_sent:
                try:
                    events += self.h2.receive_data(data)
                except h2.exceptions.ProtocolError:
                    self.raw_sent = True  # our h2 disagrees with the broker's: from here on, bytes only
        self.flush()
        return events

    def stream(self, index: int) -> int | None:
        return self.streams[index % len(self.streams)] if self.streams else None

    def act(self, action) -> None:
        kind = action[0]
        if kind == "raw":
            self.raw_sent = True
            self._write(raw_frame(*action[1:]))
            return
        if self.raw_sent or self.closed:
            return
        try:
            if kind == "call":
                _, path, timeout = action
                stream_id = self.h2.get_next_available_stream_id()
                headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "halfmq"),
                           ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", "fuzz@1")]
                if timeout is not None:
                    headers.append(("grpc-timeout", timeout))
                self.h2.send_headers(stream_id, headers)
                self.streams.append(stream_id)
            elif kind == "data" and (stream_id := self.stream(action[1])) is not None:
                self.h2.send_data(stream_id, action[2], end_stream=action[3])
            elif kind == "reset" and (stream_id := self.stream(action[1])) is not None:
                self.h2.reset_stream(stream_id, action[2])
            elif kind == "ping":
                for i in range(action[1]):
                    self.h2.ping(struct.pack(">Q", i))
            elif kind == "window":
                self.h2.increment_flow_control_window(action[2], stream_id=self.stream(action[1])
                                                      if action[1] >= 0 else None)
            elif kind == "settings":
                self.h2.update_settings({action[1]: action[2]})
            elif kind == "goaway":
                self.h2.close_connection(action[1])
        except (h2.exceptions.H2Error, ValueError):
            return  # our own h2 refused the action (a closed stream, a window past 2^31-1): nothing was sent
        self.flush()

    def probe(self) -> str:
        """A PING answered, or the connection closed by the broker; a hang fails the test (socket timeout)."""
        if self.closed:
            return "closed"
        if self.raw_sent or self.h2.state_machine.state == h2.connection.ConnectionState.CLOSED:
            # A frame that declared more bytes than were sent swallows anything more, and after our GOAWAY we may
            # say nothing: end our side, and the broker must close.
            return self.end_of_input()
        self.h2.ping(b"probe!!!")
        self.flush()
        self.sock.settimeout(30)
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return "closed"
            if not data:
                return "closed"
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                return "refused"  # the broker told of a protocol error (GOAWAY) our h2 reads as its own
            self.flush()
            if any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"probe!!!" for e in events):
                return "answered"
            if any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
                return "goaway"

    def end_of_input(self) -> str:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:  # the broker closed it already
            return "closed"
        self.sock.settimeout(30)
        while True:
            try:
                if not self.sock.recv(1 << 16):
                    return "closed after end of input"
            except ConnectionResetError:
                return "closed after end of input"

    def close(self) -> None:
        self.sock.close()


def fresh_call_completes(bt) -> bool:
    client = RawClient("%s:%d" % endpoint(bt))
    try:
        stream_id = client.call(f"/{SERVICE}/QueryRoute")
        client.send(stream_id, prefix(0), end=True)
        return b"grpc-status" in client.trailers(stream_id)
    finally:
        client.close()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(steps=actions)
def test_random_http2_never_hangs_or_hurts_the_broker(fuzzed_broker, steps):
    bt, errors = fuzzed_broker
    client = FuzzClient(endpoint(bt))
    try:
        for step in steps:
            client.act(step)
            client.read_ready()
        assert client.probe() in ("answered", "closed", "closed after end of input", "goaway", "refused")
    finally:
        client.close()
    assert fresh_call_completes(bt)
    assert not errors, errors[:3]
