"""The HTTP/2 transport of the gRPC door (broker/grpc/http2.py), driven by a raw HTTP/2 client (the h2 library, client
side) for what grpcio never sends: requests left incomplete, compressed messages, paths that are not served."""
from __future__ import annotations

import select
import socket
import struct
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from halfmq.broker.grpc.schema import SERVICE

from .conftest import wait_until

KiB, MiB = 1 << 10, 1 << 20
pytestmark = pytest.mark.grpc


class RawClient:
    """One HTTP/2 connection to the broker's gRPC port, on a blocking socket."""

    def __init__(self, endpoint: str):
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.events: list = []
        self._flush()
        self.round_trip()  # the broker's SETTINGS are in effect from here

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def call(self, path: str) -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                         (":authority", "halfmq"), ("content-type", "application/grpc"),
                                         ("te", "trailers"), ("x-mq-client-id", "raw@1")])
        self._flush()
        return stream_id

    def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        self.h2.send_data(stream_id, data, end_stream=end)
        self._flush()

    def window(self, stream_id: int) -> int:
        return self.h2.local_flow_control_window(stream_id)

    def round_trip(self) -> None:
        """Send a PING and read until its answer: whatever the broker sent before answering it is in ``events``."""
        self.h2.ping(b"halfmq!!")
        self._flush()
        while True:
            data = self.sock.recv(1 << 16)
            assert data, "the broker closed the connection"
            events = self.h2.receive_data(data)
            self._flush()
            self.events.extend(events)
            if any(isinstance(e, h2.events.PingAckReceived) for e in events):
                return

    def trailers(self, stream_id: int, timeout: float = 20.0) -> dict[bytes, bytes]:
        """The trailers (or trailers-only headers) that ended ``stream_id``, read as they come."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)) and \
                        event.stream_id == stream_id and any(k == b"grpc-status" for k, _ in event.headers):
                    return dict(event.headers)
            assert time.monotonic() < deadline, f"stream {stream_id} did not end within {timeout} s"
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            self.round_trip()

    def close(self) -> None:
        self.sock.close()


def prefix(length: int, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), length)


def start_incomplete(client: RawClient, calls: list[int], length: int) -> dict[int, int]:
    """Announce a message of ``length`` bytes on each call; what each may send, never its last byte (no request
    completes)."""
    for stream_id in calls:
        client.send(stream_id, prefix(length))
    return {stream_id: length - 1 for stream_id in calls}


def send_until_stalled(client: RawClient, left: dict[int, int]) -> int:
    """Send what the broker's windows let in, call by call, until it lets in no more; the bytes sent."""
    sent = 0
    while True:
        progress = False
        for stream_id in left:
            size = min(client.window(stream_id), left[stream_id], 16 * KiB)
            if size > 0:
                client.send(stream_id, bytes(size))
                left[stream_id] -= size
                sent += size
                progress = True
        client.round_trip()
        client.round_trip()  # the window updates for what was sent before the first PING, in any case
        if not progress and not any(min(client.window(s), left[s]) > 0 for s in left):
            return sent


def test_incomplete_requests_of_a_connection_hold_at_most_the_budget_and_one_message(grpc_broker_factory):
    """A client opening many calls and sending each message but its last byte: the broker gives more window only
    while what the connection's incomplete requests hold is within serverMaxInflightBytesPerConnection, and always
    to the oldest of them (one request can always complete). Before (grpcio's server) each call's message was
    buffered up to the size limit whatever the others held: 8 calls held 8 MiB here."""
    budget, largest = 64 * KiB, MiB + 64 * KiB
    broker = grpc_broker_factory(maxMessageSize=MiB, grpcRequestHeadroomBytes=64 * KiB,
                                 serverMaxInflightBytesPerConnection=budget)
    client = RawClient(broker.endpoint)
    try:
        calls = [client.call(f"/{SERVICE}/SendMessage") for _ in range(8)]
        left = start_incomplete(client, calls, largest)
        sent = send_until_stalled(client, left)
        stream_window = 64 * KiB  # what each call may send before the broker acknowledges any of it
        assert sent <= budget + largest + len(calls) * stream_window, sent
        assert left[calls[0]] == 0  # the oldest was never held back
        connection = next(iter(broker.broker.grpc._server.connections))
        held = sum(len(stream.buffer) for stream in connection.streams.values())
        assert held <= budget + largest + len(calls) * stream_window, held
    finally:
        client.close()


def test_a_connection_whose_client_sends_nothing_is_closed_after_the_idle_time(grpc_broker_factory):
    """serverChannelMaxIdleTimeSeconds holds for gRPC connections as it does for remoting ones: one whose client
    sends nothing for that long gets a GOAWAY and is closed, while one whose client keeps talking (PINGs here) stays.
    Before, a gRPC connection that never spoke again stayed open for ever, and kept its place under
    serverMaxConnections."""
    broker = grpc_broker_factory(serverChannelMaxIdleTimeSeconds=1)
    idle, busy = RawClient(broker.endpoint), RawClient(broker.endpoint)
    try:
        events, closed = [], False
        deadline = time.monotonic() + 20
        while not closed and time.monotonic() < deadline:
            busy.round_trip()  # busy's client speaks all the while
            if select.select([idle.sock], [], [], 0.2)[0]:
                data = idle.sock.recv(1 << 16)
                closed = not data
                events += idle.h2.receive_data(data) if data else []
        assert closed, "the idle connection is still open after 20 s"
        assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events)  # told why: a GOAWAY first
        busy.round_trip()  # the connection in use is still served
    finally:
        idle.close()
        busy.close()


@pytest.fixture
def raw_client(grpc_broker):
    client = RawClient(grpc_broker.endpoint)
    yield client
    client.close()


def unary(client: RawClient, path: str, message: bytes) -> dict[bytes, bytes]:
    """One whole request on a new stream of ``client``; the trailers that end it."""
    stream_id = client.call(path)
    client.send(stream_id, message, end=True)
    return client.trailers(stream_id)


def test_a_path_not_served_is_answered_unimplemented_and_the_connection_goes_on(raw_client):
    assert unary(raw_client, "/apache.rocketmq.v2.MessagingService/NoSuchMethod", prefix(0))[b"grpc-status"] == b"12"
    # its Status inside says what was missing
    assert unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(0))[b"grpc-status"] == b"0"


def test_a_compressed_message_is_refused_unimplemented(raw_client):
    """The broker offers grpc-accept-encoding identity only; a message flagged compressed is not inflated."""
    trailers = unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(3, compressed=True) + b"abc")
    assert trailers[b"grpc-status"] == b"12" and b"compressed" in trailers[b"grpc-message"]


def test_a_message_that_does_not_parse_fails_its_call_only(raw_client):
    assert unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(4) + b"\xff\xff\xff\xff")[b"grpc-status"] == b"13"
    assert unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(0))[b"grpc-status"] == b"0"


def test_a_request_without_its_whole_message_fails_its_call_only(raw_client):
    """A unary request that ends with no message, or within one: INTERNAL, and nothing of it is kept."""
    no_message = unary(raw_client, f"/{SERVICE}/QueryRoute", b"")
    assert no_message[b"grpc-status"] == b"13" and b"no message" in no_message[b"grpc-message"]
    cut = unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(10) + b"abc")
    assert cut[b"grpc-status"] == b"13" and b"within a message" in cut[b"grpc-message"]
    assert unary(raw_client, f"/{SERVICE}/QueryRoute", prefix(0))[b"grpc-status"] == b"0"


def test_incomplete_requests_share_the_brokers_budget_with_every_connection(grpc_broker_factory):
    """serverMaxBufferedFrameBytes bounds incomplete requests across the broker's connections, gRPC ones too:
    while another connection holds the budget, a connection gets no window past its free 128 KiB (and its calls'
    windows), and gets it once the other is gone. Before, each gRPC connection had only its own bound, so a
    thousand connections could each hold serverMaxInflightBytesPerConnection and a message."""
    broker = grpc_broker_factory(serverMaxBufferedFrameBytes=MiB, serverMaxInflightBytesPerConnection=64 * MiB)
    hog, late = RawClient(broker.endpoint), RawClient(broker.endpoint)
    try:
        hog_calls = [hog.call(f"/{SERVICE}/SendMessage")]
        hog_sent = send_until_stalled(hog, start_incomplete(hog, hog_calls, 3 * MiB))
        assert hog_sent == 3 * MiB - 1  # alone in the budget: it may finish its request
        late_calls = [late.call(f"/{SERVICE}/SendMessage") for _ in range(2)]
        left = start_incomplete(late, late_calls, MiB)
        late_sent = send_until_stalled(late, left)
        assert late_sent <= 128 * KiB + 2 * 64 * KiB + 2 * 16 * KiB, late_sent
        hog.close()
        wait_until(lambda: len(broker.broker.grpc._server.connections) == 1)  # its share went back
        late_sent += send_until_stalled(late, left)
        assert late_sent == 2 * (MiB - 1)
    finally:
        hog.close()
        late.close()


def test_a_call_over_the_stream_limit_is_refused_alone(grpc_broker_factory):
    """SETTINGS_MAX_CONCURRENT_STREAMS (grpcMaxStreamsPerConnection) exceeded by one call: that call is reset
    REFUSED_STREAM (RFC 9113 5.1.2: the client may retry it) and the connection and its open calls go on. Before,
    h2 closed the connection (GOAWAY PROTOCOL_ERROR) and every call on it failed."""
    broker = grpc_broker_factory(grpcMaxStreamsPerConnection=2)
    client = RawClient(broker.endpoint)
    try:
        # this client ignores the broker's limit, as a faulty or hostile one would
        client.h2.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 100
        client.h2.remote_settings.acknowledge()
        opened = [client.call(f"/{SERVICE}/QueryRoute") for _ in range(2)]  # open: no message sent yet
        extra = client.call(f"/{SERVICE}/QueryRoute")
        client.round_trip()
        resets = [e for e in client.events if isinstance(e, h2.events.StreamReset)]
        assert [(e.stream_id, e.error_code) for e in resets] == [(extra, h2.errors.ErrorCodes.REFUSED_STREAM)]
        for stream_id in opened:  # the calls in progress finish
            client.send(stream_id, prefix(0), end=True)
            assert client.trailers(stream_id)[b"grpc-status"] == b"0"
        assert unary(client, f"/{SERVICE}/QueryRoute", prefix(0))[b"grpc-status"] == b"0"  # room again
    finally:
        client.close()


def test_a_call_whose_grpc_timeout_passes_is_answered_deadline_exceeded_and_its_handler_cancelled(grpc_broker):
    """grpc-timeout is the call's deadline: a Telemetry stream the client keeps open past it ends with status 4
    (DEADLINE_EXCEEDED) and its handler is gone. Before, the deadline was not read: a client that never reset
    its call kept the handler (and what it holds) for ever."""
    client = RawClient(grpc_broker.endpoint)
    try:
        stream_id = client.h2.get_next_available_stream_id()
        client.h2.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/Telemetry"),
                                           (":authority", "halfmq"), ("content-type", "application/grpc"),
                                           ("te", "trailers"), ("x-mq-client-id", "raw@1"), ("grpc-timeout", "300m")])
        client._flush()
        started = time.monotonic()
        assert client.trailers(stream_id)[b"grpc-status"] == b"4"
        assert time.monotonic() - started >= 0.25
        connection = next(iter(grpc_broker.broker.grpc._server.connections))
        wait_until(lambda: not connection.tasks and not connection.streams)
    finally:
        client.close()


@pytest.mark.parametrize("value, seconds", [(b"300m", 0.3), (b"2S", 2.0), (b"1H", 3600.0), (b"99999999n", 0.099999999),
                                            (b"", None), (b"m", None), (b"123456789S", None), (b"1x", None),
                                            (b"-1S", None), (b"1.5S", None)])
def test_grpc_timeout_values(value, seconds):
    from halfmq.broker.grpc.http2 import grpc_timeout
    assert grpc_timeout(value) == seconds


def test_reused_header_blocks_decode_and_encode_as_hpack_does():
    """The connection's decoder gives back the headers of a block it decoded before, and its encoder the block of
    headers it encoded before, while the dynamic table is unchanged: random header sets, repeated, new, indexed
    or not, table size updates among them, come out as hpack's own decoder and encoder make them."""
    import random

    import hpack

    from halfmq.broker.grpc.http2 import _ReusingDecoder, _ReusingEncoder

    rng = random.Random(43)
    names = [b"x-mq-client-id", b"grpc-timeout", b"x-mq-date-time", b"custom", b":path", b"content-type"]
    sets = [tuple((rng.choice(names), b"v%d" % rng.randrange(6)) for _ in range(rng.randrange(1, 5)))
            for _ in range(12)]
    client, plain, reusing = hpack.Encoder(), hpack.Decoder(), _ReusingDecoder()
    ours, theirs, check = _ReusingEncoder(), hpack.Encoder(), hpack.Decoder()
    for _ in range(3000):
        if rng.random() < 0.01:  # a table size update, announced in the next block
            client.header_table_size = rng.choice([64, 256, 4096])
        headers = rng.choice(sets)
        block = client.encode(headers)
        assert reusing.decode(block, raw=True) == plain.decode(block, raw=True)
        if rng.random() < 0.01:
            size = rng.choice([64, 256, 4096])
            ours.header_table_size = theirs.header_table_size = size
        encoded = ours.encode(list(headers))  # as h2 hands them over
        assert encoded == theirs.encode(headers)
        assert check.decode(encoded, raw=True) == list(headers)


def test_the_connection_receives_frames_as_h2_does_less_the_trace():
    """_H2Connection._receive_frame is h2's, less the trace line that built every frame's repr: an h2 whose own
    changed fails here, so the copy is looked at again."""
    import inspect
    import re

    import h2.connection

    from halfmq.broker.grpc.http2 import _H2Connection

    def code(function) -> list[str]:
        lines = inspect.getsource(function).split("\n")
        text = "\n".join(line.split("#")[0].rstrip() for line in lines)
        text = re.sub(r'"""(.|\n)*?"""', "", text)
        text = text.replace("h2.exceptions.", "")
        body = [line.strip() for line in text.split("\n")[1:] if line.strip()]  # less the signature
        return [line for line in body if line != "events: list[Event]" and "logger.trace" not in line]

    assert code(_H2Connection._receive_frame) == code(h2.connection.H2Connection._receive_frame)


def test_answers_are_sent_as_h2_sends_them():
    """_H2Connection.send_headers / send_data write reused header blocks and DATA frames at once: random answers,
    trailers, data and mistakes (trailers without END_STREAM, data past the window or on an ended stream) on
    several streams give the same bytes, errors, stream states and windows as h2's own connection."""
    import random

    import h2.config
    import h2.connection
    import h2.exceptions

    from halfmq.broker.grpc.http2 import _OK_TRAILERS, _RESPONSE_HEADERS, _H2Connection

    config = h2.config.H2Configuration(client_side=False, header_encoding=None, validate_inbound_headers=False,
                                       normalize_inbound_headers=False, validate_outbound_headers=False,
                                       normalize_outbound_headers=False, split_outbound_cookies=False)
    rng = random.Random(43)
    for _ in range(20):
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        client.initiate_connection()
        client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.choice([20, 300, 65535])})
        ids = []
        for _ in range(rng.randrange(1, 6)):
            stream_id = client.get_next_available_stream_id()
            client.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", "/a/B"),
                                            (":authority", "x")], end_stream=rng.random() < 0.5)
            ids.append(stream_id)
        request = client.data_to_send()
        ours, theirs = _H2Connection(config), h2.connection.H2Connection(config)
        for conn in (ours, theirs):
            conn.initiate_connection()
            conn.receive_data(request)
        for _ in range(60):
            stream_id = rng.choice(ids)
            kind = rng.randrange(5)
            end = rng.random() < 0.3
            data, status, cut = bytes(rng.randrange(400)), b"%d" % rng.randrange(3), rng.randrange(1, 50)
            outcomes = []
            for conn in (ours, theirs):
                try:
                    if kind == 0:
                        conn.send_headers(stream_id, _RESPONSE_HEADERS, end_stream=end)
                    elif kind == 1:
                        conn.send_headers(stream_id, _OK_TRAILERS, end_stream=end)
                    elif kind == 2:
                        conn.send_headers(stream_id, [(b"grpc-status", status)], end_stream=end)
                    elif kind == 3:
                        conn.send_data(stream_id, data, end_stream=end)
                    else:
                        conn.send_data(stream_id, memoryview(data)[:cut], end_stream=end)
                    outcomes.append(None)
                except h2.exceptions.H2Error as exc:
                    outcomes.append(type(exc))
            assert outcomes[0] == outcomes[1]
            assert ours.data_to_send() == theirs.data_to_send()
            assert ours.outbound_flow_control_window == theirs.outbound_flow_control_window
            for sid in ids:
                mine, stock = ours.streams.get(sid), theirs.streams.get(sid)
                assert (mine is None) == (stock is None)
                if mine is not None:
                    assert mine.state_machine.state == stock.state_machine.state
                    assert mine.outbound_flow_control_window == stock.outbound_flow_control_window
                    assert mine.state_machine.trailers_sent == stock.state_machine.trailers_sent


def test_a_ping_flood_gets_enhance_your_calm_and_the_connection_closed(grpc_broker):
    """h2 answers every PING: a client sending them back to back made the broker write an answer for each, for
    ever. Past PING_BURST in a row (then PINGS_PER_SECOND) with nothing else said, the connection gets a GOAWAY
    ENHANCE_YOUR_CALM and is closed (what h2 answered of the read that held the flood is the most it answers); a
    client that pings now and then (every other test's) is not."""
    from halfmq.broker.grpc.http2 import PING_BURST

    client = RawClient(grpc_broker.endpoint)
    try:
        client.sock.settimeout(5)
        for index in range(PING_BURST * 3):
            client.h2.ping(b"%08d" % index)
        client._flush()
        events = []
        while data := client.sock.recv(1 << 16):
            events += client.h2.receive_data(data)
        goaways = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert [(e.error_code, e.additional_data) for e in goaways] == \
            [(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, b"too_many_pings")]
    finally:
        client.close()


def query_route(topic: str) -> bytes:
    from halfmq.broker.grpc.schema import pb
    return pb.QueryRouteRequest(topic=pb.Resource(name=topic)).SerializeToString()


def raw_frames(sock):
    """The frames the broker sends, parsed with hyperframe alone (h2 would close its side at the first GOAWAY),
    until it closes the connection."""
    from hyperframe.frame import Frame
    buffer = b""
    while True:
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buffer[:9]))
            if len(buffer) < 9 + length:
                break
            frame.parse_body(memoryview(buffer[9:9 + length]))
            buffer = buffer[9 + length:]
            yield frame
        data = sock.recv(1 << 16)
        if not data:
            return
        buffer += data


def test_a_client_going_away_still_gets_its_calls_in_progress_answered(grpc_broker):
    """A client's GOAWAY NO_ERROR says it opens nothing more, not that its calls are over: the call whose request
    was still arriving is answered, then the broker closes the connection. Before, h2 closed the connection the
    moment the GOAWAY came (python-hyper/h2#1181) and the call died unanswered."""
    from hyperframe.frame import GoAwayFrame

    client = RawClient(grpc_broker.endpoint)
    try:
        request = query_route("Going")
        stream_id = client.call(f"/{SERVICE}/QueryRoute")
        client.send(stream_id, prefix(len(request)) + request[:2])
        client.sock.sendall(GoAwayFrame(0, last_stream_id=0, error_code=0).serialize())  # h2's own would close it
        client.send(stream_id, request[2:], end=True)
        client.sock.settimeout(10)
        events = []
        while data := client.sock.recv(1 << 16):  # until the broker closes the connection, the call answered
            events += client.h2.receive_data(data)
        trailers = [dict(e.headers) for e in events if isinstance(e, h2.events.TrailersReceived)]
        assert [t[b"grpc-status"] for t in trailers] == [b"0"]
    finally:
        client.close()


def test_shutdown_goes_away_in_two_steps_and_lets_calls_in_progress_finish(grpc_broker):
    """Shutdown sends a GOAWAY of the highest stream id (open no more), a PING, and once it came back a GOAWAY
    naming the last stream it serves: the call whose request was still arriving is answered within the grace, a
    stream opened after is refused. Before, one GOAWAY closed h2's side at once: the call got nothing."""
    import threading

    from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame, RstStreamFrame

    client = RawClient(grpc_broker.endpoint)
    stopper = threading.Thread(target=lambda: grpc_broker.call(grpc_broker.broker.stop()))
    try:
        request = query_route("Leaving")
        stream_id = client.call(f"/{SERVICE}/QueryRoute")
        client.send(stream_id, prefix(len(request)) + request[:2])
        client.sock.settimeout(10)
        stopper.start()
        goaways, status, late, refused = [], None, None, None
        for frame in raw_frames(client.sock):
            if isinstance(frame, GoAwayFrame):
                goaways.append((frame.last_stream_id, frame.error_code))
                if len(goaways) == 2:  # the last stream is named: try another, and finish the call
                    late = stream_id + 2
                    block = client.h2.encoder.encode([(":method", "POST"), (":scheme", "http"),
                                                      (":path", f"/{SERVICE}/QueryRoute"), (":authority", "halfmq"),
                                                      ("content-type", "application/grpc"), ("te", "trailers")])
                    client.sock.sendall(HeadersFrame(late, data=block, flags=["END_HEADERS"]).serialize())
            elif isinstance(frame, RstStreamFrame) and frame.stream_id == late:
                refused = frame.error_code
                client.sock.sendall(DataFrame(stream_id, data=request[2:], flags=["END_STREAM"]).serialize())
            elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
                client.sock.sendall(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]).serialize())
            elif isinstance(frame, HeadersFrame):
                headers = dict(client.h2.decoder.decode(frame.data, raw=True))
                if frame.stream_id == stream_id and b"grpc-status" in headers:
                    status = headers[b"grpc-status"]
        assert goaways == [((1 << 31) - 1, 0), (stream_id, 0), (stream_id, 0)], goaways  # the last: closing
        assert status == b"0"
        assert refused == h2.errors.ErrorCodes.REFUSED_STREAM
    finally:
        stopper.join(30)
        client.close()
